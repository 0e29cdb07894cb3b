"""Every early warning says what its kind was shown to predict: the figures the detector report
measured on a held-out sweep (harness/monitors/calibration.json), counting an alert for a failure
only when it came before it; a label notification says it is one; anything else says "not
validated"."""
import json
import math
from pathlib import Path

from analysis.detector_validation import NOTIFICATIONS, SCORED, RunOutcome, calibration_rows, first_alerts
from analysis.labels import FailureLabel
from harness.config import MonitorConfig
from harness.monitors import monitor as monitor_module
from harness.monitors.calibration import LABEL_NOTIFICATION, NOT_VALIDATED, NOTIFYING, load_calibration, write_calibration

NAN_STEP = {"step": 12, "loss": math.nan}


def _monitor_with(calibration: Path, monkeypatch):
    monkeypatch.setattr(monitor_module, "load_calibration", lambda: load_calibration(calibration))
    return monitor_module.Monitor(MonitorConfig(), {"shared": ["shared"]}, start_step=0)


def test_an_alert_no_sweep_measured_says_not_validated(tmp_path, monkeypatch):
    [alert] = _monitor_with(tmp_path / "absent.json", monkeypatch).observe(NAN_STEP)
    assert alert.kind == "non_finite" and alert.message.endswith(f"({NOT_VALIDATED})")
    assert alert.record()["validation"] == NOT_VALIDATED


def test_an_alert_quotes_the_figures_of_its_warning(tmp_path, monkeypatch):
    calibration = tmp_path / "calibration.json"
    write_calibration(calibration, [{"name": "nan", "alerts": [["non_finite", None]], "failure": "collapse",
                                     "warned": 4, "in_time": 3, "soon": 1, "late": 2, "min_lead": 10}],
                      within=50, source="mixed-validation, seeds 500-519", command="test")
    [alert] = _monitor_with(calibration, monkeypatch).observe(NAN_STEP)
    expected = ("on held-out seeds (mixed-validation, seeds 500-519), 3 of 4 cells warned this way failed "
                "(collapse) 10-50 steps later, 1 sooner; 2 further alert(s) of this kind came after the failure")
    assert alert.record()["validation"] == expected and alert.message.endswith(f"({expected})")
    assert json.loads(calibration.read_text())["written_by"] == "test"


def test_a_label_notification_says_it_is_one_whatever_the_calibration_holds(tmp_path, monkeypatch):
    """Collapse's validation rule is the collapse label's own: it is never quoted as a prediction."""
    monitor = _monitor_with(tmp_path / "absent.json", monkeypatch)
    records = [{"step": s, "val/accuracy": a, "val/accuracy_se": 0.01}
               for s, a in zip(range(0, 50, 10), [0.6, 0.6, 0.1, 0.1, 0.1])]
    alerts = [a for r in records for a in monitor.observe(r) if a.signal == "validation"]
    assert alerts and all(a.validation == LABEL_NOTIFICATION for a in alerts)
    # the monitors' list of notifying alerts is the validation's
    assert NOTIFYING == {tuple(a) for name in NOTIFICATIONS for a in SCORED[name].alerts}


def _cell(name, alerts, labels):
    first = first_alerts(alerts, labels, {"voter"})
    return RunOutcome(Path(name), name, "voting-ip (math, tiny-m)", labels, first, alerts=alerts, policies={"voter"})


def test_calibration_counts_an_alert_only_for_a_failure_that_came_after_it():
    amplification = lambda step, policy="voter": {"kind": "amplification", "signal": None, "step": step,
                                                   "policy": policy, "role": None}
    collapse = lambda step: [FailureLabel("collapse", step, None, "")]
    cells = [_cell("in time", [amplification(10)], collapse(40)),       # 30 steps later: counts
             _cell("beyond", [amplification(10)], collapse(90)),        # 80 steps later: not within 50
             _cell("soon", [amplification(35)], collapse(40)),          # 5 steps later: sooner than 10
             _cell("late", [amplification(60)], collapse(20)),          # after the failure: never a prediction
             _cell("at it", [amplification(40)], collapse(40)),         # the same step: lead 0, soon
             _cell("healthy", [amplification(20)], []),                 # no failure
             _cell("other", [amplification(10, "aggregator")], collapse(30)),  # names a policy the cell lacks
             _cell("silent", [], collapse(30))]                         # never fired: not counted
    [row] = [r for r in calibration_rows(cells, within=50) if r["name"] == "amplification"]
    assert (row["warned"], row["in_time"], row["soon"], row["late"]) == (5, 1, 2, 1)
    assert row["failure"] == "collapse" and row["alerts"] == [["amplification", None]]
    assert not [r for r in calibration_rows(cells, within=50) if r["name"] in NOTIFICATIONS]
