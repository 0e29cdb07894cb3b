"""What a running cell does with its alerts: write each once to alerts.jsonl (and wandb), print those that
are not only logged, switch on the mitigation an `action=mitigate` alert names, and after a resume replay
exactly what was written before it (mitigations switched on, alerts that waited for the paired run)."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional

from harness.monitors import held_back
from harness.monitors.monitor import alert_key
from harness.run_dir import RunDir


class LiveAlerts:
    """One cell's alert desk. `counts`: alerts written per kind; `mitigations`: name -> the first step it
    trained under; both are kept in status.json."""

    def __init__(self, cfg, run_dir: RunDir, role_contracts: Dict[str, str], sink=None,
                 log: Callable[[str], None] = print):
        self.cfg, self.run_dir, self.role_contracts, self.sink, self.log = cfg, run_dir, role_contracts, sink, log
        self.written = run_dir.records("alerts.jsonl")
        self.counts: Dict[str, int] = {}
        for record in self.written:
            self.counts[record["kind"]] = self.counts.get(record["kind"], 0) + 1
        self.mitigations: Dict[str, int] = {}
        self.logged = {alert_key(record) for record in self.written}

    def resume(self, replayed: List, start: int, waiting: Optional[int]) -> List:
        """After a resume at `start`: switch on again each mitigation an alert before it switched on, and
        write the alerts that waited for the paired run when the run stopped (`waiting`): judged only
        now, from `replayed` (the monitor's replay of the steps logged so far). The late alerts."""
        for record in self.written:
            if record.get("action") == "mitigate" and int(record.get("step", 0)) < start:
                self.mitigate(record, int(record["step"]) + 1)
        late = held_back(replayed, self.written, waiting) if waiting is not None else []
        for alert in late:
            self.emit(alert, late=True)
            if alert.action == "mitigate":
                self.mitigate(alert.record(), start)
        self.logged |= {alert_key(alert.record()) for alert in late}
        return late

    def observe(self, alerts: Iterable, start: int, step: int) -> None:
        """A step's alerts: each written once (one for a step before the resume, still waiting then, is
        late), then the mitigations they name switched on from the next step."""
        alerts = list(alerts)
        for alert in alerts:
            if alert.step >= start:
                self.emit(alert)
            elif alert_key(alert.record()) not in self.logged:
                self.emit(alert, late=True)
        for alert in alerts:
            if alert.action == "mitigate":
                self.mitigate(alert.record(), step + 1)

    def emit(self, alert, late: bool = False) -> None:
        self.run_dir.append("alerts.jsonl", {**alert.record(), "late": True} if late else alert.record())
        self.counts[alert.kind] = self.counts.get(alert.kind, 0) + 1
        if alert.action != "log":
            self.log(f"[alert] step {alert.step} {alert.kind}: {alert.message}")
            if self.sink is not None:
                self.sink.alert(alert)
        self.run_dir.write_status("running", alerts=self.counts, last_alert=alert.message)

    def mitigate(self, alert_record: dict, from_step: int) -> None:
        """Switch on an alert's mitigation in the live config; the engine and controller read it from
        `from_step` on. Recorded in status.json; alerts.jsonl's record replays it on resume."""
        from harness.mitigations import switch_on

        for name in switch_on(self.cfg, alert_record.get("mitigation") or "none", self.role_contracts):
            if name != "none" and name not in self.mitigations:
                self.mitigations[name] = from_step
                self.log(f"[mitigate] {name} from step {from_step} ({alert_record['kind']} "
                         f"at step {alert_record['step']})")
        self.run_dir.write_status("running", mitigations=self.mitigations)
