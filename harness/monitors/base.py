"""What every detector shares: the alert it raises, the trace a report draws of what it compared,
and the paired single-agent run's log, read as it grows."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from harness.run_dir import FINAL_STATES


class Traced:
    """What each detector compares with its threshold, step by step, for a report to draw: `trace`
    is None while a run trains (nothing kept) and a list when a report replays the run
    (analysis/signals.py). A row: step, detector, signal, value, threshold, and whether the detector
    fires above or below it."""

    trace: Optional[list] = None

    def _trace(self, step: int, signal: str, value: float, threshold: float, fires: str = "above") -> None:
        if self.trace is not None and value is not None and math.isfinite(value):
            self.trace.append({"step": int(step), "detector": self.kind, "signal": signal, "value": float(value),
                               "threshold": float(threshold), "fires": fires})


@dataclass(frozen=True)
class Alert:
    step: int
    kind: str  # amplification | capture | length_drift | collapse | non_finite
    role: Optional[str]
    policy: Optional[str]
    value: float
    threshold: float
    message: str
    action: str = "alert"
    signal: Optional[str] = None  # which of a detector's rules fired, where it has several (debounced apart)
    validation: Optional[str] = None  # what this kind of alert was shown to predict (monitors/calibration.py)
    mitigation: Optional[str] = None  # action=mitigate: what the running cell switches on from the next step

    def record(self) -> dict:
        return asdict(self)


class ReferenceRun:
    """The paired single-agent run's metrics at each step, read from its metrics.jsonl as it grows
    (it may run beside this cell; only complete lines count): its drift ‖θ_t − θ_0‖ (mean over its
    policies) and its training accuracy (on the same problems as the cell's, step for step: both
    draw a step's problems from the seed)."""

    def __init__(self, run_dir: str):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.offset = 0
        self.identity: Optional[Tuple[int, int]] = None  # (inode, device) of the file read so far
        self.size = -1  # its size at the last read
        self.records: Dict[int, dict] = {}  # step -> its record (drift and accuracy are read from it)

    def record_at(self, step: int) -> Optional[dict]:
        self._read()
        return self.records.get(step)

    def drift_at(self, step: int) -> Optional[float]:
        """The mean over the paired run's policies of their drift at `step`."""
        drifts = [v for k, v in (self.record_at(step) or {}).items()
                  if k.startswith("policy/") and k.endswith("/drift") and isinstance(v, (int, float))]
        return sum(drifts) / len(drifts) if drifts else None

    def accuracy_at(self, step: int) -> Optional[float]:
        accuracy = (self.record_at(step) or {}).get("accuracy")
        return float(accuracy) if isinstance(accuracy, (int, float)) and math.isfinite(accuracy) else None

    def ended_before(self, step: int) -> bool:
        """The paired run is over (finished, stopped early or diverged) without reaching `step`: it
        never will, so waiting for it is pointless (a failed run may still be resumed: keep waiting)."""
        status_file = self.path.parent / "status.json"
        try:
            status = json.loads(status_file.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        self._read()
        seen = self.records.keys()
        return status.get("state") in FINAL_STATES and all(s < step for s in seen)

    def _read(self) -> None:
        try:
            stat = self.path.stat()
        except OSError:
            return
        if (stat.st_ino, stat.st_dev) != self.identity or stat.st_size < self.offset:
            # replaced (a resumed paired run rewrites its log without the steps past its checkpoint):
            # read it again from the start, or the line across the old offset is never parsed
            self.identity, self.offset, self.size = (stat.st_ino, stat.st_dev), 0, -1
            self.records.clear()
        if stat.st_size == self.size:
            return  # nothing new since the last read (one stat per lookup)
        self.size = stat.st_size
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record.get("step"), int):
                continue
            self.records[record["step"]] = record
