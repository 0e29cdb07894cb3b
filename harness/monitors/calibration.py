"""What each kind of alert has been shown to predict, carried in the alert itself.

`python -m reports.detectors <sweep> --calibrate` writes `calibration.json` beside this module (it
ships with the package): for each alert kind and signal, in the held-out sweeps it was measured on,
how many of the cells where it fired went on to fail in the way it warns of, within a number of
steps. Every alert's message and its record in alerts.jsonl carry that line, so a researcher reads
"12 of 15 cells with this alert failed (collapse) within 50 steps" beside the alert, or "not
validated" for an alert no held-out sweep has measured.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
NOT_VALIDATED = "not validated: no held-out sweep has measured what this alert predicts"


@dataclass(frozen=True)
class Calibration:
    kind: str
    signal: Optional[str]
    failure: str  # the failure kinds it warns of (or confirms), e.g. "collapse"
    failed: int  # cells with this alert that failed that way within `within` steps of it
    fired: int  # cells with this alert
    within: int
    source: str  # which sweeps and seeds

    def describe(self) -> str:
        return (f"validated: in {self.source}, {self.failed} of {self.fired} cells with this alert failed "
                f"({self.failure}) within {self.within} steps of it")


Key = Tuple[str, Optional[str]]


def load_calibration(path: Path = CALIBRATION_FILE) -> Dict[Key, Calibration]:
    """{(kind, signal): Calibration}; empty when no calibration has been written."""
    if not Path(path).is_file():
        return {}
    data = json.loads(Path(path).read_text())
    return {(row["kind"], row.get("signal")): Calibration(row["kind"], row.get("signal"), row["failure"],
                                                          int(row["failed"]), int(row["fired"]),
                                                          int(data["within"]), str(data["source"]))
            for row in data.get("alerts", [])}


def describe(table: Dict[Key, Calibration], kind: str, signal: Optional[str]) -> str:
    found = table.get((kind, signal))
    return found.describe() if found is not None else NOT_VALIDATED


def write_calibration(path: Path, rows: list, within: int, source: str, command: str) -> None:
    """rows: [{kind, signal, failure, failed, fired}, ...] as the detector report measured them."""
    Path(path).write_text(json.dumps({"source": source, "within": within, "written_by": command,
                                      "alerts": rows}, indent=1) + "\n")
