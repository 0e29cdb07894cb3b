"""The detector-validation report on a constructed sweep whose failures and alerts are known:
recall, lead, false-positive rate and per-arm failure rates come out as counted by hand, and the
HTML renders in headless Chromium."""
import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from analysis.detector_validation import (against_baseline, arm_failure_rates, config_baseline, detector_scores,
                                          failure_coverage, meets_bar, mitigation_effects, mixed_arms, newcombe,
                                          notification_delays, outcomes, replay_setup, watched_by, wilson)
from analysis.labels import capture_labels, contract_labels
from analysis.operating_curve import _dominates, choose, curve, default_setting, first_alert, held_out, load_cells, shown, summary_line
from harness.run_dir import read_jsonl
from tests.conftest import REPO
from reports.screenshots import open_in_chromium
from tests.test_labels import _stream, validations


def _run(sweep, cell_id, topology, sharing, seed, records, alerts):
    """A logged run; `alerts` are (step, kind, signal, role, policy) or (step, kind) with no signal,
    role or policy."""
    run = sweep / cell_id
    run.mkdir(parents=True)
    if topology != "single":  # the policy the voters train: 3 instances (IP) or every role (SP)
        records = [{**r, f"policy/{'voter' if sharing == 'ip' else 'shared'}/instances": 3 if sharing == "ip" else 4}
                   for r in records]
    (run / "cell.yaml").write_text(f"cell_id: {cell_id}\ntopology: {topology}\nsharing: {sharing}\nseed: {seed}\n"
                                   f"task: arith\nscale: tiny-m\nextra: {{task_axis: arith}}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = []
    for alert in alerts:
        step, kind, signal, role, policy = (tuple(alert) + (None, None, None))[:5]
        lines.append(json.dumps({"step": step, "kind": kind, "role": role, "policy": policy, "value": 1.0,
                                 "threshold": 1.0, "message": kind, "action": "alert", "signal": signal}) + "\n")
    (run / "alerts.jsonl").write_text("".join(lines))
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
    # voting IP: two collapses (steps 30 and 50); amplification warned of the first at step 12 and the
    # validation rule confirmed it at 40 (one validation after the label)
    _run(sweep, "voting-ip-arith-tiny-m-s0", "voting", "ip", 0,
         _with_validations(_stream(120, **STEADY), [0.5, 0.6, 0.6, 0.2, 0.1, 0.1] + [0.1] * 6),
         [(12, "amplification", None, None, "voter"), (40, "collapse", "validation")])
    _run(sweep, "voting-ip-arith-tiny-m-s1", "voting", "ip", 1,
         _with_validations(_stream(120, **STEADY), [0.5, 0.6, 0.6, 0.6, 0.6, 0.2] + [0.1] * 6), [])
    # voting SP: the aggregator is captured: capture's pressure warned at 30, length drift at 45, the
    # "moved" sign confirmed at 90; a length-drift alert about the voters (at 20) names another role.
    # One healthy SP cell with a length-drift alert on its aggregator (a false alarm)
    captured = _with_validations(_stream(120, **CAPTURED), flat)
    _run(sweep, "voting-sp-arith-tiny-m-s0", "voting", "sp", 0, captured,
         [(20, "length_drift", "band", "voter", "shared"), (30, "capture", "pressure", "aggregator", "shared"),
          (45, "length_drift", "band", "aggregator", "shared"), (90, "capture", "moved", "aggregator", "shared")])
    _run(sweep, "voting-sp-arith-tiny-m-s1", "voting", "sp", 1, _with_validations(_stream(120, **STEADY), flat),
         [(30, "length_drift", "band", "aggregator", "shared")])
    _run(sweep, "single-arith-tiny-m-s0", "single", "sp", 0, _with_validations(_stream(120, **STEADY), flat), [])
    # the paired baseline of seed 1, as a single agent logs it: one solver role, one one-instance policy
    solo = [{"step": s, "role/solver/response_length": 30.0, "role/solver/format_ok": 1.0, "policy/shared/instances": 1}
            for s in range(120)]
    _run(sweep, "single-arith-tiny-m-s1", "single", "sp", 1, _with_validations(solo, flat), [])
    return sweep, capture_labels(captured)[0].step, contract_labels(captured)[0].step


def test_scores_are_what_the_constructed_sweep_holds(sweep):
    root, capture_step, contract_step = sweep
    assert contract_step < capture_step  # the aggregator's format broke before its length reached the voters'
    assert 40 <= contract_step and capture_step < 90
    results = outcomes(root)
    scores = detector_scores(results).set_index("detector")
    amp = scores.loc["amplification"]
    assert (amp["failing cells"], amp["caught in time"], amp["recall"]) == (2, 1, 0.5)
    assert amp["median lead (steps)"] == 30 - 12 and amp["false-positive rate"] == 0.0
    # the single agents have no policy trained by two instances: silent by construction, not true negatives
    assert (amp["healthy cells"], amp["healthy, silent by construction"]) == (1, 2)
    warning = scores.loc["capture warning"]
    assert (warning["recall"], warning["median lead (steps)"]) == (1.0, capture_step - 30)
    assert warning["healthy, silent by construction"] == 1  # the solver alone has no judging role
    drift = scores.loc["length_drift"]
    # matched: the alert about the voters (step 20) does not count for the aggregator's capture
    assert drift["median lead (steps)"] == capture_step - 45
    assert (drift["healthy cells"], drift["fired on healthy"], drift["false-positive rate"]) == (2, 1, 0.5)
    assert drift["false-positive 95% CI"] == "[0.09, 0.91]"  # 1 of 2: the rate says little on its own
    assert scores.loc["collapse warning", "recall"] == 0.0
    # label notifications are not scored: only their delay after the label is said
    assert "collapse" not in scores.index and "capture" not in scores.index
    assert notification_delays(results) == {"collapse": [10], "capture": [90 - capture_step]}
    coverage = failure_coverage(results).set_index("failure")
    # collapse: amplification warned of seed 0's (lead 18), nothing of seed 1's
    assert coverage.loc["collapse", ["failing cells", "warned in time", "median lead (steps)"]].tolist() == [2, 1, 18]
    assert coverage.loc["collapse", "first warned by"] == "amplification 1"
    # the contract break is no warning's target, yet capture's warning came before it
    assert coverage.loc["contract", ["failing cells", "warned in time"]].tolist() == [1, 1]
    assert coverage.loc["contract", "median lead (steps)"] == contract_step - 30  # capture's warning on the aggregator
    assert coverage.loc["any failure", ["failing cells", "warned in time"]].tolist() == [3, 2]
    arms = arm_failure_rates(results).set_index("arm")
    assert arms.loc["voting-ip (arith, tiny-m)", "failure rate"] == 1.0
    assert arms.loc["voting-sp (arith, tiny-m)", "failure rate"] == 0.5
    assert arms.loc["voting-sp (arith, tiny-m)", "mixed"] == "yes" and arms.loc["voting-ip (arith, tiny-m)", "mixed"] == ""
    assert arms.loc["single (arith, tiny-m)", "failed"] == 0
    assert mixed_arms(results) == ["voting-sp (arith, tiny-m)"]
    assert amp["meets the aim"] == "no: recall 0.50 < 0.8"
    assert drift["meets the aim"].startswith("no: ") and "false positives 0.500 > 0.1" in drift["meets the aim"]


def test_an_alert_before_the_monitors_start_or_too_close_to_the_failure_does_not_count(tmp_path):
    """Bounded: an alert before the first validation after step 0 says how the cell was set up; a
    warning 5 steps before the failure left no time to act. Neither is a catch."""
    sweep = tmp_path / "repro"
    collapse = [0.5, 0.6, 0.6, 0.2, 0.1, 0.1] + [0.1] * 6  # labelled at step 30
    _run(sweep, "voting-ip-arith-tiny-m-s0", "voting", "ip", 0, _with_validations(_stream(120, **STEADY), collapse),
         [(5, "amplification", None, None, "voter")])
    _run(sweep, "voting-ip-arith-tiny-m-s1", "voting", "ip", 1, _with_validations(_stream(120, **STEADY), collapse),
         [(25, "amplification", None, None, "voter")])
    _run(sweep, "single-arith-tiny-m-s0", "single", "sp", 0, _with_validations(_stream(120, **STEADY), [0.5] * 12), [])
    results = {r.cell_id: r for r in outcomes(sweep)}
    assert "amplification" not in results["voting-ip-arith-tiny-m-s0"].first_alert  # step 5 < the first validation (10)
    assert results["voting-ip-arith-tiny-m-s1"].first_alert["amplification"] == 25
    amp = detector_scores(list(results.values())).set_index("detector").loc["amplification"]
    assert (amp["failing cells"], amp["caught in time"]) == (2, 0)  # a lead of 5 < 10


def test_the_config_only_baseline_fires_on_settings_that_failed_on_most_design_seeds(tmp_path):
    """Held out: a mixed setting (2 of 4 seeds collapse). The design seeds had it failing 3 of 4 times,
    so the baseline fires on all 4 held-out cells: recall 1, false positives 1. A warning that fires on
    exactly the two failing cells, 20 steps ahead, beats it; one that fires everywhere does not."""
    design, test = tmp_path / "design", tmp_path / "test"
    collapse = [0.5, 0.6, 0.6, 0.6, 0.2, 0.1] + [0.1] * 6  # labelled at step 40
    for seed in range(4):
        _run(design, f"voting-ip-arith-tiny-m-s{seed}", "voting", "ip", seed,
             _with_validations(_stream(120, **STEADY), collapse if seed < 3 else [0.5] * 12), [])
    for seed in range(10, 18):
        fails = seed % 2 == 0
        alerts = [(20, "amplification", None, None, "voter")] if fails else []
        alerts += [(15, "collapse", "training vs paired run")]  # fires on every cell
        _run(test, f"voting-ip-arith-tiny-m-s{seed}", "voting", "ip", seed,
             _with_validations(_stream(120, **STEADY), collapse if fails else [0.5] * 12), alerts)
        _run(test, f"single-arith-tiny-m-s{seed}", "single", "sp", seed,
             _with_validations(_stream(120, **STEADY), [0.5] * 12), [])
    results, design_results = outcomes(test), outcomes(design)
    # the design seeds choose the mixed settings: 3 of 4 failed there, which is mixed
    assert mixed_arms(design_results) == ["voting-ip (arith, tiny-m)"]
    on_mixed = [r for r in results if r.arm in mixed_arms(design_results)]
    baseline, firing = config_baseline(on_mixed, design_results)
    assert firing == {"voting-ip (arith, tiny-m)"}
    assert {r.first_alert["config-only"] for r in baseline} == {10}  # from the monitors' first step, as detectors
    base = detector_scores(baseline, ["config-only"]).set_index("detector").loc["config-only"]
    assert (base["recall"], base["false-positive rate"]) == (1.0, 1.0)
    versus = against_baseline(on_mixed, design_results).set_index("detector")
    assert versus.loc["amplification", "J (recall - FPR)"] == 1.0 and versus.loc["amplification", "config-only J"] == 0.0
    assert versus.loc["amplification", "verdict"].startswith("beats the config-only baseline (p = ")
    assert versus.loc["amplification", "p"] < 0.05
    assert not versus.loc["collapse warning", "verdict"].startswith("beats")
    assert versus.loc["collapse warning", "J (recall - FPR)"] == 0.0


def test_the_aim_says_what_falls_short():
    row = {"failing cells": 10, "healthy cells": 10, "recall": 0.9, "median lead (steps)": 12.0,
           "false-positive rate": 0.1}
    assert meets_bar(row) == "yes"
    assert meets_bar({**row, "recall": 0.5, "false-positive rate": 0.2}) == \
        "no: recall 0.50 < 0.8, false positives 0.200 > 0.1"
    assert meets_bar({**row, "healthy cells": 0}) == "not measurable"


def test_a_shorter_horizon_scores_only_the_steps_before_it(sweep, tmp_path):
    """--steps 45: the collapse labelled at step 30 still counts; the one from step 50 and the capture
    and contract break (from step 53) were not seen yet, so their cells are healthy, and alerts from
    step 45 on do not count."""
    root = sweep[0]
    scores = detector_scores(outcomes(root, until=45)).set_index("detector")
    amp, drift = scores.loc["amplification"], scores.loc["length_drift"]
    assert (amp["failing cells"], amp["recall"], amp["median lead (steps)"]) == (1, 1.0, 30 - 12)
    # healthy now: voting-ip seed 1, both SP cells and the single agent of seed 0; the SP cells' drift alerts
    # (steps 20, 30) are false alarms at this horizon
    assert (drift["failing cells"], drift["healthy cells"], drift["fired on healthy"]) == (0, 4, 2)
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
    assert "| amplification " in md and "[0.34, 1.00]" in md
    assert "## Early warnings on the mixed settings" in md and "give them with --design" in md
    assert "## Label notifications (not scored)" in md and "## Confirmations" not in md
    assert len(list((root / "report").glob("failure_*.png"))) == 3
    seen = open_in_chromium(html.as_uri(), tmp_path / "detectors.png")
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
    for cell in load_cells(results):  # the operating curve's replay of one warning at its defaults: the same too
        for kind in ("amplification", "capture warning", "length_drift", "collapse warning"):
            assert first_alert(kind, default_setting(kind), cell) == cell.outcome.first_alert.get(kind)
    assert sorted(r.cell_id for r in results) == ["single-arith-tiny-m-s0-setting=fast",
                                                  "voting-ip-arith-tiny-m-s0-mitigation=none-setting=fast"]
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
    assert replay_setup(run).monitors.reference_run == str(sweep / "single-arith-tiny-m-s0-setting=fast")
    # where runs logged before it was one setting recorded it: under amplification
    (run / "cell.yaml").write_text(cell_yaml + "monitors: {amplification: {reference_run: /old/root/repro/"
                                               "single-arith-tiny-m-s0-setting=fast}}\n")
    assert replay_setup(run).monitors.reference_run == str(sweep / "single-arith-tiny-m-s0-setting=fast")


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


def _drift_sweep(root, captured_from=50, seed=0):
    """A captured SP cell (its aggregator lengthens from `captured_from` on), a healthy SP cell and a
    single agent: what length drift's operating curve is read on."""
    flat = [0.5] * 12
    shifted = dict(lengths=lambda s: 1.0 if s < captured_from else min(6.0, 1.0 + (s - captured_from) * 0.1),
                   formats=lambda s: 1.0 if s < captured_from else 0.2)
    _run(root, f"voting-sp-arith-tiny-m-s{seed}", "voting", "sp", seed,
         _with_validations(_stream(120, **shifted), flat), [])
    _run(root, f"voting-sp-arith-tiny-m-s{seed + 1}", "voting", "sp", seed + 1,
         _with_validations(_stream(120, **STEADY), flat), [])
    _run(root, f"single-arith-tiny-m-s{seed}", "single", "sp", seed, _with_validations(_stream(120, **STEADY), flat), [])
    return root


def test_operating_curves_replay_each_setting_on_the_logged_metrics(tmp_path):
    """Length drift at its defaults (z 5, EWMA 0.2) sees the aggregator's growth one step before the
    capture label: no lead. A looser band (z 1.5, a faster EWMA) sees it 21 steps ahead with no false
    alarm on the healthy SP cell: the curve shows it, on the frontier, and says how many settings
    meet the aim here (tuned on the cells it is scored on: an optimistic bound)."""
    cells = load_cells(outcomes(_drift_sweep(tmp_path / "repro")))
    frame = curve("length_drift", cells).set_index("setting")
    assert len(frame) == 5 * 2 * 3 * 3 and frame["default"].sum() == 1
    default = frame[frame["default"]].iloc[0]
    assert default["recall"] == 0.0 and default["caught in time"] == 0 and not default["on the frontier"]
    loose = frame.loc["z_threshold=1.5 ewma_alpha=0.5 patience=1 pressure_z=3"]
    assert (loose["recall"], loose["median lead (steps)"], loose["false-positive rate"]) == (1.0, 21.0, 0.0)
    assert loose["on the frontier"] and loose["meets the aim"] == "yes"
    table = shown(frame.reset_index())  # one row per distinct figures on the frontier, plus the default
    assert table["default"].sum() == 1 and table.iloc[0]["recall"] == 1.0
    meeting = int((frame["meets the aim"] == "yes").sum())
    assert summary_line("length_drift", frame.reset_index()) == (
        f"length_drift: {meeting} of 90 settings meet the aim on these cells; the longest median lead at recall "
        f">= 0.8 and false positives <= 0.1 is 21 steps.")
    healthy_sp = next(c for c in cells if c.outcome.cell_id == "voting-sp-arith-tiny-m-s1")
    assert all(first_alert("length_drift", s, healthy_sp) is None for s in frame["_setting"])


def test_a_setting_chosen_on_a_design_sweep_is_scored_on_the_held_out_one(tmp_path):
    """The choice is made on the design cells only: a looser length-drift band, chosen there, catches
    the held-out sweep's capture (its aggregator lengthening from step 40) well ahead; the defaults
    see it too late (recall 0)."""
    design = _drift_sweep(tmp_path / "design", seed=9000)
    test = _drift_sweep(tmp_path / "test", captured_from=40, seed=9100)  # seeds no study has used
    chosen = held_out(["length_drift"], load_cells(outcomes(design)), load_cells(outcomes(test))).iloc[0]
    assert "z_threshold=1.5" in chosen["chosen on the design sweep"]
    assert chosen["design"].startswith("1.00 / 21") and chosen["held out"].startswith("1.00 / ")
    assert chosen["held out, defaults"].startswith("0.00 / –") and chosen["held out: meets the aim"] == "yes"
    proc = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), "--design", str(design),
                           "--thresholds"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    md = (test / "report" / "detectors.md").read_text()
    assert "## Operating curves (replayed)" in md and "### capture warning" in md
    assert "## Held out: settings chosen on a design sweep" in md and "| length_drift " in md
    assert "<h2>Operating curves (replayed)</h2>" in (test / "report" / "detectors.html").read_text()
    seen = open_in_chromium((test / "report" / "detectors.html").as_uri(), tmp_path / "thresholds.png")
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
    # held out by seed and setting, not by path: the same seeds in another folder are the same draws
    copy = _drift_sweep(tmp_path / "elsewhere", captured_from=40, seed=9100)
    moved = subprocess.run([sys.executable, "-m", "reports.detectors", str(test), f"--design={copy}"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert moved.returncode == 2 and "seed 9100" in moved.stderr and "would not be held out" in moved.stderr
    # a seed a study used to decide something (the design seeds of studies/) is never scored as held out
    spent = _drift_sweep(tmp_path / "spent", captured_from=40, seed=100)
    refused = subprocess.run([sys.executable, "-m", "reports.detectors", str(spent), f"--design={design}"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "seed 100 cannot be scored as held out" in refused.stderr
    assert not (spent / "report").exists()


def test_choosing_ranks_the_bar_first_then_recall_lead_and_fewer_false_positives():
    def row(setting, recall, lead, fpr, default=False):
        return {"setting": setting, "recall": recall, "median lead (steps)": lead, "false-positive rate": fpr,
                "default": default}
    # recall is counted at lead >= 10 already: the bar is recall and false positives
    rows = [row("a", 0.7, 3.0, 0.0, default=True), row("b", 0.8, 12.0, 0.05), row("c", 0.8, 12.0, 0.2),
            row("d", 0.9, 30.0, 0.5)]
    assert choose(pd.DataFrame(rows))["setting"] == "b"  # the only one meeting both criteria
    assert choose(pd.DataFrame(rows[:1] + rows[2:]))["setting"] == "d"  # each meets one; d recalls most
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
    assert watched_by([ip]) == {"amplification", "capture", "capture warning", "length_drift", "collapse"}
    assert watched_by([one_each]) == {"capture", "capture warning", "length_drift"}  # nothing to amplify
    assert watched_by([single]) == {"collapse"}
    assert watched_by([single], paired_reference=True) == {"collapse", "collapse warning"}
    shared = {"step": 0, **voter, "policy/shared/instances": 4}  # SP: nothing in the cell to compare with
    assert "amplification" not in watched_by([shared]) and "amplification" in watched_by([shared], paired_reference=True)
    # a graph's judging roles by contract: a verifier (verdict) is watched, a coder (answer) is not
    coded = {"step": 0, "role/coder/response_length": 40.0, "role/verifier/response_length": 3.0}
    assert "length_drift" in watched_by([coded], role_contracts={"coder": "answer", "verifier": "verdict"})
    assert "length_drift" not in watched_by([coded], role_contracts={"coder": "answer", "verifier": "answer"})
