"""What each kind of early warning has been shown to predict, carried in the alert itself.

`python -m reports.detectors <held-out sweep> --design <design sweep> --calibrate` writes
`calibration.json` beside this module (it ships with the package): for each early warning, on the
held-out seeds it was measured on, of the cells where it fired before any failure it warns of, how
many failed that way 10-50 steps later, how many sooner, and how many further alerts came only after
the failure (late: not a prediction). Every warning's message and its record in alerts.jsonl carry
that line, or "not validated" for one no held-out sweep has measured. Label notifications (collapse's
validation rule, capture's "moved" sign: the failure labels' own rules said live) say so instead:
they are not predictions and have no such figures.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
NOT_VALIDATED = "not validated: no held-out sweep has measured what this alert predicts"
LABEL_NOTIFICATION = ("a label notification: the failure label's own rule, so it says the run has failed, "
                      "not that it will")
# (kind, signal) of the alerts that apply a failure label's own rule (analysis.detector_validation NOTIFICATIONS)
NOTIFYING = {("collapse", "validation"), ("capture", "moved")}


@dataclass(frozen=True)
class Calibration:
    name: str  # the early warning (analysis.detector_validation.SCORED)
    failure: str  # the failure kinds it warns of, e.g. "collapse"
    warned: int  # cells where it fired before any such failure (or that never had one)
    in_time: int  # of those, failed that way min_lead..within steps after it
    soon: int  # of those, failed that way less than min_lead steps after it
    late: int  # further cells where it fired only after the failure
    min_lead: int
    within: int
    source: str  # which sweep and seeds

    def describe(self) -> str:
        return (f"on held-out seeds ({self.source}), {self.in_time} of {self.warned} cells warned this way failed "
                f"({self.failure}) {self.min_lead}-{self.within} steps later, {self.soon} sooner; {self.late} further "
                f"alert(s) of this kind came after the failure")


Key = Tuple[str, Optional[str]]


def load_calibration(path: Path = CALIBRATION_FILE) -> Dict[Key, Calibration]:
    """{(kind, signal): Calibration} for every alert of every calibrated warning; empty when no
    calibration has been written (or only one of an older form, which counted late alerts)."""
    if not Path(path).is_file():
        return {}
    data = json.loads(Path(path).read_text())
    table: Dict[Key, Calibration] = {}
    for row in data.get("warnings", []):
        entry = Calibration(row["name"], row["failure"], int(row["warned"]), int(row["in_time"]), int(row["soon"]),
                            int(row["late"]), int(row["min_lead"]), int(data["within"]), str(data["source"]))
        for kind, signal in row["alerts"]:
            table[(kind, signal)] = entry
    return table


def describe(table: Dict[Key, Calibration], kind: str, signal: Optional[str]) -> str:
    if (kind, signal) in NOTIFYING:
        return LABEL_NOTIFICATION
    found = table.get((kind, signal))
    return found.describe() if found is not None else NOT_VALIDATED


def write_calibration(path: Path, rows: list, within: int, source: str, command: str) -> None:
    """rows: analysis.detector_validation.calibration_rows, as the detector report measured them."""
    Path(path).write_text(json.dumps({"source": source, "within": within, "written_by": command,
                                      "warnings": rows}, indent=1) + "\n")
