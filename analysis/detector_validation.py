"""How well the early-stop detectors predict real failures, over a sweep.

Each run gets its objective failure labels (analysis/labels.py, computed after the fact from its
metrics; the detectors never saw them). A detector is scored against the failures it is meant to
warn of (`TARGETS`): on failing cells, **recall** is the share where its first alert came at or
before the failure step and **lead** the steps between them; on cells with no failure at all,
the **false-positive rate** is the share where it fired anyway. Per arm (a cell's settings less
its seed) the failure rate comes with a 95% Wilson interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Dict, List, Optional, Tuple

import pandas as pd
import yaml

from analysis.labels import FailureLabel, LabelConfig, label_run
from analysis.load import find_runs
from harness.logging import read_jsonl

# which failures each detector is an early warning of
TARGETS: Dict[str, Tuple[str, ...]] = {"amplification": ("collapse",), "collapse": ("collapse",),
                                       "capture": ("capture",), "length_drift": ("capture",)}


@dataclass
class RunOutcome:
    run_dir: Path
    cell_id: str
    arm: str
    labels: List[FailureLabel]
    first_alert: Dict[str, int]  # detector kind -> first step it fired

    def failure_step(self, kinds: Tuple[str, ...]) -> Optional[int]:
        steps = [label.step for label in self.labels if label.kind in kinds]
        return min(steps) if steps else None


def arm_of(cfg: dict) -> str:
    """The cell's settings without its seed: topology, sharing, extra axes (mitigations), task, scale."""
    topology = cfg.get("topology", "?")
    head = topology if topology == "single" else f"{topology}-{cfg.get('sharing', '?')}"
    extra = {k: v for k, v in (cfg.get("extra") or {}).items() if k != "task_axis"}
    tail = "".join(f" {k}={v}" for k, v in sorted(extra.items()))
    return f"{head}{tail} ({cfg.get('task', '?')}, {cfg.get('scale', '?')})"


def outcomes(sweep: Path, cfg: LabelConfig = LabelConfig()) -> List[RunOutcome]:
    results = []
    for run in find_runs(sweep):
        cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
        first: Dict[str, int] = {}
        for alert in read_jsonl(run / "alerts.jsonl"):
            kind, step = alert.get("kind"), alert.get("step")
            if kind in TARGETS and isinstance(step, int) and (kind not in first or step < first[kind]):
                first[kind] = step
        results.append(RunOutcome(run, cell.get("cell_id") or run.name, arm_of(cell), label_run(run, cfg), first))
    return results


def wilson(k: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def detector_scores(results: List[RunOutcome]) -> pd.DataFrame:
    rows = []
    healthy = [r for r in results if not r.labels]
    for kind, targets in TARGETS.items():
        failing = [r for r in results if r.failure_step(targets) is not None]
        leads = [r.failure_step(targets) - r.first_alert[kind] for r in failing
                 if kind in r.first_alert and r.first_alert[kind] <= r.failure_step(targets)]
        false = sum(kind in r.first_alert for r in healthy)
        rows.append({"detector": kind, "warns of": ", ".join(targets), "failing cells": len(failing),
                     "caught in time": len(leads), "recall": len(leads) / len(failing) if failing else float("nan"),
                     "median lead (steps)": median(leads) if leads else float("nan"),
                     "healthy cells": len(healthy), "fired on healthy": false,
                     "false-positive rate": false / len(healthy) if healthy else float("nan")})
    return pd.DataFrame(rows)


def arm_failure_rates(results: List[RunOutcome]) -> pd.DataFrame:
    rows = []
    for arm in sorted({r.arm for r in results}):
        part = [r for r in results if r.arm == arm]
        failed = sum(bool(r.labels) for r in part)
        low, high = wilson(failed, len(part))
        kinds = sorted({label.kind for r in part for label in r.labels})
        rows.append({"arm": arm, "cells": len(part), "failed": failed, "failure rate": failed / len(part),
                     "95% CI": f"[{low:.2f}, {high:.2f}]", "failure kinds": ", ".join(kinds) or "–"})
    return pd.DataFrame(rows)


def cell_table(results: List[RunOutcome]) -> pd.DataFrame:
    rows = []
    for r in results:
        failure = min((label.step for label in r.labels), default=None)
        rows.append({"cell": r.cell_id, "arm": r.arm,
                     "failure": "; ".join(f"{l.kind}{' (' + l.role + ')' if l.role else ''} at {l.step}"
                                          for l in r.labels) or "–",
                     **{f"first_{kind}": r.first_alert.get(kind, float("nan")) for kind in TARGETS},
                     "first_failure": failure if failure is not None else float("nan")})
    return pd.DataFrame(rows)


def seeds_of(results: List[RunOutcome]) -> int:
    """Seeds per arm (the smallest count): the figures rest on at least this many repeats."""
    counts: Dict[str, int] = {}
    for r in results:
        counts[r.arm] = counts.get(r.arm, 0) + 1
    return min(counts.values()) if counts else 0

