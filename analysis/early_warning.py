"""Fit the learned early warning on design cells, and score it as every warning is scored.

Examples come from the aligned table (analysis/indicators.py): each failing cell of a contrasting
setting read 10, 20 and 30 steps before its failure is a positive; every surviving cell of that
setting at those same steps is a negative (seed = group). The model is an L2 logistic regression
over standardised windowed features (missing = the design mean): up to `MAX_FEATURES` are chosen by
forward selection from the indicator table's top candidates, and the L2 strength from `C_GRID`,
both by the pooled out-of-fold AUROC of a cross-validation that keeps each seed's cells in one fold.
Its threshold is the lowest score whose false-positive rate over the negatives is at most
`TARGET_FPR`. Live, harness/monitors/learned.py reads the same features every `every` steps;
`first_alerts` replays exactly that on an aligned table, so held-out seeds are scored by the
detector-validation protocol (alerts before the failure only, against the config-only baseline).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from analysis.indicators import EVERY, LEADS, _read_steps, _setting, feature_columns
from harness.monitors.features import WINDOW
from harness.monitors.learned import LearnedModel

MAX_FEATURES = 4
CANDIDATES = 20
C_GRID = (0.1, 1.0, 10.0)
FOLDS = 5
TARGET_FPR = 0.1
MIN_GAIN = 0.005  # out-of-fold AUROC a further feature must add


def examples(table: pd.DataFrame, arms: Sequence[str], leads: Sequence[int] = LEADS) -> pd.DataFrame:
    """Positive rows (failing cells at their read steps) and negative rows (the setting's surviving
    cells at the same steps), with `label`, `lead` (nan for negatives) and `seed`."""
    parts = []
    for arm in arms:
        part = table[table["arm"] == arm]
        if part.empty:
            continue
        setting = _setting(part, [])
        failing = ~np.isnan(setting.failure_steps)
        positives, steps = [], set()
        for lead in leads:
            read = _read_steps(setting, setting.failure_steps[failing], lead)
            for c, s in zip(np.nonzero(failing)[0], read):
                if s >= 0:
                    positives.append((setting.cells[c], setting.steps[s], lead))
                    steps.add(setting.steps[s])
        pos = part.merge(pd.DataFrame(positives, columns=["cell", "step", "lead"]), on=["cell", "step"])
        pos = pd.concat([pos, pd.DataFrame({"label": [1] * len(pos)})], axis=1)
        survivors = [setting.cells[c] for c in np.nonzero(~failing)[0]]
        neg = part[part["cell"].isin(survivors) & part["step"].isin(steps)].reset_index(drop=True)
        neg = pd.concat([neg, pd.DataFrame({"lead": [math.nan] * len(neg), "label": [0] * len(neg)})], axis=1)
        parts += [pos, neg]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """P(a positive scores above a negative), ties half (nan without both)."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, int)
    pos, neg = scores[labels == 1], scores[labels == 0]
    if not len(pos) or not len(neg):
        return math.nan
    ranks = pd.Series(np.concatenate([pos, neg])).rank().to_numpy()
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _standardise(frame: pd.DataFrame, features: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    values = frame[features].to_numpy(float)
    mean = np.nanmean(values, axis=0)
    scale = np.nanstd(values, axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    z = (values - mean) / scale
    return np.nan_to_num(z, nan=0.0), mean, scale


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float) -> Tuple[np.ndarray, float]:
    """Minimise the log-loss plus ||w||^2 / (2c) (the intercept unpenalised)."""
    def loss(theta):
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        value = np.sum(np.logaddexp(0, z) - y * z) + w @ w / (2 * c)
        p = 1 / (1 + np.exp(-z))
        grad = np.concatenate([x.T @ (p - y) + w / c, [np.sum(p - y)]])
        return value, grad

    theta = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B").x
    return theta[:-1], float(theta[-1])


def _folds(groups: np.ndarray, k: int = FOLDS) -> List[np.ndarray]:
    seeds = sorted(set(groups.tolist()), key=str)
    return [np.isin(groups, seeds[i::k]) for i in range(min(k, len(seeds)))]


def cv_auroc(x: np.ndarray, y: np.ndarray, groups: np.ndarray, c: float) -> float:
    """Pooled out-of-fold AUROC, each seed's rows held out together."""
    scores = np.full(len(y), np.nan)
    for test in _folds(groups):
        train = ~test
        if len(set(y[train].tolist())) < 2:
            continue
        w, b = fit_logistic(x[train], y[train], c)
        scores[test] = x[test] @ w + b
    ok = ~np.isnan(scores)
    return auroc(scores[ok], y[ok])


def candidates(indicators: pd.DataFrame, n: int = CANDIDATES) -> List[str]:
    """The indicator table's best-ranked distinct signals (it is sorted by p)."""
    return list(dict.fromkeys(indicators["signal"]))[:n]


def fit(rows: pd.DataFrame, pool: Sequence[str], source: str) -> Tuple[LearnedModel, List[dict]]:
    """Forward selection over `pool` by grouped-CV AUROC; returns the model refitted on every row,
    and the selection's steps (feature added, C, out-of-fold AUROC)."""
    y, groups = rows["label"].to_numpy(int), rows["seed"].astype(str).to_numpy()
    chosen: List[str] = []
    best, best_c, steps = 0.5, C_GRID[0], []
    while len(chosen) < MAX_FEATURES:
        trials = []
        for name in pool:
            if name in chosen or name not in rows:
                continue
            x, _, _ = _standardise(rows, chosen + [name])
            for c in C_GRID:
                trials.append((cv_auroc(x, y, groups, c), name, c))
        trials = [t for t in trials if not math.isnan(t[0])]
        if not trials:
            break
        score, name, c = max(trials, key=lambda t: (t[0], -C_GRID.index(t[2]), t[1]))
        if score < best + MIN_GAIN:
            break
        chosen.append(name)
        best, best_c = score, c
        steps.append({"added": name, "C": c, "out-of-fold AUROC": score})
    if not chosen:
        raise ValueError("no feature separates the design examples better than chance: nothing to fit")
    x, mean, scale = _standardise(rows, chosen)
    w, b = fit_logistic(x, y, best_c)
    model = LearnedModel(chosen, _rounded(mean), _rounded(scale), _rounded(w), _rounded([b])[0], 1.0, EVERY, WINDOW,
                         source)
    negatives = [model.score(dict(zip(chosen, v))) for v in rows.loc[y == 0, chosen].to_numpy(float)]
    model.threshold = float(f"{threshold_for(negatives, TARGET_FPR):.6g}")
    return model, steps


def _rounded(values) -> List[float]:
    """6 significant digits: the model file is the same on every machine (the optimiser's last bits
    are not), and scores are computed from the file as it ships."""
    return [float(f"{v:.6g}") for v in values]


def threshold_for(negatives: Sequence[float], fpr: float) -> float:
    """The lowest observed score t with mean(negatives >= t) <= fpr (above every negative if none)."""
    values = np.sort(np.asarray(negatives, float))
    for t in np.unique(values):
        if np.mean(values >= t) <= fpr:
            return float(t)
    return float(np.nextafter(values.max(), np.inf)) if len(values) else 0.5


def scores(model: LearnedModel, table: pd.DataFrame) -> np.ndarray:
    present = [f for f in model.features if f in table]
    values = table[present].to_numpy(float)
    return np.array([model.score(dict(zip(present, row))) for row in values])


def first_alerts(model: LearnedModel, table: pd.DataFrame) -> Dict[str, int]:
    """Per cell, the first aligned step whose score reaches the threshold (what the live detector
    raises: it reads the same features at the same steps)."""
    scored = table[["cell", "step"]].assign(score=scores(model, table))
    fired = scored[scored["score"] >= model.threshold]
    return {cell: int(step) for cell, step in fired.groupby("cell")["step"].min().items()}


def auroc_by_lead(model: LearnedModel, table: pd.DataFrame, arms: Sequence[str],
                  leads: Sequence[int] = LEADS) -> List[dict]:
    out = []
    for lead in leads:
        rows = examples(table, arms, [lead])
        if rows.empty:
            continue
        out.append({"lead": lead, "failing reads": int(rows["label"].sum()),
                    "surviving reads": int((rows["label"] == 0).sum()),
                    "AUROC": auroc(scores(model, rows), rows["label"].to_numpy(int))})
    return out



def describe(model: Optional[LearnedModel]) -> str:
    if model is None:
        return "(no model)"
    terms = " ".join(f"{'+' if c >= 0 else '-'} {abs(c):.2f} z({f})" for f, c in zip(model.features, model.coef))
    return f"score = sigmoid({model.intercept:+.2f} {terms}); alert at score >= {model.threshold:.3f}"
