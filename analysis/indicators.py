"""What warns, asked of the data: every logged signal of failing and surviving cells of the same
setting, compared a fixed lead before each failure.

**Aligned table** (`aligned_table`): per multi-agent cell, its windowed features
(harness/monitors/features.py, the numbers the live detectors read) every `EVERY` steps from the
monitors' first step, with the cell's first failure label (any kind) beside them.

**Indicator table** (`indicator_table`): for a lead L, each failing cell is read at the last
aligned step at least L steps before its failure, and every cell of its setting at that same step.
Per feature the cells of a setting at a step are ranked (percentile 0..1; ties share); the effect is
the failing cells' mean percentile minus 0.5 (0: nothing separates them; +0.5: every failing cell
above every other cell of its setting L steps before it failed). Its 95% interval resamples the
failing cells by seed; its p-value permutes, within each setting, which cells failed (and at which
of the setting's failure steps), the ranks fixed; q-values are Benjamini-Hochberg over every
feature and lead. A planted signal that leads the failure ranks first (tests/test_indicators.py).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from analysis.labels import FailureLabel, label_records
from harness.monitors.features import SignalWindow

EVERY = 5  # steps between aligned reads (a failure at step F is read at L..L+EVERY-1 steps before it)
LEADS = (10, 20, 30)
ID_COLUMNS = ["split", "cell", "arm", "seed", "failure_step", "failure", "step"]


@dataclass
class CellStream:
    """A cell's logged steps and its paired single agent's, as the search reads them."""

    cell: str
    arm: str
    seed: Optional[int]
    records: List[dict]
    paired: Dict[int, dict] = field(default_factory=dict)  # step -> the paired run's record
    labels: List[FailureLabel] = field(default_factory=list)
    start: int = 10

    @property
    def failure(self) -> Optional[FailureLabel]:
        return min(self.labels, key=lambda label: label.step) if self.labels else None


def load_cells(sweep: Path) -> List[CellStream]:
    """The sweep's multi-agent cells with their labels and paired runs (single agents are the pairs)."""
    import yaml

    from analysis.detector_validation import arm_of, replay_setup
    from analysis.load import find_runs
    from harness.run_dir import read_jsonl

    cells = []
    for run in find_runs(sweep):
        cfg = yaml.safe_load((run / "cell.yaml").read_text()) or {}
        if cfg.get("topology") == "single" or not (run / "metrics.jsonl").is_file():
            continue
        context = replay_setup(run)
        records = read_jsonl(run / "metrics.jsonl")
        paired = {}
        if context.monitors.reference_run:
            paired = {r["step"]: r for r in read_jsonl(Path(context.monitors.reference_run) / "metrics.jsonl")
                      if isinstance(r.get("step"), int)}
        cells.append(CellStream(cfg.get("cell_id") or run.name, arm_of(cfg), cfg.get("seed"), records, paired,
                                label_records(records), context.start))
    return cells


def aligned_rows(cell: CellStream, split: str = "", every: int = EVERY) -> List[dict]:
    """The cell's features every `every` steps from its monitors' first step (causal: a row reads
    the steps up to its own)."""
    window, rows = SignalWindow(), []
    failure = cell.failure
    for record in sorted((r for r in cell.records if isinstance(r.get("step"), int)), key=lambda r: r["step"]):
        step = record["step"]
        window.update(record, cell.paired.get(step))
        if step >= cell.start and step % every == 0:
            rows.append({"split": split, "cell": cell.cell, "arm": cell.arm, "seed": cell.seed,
                         "failure_step": failure.step if failure else math.nan,
                         "failure": failure.kind if failure else "", "step": step, **window.features()})
    return rows


def aligned_table(cells: Sequence[CellStream], split: str = "", every: int = EVERY) -> pd.DataFrame:
    rows = [row for cell in cells for row in aligned_rows(cell, split, every)]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(ID_COLUMNS + [k for r in rows for k in r])))


def feature_columns(table: pd.DataFrame) -> List[str]:
    return [c for c in table.columns if c not in ID_COLUMNS]


def contrasting_arms(table: pd.DataFrame) -> List[str]:
    """The settings with at least two failing and two surviving cells: only there can a signal say
    something the setting does not."""
    per_cell = table.groupby("cell").agg(arm=("arm", "first"), failed=("failure_step", lambda s: s.notna().any()))
    counts = per_cell.groupby("arm")["failed"].agg(["sum", "count"])
    return sorted(counts.index[(counts["sum"] >= 2) & (counts["count"] - counts["sum"] >= 2)])


@dataclass
class _Setting:
    """One setting's cells as arrays: percentiles[cell, step, feature], steps, failure steps."""

    cells: List[str]
    seeds: List[object]
    steps: np.ndarray
    percentiles: np.ndarray
    failure_steps: np.ndarray  # per cell, nan for survivors


def _setting(part: pd.DataFrame, features: List[str]) -> _Setting:
    cells = sorted(part["cell"].unique())
    steps = np.array(sorted(part["step"].unique()))
    values = np.full((len(cells), len(steps), len(features)), np.nan)
    index = {c: i for i, c in enumerate(cells)}
    where = {s: i for i, s in enumerate(steps)}
    ci = part["cell"].map(index).to_numpy()
    si = part["step"].map(where).to_numpy()
    values[ci, si, :] = part[features].to_numpy(dtype=float)
    percentiles = np.full_like(values, np.nan)
    for s in range(len(steps)):  # rank the setting's cells at each step, per feature (nan: unranked)
        frame = pd.DataFrame(values[:, s, :])
        ranks = frame.rank(axis=0, method="average")
        counts = frame.notna().sum(axis=0).to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            percentiles[:, s, :] = np.where(counts > 1, (ranks.to_numpy() - 1) / (counts - 1), np.nan)
    first = part.groupby("cell")["failure_step"].first()
    seeds = part.groupby("cell")["seed"].first()
    return _Setting(cells, [seeds[c] for c in cells], steps, percentiles,
                    np.array([first[c] for c in cells], dtype=float))


Assignment = List[tuple]  # per setting: (cell indices, step indices) of its failing cells, as arrays


def _effects(settings: List[_Setting], assignment: Assignment, n_features: int) -> np.ndarray:
    """Mean over failing cells of (percentile - 0.5) per feature."""
    total, count = np.zeros(n_features), np.zeros(n_features)
    for setting, (cells, steps) in zip(settings, assignment):
        if len(cells):
            rows = setting.percentiles[cells, steps] - 0.5
            total += np.nansum(rows, axis=0)
            count += (~np.isnan(rows)).sum(axis=0)
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _read_steps(setting: _Setting, failure_steps: np.ndarray, lead: int) -> np.ndarray:
    """Per failure step, the index of the last aligned step at least `lead` before it (-1: none)."""
    return np.searchsorted(setting.steps, failure_steps - lead, side="right") - 1


def _observed(settings: List[_Setting], lead: int) -> Assignment:
    assignment = []
    for setting in settings:
        cells = np.nonzero(~np.isnan(setting.failure_steps))[0]
        steps = _read_steps(setting, setting.failure_steps[cells], lead)
        assignment.append((cells[steps >= 0], steps[steps >= 0]))
    return assignment


def _permuted(settings: List[_Setting], lead: int, rng: np.random.Generator) -> Assignment:
    """Within each setting: as many random cells as failed, given the setting's failure steps in a random order."""
    assignment = []
    for setting in settings:
        failure_steps = setting.failure_steps[~np.isnan(setting.failure_steps)]
        cells = rng.choice(len(setting.cells), size=len(failure_steps), replace=False)
        steps = _read_steps(setting, failure_steps, lead)
        assignment.append((cells[steps >= 0], steps[steps >= 0]))
    return assignment


def _bootstrap(settings: List[_Setting], observed: Assignment, n_features: int, resamples: int,
               rng: np.random.Generator) -> np.ndarray:
    """The effect over failing cells resampled by seed (a seed's cells share one paired run)."""
    rows = [(setting.seeds[c], setting.percentiles[c, s] - 0.5) for setting, (cells, steps) in zip(settings, observed)
            for c, s in zip(cells, steps)]
    clusters: Dict[object, List[np.ndarray]] = {}
    for seed, row in rows:
        clusters.setdefault(seed, []).append(row)
    keys = list(clusters)
    stacked = [np.vstack(clusters[k]) for k in keys]
    out = np.full((resamples, n_features), np.nan)
    for b in range(resamples):
        picks = np.vstack([stacked[i] for i in rng.integers(0, len(keys), len(keys))])
        with warnings.catch_warnings():  # a feature no resampled cell has stays nan
            warnings.simplefilter("ignore", RuntimeWarning)
            out[b] = np.nanmean(picks, axis=0)
    return out


def bh_qvalues(p: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (nan stays nan)."""
    p = np.asarray(p, dtype=float)
    q = np.full_like(p, np.nan)
    ok = np.nonzero(~np.isnan(p))[0]
    if not len(ok):
        return q
    order = ok[np.argsort(p[ok])]
    m = len(order)
    ranked = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    return q


def indicator_table(table: pd.DataFrame, arms: Optional[Sequence[str]] = None, leads: Sequence[int] = LEADS,
                    permutations: int = 20000, resamples: int = 2000, seed: int = 0,
                    signals: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per (feature, lead): failing cells read, the effect (mean percentile - 0.5) with its
    95% interval, the permutation p within setting and the BH q over all rows; ranked by p, then
    by the effect's size."""
    arms = list(arms) if arms is not None else contrasting_arms(table)
    features = [c for c in (signals or feature_columns(table))
                if c in table and table.loc[table["arm"].isin(arms), c].notna().any()]
    settings = [_setting(table[table["arm"] == arm], features) for arm in arms]
    rng = np.random.default_rng(seed)
    rows = []
    for lead in leads:
        observed = _observed(settings, lead)
        n_read = sum(len(cells) for cells, _ in observed)
        if not n_read:
            continue
        effect = _effects(settings, observed, len(features))
        extreme = np.zeros(len(features))
        for _ in range(permutations):
            null = _effects(settings, _permuted(settings, lead, rng), len(features))
            extreme += np.abs(np.nan_to_num(null, nan=0.0)) >= np.abs(effect) - 1e-12
        p = (extreme + 1) / (permutations + 1)
        boot = _bootstrap(settings, observed, len(features), resamples, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = np.nanpercentile(boot, 2.5, axis=0), np.nanpercentile(boot, 97.5, axis=0)
        for j, name in enumerate(features):
            if math.isnan(effect[j]):
                continue
            rows.append({"signal": name, "lead": lead, "failing cells read": n_read, "effect": effect[j],
                         "95% CI": f"[{low[j]:+.2f}, {high[j]:+.2f}]", "p": p[j]})
    out = pd.DataFrame(rows, columns=["signal", "lead", "failing cells read", "effect", "95% CI", "p", "q"])
    if len(out):
        out["q"] = bh_qvalues(out["p"])
        out = out.sort_values(["p", "effect"], key=lambda s: s if s.name == "p" else -s.abs(),
                              kind="stable").reset_index(drop=True)
    return out


def aligned_at_failure(table: pd.DataFrame, signal: str, arms: Sequence[str], lags: Sequence[int]) -> pd.DataFrame:
    """For the trajectory plot: per lag before the failure (0 = the failure's step), the median
    percentile of `signal` among failing cells and among the survivors of their setting at the
    same steps."""
    rows = []
    for arm in arms:
        setting = _setting(table[table["arm"] == arm], [signal])
        failing = ~np.isnan(setting.failure_steps)
        for c in np.nonzero(failing)[0]:
            for lag in lags:
                s = int(_read_steps(setting, setting.failure_steps[c:c + 1], lag)[0])
                if s < 0:
                    continue
                rows.append({"lag": -lag, "group": "failing", "value": setting.percentiles[c, s, 0]})
                rows += [{"lag": -lag, "group": "surviving", "value": v}
                         for v in setting.percentiles[~failing, s, 0] if not math.isnan(v)]
    frame = pd.DataFrame(rows, columns=["lag", "group", "value"])
    return frame.groupby(["group", "lag"])["value"].median().reset_index() if len(frame) else frame
