"""Runs every detector on each metrics record, debounces repeats and decides the action.

Actions per detector: `log` (alerts.jsonl only), `alert` (also printed and sent to wandb),
`stop` (alert, then the run ends cleanly with status stopped_early), `mitigate` (alert, and the
running cell switches on the kind's matched mitigation, monitors.mitigations, from the next step). The same
(kind, role, policy, signal) does not fire again within `debounce` steps. On resume the replay's
alerts that never reached alerts.jsonl (steps that waited for the paired run when the run died)
are written then (`held_back`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from harness.monitors.calibration import describe, load_calibration
from harness.monitors.base import PairedStream
from harness.monitors.detectors import DETECTORS, PAIRED_ALERTS, Alert, build_detector


class Monitor:
    """`start_step`: no alert before it (the detectors still read every record); the run resolves
    monitors.start_step, by default its first validation after step 0. Each alert carries what its
    kind was shown to predict (harness/monitors/calibration.py). `reference`: the paired single-agent
    run's records, from the caller (harness/paired_run.py follows one on disk); detectors never read files."""

    def __init__(self, cfg, role_policies: Dict[str, List[str]], role_contracts: Optional[Dict[str, str]] = None,
                 start_step: int = 0, trace: Optional[list] = None, reference: Optional[PairedStream] = None):
        self.cfg = cfg
        self.start_step = start_step
        self.detectors = [build_detector(name, getattr(cfg, name), role_policies, reference, role_contracts)
                          for name in DETECTORS]
        for detector in self.detectors:  # a report's replay: what each detector compared, step by step
            if trace is not None and hasattr(detector, "_trace"):
                detector.trace = trace
        self.last_fired: Dict[Tuple[str, Optional[str], Optional[str], Optional[str]], int] = {}
        self.calibration = load_calibration()

    def observe(self, record: dict) -> List[Alert]:
        return self._debounced([alert for detector in self.detectors for alert in detector.observe(record)])

    def _debounced(self, alerts: List[Alert]) -> List[Alert]:
        fired = []
        for alert in alerts:
            if alert.step < self.start_step and alert.kind != "non_finite":  # a NaN is news at any step
                continue
            key = alert_key(alert.record())[1:]
            last = self.last_fired.get(key)
            if last is not None and alert.step - last < self.cfg.debounce:
                continue
            self.last_fired[key] = alert.step
            validation = describe(self.calibration, alert.kind, alert.signal)
            mitigation = self.cfg.mitigations.get(alert.kind, "none") if alert.action == "mitigate" else None
            fired.append(replace(alert, validation=validation, message=f"{alert.message} ({validation})",
                                 mitigation=mitigation))
        return fired

    def waiting_since(self) -> Optional[int]:
        """The first step a detector still holds for the paired run to reach (None: none): written to
        status.json when the run ends, so that harness/monitors/settle.py judges exactly those steps."""
        steps = [d.waiting_since() for d in self.detectors if hasattr(d, "waiting_since")]
        return min((s for s in steps if s is not None), default=None)

    def replay(self, records: List[dict], written: Sequence[dict] = (), since: int = 0) -> List[Alert]:
        """Rebuild detector state from records already logged; returns the alerts the replay raised.
        Most were written when those steps ran, but a step that waited for the paired run (collapse,
        amplification) may only be judged now, when that run has moved on: `held_back` finds those.
        With `since` (the first step the run left waiting), steps before it were judged live: their
        alerts are the ones in `written` (alerts.jsonl), which also set the debounce, whatever this
        replay makes of those steps (newer code, or a paired log rewritten since)."""
        for logged in written:
            step = logged.get("step")
            if isinstance(step, int) and step < since:
                key = alert_key(logged)[1:]
                self.last_fired[key] = max(step, self.last_fired.get(key, step))
        raised = []
        for record in records:
            raised += self._debounced([a for d in self.detectors for a in d.observe(record) if a.step >= since])
        return raised


def alert_key(alert: dict) -> tuple:
    """(step, kind, role, policy, signal): one alert's identity in alerts.jsonl."""
    return alert.get("step"), alert.get("kind"), alert.get("role"), alert.get("policy"), alert.get("signal")


def unwritten(alerts: List[Alert], written: List[dict]) -> List[Alert]:
    """The alerts with no record in alerts.jsonl yet (same step, kind, role, policy and signal)."""
    seen = {alert_key(record) for record in written}
    return [alert for alert in alerts if alert_key(alert.record()) not in seen]


def stop_reason(alerts: List[Alert]) -> Optional[str]:
    for alert in alerts:
        if alert.action == "stop":
            return f"{alert.kind}: {alert.message}"
    return None


def held_back(replayed: List[Alert], written: List[dict], since: int) -> List[Alert]:
    """What a replay may add to alerts.jsonl: the waiting detectors' alerts from `since` (the first
    step the run left waiting for its paired run) on that the log lacks. Any other difference
    between a replay and the log is today's code differing from the run's, not a late judgement."""
    return [alert for alert in unwritten(replayed, written)
            if alert.step >= since and (alert.kind, alert.signal) in PAIRED_ALERTS]
