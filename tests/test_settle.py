"""Steps that waited for a lagging paired run when their cell ended are judged once both runs are over."""
import json

from omegaconf import OmegaConf

from grid.launch import main as launch_main
from grid.launch import settle_alerts
from harness.config import CellConfig
from harness.logging import read_jsonl
from harness.monitors import Monitor
from harness.monitors.settle import late_alerts, role_policies_of, settle_sweep
from reports.detectors import build_detector_report

POLICIES = {"shared": ["voter:0", "voter:1", "voter:2", "aggregator:0"]}


def _paired_run(directory, steps, state="finished", accuracy=0.5):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": accuracy,
                                                                 "policy/solver/drift": 0.01 * s}) + "\n"
                                                     for s in range(steps)))
    (directory / "status.json").write_text(json.dumps({"state": state, "step": steps}))


def _cell_that_ended_ahead(sweep, state="finished", policies=POLICIES):
    """A voting-sp cell whose training and validation accuracy fall from step 12, run live while its
    paired single agent had logged only 12 steps: the training-accuracy warning waited for that run
    and was never judged; the validation confirmation (no paired run needed) was written live."""
    run, paired = sweep / "voting-sp-s0", sweep / "single-s0"
    _paired_run(paired, 12, state="running")
    run.mkdir(parents=True)
    cfg = OmegaConf.structured(CellConfig)
    cfg.topology, cfg.sharing, cfg.monitors.reference_run = "voting", "sp", str(paired)
    (run / "cell.yaml").write_text(OmegaConf.to_yaml(cfg))
    records = [{"step": s, "accuracy": 0.5 if s < 12 else 0.05} for s in range(40)]
    for r in records[::10]:
        r.update({"val/accuracy": r["accuracy"], "val/accuracy_se": 0.02})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    live = Monitor(OmegaConf.to_object(cfg).monitors, role_policies_of({"policies": POLICIES}))
    (run / "alerts.jsonl").write_text("".join(json.dumps(a.record()) + "\n" for r in records for a in live.observe(r)))
    assert live.waiting_since() == 12
    (run / "status.json").write_text(json.dumps({"state": state, "step": 40, "policies": policies,
                                                 "alerts": {"collapse": 1}, "waiting_for_paired_run": 12}))
    return run, paired


def test_a_finished_run_gets_the_alerts_its_lagging_paired_run_held_back_once(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path)
    live = read_jsonl(run / "alerts.jsonl")
    assert [a["signal"] for a in live] == ["validation"]  # the warning waited for the paired run
    assert not late_alerts(run)  # the paired run is still running: its log may still change
    _paired_run(paired, 40, state="failed")
    assert not late_alerts(run)  # a failed paired run resumes and rewrites its last steps
    _paired_run(paired, 40)
    late = late_alerts(run)
    assert late and all(a.kind == "collapse" and a.signal == "training vs paired run" and 12 < a.step < 40
                        for a in late)
    written = read_jsonl(run / "alerts.jsonl")
    assert written[:len(live)] == live and all(w["late"] is True for w in written[len(live):])
    status = json.loads((run / "status.json").read_text())
    assert status["alerts"] == {"collapse": 1 + len(late)} and status["waiting_for_paired_run"] is None
    assert not late_alerts(run)  # nothing is written twice


def test_only_the_steps_the_run_left_waiting_are_judged(tmp_path):
    """A replay differs from the log wherever today's code differs from the run's: those steps were
    judged live, and nothing before the first waiting step (or in a run that recorded none) is written."""
    run, paired = _cell_that_ended_ahead(tmp_path)
    _paired_run(paired, 40)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "waiting_for_paired_run": 30}))
    assert all(a.step >= 30 for a in late_alerts(run))
    run, paired = _cell_that_ended_ahead(tmp_path / "older")
    _paired_run(paired, 40)
    status = json.loads((run / "status.json").read_text())
    del status["waiting_for_paired_run"]  # a run logged before runs recorded their waiting steps
    (run / "status.json").write_text(json.dumps(status))
    assert not late_alerts(run)


def test_only_alerts_that_waited_are_written_late(tmp_path):
    """A replayed alert the log lacks that never waited for the paired run (here the validation
    confirmation, as if today's code raised one the run's did not) is a code difference, not late."""
    run, paired = _cell_that_ended_ahead(tmp_path)
    (run / "alerts.jsonl").write_text("")
    _paired_run(paired, 40)
    assert {a.signal for a in late_alerts(run)} == {"training vs paired run"}


def test_a_run_that_may_still_change_is_left_alone(tmp_path):
    running, paired = _cell_that_ended_ahead(tmp_path / "running", state="running")
    _paired_run(paired, 40)
    no_map, paired = _cell_that_ended_ahead(tmp_path / "no_map", policies=None)  # a status cut short by a full disk
    _paired_run(paired, 40)
    assert not late_alerts(running) and not late_alerts(no_map)
    assert [a["signal"] for a in read_jsonl(running / "alerts.jsonl")] == ["validation"]


def test_the_paired_run_beside_the_cell_wins_over_the_recorded_path(tmp_path):
    """After a sweep moved, its recorded path may hold another run (a new sweep of the same name)."""
    run, paired = _cell_that_ended_ahead(tmp_path / "old")
    _paired_run(paired, 40)
    moved = tmp_path / "new"
    (tmp_path / "old").rename(moved)
    _paired_run(paired, 40, accuracy=0.05)  # the old place, reused: the cell matches this one step for step
    assert set(settle_sweep(moved)) == {run.name}
    assert not late_alerts(paired.parent / run.name)  # (nothing there to settle)


def test_the_launcher_settles_a_finished_sweep_and_says_which_alerts_came_late(tmp_path):
    run, paired = _cell_that_ended_ahead(tmp_path)
    _paired_run(paired, 40)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cell.yaml").write_text("not_a_field: 1\n")  # one unreadable run stops nothing
    (tmp_path / "broken" / "metrics.jsonl").write_text("")
    lines = []
    settle_alerts(tmp_path, lines.append)
    assert any(line.startswith(f"late alerts in {run.name}") and "collapse" in line for line in lines)
    assert any(line.startswith("warning: could not judge the late steps of broken") for line in lines)
    rows = [line for line in (run / "report" / "report.md").read_text().splitlines() if "collapse warning" in line]
    assert rows and rows[0].rstrip(" |").endswith("late")  # the run's report redrawn, the alert marked late
    report = build_detector_report(tmp_path).with_suffix(".md")
    assert "judged only after their run ended" in report.read_text()  # scored, and said to have come late


def test_status_of_a_sweep_never_launched_settles_nothing_and_succeeds(tmp_path):
    assert launch_main([f"root={tmp_path}", "sweep=smoke", "action=status"]) == 0
    assert not (tmp_path / "smoke").exists()


def test_a_trained_cell_records_the_steps_it_left_waiting_and_they_are_judged_later(tmp_path, warm_model_dir):
    """A real voting-sp cell whose paired run has logged 3 steps and is still running: the cell ends
    with steps 3-7 unjudged and says so in status.json and its checkpoint; a resume judges them;
    once the paired run is over, the settle step judges the rest."""
    from harness.run import run_cell
    from tests.conftest import cell

    paired = tmp_path / "single"
    paired.mkdir()

    def log_paired(steps, state):
        (paired / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": 0.5, "policy/solver/drift": 0.01})
                                                      + "\n" for s in range(steps)))
        (paired / "status.json").write_text(json.dumps({"state": state, "step": steps}))

    log_paired(3, "running")
    cfg = cell(tmp_path, "topology=voting", "sharing=sp", "steps=8", "val_every=4", "val_problems=4",
               f"monitors.reference_run={paired}")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    run = tmp_path / cfg.sweep / cfg.cell_id
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] == 3
    assert not late_alerts(run)  # the paired run is still running
    assert OmegaConf.load(run / "checkpoints" / "step_0000008" / "trainer.yaml").waiting_for_paired_run == 3

    # raised to 10 steps, it resumes from step 8 with steps 3-7 judged now (the paired run reached them)
    log_paired(8, "running")
    cfg = cell(tmp_path, "topology=voting", "sharing=sp", "steps=10", "val_every=4", "val_problems=4",
               f"monitors.reference_run={paired}")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] == 8
    assert all(a.get("late") is True and a["step"] >= 3 for a in read_jsonl(run / "alerts.jsonl")
               if a["kind"] in ("amplification", "collapse") and a["step"] < 8)

    log_paired(10, "finished")
    late = late_alerts(run)
    assert all(a.step >= 3 for a in late)
    assert [a["step"] for a in read_jsonl(run / "alerts.jsonl") if a.get("late")] == [a.step for a in late]
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] is None
