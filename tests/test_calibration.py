"""Every alert says what its kind was shown to predict: the figures the detector report measured on
a held-out sweep (harness/monitors/calibration.json), or "not validated" where none did."""
import json
import math
from pathlib import Path

from analysis.detector_validation import RunOutcome, calibration_rows
from analysis.labels import FailureLabel
from harness.config import MonitorConfig
from harness.monitors import monitor as monitor_module
from harness.monitors.calibration import NOT_VALIDATED, load_calibration, write_calibration

NAN_STEP = {"step": 12, "loss": math.nan}


def _monitor_with(calibration: Path, monkeypatch):
    monkeypatch.setattr(monitor_module, "load_calibration", lambda: load_calibration(calibration))
    return monitor_module.Monitor(MonitorConfig(), {"shared": ["shared"]}, start_step=0)


def test_an_alert_no_sweep_measured_says_not_validated(tmp_path, monkeypatch):
    [alert] = _monitor_with(tmp_path / "absent.json", monkeypatch).observe(NAN_STEP)
    assert alert.kind == "non_finite" and alert.message.endswith(f"({NOT_VALIDATED})")
    assert alert.record()["validation"] == NOT_VALIDATED


def test_an_alert_quotes_the_figures_of_its_kind_and_signal(tmp_path, monkeypatch):
    calibration = tmp_path / "calibration.json"
    write_calibration(calibration, [{"kind": "non_finite", "signal": None, "failure": "collapse", "failed": 3, "fired": 4},
                                    {"kind": "collapse", "signal": "validation", "failure": "collapse", "failed": 9,
                                     "fired": 9}],
                      within=50, source="the held-out sweep repro_mixed (seeds 200-209)", command="test")
    [alert] = _monitor_with(calibration, monkeypatch).observe(NAN_STEP)
    expected = ("validated: in the held-out sweep repro_mixed (seeds 200-209), 3 of 4 cells with this alert failed "
                "(collapse) within 50 steps of it")
    assert alert.record()["validation"] == expected and alert.message.endswith(f"({expected})")
    assert json.loads(calibration.read_text())["written_by"] == "test"


def _cell(name, alerts, labels):
    return RunOutcome(Path(name), name, "voting-ip (math, tiny-m)", labels, {}, alerts=alerts, policies={"voter"})


def test_calibration_counts_cells_whose_alert_was_followed_by_its_failure_within_the_window():
    amplification = lambda step, policy="voter": {"kind": "amplification", "signal": None, "step": step,
                                                   "policy": policy, "role": None}
    collapse = lambda step: [FailureLabel("collapse", step, None, "")]
    cells = [_cell("soon", [amplification(10)], collapse(40)),          # failed 30 steps after: counts
             _cell("late", [amplification(10)], collapse(90)),          # 80 steps after: not within 50
             _cell("healthy", [amplification(20)], []),                 # no failure
             _cell("other", [amplification(10, "aggregator")], collapse(30)),  # names a policy the cell lacks
             _cell("silent", [], collapse(30))]                         # never fired: not counted
    [row] = [r for r in calibration_rows(cells, within=50) if r["kind"] == "amplification"]
    assert (row["failed"], row["fired"], row["failure"]) == (1, 4, "collapse")
