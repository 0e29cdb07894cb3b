"""The arms branched from runs (harness.intervene, harness.diagnose) as rows, and their paired tests.

One row per arm of a branched run: where it branched, what it switched on, which random stream it
drew (`resample`), whether and when it failed after the branch, its final validation accuracy, and
how much it changed the update against its `none` arm on the same stream. Arms of one run at one
branch point on one stream share their random numbers, so an arm and its `none` arm are a pair;
every comparison is a paired test over those pairs (analysis/paired.py). Only arms that were run
count: a `none` arm is never assumed to be the parent run.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from analysis.labels import label_records
from analysis.paired import DifferenceTest, FailureComparison, compare_failures, compare_values, worded
from harness.run_dir import read_jsonl

UPDATE_WINDOW = 10  # steps after the branch over which an arm's change of the update is measured


def _float(value) -> Optional[float]:
    if value in (None, ""):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value) -> Optional[int]:
    return None if value in (None, "") else int(float(value))


def update_sizes(records: Sequence[dict], start: int) -> Dict[int, float]:
    """Step -> the summed update norm of every policy, over the UPDATE_WINDOW steps from `start`."""
    sizes = {}
    for r in records:
        step = r.get("step")
        if isinstance(step, int) and start <= step < start + UPDATE_WINDOW:
            norms = [v for k, v in r.items() if k.startswith("policy/") and k.endswith("/update_norm")
                     and isinstance(v, (int, float))]
            if norms:
                sizes[step] = sum(norms)
    return sizes


def arm_row(arm_dir: Path, branch: dict, status: dict) -> dict:
    """One arm's outcome: its failures at or after the branch, its final validation accuracy."""
    records = read_jsonl(arm_dir / "metrics.jsonl")
    start = int(branch["start"])
    labels = label_records(records)
    after = [l.step for l in labels if l.step >= start]
    before = [l.step for l in labels if l.step < start]
    alert = branch.get("alert") or {}
    sham = branch.get("sham_of") or {}
    accuracies = [r["val/accuracy"] for r in records if isinstance(r.get("val/accuracy"), (int, float))]
    return {"arm_dir": str(arm_dir), "parent": branch["parent_cell"], "start": start, "arm": branch["arm"],
            "mitigation": branch.get("mitigation", ""), "mechanism": branch.get("mechanism", ""),
            "resample": int(branch.get("resample", 0)), "point": branch.get("point", ""),
            "alert_kind": alert.get("kind") or sham.get("kind") or "", "alert_step": alert.get("step", sham.get("step", "")),
            "sham": bool(sham), "failure_kind": (branch.get("failure") or {}).get("kind", ""),
            "failure_step": (branch.get("failure") or {}).get("step", ""), "failed_at": min(after) if after else "", "failed_before": min(before) if before else "",
            "final_accuracy": f"{accuracies[-1]:.4f}" if accuracies else "", "state": status.get("state", ""),
            "update_sizes": json.dumps(update_sizes(records, start))}


def collect_arms(arms_root: Path) -> List[dict]:
    """Every ended arm under `arms_root` (a `<sweep>-interventions` or `-diagnosis` folder); the
    parent's setting and seed from its cell.yaml."""
    import yaml

    from analysis.detector_validation import arm_of

    rows = []
    for arm_dir in sorted(p for p in Path(arms_root).glob("*") if (p / "branch.json").is_file()):
        status_file = arm_dir / "status.json"
        status = json.loads(status_file.read_text()) if status_file.is_file() else {}
        if status.get("state") not in ("finished", "stopped_early"):
            continue
        branch = json.loads((arm_dir / "branch.json").read_text())
        parent_cfg = yaml.safe_load((Path(branch["parent"]) / "cell.yaml").read_text()) or {}
        row = arm_row(arm_dir, branch, status)
        row.update(setting=arm_of(parent_cfg), seed=parent_cfg.get("seed"), sharing=parent_cfg.get("sharing"))
        rows.append(row)
    return rows


@dataclass
class Pair:
    """An arm and its reference on the same branched run (and stream)."""

    key: Tuple
    arm: dict
    reference: dict


def failed_after(row: dict, step: Optional[int] = None) -> bool:
    """The arm failed at or after `step` (default: its branch point)."""
    failed = _int(row.get("failed_at"))
    return failed is not None and failed >= (step if step is not None else int(row["start"]))


def pairs(rows: Iterable[dict], arm: str, reference: str = "none", same_start: bool = True) -> List[Pair]:
    """(parent, start, resample) pairs of `arm` and `reference` (the parent's first alert branch for a
    sham arm, which branched elsewhere: paired by parent and stream)."""
    def key(row):
        return (row["parent"], int(row["start"]) if same_start else None, int(row.get("resample") or 0))

    refs = {key(r): r for r in rows if r["arm"] == reference and not truthy(r.get("sham"))}
    return [Pair(key(r), r, refs[key(r)]) for r in rows if r["arm"] == arm and key(r) in refs]


def truthy(value) -> bool:
    return value is True or str(value).lower() == "true"


def update_change(pair: Pair) -> Optional[float]:
    """Mean over the window of |arm's update size / reference's - 1|: how much the arm changed the update."""
    mine, theirs = json.loads(pair.arm.get("update_sizes") or "{}"), json.loads(pair.reference.get("update_sizes") or "{}")
    ratios = [abs(mine[s] / theirs[s] - 1) for s in mine if s in theirs and theirs[s] > 0]
    return fmean(ratios) if ratios else None


@dataclass
class Comparison:
    arm: str
    reference: str
    failures: FailureComparison
    accuracy: DifferenceTest
    update_change: Optional[float]
    testable: int  # pairs whose run had not failed before the branch

    def row(self) -> dict:
        return {"arm": self.arm, "against": self.reference, "pairs": self.accuracy.cells,
                "failed after the branch (paired, not failed before it)": self.failures.text(),
                "failures": worded(self.failures.p, f"{self.arm} fails less often than {self.reference}",
                                   holds=self.failures.difference < 0)
                if self.failures.cells else "no testable pair",
                "final accuracy, arm - reference": self.accuracy.text(),
                "accuracy": worded(self.accuracy.sign_p, f"{self.arm} ends more accurate than {self.reference}",
                                   holds=self.accuracy.higher > self.accuracy.lower)
                if self.accuracy.cells else "no pair",
                "change of the update vs none": "–" if self.update_change is None else f"{self.update_change:.0%}"}


def compare(rows: List[dict], arm: str, reference: str = "none", same_start: bool = True,
            failure_from: str = "branch") -> Comparison:
    """`arm` against `reference` over their pairs: failures after the branch on the pairs whose run had
    not failed before it (McNemar), final accuracy on every pair (sign test, Wilcoxon). `failure_from`
    `alert` counts failures from the alert's step instead (a sham arm against an arm branched at the alert)."""
    found = pairs(rows, arm, reference, same_start)
    testable = [p for p in found if _int(p.reference.get("failed_before")) is None]

    def failed(row):
        step = _int(row.get("alert_step")) if failure_from == "alert" else None
        return failed_after(row, step)

    changes = [c for c in (update_change(p) for p in pairs(rows, arm, "none")) if c is not None]  # vs none, same point
    return Comparison(arm, reference,
                      compare_failures([failed(p.arm) for p in testable], [failed(p.reference) for p in testable]),
                      compare_values([_float(p.arm.get("final_accuracy")) for p in found],
                                     [_float(p.reference.get("final_accuracy")) for p in found]),
                      fmean(changes) if changes else None, len(testable))


def comparisons(rows: List[dict]) -> List[dict]:
    """Per alert kind, every arm against `none`, the matched against the control, and the sham against
    the matched (from the alert's step on): paired tests, worded by their p."""
    found = []
    for kind in sorted({r["alert_kind"] or "(a step)" for r in rows}):
        mine = [r for r in rows if (r["alert_kind"] or "(a step)") == kind]
        labels = {r["arm"] for r in mine}
        wanted = [(a, "none", True, "branch") for a in sorted(labels - {"none", "sham"})]
        if {"matched", "control"} <= labels:
            wanted.append(("matched", "control", True, "branch"))
        if {"sham", "matched"} <= labels:
            wanted.append(("sham", "matched", False, "alert"))
        for arm, reference, same_start, since in wanted:
            found.append({"alert kind": kind, **compare(mine, arm, reference, same_start, since).row()})
    return found


POOLED = "all (pairs: seed x sharing)"


def action_comparisons(rows: List[dict]) -> List[dict]:
    """Cells of a sweep with an `action` axis (one row each: sharing, seed, action, failed_at,
    final_accuracy): per sharing mode, and over both (a pair: one seed and sharing mode), every action
    against `alert` on the same seeds, failures over the whole run (McNemar exact) and final accuracy
    (sign test)."""
    by: Dict[tuple, Dict[object, dict]] = {}
    pooled = len({row["sharing"] for row in rows}) > 1  # one sharing mode: its own row is the pooled one
    for row in rows:
        by.setdefault((row["sharing"], row["action"]), {})[int(row["seed"])] = row
        if pooled:
            by.setdefault((POOLED, row["action"]), {})[(row["sharing"], int(row["seed"]))] = row
    found = []
    for (sharing, action), runs in sorted(by.items(), key=lambda kv: (kv[0][0] == POOLED, kv[0])):
        if action == "alert":
            continue
        reference = by.get((sharing, "alert"), {})
        seeds = sorted(set(runs) & set(reference), key=str)
        failures = compare_failures([_int(runs[s].get("failed_at")) is not None for s in seeds],
                                    [_int(reference[s].get("failed_at")) is not None for s in seeds])
        accuracy = compare_values([_float(runs[s].get("final_accuracy")) for s in seeds],
                                  [_float(reference[s].get("final_accuracy")) for s in seeds])
        found.append({"sharing": sharing, "action": action, "against": "alert", "seeds": len(seeds),
                      "failed (paired)": failures.text(),
                      "failures": worded(failures.p, f"{action} fails less often than alert", holds=failures.difference < 0),
                      "final accuracy, action - alert": accuracy.text(),
                      "accuracy": worded(accuracy.sign_p, f"{action} ends more accurate than alert",
                                          holds=accuracy.higher > accuracy.lower)})
    return found
