"""The alerts a run could not raise while it trained, written once the run is over.

`collapse` (its training-accuracy warning) and `amplification` compare each step with the paired
single-agent run's same step; a step that run has not logged yet waits. A cell that ends ahead of
its paired run (on SLURM the baseline may start later, locally it may be slower) ends with steps
that were never judged, and writes the first of them to status.json (`waiting_for_paired_run`).
A resume judges them (harness/run.py); a run that is never resumed needs this: once the paired run
is over too, replaying the run's metrics with its own monitor settings judges those steps, and the
waiting detectors' alerts from that step on are appended, marked `late` (raised after the fact:
nobody could act on them). Only those steps: a replay also differs from the log wherever today's
code differs from the run's, and that is not a late judgement.
"""
from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Callable, Dict, List, Optional

from harness.run_dir import FINAL_STATES, RunDir
from harness.monitors.detectors import Alert
from harness.monitors.monitor import Monitor, held_back
from harness.paired_run import paired_run

ENDED = ("finished", "stopped_early")  # the states a run's last status write records its waiting steps in


def role_policies_of(status: dict) -> Dict[str, List[str]]:
    """role -> the policies its instances train, sorted as harness/run.py builds it, from
    status.json's `policies` (policy -> [role:instance, ...])."""
    role_policies: Dict[str, set] = {}
    for policy, slots in (status.get("policies") or {}).items():
        for slot in slots:
            role_policies.setdefault(slot.split(":")[0], set()).add(policy)
    return {role: sorted(policies) for role, policies in role_policies.items()}


def role_contracts_of(status: dict) -> Optional[Dict[str, str]]:
    """role -> contract from status.json (None for a run logged before it was recorded: the
    monitors then take the study topologies' judging roles by name)."""
    contracts = status.get("contracts")
    return dict(contracts) if isinstance(contracts, dict) else None


def paired_run_of(run: Path, recorded: str) -> Path:
    """The paired run the cell read live: the recorded path, unless the sweep has moved (the same
    sweep's run of that name sits beside the cell while the recorded place is gone or now belongs to
    another directory of the same sweep name); a path a user set to another sweep's run is kept."""
    recorded_path, beside = Path(recorded), run.parent / Path(recorded).name
    moved = recorded_path.parent.name == run.parent.name and recorded_path.parent.resolve() != run.parent.resolve()
    if (beside / "metrics.jsonl").is_file() and (moved or not (recorded_path / "metrics.jsonl").is_file()):
        return beside
    return recorded_path


def late_alerts(run: Path) -> List[Alert]:
    """Judge the steps a run that is over left waiting for its paired run, once that run is over
    too; append and return their alerts. Nothing while either run may still change."""
    from harness.config import monitor_start
    from harness.run_dir import stored_cell_config

    run_dir = RunDir(run)
    if not (run / "cell.yaml").is_file() or not (run / "metrics.jsonl").is_file():
        return []
    with open(run / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held through the append (a cell started now is refused)
        except BlockingIOError:
            return []  # a harness.run process owns the run
        status = run_dir.read_status() or {}
        since = status.get("waiting_for_paired_run")
        cfg = stored_cell_config(run)
        monitors = cfg.monitors
        if status.get("state") not in ENDED or not isinstance(since, int) or not status.get("policies") \
                or not monitors.reference_run:
            return []
        paired = paired_run_of(run, monitors.reference_run)
        if (RunDir(paired).read_status() or {}).get("state") not in FINAL_STATES:  # its log will not change
            return []
        monitors.reference_run = str(paired)
        written = run_dir.records("alerts.jsonl")
        replayed = Monitor(monitors, role_policies_of(status), role_contracts_of(status), monitor_start(cfg),
                           reference=paired_run(monitors)).replay(
            run_dir.records("metrics.jsonl"), written, since)
        late = held_back(replayed, written, since)
        if late:
            _end_torn_line(run_dir.file("alerts.jsonl"))
            for alert in late:
                run_dir.append("alerts.jsonl", {**alert.record(), "late": True})
        counts = dict(status.get("alerts") or {})
        for alert in late:
            counts[alert.kind] = counts.get(alert.kind, 0) + 1
        run_dir.write_status(status["state"], alerts=counts, waiting_for_paired_run=None)  # judged: not again
        return late


def _end_torn_line(path: Path) -> None:
    """A run that died mid-write (a full disk) may leave a last line without its newline: close it, so
    that line stays unreadable on its own and the next record is not glued to it."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as handle:
            handle.seek(-1, 2)
            torn = handle.read(1) != b"\n"
        if torn:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("\n")


def settle_sweep(sweep_dir: Path, warn: Optional[Callable[[str], None]] = None) -> Dict[str, List[Alert]]:
    """late_alerts of every run in a sweep directory (run id -> the alerts written now); a run that
    cannot be settled is named through `warn` and the others still are."""
    written: Dict[str, List[Alert]] = {}
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return written
    for run in sorted(p for p in sweep_dir.iterdir() if (p / "cell.yaml").is_file()):
        try:
            late = late_alerts(run)
        except Exception as exc:  # noqa: BLE001 - one unreadable run must not keep the others unjudged
            if warn is not None:
                warn(f"warning: could not judge the late steps of {run.name} ({type(exc).__name__}: {exc})")
            continue
        if late:
            written[run.name] = late
    return written
