"""What every detector shares: the alert it raises, the trace a report draws of what it compared,
and the paired single-agent run's records as the caller hands them over."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional


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


class PairedStream:
    """The paired single-agent run's records, step by step, as its caller hands them over: what the
    detectors that compare with it (amplification: drift, collapse: training accuracy) read. Pure: the
    caller feeds records (`add`) and says when that run is over (`end`); a detector never reads a file.
    harness/paired_run.py's ReferenceRun is the one that follows a run directory's log as it grows."""

    def __init__(self, records: Optional[List[dict]] = None, over: bool = False):
        self.records: Dict[int, dict] = {}  # step -> its record (drift and accuracy are read from it)
        self.over = over  # the run ended (finished, stopped early, diverged): it writes no more steps
        for record in records or []:
            self.add(record)

    def add(self, record: dict) -> None:
        if isinstance(record.get("step"), int):
            self.records[record["step"]] = record

    def end(self) -> None:
        self.over = True

    def refresh(self) -> None:
        """Take in what the paired run wrote since the last look (here: nothing, the caller feeds it)."""

    def record_at(self, step: int) -> Optional[dict]:
        self.refresh()
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
        """The paired run is over without reaching `step`: it never will, so waiting for it is pointless
        (a failed run may still be resumed: keep waiting)."""
        self.refresh()
        return self.over and all(s < step for s in self.records)
