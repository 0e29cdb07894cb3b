"""Steps that waited for a lagging paired run when their cell ended are judged once both runs are over."""
import json

from omegaconf import OmegaConf

from grid.launch import main as launch_main
from grid.launch import settle_alerts
from harness.config import CellConfig
from harness.run_dir import stored_cell_config
from harness.run_dir import read_jsonl
from harness.monitors import Monitor, unwritten
from harness.paired_run import paired_run
from harness.monitors.settle import late_alerts, role_policies_of, settle_sweep
from reports.detectors import build_detector_report

POLICIES = {"shared": ["voter:0", "voter:1", "voter:2", "aggregator:0"]}


FALLING = [0.5] * 12 + [0.05] * 28  # the cell's own training accuracy, step for step


def _paired_run(directory, steps, state="finished", accuracy=0.5):
    """A single agent's log (training accuracy, a constant or per step, and drift, logged after each
    step's update so never 0) and status."""
    directory.mkdir(parents=True, exist_ok=True)
    per_step = accuracy if isinstance(accuracy, list) else [accuracy] * steps
    (directory / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "accuracy": per_step[s], "policy/solver/drift": 0.01 * (s + 1)}) + "\n" for s in range(steps)))
    (directory / "status.json").write_text(json.dumps({"state": state, "step": steps}))


def _cell_that_ended_ahead(sweep, state="finished", policies=POLICIES, debounce=25):
    """A voting-sp cell whose training and validation accuracy fall from step 12, run live while its
    paired single agent had logged only 12 steps: the training-accuracy warning waited for that run
    and was never judged; the validation confirmation (no paired run needed) was written live."""
    run, paired = sweep / "voting-sp-s0", sweep / "single-s0"
    _paired_run(paired, 12, state="running")
    run.mkdir(parents=True)
    cfg = OmegaConf.structured(CellConfig)
    cfg.topology, cfg.sharing, cfg.monitors.reference_run = "voting", "sp", str(paired)
    cfg.monitors.debounce = debounce
    (run / "cell.yaml").write_text(OmegaConf.to_yaml(cfg))
    records = [{"step": s, "accuracy": 0.5 if s < 12 else 0.05} for s in range(40)]
    for r in records[::10]:
        r.update({"val/accuracy": r["accuracy"], "val/accuracy_se": 0.02})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monitors = OmegaConf.to_object(cfg).monitors
    live = Monitor(monitors, role_policies_of({"policies": POLICIES}), reference=paired_run(monitors))
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
    cfg = stored_cell_config(run).monitors  # what a live run would have raised
    in_step = Monitor(cfg, role_policies_of({"policies": POLICIES}), reference=paired_run(cfg)).replay(
        read_jsonl(run / "metrics.jsonl"))
    assert late == unwritten(in_step, live)  # had its paired run kept pace: exactly these
    written = read_jsonl(run / "alerts.jsonl")
    assert written[:len(live)] == live and all(w["late"] is True for w in written[len(live):])
    status = json.loads((run / "status.json").read_text())
    assert status["alerts"] == {"collapse": 1 + len(late)} and status["waiting_for_paired_run"] is None
    assert not late_alerts(run)  # nothing is written twice


def test_only_the_steps_the_run_left_waiting_are_judged(tmp_path):
    """A replay differs from the log wherever today's code differs from the run's: those steps were
    judged live, and nothing before the first waiting step (or in a run that recorded none) is written."""
    def settled(name, since, written=None):
        run, paired = _cell_that_ended_ahead(tmp_path / name, debounce=1)  # a warning at every low step
        _paired_run(paired, 40)
        status = json.loads((run / "status.json").read_text())
        (run / "status.json").write_text(json.dumps({**status, "waiting_for_paired_run": since}))
        if written is not None:
            (run / "alerts.jsonl").write_text("".join(json.dumps(w) + "\n" for w in written))
        return [a.step for a in late_alerts(run)]

    every = settled("all", 12)
    assert min(every) < 30 and [s for s in every if s >= 30] == settled("from30", 30) != []
    assert settled("older", None) == []  # a run that left no step waiting, or logged before the record


def test_the_debounce_of_a_replay_follows_what_the_run_wrote(tmp_path):
    """A warning the live run wrote at step 18 holds the next one back for `debounce` steps, as it
    did live, even where today's replay would not have raised it there."""
    run, paired = _cell_that_ended_ahead(tmp_path)
    _paired_run(paired, 40)
    warning = {"step": 18, "kind": "collapse", "role": None, "policy": None, "value": 0.1, "threshold": 0.3,
               "message": "collapse warning", "action": "alert", "signal": "training vs paired run"}
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "waiting_for_paired_run": 20}))
    (run / "alerts.jsonl").write_text(json.dumps(warning) + "\n")
    assert all(a.step >= 18 + 25 for a in late_alerts(run))  # debounced from the logged 18
    run, paired = _cell_that_ended_ahead(tmp_path / "unlogged")
    _paired_run(paired, 40)
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "waiting_for_paired_run": 20}))
    (run / "alerts.jsonl").write_text("")
    assert [a.step for a in late_alerts(run)][:1] == [20]  # nothing logged before: the first waiting step warns


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


def test_after_a_move_the_paired_run_beside_the_cell_wins_over_the_recorded_path(tmp_path):
    """After a sweep moved, its recorded path may hold another run (a new sweep of the same name)."""
    run, paired = _cell_that_ended_ahead(tmp_path / "old" / "repro")
    _paired_run(paired, 40)
    moved = tmp_path / "new" / "repro"
    moved.parent.mkdir()
    (tmp_path / "old" / "repro").rename(moved)
    _paired_run(paired, 40, accuracy=FALLING)  # the old place, reused: the cell matches it step for step
    assert set(settle_sweep(moved)) == {run.name}  # judged against its own paired run, which stayed at 0.5


def test_a_paired_run_a_user_chose_in_another_sweep_is_kept(tmp_path):
    """`monitors.reference_run` set by hand to another sweep's baseline: the grid's own baseline
    beside the cell is not the run the cell read live."""
    run, beside = _cell_that_ended_ahead(tmp_path / "repro")
    _paired_run(beside, 40)
    chosen = tmp_path / "baselines" / "single-s0"
    _paired_run(chosen, 40, accuracy=FALLING)  # the cell matches it: nothing to warn of
    cfg = OmegaConf.load(run / "cell.yaml")
    cfg.monitors.reference_run = str(chosen)
    (run / "cell.yaml").write_text(OmegaConf.to_yaml(cfg))
    assert not late_alerts(run)


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
    once the paired run is over, the settle step judges the rest. `amplification` is set to fire at
    every step it judges (no thresholds, no debounce), so each step's judgement shows in alerts.jsonl."""
    from harness.run import run_cell
    from tests.conftest import cell

    paired = tmp_path / "single"
    every_step = ["monitors.amplification.min_step=0", "monitors.amplification.patience=1",
                  "monitors.amplification.min_ratio=0", "monitors.amplification.min_coherence=0",
                  "monitors.amplification.baseline_steps=0", "monitors.debounce=1", "monitors.start_step=0"]

    def train(steps):
        cfg = cell(tmp_path, "topology=voting", "sharing=sp", f"steps={steps}", "val_every=4", "val_problems=4",
                   f"monitors.reference_run={paired}", *every_step)
        assert run_cell(cfg, log=lambda *_: None) == "finished"
        return tmp_path / cfg.sweep / cfg.cell_id

    def judged(run):  # amplification's alerts, by step: (late or not)
        alerts = [a for a in read_jsonl(run / "alerts.jsonl") if a["kind"] == "amplification"]
        assert len({(a["step"], a["policy"]) for a in alerts}) == len(alerts)  # none written twice
        return {a["step"]: bool(a.get("late")) for a in alerts}

    _paired_run(paired, 3, state="running")
    run = train(8)
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] == 3
    assert OmegaConf.load(run / "checkpoints" / "step_0000008" / "trainer.yaml").waiting_for_paired_run == 3
    assert judged(run) == {0: False, 1: False, 2: False}
    assert not late_alerts(run)  # the paired run is still running

    _paired_run(paired, 8, state="running")  # it has caught up to step 7
    train(10)  # raised to 10 steps: resumes from step 8, judging steps 3-7 now
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] == 8
    assert judged(run) == {0: False, 1: False, 2: False, 3: True, 4: True, 5: True, 6: True, 7: True}

    _paired_run(paired, 10)  # over
    assert [a.step for a in late_alerts(run)] == [8, 9]
    assert judged(run) == {**{s: False for s in range(3)}, **{s: True for s in range(3, 10)}}
    assert json.loads((run / "status.json").read_text())["waiting_for_paired_run"] is None
