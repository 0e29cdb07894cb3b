"""Each detector's operating curve: its recall, lead and false-positive rate at a grid of threshold
settings, replayed on a sweep's logged metrics, and a setting chosen on one sweep scored on another.

Why: a detector that misses the bar at its defaults may only be mis-tuned, or the signal it watches
may not precede the failure at all. The curve answers which, with data: if no setting in a wide
grid reaches a median lead of 10 steps at a false-positive rate <= 0.1 *on the cells it is scored
on* (an optimistic bound), no threshold will. A setting picked that way is tuned on its test data,
so the figures that count come from `choose` on a design sweep, scored on a held-out one.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional

import pandas as pd

from analysis.detector_validation import (BAR, DETECTOR_OF, WARNINGS, ReplayContext, RunOutcome, detector_scores,
                                          first_alerts, replay_setup, scored_name)
from harness.run_dir import read_jsonl
from harness.monitors.detectors import build_detector
from harness.paired_run import ReferenceRun, paired_run

# the settings tried per early warning (its detector's MonitorConfig field's names); the defaults are added
GRID: Dict[str, Dict[str, List[Any]]] = {
    "amplification": {"min_ratio": [1.1, 1.3, 1.6], "min_rise": [0.0, 0.1, 0.25, 0.5],
                      "min_coherence": [0.0, 0.5], "patience": [1, 2, 5]},
    "capture warning": {"pressure_window": [5, 10, 20], "patience": [1, 2, 5], "pressure_z": [3.0, 4.0, 6.0]},
    "length_drift": {"z_threshold": [1.5, 2.0, 3.0, 5.0, 8.0], "ewma_alpha": [0.2, 0.5], "patience": [1, 3, 5],
                     "pressure_z": [3.0, 4.0, 6.0]},
    "collapse warning": {"fraction": [0.7, 0.8, 0.9], "se": [0.0, 1.0, 2.0], "trend_window": [5, 10, 20],
                         "trend_patience": [1, 2]},
}
# scored warning -> its detector's field of MonitorConfig and of DETECTORS
CONFIG_FIELD = {name: DETECTOR_OF[name] for name in WARNINGS}


@dataclass
class ReplayCell:
    """One run, loaded once: its labels (an outcome without alerts), metrics and the detectors' context."""

    outcome: RunOutcome
    records: List[dict]
    context: ReplayContext
    reference: Optional[ReferenceRun]  # the paired run's log, read once for every setting


def load_cells(results: List[RunOutcome], until: Optional[int] = None) -> List[ReplayCell]:
    cells = []
    for r in results:
        records = [m for m in read_jsonl(r.run_dir / "metrics.jsonl")
                   if isinstance(m.get("step"), int) and (until is None or m["step"] < until)]
        context = replay_setup(r.run_dir)
        reference = paired_run(context.monitors)
        cells.append(ReplayCell(r, records, context, reference))
    return cells


def settings(kind: str, grid: Optional[Dict[str, List[Any]]] = None) -> List[Dict[str, Any]]:
    """Every combination of the grid's values, the detector's defaults among them."""
    grid = dict(GRID[kind] if grid is None else grid)
    defaults = default_setting(kind, grid)
    axes = {name: sorted(set(values) | {defaults[name]}) for name, values in grid.items()}
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def default_setting(kind: str, grid: Optional[Dict[str, List[Any]]] = None) -> Dict[str, Any]:
    from harness.config import MonitorConfig

    cfg = getattr(MonitorConfig(), CONFIG_FIELD[kind])
    return {name: getattr(cfg, name) for name in (GRID[kind] if grid is None else grid)}


def first_alert(kind: str, setting: Dict[str, Any], cell: ReplayCell) -> Optional[int]:
    """The step of the warning's first alert on the run's metrics under `setting` that names the
    cell's failure (or at all, on a healthy cell), from the monitors' first step on; or None."""
    field = CONFIG_FIELD[kind]
    context = cell.context
    detector = build_detector(field, replace(getattr(context.monitors, field), **setting), context.role_policies,
                              cell.reference, context.role_contracts)
    alerts = [a.record() for record in cell.records for a in detector.observe(record)]
    alerts = [a for a in alerts if a["step"] >= context.start and scored_name(a) == kind]
    return first_alerts(alerts, cell.outcome.labels, cell.outcome.policies).get(kind)


def describe(setting: Dict[str, Any]) -> str:
    return " ".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in setting.items())


def score(kind: str, setting: Dict[str, Any], cells: List[ReplayCell]) -> dict:
    """The warning's figures under `setting` on these cells, as detector_scores counts them."""
    scored = []
    for cell in cells:
        step = first_alert(kind, setting, cell)
        scored.append(replace(cell.outcome, first_alert={} if step is None else {kind: step}))
    return detector_scores(scored, [kind]).set_index("detector").loc[kind].to_dict()


def curve(kind: str, cells: List[ReplayCell], grid: Optional[Dict[str, List[Any]]] = None) -> pd.DataFrame:
    """One row per setting: its figures on these cells, whether it is the default and whether no
    other setting beats it on all three figures (the frontier)."""
    defaults = default_setting(kind, grid)
    rows = [{"setting": describe(setting), "default": setting == defaults, **score(kind, setting, cells),
             "_setting": setting} for setting in settings(kind, grid)]
    frame = pd.DataFrame(rows)
    frame["on the frontier"] = [not any(_dominates(other, row) for other in rows) for row in rows]
    return frame


def _figures(row) -> tuple:
    lead = row["median lead (steps)"]
    return (row["recall"], -math.inf if math.isnan(lead) else lead, -row["false-positive rate"])


def _dominates(a, b) -> bool:
    """a is at least as good as b on recall, lead and false positives, and better on one."""
    fa, fb = _figures(a), _figures(b)
    return all(x >= y for x, y in zip(fa, fb)) and fa != fb


def closeness_to_bar(row) -> tuple:
    """How a setting is ranked when choosing one: the bar's criteria it meets (0-2: recall at lead >= 10, false positives), then recall,
    lead and false positives (a setting meeting the bar always beats one that does not), then the
    default among settings alike."""
    recall, lead, neg_fpr = _figures(row)
    met = (recall >= BAR["recall"]) + (-neg_fpr <= BAR["false-positive rate"])
    return (met, recall, lead, neg_fpr, row["default"])


def unscorable(row) -> bool:
    """These cells cannot measure its recall or false-positive rate (no failure it warns of, no
    healthy cell it can fire on): the same for every setting of the detector."""
    return any(math.isnan(row[figure]) for figure in ("recall", "false-positive rate"))


def choose(frame: pd.DataFrame) -> dict:
    """The setting closest to the bar on these cells (the design sweep's, when it is to be held out).
    Where they cannot score it, nothing here can justify moving a threshold: the default stands."""
    rows = frame.to_dict("records")
    if unscorable(rows[0]):
        return next(row for row in rows if row["default"])
    return max(rows, key=closeness_to_bar)


def summary_line(kind: str, frame: pd.DataFrame) -> str:
    """What the whole curve says: how many settings meet the bar here, and the best lead any setting
    reaches with the bar's recall and false-positive rate."""
    if (frame["meets the aim"] == "not measurable").all():
        return f"{kind}: not measurable on these cells (no failure it warns of, or no healthy cell)."
    meeting = frame[frame["meets the aim"] == "yes"]
    usable = frame[(frame["recall"] >= BAR["recall"]) & (frame["false-positive rate"] <= BAR["false-positive rate"])]
    best = usable["median lead (steps)"].max() if len(usable) else float("nan")
    text = (f"{kind}: {len(meeting)} of {len(frame)} settings meet the aim on these cells; "
            + (f"the longest median lead at recall >= {BAR['recall']:g} and false positives <= "
               f"{BAR['false-positive rate']:g} is {best:g} steps." if not math.isnan(best) else
               f"no setting reaches recall >= {BAR['recall']:g} with false positives <= {BAR['false-positive rate']:g}."))
    return text


SHOWN = ["setting", "default", "settings alike", "recall", "median lead (steps)", "false-positive rate", "meets the aim"]


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The frontier and the default, best recall first, one row per distinct set of figures (the
    default's, or the first, standing for the settings alike): the rest is beaten on every figure."""
    frame = frame.copy()
    frame["_figures"] = [_figures(row) for row in frame.to_dict("records")]
    frame["settings alike"] = frame.groupby("_figures")["setting"].transform("size")
    part = frame[frame["on the frontier"] | frame["default"]]
    part = part.sort_values("default", ascending=False, kind="stable").drop_duplicates("_figures")
    return part.sort_values(["recall", "median lead (steps)"], ascending=False, kind="stable")[SHOWN]


def held_out(kinds: List[str], design: List[ReplayCell], test: List[ReplayCell],
             grids: Optional[Dict[str, Dict[str, List[Any]]]] = None) -> pd.DataFrame:
    """Per detector: the setting chosen on the design cells, its figures there and on the test
    cells, against the defaults' on the test cells."""
    rows = []
    for kind in kinds:
        grid = (grids or {}).get(kind)
        chosen = choose(curve(kind, design, grid))
        on_test = score(kind, chosen["_setting"], test)
        defaults = score(kind, default_setting(kind, grid), test)
        rows.append({"detector": kind,
                     "chosen on the design sweep": chosen["setting"] + (" (the default: the design sweep cannot "
                                                                        "score it)" if unscorable(chosen) else ""),
                     "design": _triple(chosen), "held out": _triple(on_test),
                     "held out, defaults": _triple(defaults), "held out: meets the aim": on_test["meets the aim"]})
    return pd.DataFrame(rows)


def _triple(row) -> str:
    """recall / median lead / false-positive rate, "–" where a figure cannot be measured."""
    recall, lead, fpr = row["recall"], row["median lead (steps)"], row["false-positive rate"]
    return " / ".join("–" if math.isnan(value) else fmt.format(value)
                      for value, fmt in ((recall, "{:.2f}"), (lead, "{:g}"), (fpr, "{:.3f}")))
