"""Objective failure labels of a run, computed after the fact from its metrics.jsonl.

The detectors (harness/monitors) raise alerts while a run trains; these labels say whether the run
actually failed, and from which step, so alerts can be scored against outcomes (recall, lead time,
false positives). The detectors never see them.

- **collapse**: sampled validation accuracy falls below `collapse_fraction` of its running best,
  by more than `collapse_se` standard errors of the difference, and stays there for
  `collapse_patience` validations. Relative, so a low-accuracy model's collapse (0.25 -> 0.08)
  counts; with its standard error, so sampling noise does not.
- **capture** (per role): the role's format compliance or its own accuracy falls by
  `capture_drop` (relative) below its early band (the first `early_steps` steps) while its
  response length moves toward another role's (the gap to that role shrank by `capture_approach`
  of its early size), both on `smooth`-step rolling means and for `capture_patience` steps.
- **contract** (per role): the role's format compliance falls by `capture_drop` (relative) below
  its early band for `capture_patience` steps, wherever its length goes.

Usage: python -m analysis.labels <run dir | sweep dir> ...
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Any, Callable, Dict, List, Optional, Sequence

from harness.run_dir import read_jsonl
from harness.monitors.detectors import significantly_below
from harness.metric_keys import role_key


@dataclass(frozen=True)
class LabelConfig:
    collapse_fraction: float = 0.7
    collapse_se: float = 2.0
    collapse_patience: int = 2  # consecutive validations
    early_steps: int = 20
    smooth: int = 10  # rolling window (steps) of the capture signals
    capture_drop: float = 0.3  # relative fall of format compliance or role accuracy
    capture_approach: float = 0.5  # share of the early length gap to another role that closed
    capture_patience: int = 10  # consecutive steps


@dataclass(frozen=True)
class FailureLabel:
    kind: str  # collapse | capture | contract
    step: int  # first step of the failure (the first validation below the bar; the first captured step)
    role: Optional[str]
    detail: str

    def record(self) -> dict:
        return asdict(self)


def collapse_label(records: Sequence[dict], cfg: LabelConfig = LabelConfig()) -> Optional[FailureLabel]:
    """The first validation that starts `collapse_patience` validations in a row below the bar."""
    validations = [(int(r["step"]), float(r["val/accuracy"]), float(r.get("val/accuracy_se", 0.0)))
                   for r in records if isinstance(r.get("val/accuracy"), (int, float))]
    best = best_se = None
    run: List[tuple] = []
    for step, accuracy, se in validations:
        if best is not None:
            below = significantly_below(accuracy, se, best, best_se, cfg.collapse_fraction, cfg.collapse_se)
            run = run + [(step, accuracy, best)] if below else []
            if len(run) >= cfg.collapse_patience:
                first, low, peak = run[0]
                return FailureLabel("collapse", first, None,
                                    f"validation accuracy {low:.3f} < {cfg.collapse_fraction:.0%} of its best "
                                    f"{peak:.3f} for {len(run)} validations from step {first}")
        if best is None or accuracy > best:
            best, best_se = accuracy, se
    return None


def _rolling(values: List[Optional[float]], window: int) -> List[Optional[float]]:
    out: List[Optional[float]] = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - window + 1): i + 1] if v is not None]
        out.append(mean(recent) if recent else None)
    return out


def _series(records: Sequence[dict], key: str) -> List[Optional[float]]:
    return [float(r[key]) if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) else None
            for r in records]


def _roles_with(records: Sequence[dict], suffix: str) -> List[str]:
    return sorted({k.split("/")[1] for r in records for k in r
                   if k.startswith("role/") and k.count("/") == 2 and k.endswith("/" + suffix)})


def _first_streak(records: Sequence[dict], start: int, patience: int, hit: Callable[[int], Any]):
    """(first step, last hit) of the first `patience` records in a row from index `start` where
    `hit(i)` is truthy, or None."""
    streak, first = 0, None
    for i in range(start, len(records)):
        found = hit(i)
        if not found:
            streak, first = 0, None
            continue
        streak, first = streak + 1, first if streak else int(records[i]["step"])
        if streak >= patience:
            return first, found
    return None


def capture_labels(records: Sequence[dict], cfg: LabelConfig = LabelConfig()) -> List[FailureLabel]:
    """One label per captured role: its job signal fell while its length moved toward another role's."""
    records = [r for r in records if "step" in r]
    roles = _roles_with(records, "response_length")
    if len(roles) < 2 or len(records) <= cfg.early_steps:
        return []
    length = {role: _rolling(_series(records, role_key(role, "response_length")), cfg.smooth) for role in roles}
    early_len = {role: [v for v in length[role][: cfg.early_steps] if v is not None] for role in roles}
    labels = []
    for role in roles:
        job_signals = {}
        for signal in ("format_ok", "accuracy"):
            series = _series(records, role_key(role, signal))
            early = [v for v in series[: cfg.early_steps] if v is not None]
            if early and mean(early) > 0:
                job_signals[signal] = (mean(early), _rolling(series, cfg.smooth))
        if not job_signals:
            continue

        def captured(i: int, role: str = role, job_signals: dict = job_signals):
            fallen = [s for s, (base, now) in job_signals.items()
                      if now[i] is not None and now[i] < (1 - cfg.capture_drop) * base]
            toward = []
            for other in roles:
                if other == role or not early_len[role] or not early_len[other] or length[role][i] is None \
                        or length[other][i] is None:
                    continue
                early_gap = abs(mean(early_len[role]) - mean(early_len[other]))
                gap = abs(length[role][i] - length[other][i])
                if early_gap > 0 and gap <= (1 - cfg.capture_approach) * early_gap:
                    toward.append(other)
            return (fallen, toward) if fallen and toward else None

        found = _first_streak(records, cfg.early_steps, cfg.capture_patience, captured)
        if found:
            first, (fallen, toward) = found
            labels.append(FailureLabel("capture", first, role,
                                       f"{role}'s {' and '.join(fallen)} fell by > {cfg.capture_drop:.0%} "
                                       f"of its early level while its length moved toward "
                                       f"{', '.join(toward)}'s, from step {first}"))
    return labels


def contract_labels(records: Sequence[dict], cfg: LabelConfig = LabelConfig()) -> List[FailureLabel]:
    """One label per role that stops honouring its output contract: its format compliance (rolling
    mean) below (1 - capture_drop) of its early level for `capture_patience` steps, wherever its
    length goes (an aggregator that writes 12 tokens instead of an index has failed at its job
    even when its length moved away from every other role's)."""
    records = [r for r in records if "step" in r]
    labels = []
    for role in _roles_with(records, "format_ok"):
        series = _series(records, role_key(role, "format_ok"))
        early = [v for v in series[: cfg.early_steps] if v is not None]
        if len(records) <= cfg.early_steps or not early or mean(early) <= 0:
            continue
        base, now = mean(early), _rolling(series, cfg.smooth)
        bar = (1 - cfg.capture_drop) * base
        found = _first_streak(records, cfg.early_steps, cfg.capture_patience,
                              lambda i, now=now, bar=bar: now[i] is not None and now[i] < bar)
        if found:
            labels.append(FailureLabel("contract", found[0], role,
                                       f"{role}'s format compliance fell from {base:.2f} to below "
                                       f"{bar:.2f} from step {found[0]}"))
    return labels


def label_records(records: Sequence[dict], cfg: LabelConfig = LabelConfig()) -> List[FailureLabel]:
    collapse = collapse_label(records, cfg)
    return ([collapse] if collapse else []) + capture_labels(records, cfg) + contract_labels(records, cfg)


def label_run(run_dir: Path, cfg: LabelConfig = LabelConfig()) -> List[FailureLabel]:
    return label_records(read_jsonl(Path(run_dir) / "metrics.jsonl"), cfg)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from analysis.load import find_runs

    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m analysis.labels <run dir | sweep dir> ...", file=sys.stderr)
        return 2
    runs = find_runs(paths)
    if not runs:
        print(f"error: no run directory (with cell.yaml) under {', '.join(paths)}", file=sys.stderr)
        return 2
    counts: Dict[str, int] = {}
    for run in runs:
        labels = label_run(run)
        for label in labels:
            counts[label.kind] = counts.get(label.kind, 0) + 1
        print(f"{run.name}: " + ("; ".join(f"{l.kind} at step {l.step}" + (f" ({l.role})" if l.role else "")
                                          for l in labels) or "no failure"))
    print(f"{len(runs)} runs: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no failure labels"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
