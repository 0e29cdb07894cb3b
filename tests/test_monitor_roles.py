"""The monitors find the judging roles of every workflow by contract (a verdict, an index, a plan,
a search action), on the study's three topologies and UnityMAS-O's A-D alike; a monitor or
mitigation setting that names a role the topology lacks is one error."""
import subprocess

import pytest

from harness.config import MonitorConfig
from harness.monitors import Monitor
from harness.monitors.detectors import CaptureDetector, LengthDriftDetector
from harness.monitors.roles import contracts_of, judging_roles
from harness.workflows import build_workflow
from tests.conftest import REPO, cell, python_cmd

JUDGING = {
    ("voting", "arith"): {"aggregator"},
    ("eval_opt", "arith"): {"evaluator"},
    ("orch_workers", "arith"): {"orchestrator"},
    ("qd_retrieve_answer", "qa-synth"): {"decomposer"},
    ("qd_retrieve_evidence_answer", "qa-synth"): {"decomposer"},
    ("mask_search", "qa-synth"): {"planner", "searcher"},
    ("reflective_code", "code-synth"): set(),  # its reflector writes free text; the jail's run stops the loop
    ("single", "arith"): set(),
}


@pytest.mark.parametrize("topology,task", list(JUDGING))
def test_the_monitors_watch_each_workflows_judging_roles(tmp_path, topology, task):
    cfg = cell(tmp_path, f"topology={topology}", f"task={task}")
    contracts = contracts_of(build_workflow(cfg))
    assert set(judging_roles(contracts)) == JUDGING[(topology, task)]
    monitor = Monitor(MonitorConfig(), {r: ["p"] for r in contracts}, contracts)
    watched = {type(d): d for d in monitor.detectors}
    assert watched[LengthDriftDetector].roles == JUDGING[(topology, task)]
    assert watched[CaptureDetector].pressure_roles == JUDGING[(topology, task)]
    if JUDGING[(topology, task)]:  # a judging role growing its replies is seen, whatever its name
        role = sorted(JUDGING[(topology, task)])[0]
        grow = [{"step": s, f"role/{role}/response_length": 3.0 if s < 12 else 3.0 + 2 * (s - 11)} for s in range(30)]
        assert any(a.kind == "length_drift" and a.role == role for r in grow for a in monitor.observe(r))


def test_an_explicit_role_list_wins_and_an_old_run_keeps_its_named_roles():
    assert judging_roles({"voter": "answer", "aggregator": "index"}, ["voter"]) == ["voter"]
    assert judging_roles(None) == ["aggregator", "evaluator", "orchestrator"]  # logs without contracts


@pytest.mark.parametrize("override,where", [
    ("monitors.drift.roles=[aggregatr]", "monitors.drift.roles names aggregatr"),
    ("monitors.capture.pressure_roles=[evaluator]", "monitors.capture.pressure_roles names evaluator"),
    ("+algo.kl_coef_per_role={verifier: 0.1}", "algo.kl_coef_per_role names verifier"),
])
def test_a_monitor_or_mitigation_setting_naming_a_role_the_topology_lacks_is_one_error(tmp_path, override, where):
    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", "topology=voting", override], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and where in proc.stderr and "its roles: aggregator, voter" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_length_penalty_charges_each_workflows_judging_roles(tmp_path):
    cfg = cell(tmp_path, "topology=mask_search", "task=qa-synth", "mitigation=length_penalty")
    charged = {role for role, terms in cfg.reward.per_role.items() if terms.get("length") == -0.05}
    assert charged == {"planner", "searcher"}
