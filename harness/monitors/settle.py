"""The alerts a run could not raise while it trained, written once the run is over.

`collapse` and `amplification` compare each step with the paired single-agent run's same step; a
step that run has not logged yet waits. A cell that ends ahead of its paired run (on SLURM the
baseline may start later, locally it may be slower) ends with steps that were never judged. A
resume judges them (harness/run.py); a run that is never resumed needs this: once the sweep is
over, replaying the run's metrics with its own monitor settings judges every step, and the alerts
alerts.jsonl lacks are appended, marked `late` (raised after the fact: nobody could act on them).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from harness.logging import RunDir
from harness.monitors.detectors import Alert
from harness.monitors.monitor import Monitor, unwritten

SETTLED_STATES = ("finished", "stopped_early", "diverged", "failed")  # not running: nothing else appends


def role_policies_of(status: dict) -> Dict[str, List[str]]:
    """role -> the policies its instances train, from status.json's `policies` (policy -> role:instance)."""
    role_policies: Dict[str, List[str]] = {}
    for policy, slots in (status.get("policies") or {}).items():
        for slot in slots:
            role = slot.split(":")[0]
            role_policies.setdefault(role, [])
            if policy not in role_policies[role]:
                role_policies[role].append(policy)
    return role_policies


def late_alerts(run: Path) -> List[Alert]:
    """Judge a run that is over against its paired run as that run stands now; append and return the
    alerts alerts.jsonl lacks (none while the run is still running, or without a paired run)."""
    from harness.config import stored_cell_config

    run_dir = RunDir(run)
    status = run_dir.read_status() or {}
    if status.get("state") not in SETTLED_STATES or not (run / "cell.yaml").is_file():
        return []
    monitors = stored_cell_config(run).monitors
    if not monitors.reference_run:
        return []
    recorded = Path(monitors.reference_run)
    if not (recorded / "metrics.jsonl").is_file():  # the sweep directory moved: the paired run sits beside it
        monitors.reference_run = str(run.parent / recorded.name)
    replayed = Monitor(monitors, role_policies_of(status)).replay(run_dir.records("metrics.jsonl"))
    late = unwritten(replayed, run_dir.records("alerts.jsonl"))
    for alert in late:
        run_dir.append("alerts.jsonl", {**alert.record(), "late": True})
    return late


def settle_sweep(sweep_dir: Path) -> Dict[str, List[Alert]]:
    """late_alerts of every run in a sweep directory; run id -> the alerts written now."""
    written = {}
    for run in sorted(p for p in Path(sweep_dir).iterdir() if (p / "metrics.jsonl").is_file()):
        late = late_alerts(run)
        if late:
            written[run.name] = late
    return written
