"""How each kind of study is collected into `outcomes.csv` and scored from it (analysis/studies.py).

`detector_validation`: one row per cell of the design and the held-out sweeps (its labels, the first
step of each scored alert, what it can fire on); scored as analysis/detector_validation.py scores a
sweep: mixed settings and the config-only baseline from the design rows, every figure from the
held-out rows, and the calibration every alert quotes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

from analysis.detector_validation import (BOOTSTRAP_NOTE, CALIBRATION_WITHIN, MIN_LEAD, MIXED, SCORED, WARNINGS, RunOutcome,
                                          against_baseline, arm_failure_rates, calibration_rows, detector_scores,
                                          mixed_arms, outcomes)
from analysis.labels import FailureLabel
from analysis.studies import Study, StudyError, refuse_decision_seeds, register, seed_ranges
from analysis.tables import to_markdown

# ------------------------------------------------------------------ outcome rows <-> RunOutcome
def _labels_text(labels: List[FailureLabel]) -> str:
    return ";".join(f"{l.kind}{':' + l.role if l.role else ''}@{l.step}" for l in labels)


def _parse_labels(text: str) -> List[FailureLabel]:
    labels = []
    for part in filter(None, (text or "").split(";")):
        head, step = part.rsplit("@", 1)
        kind, _, role = head.partition(":")
        labels.append(FailureLabel(kind, int(step), role or None, ""))
    return labels


def cell_row(r: RunOutcome, split: str, final_accuracy: Optional[float], sharing: str) -> dict:
    return {"split": split, "cell": r.cell_id, "arm": r.arm, "sharing": sharing, "seed": r.seed, "start": r.start,
            "val_every": r.val_every, "labels": _labels_text(r.labels),
            "first_alerts": ";".join(f"{name}@{step}" for name, step in sorted(r.first_alert.items())),
            "watched": ";".join(sorted(r.watched)),
            "final_val_accuracy": "" if final_accuracy is None else f"{final_accuracy:.4f}"}


def outcome_of(row: dict) -> RunOutcome:
    first = {}
    for part in filter(None, (row.get("first_alerts") or "").split(";")):
        name, step = part.rsplit("@", 1)
        first[name] = int(step)
    return RunOutcome(Path(row["cell"]), row["cell"], row["arm"], _parse_labels(row.get("labels", "")), first,
                      watched=set(filter(None, (row.get("watched") or "").split(";"))), start=int(row["start"]),
                      val_every=int(row["val_every"]), seed=int(row["seed"]) if row.get("seed") not in ("", None) else None)


def _final_accuracy(run: Path) -> Optional[float]:
    from harness.logging import read_jsonl

    values = [r["val/accuracy"] for r in read_jsonl(run / "metrics.jsonl") if isinstance(r.get("val/accuracy"), (int, float))]
    return float(values[-1]) if values else None


def _sharing(run: Path) -> str:
    import yaml

    cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
    return "single" if cell.get("topology") == "single" else str(cell.get("sharing", ""))


# ------------------------------------------------------------------ detector validation
def collect_detector_validation(study: Study, root: Path) -> List[dict]:
    """Both sweeps' cells, as the runs raised their alerts; each split's seeds must be the study's."""
    rows = []
    runs = study.data.get("runs") or {}
    for split in ("design", "held_out"):
        if split not in runs:
            raise StudyError(f"study {study.name}: runs.{split} (the sweep folder under the runs root) is not set")
        sweep = root / runs[split]
        results = outcomes(sweep)
        if not results:
            raise StudyError(f"study {study.name}: {sweep} holds no run directories")
        declared = set(study.seeds(split))
        found = {r.seed for r in results}
        if found - declared:
            raise StudyError(f"study {study.name}: {sweep} holds seeds {sorted(found - declared)[:5]} that its "
                             f"{split} seeds do not list")
        rows += [cell_row(r, split, _final_accuracy(r.run_dir), _sharing(r.run_dir)) for r in results]
    return rows


def _split(rows: List[dict], split: str) -> List[RunOutcome]:
    return [outcome_of(r) for r in rows if r["split"] == split]


def _table(frame: pd.DataFrame, columns: List[str]) -> str:
    return to_markdown(frame[[c for c in columns if c in frame.columns]])


def render_detector_validation(study: Study, rows: List[dict]) -> Dict[str, str]:
    design, held = _split(rows, "design"), _split(rows, "held_out")
    refuse_decision_seeds({r.seed for r in held if r.seed is not None} - set(study.seeds("design")))
    mixed = mixed_arms(design)
    on_mixed = [r for r in held if r.arm in mixed]
    blocks: Dict[str, str] = {}
    rates = arm_failure_rates(held).drop(columns=["mixed"]).rename(columns={"cells": "held-out cells",
                                                                              "failed": "held-out failed",
                                                                              "failure rate": "held-out rate"})
    design_rates = arm_failure_rates(design).set_index("arm")
    rates.insert(1, "design failed", [f"{design_rates.loc[a, 'failed']}/{design_rates.loc[a, 'cells']}"
                                      if a in design_rates.index else "–" for a in rates["arm"]])
    rates["mixed (design)"] = ["yes" if a in mixed else "" for a in rates["arm"]]
    blocks["failure-rates"] = (_table(rates, ["arm", "design failed", "held-out failed", "held-out cells", "95% CI",
                                              "failure kinds", "mixed (design)"])
                               + f"\n\nDesign seeds {seed_ranges([r.seed for r in design if r.seed is not None])}, held-out seeds {seed_ranges([r.seed for r in held if r.seed is not None])}. Mixed: the "
                               f"failure rate over the design seeds lies in [{MIXED[0]:g}, {MIXED[1]:g}].")
    scores = detector_scores(on_mixed)
    blocks["warnings"] = _table(scores, ["detector", "failing cells", "caught in time", "recall", "recall 95% CI",
                                         "median lead (steps)", "fired after the failure (late)", "healthy cells",
                                         "fired on healthy", "false-positive rate", "false-positive 95% CI"]) + \
        f"\n\nHeld-out cells of the mixed settings ({len(on_mixed)}); recall counts a warning at least {MIN_LEAD} " \
        f"steps before the failure it names."
    versus = against_baseline(on_mixed, design)
    blocks["against-baseline"] = _table(versus, ["detector", "failing cells", "healthy cells", "J (recall - FPR)",
                                                 "config-only J", "difference", "95% CI (bootstrap)", "verdict"]) + \
        "\n\n" + BOOTSTRAP_NOTE
    verdicts = versus.set_index("detector")["verdict"].to_dict()
    lines = []
    for hypothesis in study.data.get("hypotheses", []):
        warning = hypothesis.get("warning")
        result = verdicts.get(warning, "not testable here")
        lines.append(f"- **{hypothesis['id']}** ({hypothesis['claim'].strip()}): {result}.")
    blocks["hypotheses"] = "\n".join(lines) or "(no hypotheses)"
    calibration = calibration_rows(held, CALIBRATION_WITHIN)
    source = f"{study.name}, seeds {seed_ranges([r.seed for r in held if r.seed is not None])}"
    blocks["calibration"] = "\n".join(
        f"- {row['name']}: of {row['warned']} held-out cells warned this way, {row['in_time']} failed "
        f"({row['failure']}) {MIN_LEAD}-{CALIBRATION_WITHIN} steps later, {row['soon']} sooner; {row['late']} further "
        f"alert(s) came after the failure" for row in calibration) or "(no warning fired)"
    if study.data.get("calibrates"):
        blocks["_calibration.json"] = json.dumps(
            {"source": source, "within": CALIBRATION_WITHIN,
             "written_by": "python -m analysis.studies render (from studies/" + study.name + "/outcomes.csv)",
             "warnings": calibration}, indent=1) + "\n"
    return blocks


register("detector_validation", collect_detector_validation, render_detector_validation)
