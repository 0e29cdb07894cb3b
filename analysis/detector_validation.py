"""How well the early-stop detectors predict real failures, over a sweep.

Each run gets its objective failure labels (analysis/labels.py, computed after the fact from its
metrics; the detectors never saw them). A detector is scored against the failures it is meant to
warn of (`TARGETS`): on failing cells, **recall** is the share where its first alert came at or
before the failure step and **lead** the steps between them; on cells with no failure at all
that it can fire on (`watched_by`: a single agent has no multi-instance policy to amplify), the
**false-positive rate** is the share where it fired anyway. Per arm (a cell's settings less
its seed) the failure rate comes with a 95% Wilson interval, and each mitigated arm is compared
with the same settings unmitigated (difference of failure rates, Newcombe 95% interval). `BAR` is
the detector issue's validation bar (recall >= 0.8, median lead >= 10 steps, false positives <= 0.1).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import pandas as pd
import yaml

from analysis.labels import FailureLabel, LabelConfig, label_records
from analysis.load import find_runs
from harness.logging import read_jsonl

if TYPE_CHECKING:
    from harness.config import MonitorConfig

# which failures each detector is an early warning of. length_drift is capture's (the detector
# issue: "a verdict/index/plan role growing is capture's early warning"); a contract failure whose
# length does not move toward another role's (an IP aggregator's own adapter losing its index
# format, with no other role's gradient in it) is not capture. Contract failures still count in
# the failure rates, and `failure_coverage` says which detector, if any, warned of each kind.
TARGETS: Dict[str, Tuple[str, ...]] = {"amplification": ("collapse",), "collapse": ("collapse",),
                                       "capture": ("capture",), "length_drift": ("capture",)}
FAILURE_KINDS = ("collapse", "capture", "contract")


@dataclass
class RunOutcome:
    run_dir: Path
    cell_id: str
    arm: str
    labels: List[FailureLabel]
    first_alert: Dict[str, int]  # detector kind -> first step it fired
    watched: Set[str] = field(default_factory=lambda: set(TARGETS))  # detectors with something to watch here

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


def replay_setup(run: Path) -> Tuple[MonitorConfig, Dict[str, List[str]]]:
    """The detectors' context of a logged run, as it was live: default settings with the paired
    single-agent run of the same sweep directory as `monitors.reference_run` (the one the run
    recorded, looked up by name beside it, since a sweep directory may have moved; else the grid's
    id for it), and the role -> policy map from status.json."""
    from harness.config import MonitorConfig, upgrade_stored
    from harness.monitors.settle import role_policies_of

    from grid.expand import cell_id

    cell = upgrade_stored(yaml.safe_load((run / "cell.yaml").read_text()) or {})
    monitors = MonitorConfig()
    task_axis = (cell.get("extra") or {}).get("task_axis", cell.get("task"))
    recorded = (cell.get("monitors") or {}).get("reference_run")
    paired = run.parent / (Path(recorded).name if recorded else
                           cell_id({"topology": "single", "task": task_axis, "scale": cell.get("scale"),
                                    "seed": cell.get("seed")}, {}))
    if cell.get("topology") != "single" and (paired / "metrics.jsonl").is_file():
        monitors.reference_run = str(paired)
    status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
    return monitors, role_policies_of(status)


def replayed_alerts(records: List[dict], monitors: MonitorConfig, role_policies: Dict[str, List[str]]) -> List[dict]:
    """The alerts today's detectors raise on a run's logged metrics, as they would have live (in the
    context replay_setup gives). For re-scoring a sweep after the detectors changed; the run's own
    alerts.jsonl stays as it was."""
    from harness.monitors import Monitor

    monitor = Monitor(monitors, role_policies)
    return [a.record() for record in records for a in monitor.observe(record)]


def watched_by(records: List[dict], paired_reference: bool = False) -> Set[str]:
    """The detectors that can fire on a run at all, from what its metrics hold: amplification needs a
    policy trained by >= 2 role instances and something to compare it with (the paired single-agent
    run, else a one-instance policy in the cell), capture two roles, length_drift a short-contract
    role, collapse validations. A cell built so that a detector cannot fire (a single agent, one
    adapter per instance) is silent by construction: counting it as a true negative would lower the
    false-positive rate by how the sweep is composed, not by what the detector does."""
    from harness.config import MonitorConfig
    from harness.monitors.detectors import names_in

    roles = {role for r in records for role in names_in(r, "role", "response_length")}
    kinds = {"collapse"} if any(isinstance(r.get("val/accuracy"), (int, float)) for r in records) else set()
    instances = [r[f"policy/{p}/instances"] for r in records for p in names_in(r, "policy", "instances")
                 if isinstance(r[f"policy/{p}/instances"], (int, float))]
    if any(n >= 2 for n in instances) and (paired_reference or any(n < 2 for n in instances)):
        kinds.add("amplification")
    if len(roles) >= 2:
        kinds.add("capture")
    if roles & set(MonitorConfig().drift.roles):
        kinds.add("length_drift")
    return kinds


def outcomes(sweep: Path, cfg: LabelConfig = LabelConfig(), replay: bool = False,
             until: Optional[int] = None) -> List[RunOutcome]:
    """Every run's labels and first alerts; with `until`, only its steps below `until` count, as
    if the sweep had stopped there (the same cells scored at a shorter horizon: the first steps
    of a longer run are those of the shorter one under a constant learning rate)."""
    results = []
    for run in find_runs(sweep):
        cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
        monitors, role_policies = replay_setup(run)
        records = read_jsonl(run / "metrics.jsonl")
        first: Dict[str, int] = {}
        for alert in (replayed_alerts(records, monitors, role_policies) if replay
                      else read_jsonl(run / "alerts.jsonl")):
            kind, step = alert.get("kind"), alert.get("step")
            if kind in TARGETS and isinstance(step, int) and (until is None or step < until) \
                    and (kind not in first or step < first[kind]):
                first[kind] = step
        if until is not None:
            records = [r for r in records if isinstance(r.get("step"), int) and r["step"] < until]
        paired = monitors.reference_run is not None
        results.append(RunOutcome(run, cell.get("cell_id") or run.name, arm_of(cell), label_records(records, cfg),
                                  first, watched_by(records, paired) | set(first)))
    return results


def wilson(k: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """95% Wilson score interval of a proportion k/n (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# the detector issue's bar: a detector is validated when, over >= 5 seeds, it meets all three
BAR = {"recall": 0.8, "median lead (steps)": 10.0, "false-positive rate": 0.1}


def meets_bar(row: dict) -> str:
    """yes, or no with what falls short ("no: lead 3 < 10"), or "not measurable" where the sweep has
    no failing or no healthy cell to score it on."""
    if not row["failing cells"] or not row["healthy cells"]:
        return "not measurable"
    recall, lead, fpr = (row["recall"], row["median lead (steps)"], row["false-positive rate"])
    short = []
    if not recall >= BAR["recall"]:
        short.append(f"recall {recall:.2f} < {BAR['recall']:g}")
    if math.isnan(lead) or lead < BAR["median lead (steps)"]:
        short.append("no lead" if math.isnan(lead) else f"lead {lead:g} < {BAR['median lead (steps)']:g}")
    if not fpr <= BAR["false-positive rate"]:
        short.append(f"false positives {fpr:.3f} > {BAR['false-positive rate']:g}")
    return "no: " + ", ".join(short) if short else "yes"


def newcombe(k1: int, n1: int, k2: int, n2: int) -> Tuple[float, float]:
    """95% interval of the difference of two proportions k1/n1 - k2/n2 (Newcombe's hybrid score
    method, from the two Wilson intervals)."""
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1), wilson(k2, n2)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def mitigation_effects(results: List[RunOutcome]) -> pd.DataFrame:
    """Each mitigated arm against the same settings without mitigation: failure rates, their
    difference with a 95% interval, and whether the interval shows the mitigated arm lower."""
    by_arm: Dict[str, List[RunOutcome]] = {}
    for r in results:
        by_arm.setdefault(r.arm, []).append(r)
    rows = []
    for arm, part in sorted(by_arm.items()):
        match = re.search(r"mitigation=(\S+)", arm)
        if not match or match.group(1) == "none":
            continue
        control = by_arm.get(arm.replace(match.group(0), "mitigation=none"))
        if not control:
            continue
        k1, n1 = sum(bool(r.labels) for r in part), len(part)
        k2, n2 = sum(bool(r.labels) for r in control), len(control)
        low, high = newcombe(k1, n1, k2, n2)
        verdict = ("lower" if high < 0 else "higher" if low > 0 else
                   "not shown lower: the interval includes 0")
        rows.append({"arm": arm, "failed": f"{k1}/{n1}", "without mitigation": f"{k2}/{n2}",
                     "difference": k1 / n1 - k2 / n2, "95% CI (Newcombe)": f"[{low:+.2f}, {high:+.2f}]",
                     "verdict": verdict})
    return pd.DataFrame(rows)


def detector_scores(results: List[RunOutcome]) -> pd.DataFrame:
    rows = []
    healthy = [r for r in results if not r.labels]
    for kind, targets in TARGETS.items():
        failing = [r for r in results if r.failure_step(targets) is not None]
        leads = [r.failure_step(targets) - r.first_alert[kind] for r in failing
                 if kind in r.first_alert and r.first_alert[kind] <= r.failure_step(targets)]
        watching = [r for r in healthy if kind in r.watched]
        false = sum(kind in r.first_alert for r in watching)
        rows.append({"detector": kind, "warns of": ", ".join(targets), "failing cells": len(failing),
                     "caught in time": len(leads), "recall": len(leads) / len(failing) if failing else float("nan"),
                     "median lead (steps)": median(leads) if leads else float("nan"),
                     "healthy cells": len(watching), "fired on healthy": false,
                     "false-positive rate": false / len(watching) if watching else float("nan"),
                     "false-positive 95% CI": "[{:.2f}, {:.2f}]".format(*wilson(false, len(watching))),
                     "healthy, silent by construction": len(healthy) - len(watching)})
        rows[-1]["meets the bar"] = meets_bar(rows[-1])
    return pd.DataFrame(rows)


def failure_coverage(results: List[RunOutcome]) -> pd.DataFrame:
    """Per failure kind (and any failure): the failing cells that some detector warned of in time
    (a first alert of amplification, capture, length_drift or collapse at or before the failure
    step, whatever failure that detector targets), the median lead of the earliest
    such alert and which detector came first. What a user watching every alert would have seen,
    including failures no detector targets."""
    rows = []
    for kind in FAILURE_KINDS + ("any failure",):
        kinds = FAILURE_KINDS if kind == "any failure" else (kind,)
        failing = [r for r in results if r.failure_step(kinds) is not None]
        leads, first_by = [], {}
        for r in failing:
            step = r.failure_step(kinds)
            in_time = {detector: alert for detector, alert in r.first_alert.items() if alert <= step}
            if in_time:
                first = min(in_time, key=lambda detector: (in_time[detector], detector))
                leads.append(step - in_time[first])
                first_by[first] = first_by.get(first, 0) + 1
        rows.append({"failure": kind, "failing cells": len(failing), "warned in time": len(leads),
                     "share": len(leads) / len(failing) if failing else float("nan"),
                     "median lead (steps)": median(leads) if leads else float("nan"),
                     "first warned by": ", ".join(f"{d} {n}" for d, n in sorted(first_by.items())) or "–"})
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

