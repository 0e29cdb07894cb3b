"""The detector-validation report on a constructed sweep whose failures and alerts are known:
recall, lead, false-positive rate and per-arm failure rates come out as counted by hand, and the
HTML renders in headless Chromium."""
import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from analysis.detector_validation import (arm_failure_rates, detector_scores, failure_coverage, meets_bar,
                                          mitigation_effects, newcombe, outcomes, replay_setup, watched_by, wilson)
from analysis.labels import capture_labels, contract_labels
from analysis.operating_curve import _dominates, choose, curve, default_setting, first_alert, held_out, load_cells, shown, summary_line
from harness.logging import read_jsonl
from tests.conftest import REPO
from tests.test_analysis_reports import _open_in_chromium
from tests.test_labels import _stream, validations


def _run(sweep, cell_id, topology, sharing, seed, records, alerts):
    run = sweep / cell_id
    run.mkdir(parents=True)
    if topology != "single":  # the policy the voters train: 3 instances (IP) or every role (SP)
        records = [{**r, f"policy/{'voter' if sharing == 'ip' else 'shared'}/instances": 3 if sharing == "ip" else 4}
                   for r in records]
    (run / "cell.yaml").write_text(f"cell_id: {cell_id}\ntopology: {topology}\nsharing: {sharing}\nseed: {seed}\n"
                                   f"task: arith\nscale: tiny-m\nextra: {{task_axis: arith}}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "alerts.jsonl").write_text("".join(json.dumps({"step": s, "kind": k, "role": None, "policy": None,
                                                          "value": 1.0, "threshold": 1.0, "message": k,
                                                          "action": "alert"}) + "\n" for s, k in alerts))
    return run


def _with_validations(records, accuracies):
    for record, validation in zip(records[::10], validations(accuracies)):
        record.update(validation)
    return records


STEADY = dict(lengths=lambda s: 1.0, formats=lambda s: 1.0)
CAPTURED = dict(lengths=lambda s: 1.0 if s < 50 else min(6.0, 1.0 + (s - 50) * 0.1),
                formats=lambda s: 1.0 if s < 50 else 0.2)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("repro") / "repro"
    flat = [0.5] * 12
    # voting IP: two collapses (steps 30 and 50); amplification warned of the first at step 12
    _run(sweep, "voting-ip-arith-tiny-m-s0", "voting", "ip", 0,
         _with_validations(_stream(120, **STEADY), [0.5, 0.6, 0.6, 0.2, 0.1, 0.1] + [0.1] * 6),
         [(12, "amplification"), (40, "collapse")])
    _run(sweep, "voting-ip-arith-tiny-m-s1", "voting", "ip", 1,
         _with_validations(_stream(120, **STEADY), [0.5, 0.6, 0.6, 0.6, 0.6, 0.2] + [0.1] * 6), [])
    # voting SP: one capture (warned by capture at 60 and length drift at 45), one healthy cell with a drift alert
    captured = _with_validations(_stream(120, **CAPTURED), flat)
    _run(sweep, "voting-sp-arith-tiny-m-s0", "voting", "sp", 0, captured, [(45, "length_drift"), (60, "capture")])
    _run(sweep, "voting-sp-arith-tiny-m-s1", "voting", "sp", 1, _with_validations(_stream(120, **STEADY), flat),
         [(30, "length_drift")])
    _run(sweep, "single-arith-tiny-m-s0", "single", "sp", 0, _with_validations(_stream(120, **STEADY), flat), [])
    # the paired baseline of seed 1, as a single agent logs it: one solver role, one one-instance policy
    solo = [{"step": s, "role/solver/response_length": 30.0, "role/solver/format_ok": 1.0, "policy/shared/instances": 1}
            for s in range(120)]
    _run(sweep, "single-arith-tiny-m-s1", "single", "sp", 1, _with_validations(solo, flat), [])
    return sweep, capture_labels(captured)[0].step, contract_labels(captured)[0].step


def test_scores_are_what_the_constructed_sweep_holds(sweep):
    root, capture_step, contract_step = sweep
    assert contract_step < capture_step  # the aggregator's format broke before its length reached the voters'
    scores = detector_scores(outcomes(root)).set_index("detector")
    amp = scores.loc["amplification"]
    assert (amp["failing cells"], amp["caught in time"], amp["recall"]) == (2, 1, 0.5)
    assert amp["median lead (steps)"] == 30 - 12 and amp["false-positive rate"] == 0.0
    # the single agents have no policy trained by two instances: silent by construction, not true negatives
    assert (amp["healthy cells"], amp["healthy, silent by construction"]) == (1, 2)
    for kind in ("capture", "length_drift"):  # nor a second role, nor a short-contract one
        assert scores.loc[kind, "healthy, silent by construction"] == 1
    assert scores.loc["collapse", "recall"] == 0.0  # it fired at 40, after the failure at 30
    assert scores.loc["capture", "recall"] == 1.0 and scores.loc["capture", "median lead (steps)"] == capture_step - 60
    drift = scores.loc["length_drift"]
    assert drift["median lead (steps)"] == capture_step - 45  # it warns of capture, not of the contract break
    coverage = failure_coverage(outcomes(root)).set_index("failure")
    # collapse: amplification warned of seed 0's (lead 18), nothing of seed 1's
    assert coverage.loc["collapse", ["failing cells", "warned in time", "median lead (steps)"]].tolist() == [2, 1, 18]
    assert coverage.loc["collapse", "first warned by"] == "amplification 1"
    # the contract break is no detector's target, yet length_drift's alert came before it
    assert coverage.loc["contract", ["failing cells", "warned in time"]].tolist() == [1, 1]
    assert coverage.loc["contract", "median lead (steps)"] == contract_step - 45
    assert coverage.loc["any failure", ["failing cells", "warned in time"]].tolist() == [3, 2]
    assert coverage.loc["any failure", "first warned by"] == "amplification 1, length_drift 1"
    assert (drift["healthy cells"], drift["fired on healthy"], drift["false-positive rate"]) == (2, 1, 0.5)
    assert drift["false-positive 95% CI"] == "[0.09, 0.91]"  # 1 of 2: the rate says little on its own
    arms = arm_failure_rates(outcomes(root)).set_index("arm")
    assert arms.loc["voting-ip (arith, tiny-m)", "failure rate"] == 1.0
    assert arms.loc["voting-sp (arith, tiny-m)", "failure rate"] == 0.5
    assert arms.loc["single (arith, tiny-m)", "failed"] == 0
    assert amp["meets the bar"] == "no: recall 0.50 < 0.8"
    assert scores.loc["collapse", "meets the bar"] == "no: recall 0.00 < 0.8, no lead"
    assert drift["meets the bar"].startswith("no: ") and "false positives 0.500 > 0.1" in drift["meets the bar"]


def test_the_bar_says_what_falls_short():
    row = {"failing cells": 10, "healthy cells": 10, "recall": 0.9, "median lead (steps)": 12.0,
           "false-positive rate": 0.1}
    assert meets_bar(row) == "yes"
    assert meets_bar({**row, "median lead (steps)": 3.0}) == "no: lead 3 < 10"
    assert meets_bar({**row, "recall": 0.5, "false-positive rate": 0.2}) == \
        "no: recall 0.50 < 0.8, false positives 0.200 > 0.1"
    assert meets_bar({**row, "healthy cells": 0}) == "not measurable"


def test_a_shorter_horizon_scores_only_the_steps_before_it(sweep, tmp_path):
    """--steps 45: the collapse confirmed at step 40 still counts; the one from step 50 and the capture
    from step 50 were not seen yet, so their cells are healthy and alerts after step 44 do not count."""
    root = sweep[0]
    scores = detector_scores(outcomes(root, until=45)).set_index("detector")
    amp, drift = scores.loc["amplification"], scores.loc["length_drift"]
    assert (amp["failing cells"], amp["recall"], amp["median lead (steps)"]) == (1, 1.0, 30 - 12)
    assert (drift["failing cells"], drift["healthy cells"], drift["fired on healthy"]) == (0, 4, 1)
    proc = subprocess.run([sys.executable, "-m", "reports.detectors", str(root), "--steps", "45"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "6 cells, 1 with a failure label" in proc.stdout and "first 45 steps" in proc.stdout
    assert (root / "report" / "detectors-45.md").is_file() and (root / "report" / "detectors-45.html").is_file()
    bad = subprocess.run([sys.executable, "-m", "reports.detectors", str(root), "--steps", "soon"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--steps needs a whole number" in bad.stderr


def test_wilson_interval():
    low, high = wilson(0, 5)
    assert low == 0.0 and 0.4 < high < 0.5  # no failure in 5 seeds still leaves up to ~43%
    low, high = wilson(5, 10)
    assert math.isclose(low + high, 1.0, abs_tol=1e-9) and 0.23 < low < 0.24
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_report_is_written_and_renders_in_chromium(sweep, tmp_path):
    root = sweep[0]
    proc = subprocess.run([sys.executable, "-m", "reports.detectors", str(root)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "6 cells, 3 with a failure label" in proc.stdout and "amplification" in proc.stdout
    html = root / "report" / "detectors.html"
    md = (root / "report" / "detectors.md").read_text()
    assert "| amplification |" in md and "[0.34, 1.00]" in md
    assert len(list((root / "report").glob("failure_*.png"))) == 3
    seen = _open_in_chromium(html.as_uri(), tmp_path / "detectors.png")
    assert not seen["errors"] and not seen["dialogs"] and len(seen["images"]) == 3 and all(seen["images"])
    missing = subprocess.run([sys.executable, "-m", "reports.detectors", str(tmp_path / "none")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "holds no run directories" in missing.stderr


def test_a_slice_of_the_repro_sweep_runs_and_is_scored(tmp_path, warm_model_dir):
    """Two cells of `sweep=repro` (voting IP and its single-agent baseline), a few steps, through the
    local launcher; the detector report labels and scores them (the full sweep is a documented command)."""
    proc = subprocess.run([sys.executable, "grid/launch.py", "sweep=repro", f"root={tmp_path}", "sweep.axes.sharing=[ip]",
                           "sweep.axes.topology=[voting]", "sweep.extra_axes.mitigation=[none]", "~sweep.extra_axes.setting.default", "sweep.axes.seed=[0]", "sweep.cell.steps=6", "sweep.cell.val_every=2",
                           "sweep.cell.val_problems=8", "+sweep.cell.report=false"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "summary: 2 finished" in proc.stdout
    results = outcomes(tmp_path / "repro")
    replayed = outcomes(tmp_path / "repro", replay=True)  # today's detectors on the logged metrics: the same alerts
    assert [r.first_alert for r in replayed] == [r.first_alert for r in results]
    for cell in load_cells(results):  # the operating curve's replay of one detector at its defaults: the same too
        for kind in ("amplification", "capture", "length_drift", "collapse"):
            assert first_alert(kind, default_setting(kind), cell) == cell.outcome.first_alert.get(kind)
    assert sorted(r.cell_id for r in results) == ["single-math-tiny-m-s0-setting=fast",
                                                  "voting-ip-math-tiny-m-s0-mitigation=none-setting=fast"]
    for r in results:  # labels come from the run's own validation curve
        validations = [m for m in read_jsonl(r.run_dir / "metrics.jsonl") if "val/accuracy" in m]
        assert len(validations) == 4 and all("val/accuracy_se" in m for m in validations)
    report = subprocess.run([sys.executable, "-m", "reports.detectors", str(tmp_path / "repro")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "2 cells," in report.stdout and (tmp_path / "repro" / "report" / "detectors.html").is_file()


def test_replay_finds_the_baseline_the_run_recorded_beside_it_after_the_sweep_moved(tmp_path):
    """A cell paired with a per-setting baseline (`paired_axes`) records that baseline's path; the
    replay looks it up by name in the run's own sweep directory, wherever the sweep now lies."""
    sweep = tmp_path / "moved" / "repro"
    _run(sweep, "single-arith-tiny-m-s0-setting=fast", "single", "sp", 0, _stream(30, **STEADY), [])
    _run(sweep, "single-arith-tiny-m-s0-setting=default", "single", "sp", 0, _stream(30, **STEADY), [])
    run = _run(sweep, "voting-ip-arith-tiny-m-s0-setting=fast", "voting", "ip", 0, _stream(30, **STEADY), [])
    cell_yaml = (run / "cell.yaml").read_text()
    (run / "cell.yaml").write_text(cell_yaml + "monitors: {reference_run: /old/root/repro/single-arith-tiny-m-s0-setting=fast}\n")
    monitors, _ = replay_setup(run)
    assert monitors.reference_run == str(sweep / "single-arith-tiny-m-s0-setting=fast")
    # where runs logged before it was one setting recorded it: under amplification
    (run / "cell.yaml").write_text(cell_yaml + "monitors: {amplification: {reference_run: /old/root/repro/"
                                               "single-arith-tiny-m-s0-setting=fast}}\n")
    monitors, _ = replay_setup(run)
    assert monitors.reference_run == str(sweep / "single-arith-tiny-m-s0-setting=fast")


def test_newcombe_interval_and_the_mitigation_verdict():
    low, high = newcombe(0, 5, 5, 5)  # 0/5 against 5/5: clearly lower
    assert high < 0 and -1.0 <= low < -0.5
    low, high = newcombe(2, 5, 3, 5)  # 2/5 against 3/5: the interval includes 0
    assert low < 0 < high


def test_mitigated_arms_are_compared_with_the_same_arm_without(tmp_path):
    sweep = tmp_path / "repro"
    for seed in range(5):
        collapse = [0.5, 0.6, 0.6, 0.2, 0.1, 0.1] + [0.1] * 6
        flat = [0.5] * 12
        for mitigation, accuracies in (("none", collapse), ("role_count_scaling", flat if seed else collapse)):
            run = _run(sweep, f"voting-ip-arith-tiny-m-s{seed}-mitigation={mitigation}", "voting", "ip", seed,
                       _with_validations(_stream(120, **STEADY), accuracies), [])
            cell = (run / "cell.yaml").read_text().replace("task_axis: arith}", f"task_axis: arith, mitigation: {mitigation}}}")
            (run / "cell.yaml").write_text(cell)
    [row] = mitigation_effects(outcomes(sweep)).to_dict("records")
    assert row["arm"].startswith("voting-ip mitigation=role_count_scaling") and row["failed"] == "1/5"
    assert row["without mitigation"] == "5/5" and row["difference"] == -0.8 and row["verdict"] == "lower"


def test_operating_curves_replay_each_setting_on_the_logged_metrics(sweep):
    """On the constructed sweep, collapse at its default patience (2 validations) confirms each
    collapse one validation late; with patience 1 it fires at the label's step: recall 1, lead 0,
    still short of the bar, which the curve's summary says. The constructed cells log no training
    accuracy, so the early warning's window (4 values on the grid) changes nothing here."""
    root = sweep[0]
    cells = load_cells(outcomes(root))
    frame = curve("collapse", cells).set_index("setting")
    assert len(frame) == 3 * 3 * 2 * 4 and frame["default"].sum() == 1
    default = frame[frame["default"]].iloc[0]
    assert default["recall"] == 0.0 and default["caught in time"] == 0
    quick = frame.loc["fraction=0.7 se=2 patience=1 trend_window=10"]
    assert (quick["recall"], quick["median lead (steps)"], quick["false-positive rate"]) == (1.0, 0.0, 0.0)
    assert quick["on the frontier"] and not default["on the frontier"]  # patience 1 beats it on recall
    table = shown(frame.reset_index())  # one row per distinct figures on the frontier, plus the default
    assert table["default"].sum() == 1 and len(table) == len(set(zip(table["recall"], table["false-positive rate"],
                                                                      table["median lead (steps)"].fillna(-1))))
    alike = frame[(frame["recall"] == 1.0) & (frame["median lead (steps)"] == 0.0) & (frame["false-positive rate"] == 0.0)]
    assert table.iloc[0]["recall"] == 1.0 and table.iloc[0]["settings alike"] == len(alike) > 1
    assert table[table["default"]].iloc[0]["settings alike"] == (frame["recall"] == 0.0).sum()  # the default's twins
    assert summary_line("collapse", frame.reset_index()).startswith("collapse: 0 of 72 settings meet the bar")
    assert "longest median lead at recall >= 0.8 and false positives <= 0.1 is 0 steps" in \
        summary_line("collapse", frame.reset_index())
    # length_drift: the healthy SP cell's aggregator never moves, so no z threshold fires on it
    drift = curve("length_drift", cells)
    healthy_sp = [c for c in cells if c.outcome.cell_id == "voting-sp-arith-tiny-m-s1"][0]
    assert all(first_alert("length_drift", s, healthy_sp) is None for s in drift["_setting"])
    assert first_alert("length_drift", {"z_threshold": 2.0, "patience": 1},
                       [c for c in cells if c.outcome.cell_id == "voting-sp-arith-tiny-m-s0"][0]) > 50


def test_a_setting_chosen_on_a_design_sweep_is_scored_on_the_held_out_one(sweep, tmp_path):
    """The choice is made on the design cells only: collapse's patience-1 setting, chosen there, is
    scored on a held-out sweep whose one collapse (step 20) it catches at 20 and whose healthy cell
    it leaves alone; its defaults confirm late (recall 0)."""
    design = sweep[0]
    test = tmp_path / "test"
    _run(test, "voting-ip-arith-tiny-m-s7", "voting", "ip", 7,
         _with_validations(_stream(120, **STEADY), [0.5, 0.6, 0.2, 0.1] + [0.1] * 8), [])
    _run(test, "single-arith-tiny-m-s7", "single", "sp", 7, _with_validations(_stream(120, **STEADY), [0.5] * 12), [])
    chosen = held_out(["collapse"], load_cells(outcomes(design)), load_cells(outcomes(test))).iloc[0]
    assert "patience=1" in chosen["chosen on the design sweep"]
    assert chosen["design"] == "1.00 / 0 / 0.000" and chosen["held out"] == "1.00 / 0 / 0.000"
    assert chosen["held out, defaults"] == "0.00 / – / 0.000"
    assert chosen["held out: meets the bar"] == "no: lead 0 < 10"
    proc = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), "--design", str(design)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    md = (test / "report" / "detectors.md").read_text()
    assert "## Operating curves (replayed)" in md and "### capture" in md
    assert "## Held out: settings chosen on a design sweep" in md and "| collapse " in md
    assert "capture: not measurable on these cells" in md  # the held-out sweep has no capture to warn of
    assert "<h2>Operating curves (replayed)</h2>" in (test / "report" / "detectors.html").read_text()
    seen = _open_in_chromium((test / "report" / "detectors.html").as_uri(), tmp_path / "thresholds.png")
    assert not seen["errors"] and not seen["dialogs"]
    assert md.index("## Held out") < md.index("## Cells")
    bad = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), "--design"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--design needs the design sweep's directory" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), "--design", str(tmp_path / "no")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "design sweep" in missing.stderr and "holds no run directories" in missing.stderr
    same = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), f"--design={test}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 2 and "would not be held out" in same.stderr  # a design sweep must be another one


def test_choosing_ranks_the_bar_first_then_recall_lead_and_fewer_false_positives():
    def row(setting, recall, lead, fpr, default=False):
        return {"setting": setting, "recall": recall, "median lead (steps)": lead, "false-positive rate": fpr,
                "default": default}
    rows = [row("a", 1.0, 3.0, 0.0, default=True), row("b", 0.8, 12.0, 0.05), row("c", 0.8, 12.0, 0.2),
            row("d", 0.9, 30.0, 0.5)]
    assert choose(pd.DataFrame(rows))["setting"] == "b"  # the only one meeting all three criteria
    assert choose(pd.DataFrame(rows[:1] + rows[2:]))["setting"] == "a"  # 2 met; more recall than c
    tie = [row("x", 0.5, float("nan"), 0.0), row("y", 0.5, float("nan"), 0.0, default=True)]
    assert choose(pd.DataFrame(tie))["setting"] == "y"  # alike: the default stands
    # no healthy cell it can fire on: a looser setting's higher recall cannot be weighed against false alarms
    blind = [row("loose", 1.0, 30.0, float("nan")), row("default", 0.5, 5.0, float("nan"), default=True)]
    assert _dominates(row("a", 0.8, 5.0, 0.0), row("b", 0.8, 5.0, 0.2))  # fewer false positives is better
    assert not _dominates(row("a", 0.8, 5.0, 0.2), row("b", 0.8, 5.0, 0.0))
    assert not _dominates(row("a", 0.9, 5.0, 0.2), row("b", 0.8, 5.0, 0.0))  # a trade-off: both on the frontier
    assert choose(pd.DataFrame(blind))["setting"] == "default"


def test_a_cell_built_so_that_a_detector_cannot_fire_is_not_counted_as_its_true_negative():
    voter = {"role/voter/response_length": 6.0, "role/aggregator/response_length": 2.0}
    ip = {"step": 0, **voter, "policy/voter/instances": 3, "policy/aggregator/instances": 1, "val/accuracy": 0.5}
    one_each = {"step": 0, **voter, **{f"policy/voter_{i}/instances": 1 for i in range(3)}}
    single = {"step": 0, "role/solver/response_length": 30.0, "policy/shared/instances": 1, "val/accuracy": 0.5}
    assert watched_by([ip]) == {"amplification", "capture", "length_drift", "collapse"}
    assert watched_by([one_each]) == {"capture", "length_drift"}  # one adapter per voter: nothing to amplify
    assert watched_by([single]) == {"collapse"}
    shared = {"step": 0, **voter, "policy/shared/instances": 4}  # SP: nothing in the cell to compare with
    assert "amplification" not in watched_by([shared]) and "amplification" in watched_by([shared], paired_reference=True)
