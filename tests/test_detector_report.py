"""The detector-validation report on a constructed sweep whose failures and alerts are known:
recall, lead, false-positive rate and per-arm failure rates come out as counted by hand, and the
HTML renders in headless Chromium."""
import json
import math
import subprocess
import sys

import pytest

from analysis.detector_validation import (arm_failure_rates, detector_scores, meets_bar, mitigation_effects, newcombe,
                                          outcomes, wilson)
from analysis.labels import capture_labels, contract_labels
from harness.logging import read_jsonl
from tests.conftest import REPO
from tests.test_analysis_reports import _open_in_chromium
from tests.test_labels import _stream, validations


def _run(sweep, cell_id, topology, sharing, seed, records, alerts):
    run = sweep / cell_id
    run.mkdir(parents=True)
    (run / "cell.yaml").write_text(f"cell_id: {cell_id}\ntopology: {topology}\nsharing: {sharing}\nseed: {seed}\n"
                                   f"task: arith\nscale: tiny-m\nextra: {{task_axis: math}}\n")
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
    return sweep, capture_labels(captured)[0].step, contract_labels(captured)[0].step


def test_scores_are_what_the_constructed_sweep_holds(sweep):
    root, capture_step, contract_step = sweep
    assert contract_step < capture_step  # the aggregator's format broke before its length reached the voters'
    scores = detector_scores(outcomes(root)).set_index("detector")
    amp = scores.loc["amplification"]
    assert (amp["failing cells"], amp["caught in time"], amp["recall"]) == (2, 1, 0.5)
    assert amp["median lead (steps)"] == 30 - 12 and amp["false-positive rate"] == 0.0
    assert scores.loc["collapse", "recall"] == 0.0  # it fired at 40, after the failure at 30
    assert scores.loc["capture", "recall"] == 1.0 and scores.loc["capture", "median lead (steps)"] == capture_step - 60
    drift = scores.loc["length_drift"]
    assert drift["median lead (steps)"] == contract_step - 45  # it warns of both; the contract broke first
    assert (drift["healthy cells"], drift["fired on healthy"], drift["false-positive rate"]) == (2, 1, 0.5)
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
    assert "5 cells, 1 with a failure label" in proc.stdout and "first 45 steps" in proc.stdout
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
    assert "5 cells, 3 with a failure label" in proc.stdout and "amplification" in proc.stdout
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
                           "sweep.axes.topology=[voting]", "sweep.extra_axes.mitigation=[none]", "sweep.axes.seed=[0]", "sweep.cell.steps=6", "sweep.cell.val_every=2",
                           "sweep.cell.val_problems=8", "+sweep.cell.report=false"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "summary: 2 finished" in proc.stdout
    results = outcomes(tmp_path / "repro")
    replayed = outcomes(tmp_path / "repro", replay=True)  # today's detectors on the logged metrics: the same alerts
    assert [r.first_alert for r in replayed] == [r.first_alert for r in results]
    assert sorted(r.cell_id for r in results) == ["single-math-tiny-m-s0", "voting-ip-math-tiny-m-s0-mitigation=none"]
    for r in results:  # labels come from the run's own validation curve
        validations = [m for m in read_jsonl(r.run_dir / "metrics.jsonl") if "val/accuracy" in m]
        assert len(validations) == 4 and all("val/accuracy_se" in m for m in validations)
    report = subprocess.run([sys.executable, "-m", "reports.detectors", str(tmp_path / "repro")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "2 cells," in report.stdout and (tmp_path / "repro" / "report" / "detectors.html").is_file()


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
            cell = (run / "cell.yaml").read_text().replace("task_axis: math}", f"task_axis: math, mitigation: {mitigation}}}")
            (run / "cell.yaml").write_text(cell)
    [row] = mitigation_effects(outcomes(sweep)).to_dict("records")
    assert row["arm"].startswith("voting-ip mitigation=role_count_scaling") and row["failed"] == "1/5"
    assert row["without mitigation"] == "5/5" and row["difference"] == -0.8 and row["verdict"] == "lower"
