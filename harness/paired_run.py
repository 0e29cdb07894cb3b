"""The paired single-agent run, followed on disk: its metrics.jsonl read as it grows (it may run beside
the cell; only complete lines count) and its status.json for whether it is over. The run's caller builds
it and hands it to the Monitor, so detectors only ever see records (harness/monitors/base.py PairedStream)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

from harness.monitors.base import PairedStream
from harness.run_dir import FINAL_STATES


class ReferenceRun(PairedStream):
    """A run directory's log as a PairedStream: its drift ‖θ_t − θ_0‖ (mean over its policies) and its
    training accuracy (on the same problems as the cell's, step for step: both draw a step's problems
    from the seed)."""

    def __init__(self, run_dir: str):
        super().__init__()
        self.path = Path(run_dir) / "metrics.jsonl"
        self.offset = 0
        self.identity: Optional[Tuple[int, int]] = None  # (inode, device) of the file read so far
        self.size = -1  # its size at the last read

    def ended_before(self, step: int) -> bool:
        try:  # read each time: a finished paired run says so in its status
            status = json.loads((self.path.parent / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False
        self.over = status.get("state") in FINAL_STATES
        return super().ended_before(step)

    def refresh(self) -> None:
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
            self.add(record)


def paired_run(monitors) -> Optional[ReferenceRun]:
    """The Monitor's paired stream for a cell's `monitors` section: its `reference_run` followed on disk."""
    return ReferenceRun(monitors.reference_run) if monitors.reference_run else None
