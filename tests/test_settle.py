"""Steps that waited for a lagging paired run when their cell ended are judged once the sweep is over."""
import json

from omegaconf import OmegaConf

from grid.launch import settle_alerts
from harness.config import CellConfig
from harness.logging import read_jsonl
from harness.monitors import Monitor
from harness.monitors.settle import late_alerts, role_policies_of, settle_sweep
from reports.detectors import build_detector_report

POLICIES = {"shared": ["voter:0", "voter:1", "voter:2", "aggregator:0"]}


def _paired_run(directory, steps):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": 0.5}) + "\n"
                                                     for s in range(steps)))


def _cell_that_ended_ahead(sweep, state="finished"):
    """A voting-sp cell whose training accuracy falls from step 12, run live while its paired single
    agent had logged only 12 steps: the fall waited for that run and was never judged."""
    run, paired = sweep / "voting-sp-s0", sweep / "single-s0"
    _paired_run(paired, 12)
    run.mkdir(parents=True)
    cfg = OmegaConf.structured(CellConfig)
    cfg.topology, cfg.sharing, cfg.monitors.reference_run = "voting", "sp", str(paired)
    (run / "cell.yaml").write_text(OmegaConf.to_yaml(cfg))
    records = [{"step": s, "accuracy": 0.5 if s < 12 else 0.05} for s in range(30)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    live = Monitor(OmegaConf.to_object(cfg).monitors, role_policies_of({"policies": POLICIES}))
    (run / "alerts.jsonl").write_text("".join(json.dumps(a.record()) + "\n" for r in records for a in live.observe(r)))
    (run / "status.json").write_text(json.dumps({"state": state, "step": 30, "policies": POLICIES}))
    return run, paired


def test_a_finished_run_gets_the_alerts_its_lagging_paired_run_held_back_once(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path)
    assert not read_jsonl(run / "alerts.jsonl")  # live, steps 12-29 waited for the paired run
    assert not late_alerts(run)  # the paired run has not moved: still nothing to judge
    _paired_run(paired, 40)
    late = late_alerts(run)
    assert late and {a.kind for a in late} == {"collapse"} and all(12 < a.step < 30 for a in late)
    written = read_jsonl(run / "alerts.jsonl")
    assert [w["step"] for w in written] == [a.step for a in late] and all(w["late"] for w in written)
    assert not late_alerts(run)  # nothing is written twice


def test_a_running_run_is_left_to_its_own_process(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path, state="running")
    _paired_run(paired, 40)
    assert not late_alerts(run) and not read_jsonl(run / "alerts.jsonl")


def test_a_moved_sweep_finds_the_paired_run_beside_the_cell(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path / "old")
    _paired_run(paired, 40)
    moved = tmp_path / "new"
    (tmp_path / "old").rename(moved)
    assert set(settle_sweep(moved)) == {run.name}


def test_the_launcher_settles_a_finished_sweep_and_says_which_alerts_came_late(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path)
    _paired_run(paired, 40)
    lines = []
    settle_alerts(tmp_path, lines.append)
    assert any(line.startswith(f"late alerts in {run.name}") and "collapse" in line for line in lines)
    assert read_jsonl(run / "alerts.jsonl")
    report = build_detector_report(tmp_path).with_suffix(".md")
    assert "judged only after their run ended" in report.read_text()  # scored, and said to have come late
