"""Intervening on a diagnosis: a run branched at a step or an alert into arms that share its random
numbers (harness.intervene), and a running cell that switches on its alert's mitigation itself
(monitors.action=mitigate)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.run_dir import read_jsonl
from tests.conftest import REPO, python_cmd

INTERVENE = [sys.executable, "-m", "harness.intervene"]
PARENT = ["topology=voting", "sharing=ip", "steps=12", "ckpt_every=4", "ckpt_keep=10", "val_every=5", "val_problems=8",
          "progress=false", "wandb.enabled=false", "report=false"]
CELL = "voting-ip-arith-tiny-m-s0"
# an aggregator paid per token at T=1.5 (tests/test_diagnostic_runs.py): length drift fires after the first
# validation (step 20), at step 25 on an Intel CPU's pinned kernels and at step 46 on an AMD EPYC's (MKL's
# reproducible AVX2 branch is Intel's only); STEPS leaves room on both to cut a run after it
STEPS = 60
DRIFTING = ["topology=voting", "sharing=ip", "progress=false", "val_every=20", "wandb.enabled=false", "report=false",
            "+reward.per_role.aggregator.length=1.0", "algo.temperature=1.5",
            "+workflow.role_max_new_tokens={aggregator:24}", "monitors.drift.action=mitigate",
            "monitors.mitigations.length_drift=kl_anchor"]


def same_keys(got: dict, want: dict) -> list:
    """The keys on which two metrics records differ, wall-clock keys aside."""
    return sorted(k for k in set(got) | set(want) if not k.startswith("time/") and got.get(k) != want.get(k))


def run(root, *args, steps=None, timeout=300):
    extra = [f"steps={steps}"] if steps else []
    proc = subprocess.run(python_cmd() + [f"root={root}", *args, *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def parent(tmp_path_factory, warm_model_dir):
    root = tmp_path_factory.mktemp("parent")
    run(root, *PARENT)
    return root / "default" / CELL


def test_a_none_arm_killed_and_resumed_repeats_its_run_key_for_key(parent, tmp_path):
    arms = ["--at", "4", "--arms", "none,role_count_scaling"]
    arms_dir = parent.parent.parent / "default-interventions"
    none_dir = arms_dir / f"{CELL}@4+none"
    proc = subprocess.Popen(INTERVENE + [str(parent), *arms], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while len(read_jsonl(none_dir / "metrics.jsonl")) < 7 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 7 <= len(read_jsonl(none_dir / "metrics.jsonl")) < 12, "the kill must land mid-arm"
    again = subprocess.run(INTERVENE + [str(parent), *arms], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]

    want = read_jsonl(parent / "metrics.jsonl")
    got = read_jsonl(none_dir / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(12))
    for a, b in zip(got, want):  # the same problems, samples and updates: common random numbers
        assert same_keys(a, b) == [], a["step"]
    branch = json.loads((none_dir / "branch.json").read_text())
    assert (branch["start"], branch["checkpoint"], branch["mitigation"], branch["alert"]) == (
        4, "step_0000004", "none", None)

    scaled = read_jsonl(arms_dir / f"{CELL}@4+role_count_scaling" / "metrics.jsonl")
    assert [m["step"] for m in scaled] == list(range(12))
    assert all(same_keys(a, b) == [] for a, b in zip(scaled[:4], want[:4]))  # the run's own records before K
    # from K on the voter adapter takes one optimizer step where the run took three
    assert [m["policy/voter/optimizer_steps"] for m in want[4:6]] == [3, 3]
    assert [m["policy/voter/optimizer_steps"] for m in scaled[4:6]] == [1, 1]
    status = json.loads((arms_dir / f"{CELL}@4+role_count_scaling" / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 12


@pytest.mark.parametrize("args,message", [
    (["--at", "40"], "branch step 40 is outside the run's training steps 1..11"),
    (["--at", "soon"], "--at must be first-alert or a step number, got 'soon'"),
    (["--at", "4", "--arms", "none,nosuch"], "unknown arm 'nosuch'; valid: none, matched, control or a mitigation"),
    (["--at", "4", "--arms", "matched"], "arm 'matched' needs an alert to match"),
    (["--at", "first-alert"], "has no alert to branch at"),
    (["--kind", "boredom"], "unknown alert kind 'boredom'; valid: amplification, capture, length_drift"),
    (["--at", "4", "--arms", "none,none"], "an arm is named twice"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(parent, args, message):
    before = sorted(p.name for p in parent.parent.parent.rglob("*") if "checkpoints" not in p.parts)
    proc = subprocess.run(INTERVENE + [str(parent), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in parent.parent.parent.rglob("*") if "checkpoints" not in p.parts) == before


def test_a_branch_never_starts_from_a_damaged_or_missing_checkpoint(parent, tmp_path):
    import shutil

    copy = tmp_path / "sweep" / CELL
    shutil.copytree(parent, copy)
    for old in (copy / "checkpoints").glob("step_*"):  # every other state at or before step 5 (bests, the first)
        if int(old.name.split("_")[1]) <= 5 and old.name != "step_0000004":
            shutil.rmtree(old)
    weights = copy / "checkpoints" / "step_0000004" / "engine.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"damaged!")
    proc = subprocess.run(INTERVENE + [str(copy), "--at", "5", "--arms", "none"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "has no verified checkpoint at or before step 5 (checked: step_0000004)" in proc.stderr
    assert sorted(p.name for p in copy.parent.parent.iterdir()) == ["sweep"]


def test_not_a_run_directory_is_refused(tmp_path):
    proc = subprocess.run(INTERVENE + [str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is not a run directory (no cell.yaml)" in proc.stderr


def test_action_mitigate_switches_the_mitigation_on_and_a_resume_replays_it(tmp_path, warm_model_dir):
    whole = tmp_path / "whole"
    run(whole, *DRIFTING, steps=STEPS)
    cell = whole / "default" / CELL
    mitigated = [a for a in read_jsonl(cell / "alerts.jsonl") if a["action"] == "mitigate"]
    assert mitigated and mitigated[0]["kind"] == "length_drift" and mitigated[0]["mitigation"] == "kl_anchor"
    first = mitigated[0]["step"]
    assert first + 3 < STEPS  # room to cut the run after it
    status = json.loads((cell / "status.json").read_text())
    assert status["state"] == "finished" and status["mitigations"] == {"kl_anchor": first + 1}
    metrics = read_jsonl(cell / "metrics.jsonl")
    # KL to the base joins the loss from the next step: measured every step (no kl_age) from then on
    assert all(m.get("kl_age") is None and "role/voter/kl" in m for m in metrics[first + 1:])
    assert any(m.get("kl_age") not in (None, 0) for m in metrics[1:first + 1])
    # the state at the alert is kept for branching, however many checkpoints came after
    assert (cell / "checkpoints" / f"step_{first + 1:07d}").is_dir()
    assert f"step_{first + 1:07d}" in json.loads((cell / "checkpoints" / "pinned.json").read_text())

    # a run cut two steps after the alert and resumed replays the mitigation from alerts.jsonl
    cut = tmp_path / "cut"
    run(cut, *DRIFTING, steps=first + 3)
    resumed = run(cut, *DRIFTING, steps=STEPS)
    assert f"resuming {CELL} from step {first + 3}" in resumed.stdout
    got = read_jsonl(cut / "default" / CELL / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(STEPS))
    for a, b in zip(got[first + 3:], metrics[first + 3:]):
        assert same_keys(a, b) == [], a["step"]

    # branching at the first alert: the arms start from the state at it, the matched one from the run's map
    proc = subprocess.run(INTERVENE + [str(cell), "--kind", "length_drift", "--arms", "none,matched,control",
                                       "--prepare-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for label, mitigation in (("none", "none"), ("matched", "kl_anchor"), ("control", "lr_half")):
        arm = cell.parent.parent / "default-interventions" / f"{CELL}@{first + 1}+{label}"
        branch = json.loads((arm / "branch.json").read_text())
        assert (branch["start"], branch["mitigation"], branch["alert"]["step"]) == (first + 1, mitigation, first)
        assert [m["step"] for m in read_jsonl(arm / "metrics.jsonl")] == list(range(first + 1))
        assert (arm / "checkpoints" / f"step_{first + 1:07d}" / "manifest.json").is_file()
    # the sham arm: the same matched mitigation switched on at a step no alert of this run chose
    sham = subprocess.run(INTERVENE + [str(cell), "--kind", "length_drift", "--sham-at", str(first + 2),
                                       "--prepare-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert sham.returncode == 0, sham.stderr
    [arm] = (cell.parent.parent / "default-interventions").glob(f"{CELL}@*+sham")
    branch = json.loads((arm / "branch.json").read_text())
    assert branch["mitigation"] == "kl_anchor" and branch["alert"] is None
    assert branch["sham_of"]["step"] == first and first + 1 <= branch["start"] <= first + 2


def test_sham_steps_give_each_cell_another_cells_alert_step():
    from harness.intervene import sham_steps

    assert sham_steps({"b": 30, "a": 12, "c": 50}) == {"a": 31, "b": 51, "c": 13}
    assert sham_steps({"a": 12}) == {}  # one cell: no other alert step to borrow


def test_action_mitigate_needs_the_local_engine(tmp_path):
    from harness.config import ConfigError
    from harness.validation import config_from_dict

    with pytest.raises(ConfigError, match="only the single-model local engine reads live"):
        config_from_dict({"engine": "verl", "monitors": {"action": "mitigate"}})
    with pytest.raises(ConfigError, match=r"monitors.mitigations.capture: unknown mitigation 'calm'"):
        config_from_dict({"monitors": {"mitigations": {"capture": "calm"}}})
    cfg = config_from_dict({"monitors": {"action": "stop"}})
    assert {cfg.monitors.amplification.action, cfg.monitors.capture.action, cfg.monitors.drift.action,
            cfg.monitors.collapse.action, cfg.monitors.nonfinite.action} == {"stop"}


def test_the_intervention_report_renders_in_chromium(parent, tmp_path):
    from reports.interventions import build_intervention_report
    from reports.screenshots import open_in_chromium

    proc = subprocess.run(INTERVENE + [str(parent), "--at", "8", "--arms", "none,kl_anchor"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = build_intervention_report(parent.parent)
    assert index == parent.parent.parent / "default-interventions" / "report" / "index.html"
    seen = open_in_chromium(index.as_uri(), tmp_path / "interventions.png")
    assert seen["errors"] == [] and seen["dialogs"] == [] and seen["images"] and all(seen["images"])
    md = (index.parent / "report.md").read_text()
    # a none arm run at 8 (and at 4 when the first test ran before) repeats the run, whichever ran
    import re

    ran, repeated = re.search(r"a `none` arm ran at (\d+) of them and repeated its run's records key for key at "
                              r"(\d+)\.", md).groups()
    assert int(ran) >= 1 and ran == repeated
    # every arm against the none arm run beside it, by paired tests worded by their p
    assert re.search(r"\| \(a step\) +\| kl_anchor +\| none ", md) and "McNemar exact p = " in md
    assert "sign test p = " in md and "nan" not in md
    assert "fails less often than none (p = " in md


def test_a_sweep_is_branched_by_the_grid_and_its_actions_compared(tmp_path, warm_model_dir):
    from reports.interventions import action_table

    sweep = ["sweep=smoke", f"root={tmp_path}", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]",
             "sweep.axes.seed=[0]", "sweep.baseline=false", "sweep.cell.steps=5", "+sweep.cell.ckpt_keep=10",
             "+sweep.cell.report=false", "+sweep.extra_axes.action={alert:{},mitigate:{monitors:{action:mitigate}}}"]
    launched = subprocess.run([sys.executable, "grid/launch.py", *sweep], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]
    frame = action_table(tmp_path / "smoke")  # mitigate against alert on the same seed, paired
    assert list(frame["action"]) == ["mitigate"] and list(frame["against"]) == ["alert"]
    assert list(frame["sharing"]) == ["ip"] and list(frame["seeds"]) == [1]
    assert frame["failed (paired)"][0].startswith(("0/1 vs", "1/1 vs")) and "McNemar exact p" in frame["failed (paired)"][0]

    branched = subprocess.run([sys.executable, "grid/launch.py", *sweep, "action=intervene", "intervene.at=2",
                               "intervene.arms=[none,kl_anchor]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert branched.returncode == 0, branched.stdout[-2000:] + branched.stderr[-2000:]
    arms = sorted(p.name for p in (tmp_path / "smoke-interventions").iterdir() if (p / "branch.json").is_file())
    parents = sorted(p.name for p in (tmp_path / "smoke").iterdir() if (p / "cell.yaml").is_file())
    assert len(parents) == 2 and len(arms) == 4 and all("@" in a for a in arms)
    for parent_name in parents:
        start = json.loads(next((tmp_path / "smoke-interventions").glob(f"{parent_name}@*+none/branch.json"))
                           .read_text())["start"]
        none = read_jsonl(tmp_path / "smoke-interventions" / f"{parent_name}@{start}+none" / "metrics.jsonl")
        want = read_jsonl(tmp_path / "smoke" / parent_name / "metrics.jsonl")
        assert [m["step"] for m in none] == list(range(5)) and all(same_keys(a, b) == [] for a, b in zip(none, want))
        status = json.loads((tmp_path / "smoke-interventions" / f"{parent_name}@{start}+kl_anchor" / "status.json")
                            .read_text())
        assert status["state"] == "finished"
    assert "intervention report:" in branched.stdout
    assert (tmp_path / "smoke-interventions" / "report" / "report.md").is_file()
    again = subprocess.run([sys.executable, "grid/launch.py", *sweep, "action=intervene", "intervene.at=2",
                            "intervene.arms=[none,kl_anchor]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to submit" in again.stdout  # idempotent, as a launch is
