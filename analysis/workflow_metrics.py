"""The numbers UnityMAS-O reports for a workflow, per cell: the task metric (EM and token F1 for
search QA, the all-passed rate for code), the loop's rounds or searches used, early (first 20
steps) and late (last 20 steps), and the validation figures; and per agent: reward and advantage
means, samples, prompt and output tokens, calls per episode and the format-legal rate."""
from __future__ import annotations

from typing import List

import pandas as pd
from harness.metric_keys import role_key

WINDOW = 20  # steps: "first 20 vs last 20", as the docs quote them; shorter runs get half their steps


def window_for(steps: int) -> int:
    """The early/late window: WINDOW steps, or half the run when it is shorter than two windows (a
    10-step run compares its first 5 with its last 5 rather than the same 10 with themselves)."""
    return max(1, min(WINDOW, steps // 2))
EPISODE_KEYS = ("accuracy", "episode/f1", "episode/rounds", "episode/searches")
AGENT_KEYS = (("reward", "reward"), ("advantage_mean", "adv mean"), ("samples", "samples"),
              ("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens"), ("calls", "calls"),
              ("format_ok", "format legal"))


def _label(key: str, task: str) -> str:
    from harness.tasks import CODE_TASKS

    if key == "accuracy":
        return "all passed" if task in CODE_TASKS else "EM" if task in ("qa-synth", "nq", "hotpotqa") else "accuracy"
    return key.split("/")[-1].replace("f1", "F1")


def workflow_rows(metrics: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: each episode metric's first-N and last-N means (N: `window_for` the shortest
    run, so every row compares the same window; in `.attrs["window"]`), and final validation EM/F1
    or accuracy."""
    rows: List[dict] = []
    steps = metrics.groupby("cell_id")["accuracy"].count() if "accuracy" in metrics else pd.Series(dtype=int)
    lengths = [int(steps.get(c, 0)) for c in cells["cell_id"]]
    window = window_for(min([n for n in lengths if n] or [2 * WINDOW]))
    for _, cell in cells.iterrows():
        mine = metrics[metrics["cell_id"] == cell["cell_id"]].sort_values("step")
        train = mine[mine["accuracy"].notna()] if "accuracy" in mine else mine.iloc[0:0]
        row = {"cell_id": cell["cell_id"], "topology": cell["topology"], "sharing": cell["sharing"],
               "task": cell["task"], "steps": len(train)}
        for key in EPISODE_KEYS:
            if key in train and train[key].notna().any():
                label = _label(key, str(cell["task"]))
                row[f"{label} first {window}"] = train[key].head(window).mean()
                row[f"{label} last {window}"] = train[key].tail(window).mean()
        for key in ("val/accuracy", "val/episode/f1"):
            if key in mine and mine[key].notna().any():
                row[f"val {_label(key.split('val/')[1], str(cell['task']))} final"] = mine[key].dropna().iloc[-1]
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["window"] = window
    return frame


def paper_table(metrics: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """UnityMAS-O's results table: rows workflow x sharing, columns scale; each the task's headline
    validation metric (F1 on QA, the all-passed rate on code) before training (the validation of
    the untrained policy, `val/updates` 0) and its peak over training, mean over seeds. A run logged
    before validation came first (its first validation after one update) has no "before": NaN."""
    from analysis.compare import headline
    from harness.tasks import CODE_TASKS

    rows = []
    for _, cell in cells.iterrows():
        column, name = headline(str(cell["task"]))
        if column not in metrics:
            continue
        columns = ["step", column] + (["val/updates"] if "val/updates" in metrics else [])
        val = metrics.loc[metrics["cell_id"] == cell["cell_id"], columns].dropna(subset=[column]).sort_values("step")
        if val.empty:
            continue
        untrained = val[val["val/updates"] == 0] if "val/updates" in val else val.iloc[:0]
        rows.append({"workflow": cell["topology"], "sharing": cell["sharing"], "scale": cell["scale"],
                     "metric": "all passed" if cell["task"] in CODE_TASKS else name,
                     "before": untrained[column].iloc[0] if len(untrained) else float("nan"),
                     "peak": val[column].max()})
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows).groupby(["workflow", "sharing", "metric", "scale"])[["before", "peak"]].mean()
    wide = frame.unstack("scale")
    wide.columns = [f"{scale} {when}" for when, scale in wide.columns]
    ordered = sorted(wide.columns, key=lambda c: (c.rsplit(" ", 1)[0], c.endswith("peak")))
    return wide[ordered].reset_index()


def agent_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per agent (role) of one run: the mean over training steps of what UnityMAS-O logs."""
    train = metrics[metrics["accuracy"].notna()] if "accuracy" in metrics else metrics
    roles = sorted({c.split("/")[1] for c in train.columns if c.startswith("role/") and c.endswith("/calls")})
    rows = []
    for role in roles:
        row = {"agent": role}
        for key, label in AGENT_KEYS:
            column = role_key(role, key)
            if column in train:
                row[label] = train[column].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def columns_needed() -> List[str]:
    return ["accuracy", "val/accuracy", "val/episode/f1", *EPISODE_KEYS]
