"""Did multi-agent RL beat single-agent RL? Per cell, peak and final validation accuracy and the
difference to its paired baseline (same sweep, scale, task and seed); across seeds, the mean
difference with a 95% paired t confidence interval; the grid table (rows topology x sharing,
columns scale, one table per task); best and worst cells; each cell's failure modes from the
objective labels of analysis/labels.py (what happened), with the alerts its detectors raised beside
them (what was predicted): a healthy cell whose detector fired has an alert and no failure mode.

    python -m analysis.compare <sweep dir> [<sweep dir> ...] --out <dir>
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from analysis.load import RunsNotFound, load_alerts, load_cells, load_metrics
from analysis.tables import to_markdown

FAILURE_MODES = ("collapse", "capture", "contract")  # the labels' kinds (analysis/labels.py)
ALERT_KINDS = ("amplification", "capture", "length_drift", "collapse", "non_finite")
PAIR_KEYS = ["sweep_dir", "scale", "task_axis", "seed"]  # a baseline pairs within its own sweep directory


def mean_ci(values: Sequence[float], level: float = 0.95) -> Tuple[float, float, float, int]:
    """Mean and the two-sided t interval of the mean; NaN bounds with fewer than two values."""
    from scipy import stats

    data = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = len(data)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(data.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * data.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half, n


DERIVED_PREFIXES = ("first_", "baseline_", "gain_", "peak_", "final_")  # columns summarize/paired_gains add


def extra_axes(frame: pd.DataFrame) -> List[str]:
    """The grid's extra axes (e.g. mitigation): columns that are neither cell fields nor derived."""
    from analysis.load import CELL_COLUMNS

    return [c for c in frame.columns if c not in CELL_COLUMNS and c not in ("failure_modes", "alerts")
            and not c.startswith(DERIVED_PREFIXES)]


def _labels(run_dir: str) -> list:
    from analysis.labels import label_run

    return label_run(Path(run_dir)) if (Path(run_dir) / "metrics.jsonl").is_file() else []


HEADLINE_COLUMNS = ["val/accuracy", "val/episode/f1"]


def headline(task: str) -> Tuple[str, str]:
    """(metric column, its name) a task's tables lead with: token F1 on QA (UnityMAS-O's; EM beside it
    in the workflow table), the validation accuracy elsewhere (exact answer, all tests passed)."""
    from harness.tasks import QA_TASKS

    return ("val/episode/f1", "F1") if task in QA_TASKS else ("val/accuracy", "accuracy")


def headline_name(tasks: Sequence[str]) -> str:
    return " / ".join(sorted({headline(str(t))[1] for t in tasks})) or "accuracy"


def accuracy_summary(cells: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: peak and final validation figure of its task's headline metric (all
    paired_gains needs)."""
    summary = cells.copy()
    peak, final = {}, {}
    for column in HEADLINE_COLUMNS:
        if column not in metrics:
            continue
        val = metrics[["run_dir", "step", column]].dropna().sort_values("step")
        peak[column] = val.groupby("run_dir")[column].max()
        final[column] = val.groupby("run_dir")[column].last()
    keys = [headline(str(task))[0] for task in summary["task"]] if "task" in summary else ["val/accuracy"] * len(summary)
    summary["peak_val"] = [peak[k].get(run, math.nan) if k in peak else math.nan for k, run in zip(keys, summary["run_dir"])]
    summary["final_val"] = [final[k].get(run, math.nan) if k in final else math.nan for k, run in zip(keys, summary["run_dir"])]
    return summary


def summarize(cells: pd.DataFrame, metrics: pd.DataFrame, alerts: pd.DataFrame) -> pd.DataFrame:
    """accuracy_summary, with the first step of each failure mode (labels) and `failure_modes` naming
    them (with the role), and `alerts`: each alert kind's first step."""
    summary = accuracy_summary(cells, metrics)
    labels = {run: sorted(_labels(run), key=lambda label: (label.step, label.kind)) for run in summary["run_dir"]}
    for mode in FAILURE_MODES:
        summary[f"first_{mode}"] = [min((l.step for l in labels[run] if l.kind == mode), default=math.nan)
                                    for run in summary["run_dir"]]
    summary["failure_modes"] = [", ".join(f"{l.kind}" + (f"({l.role})" if l.role else "") + f"@{l.step}"
                                          for l in labels[run]) for run in summary["run_dir"]]
    first = alerts.groupby(["run_dir", "kind"])["step"].min() if len(alerts) else pd.Series(dtype=float)
    summary["alerts"] = [", ".join(f"{k}@{int(first[(run, k)])}" for k in ALERT_KINDS if (run, k) in first.index)
                         for run in summary["run_dir"]]
    return summary


def paired_gains(summary: pd.DataFrame) -> pd.DataFrame:
    """Multi-agent cells with their baseline's accuracy and the differences (cell - baseline). An
    extra axis that the baselines carry too (a sweep's `paired_axes`, e.g. the lr setting) is part
    of the pairing: a cell is compared with the baseline trained the same way."""
    singles = summary[summary["topology"] == "single"]
    shared_axes = [c for c in extra_axes(summary) if singles[c].notna().any()]
    keys = PAIR_KEYS + shared_axes
    baselines = singles[keys + ["cell_id", "peak_val", "final_val"]]
    baselines = baselines.rename(columns={"cell_id": "baseline_id", "peak_val": "baseline_peak",
                                          "final_val": "baseline_final"})
    multi = summary[summary["topology"] != "single"]
    merged = multi.merge(baselines, on=keys, how="left")
    merged["gain_peak"] = merged["peak_val"] - merged["baseline_peak"]
    merged["gain_final"] = merged["final_val"] - merged["baseline_final"]
    return merged


def grid_tables(gains: pd.DataFrame, metric: str = "gain_final") -> Dict[str, pd.DataFrame]:
    """Per task: rows topology x sharing (x extra axes), columns scale; cells 'mean [lo, hi] (n)'."""
    rows = ["topology", "sharing"] + extra_axes(gains)
    tables = {}
    for task, part in gains.groupby("task_axis"):
        stats = part.groupby(rows + ["scale"])[metric].apply(lambda s: mean_ci(list(s)))
        frame = stats.apply(_format_ci).unstack("scale")
        tables[str(task)] = frame
    return tables


def ci_frame(gains: pd.DataFrame, metric: str = "gain_final") -> pd.DataFrame:
    """The same statistics as numbers: mean, ci_low, ci_high, n per (topology, sharing, ..., scale, task)."""
    keys = ["task_axis", "topology", "sharing", "scale"] + extra_axes(gains)
    rows = []
    for key, part in gains.groupby(keys):
        mean, low, high, n = mean_ci(list(part[metric]))
        rows.append({**dict(zip(keys, key)), "mean": mean, "ci_low": low, "ci_high": high, "n": n})
    return pd.DataFrame(rows)


def seeds_sentence(ci: pd.DataFrame) -> str:
    """How many seeds stand behind the tables, in one sentence a reader needs before trusting them."""
    counts = sorted({int(n) for n in ci["n"]}) if len(ci) else []
    if not counts:
        return "No multi-agent cell has a paired baseline yet, so no gains are shown."
    no_ci = "rows with n=1 carry no confidence interval: one seed gives no spread."
    if counts == [1]:
        return f"Each entry is the gain of a single seed (n=1); {no_ci}"
    if counts[0] == 1:
        return (f"Each entry is the mean over 1 to {counts[-1]} seeds (n per entry) with a 95% paired t confidence "
                f"interval where n > 1; {no_ci}")
    seeds = f"{counts[0]} seeds" if len(counts) == 1 else f"{counts[0]} to {counts[-1]} seeds"
    return f"Each entry is the mean over {seeds} (n per entry) with a 95% paired t confidence interval."


def _format_ci(stat: Tuple[float, float, float, int]) -> str:
    mean, low, high, n = stat
    if math.isnan(mean):
        return "n/a"
    if math.isnan(low):
        return f"{mean:+.3f} (n={n})"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] (n={n})"


def best_and_worst(gains: pd.DataFrame, k: int = 3, metric: str = "gain_final") -> Tuple[pd.DataFrame, pd.DataFrame]:
    """The k best cells and the k worst, never the same cell in both: with 2k cells or fewer the
    worst are the ones not among the best (none at all with k or fewer)."""
    ranked = gains.dropna(subset=[metric]).sort_values(metric, ascending=False)
    columns = ["cell_id", "baseline_id", metric, "final_val", "baseline_final", "failure_modes", "alerts"]
    best = ranked[columns].head(k)
    worst = ranked[columns].iloc[len(best):].tail(k).iloc[::-1]
    return best, worst


def compare(paths) -> dict:
    """Every cell under `paths` (any depth) against its paired baseline; raises RunsNotFound where a
    path is missing or holds no run."""
    cells = load_cells(paths)
    metrics = load_metrics(paths, columns=HEADLINE_COLUMNS)
    alerts = load_alerts(paths)
    summary = summarize(cells, metrics, alerts)
    gains = paired_gains(summary)
    best, worst = best_and_worst(gains)
    return {"cells": summary, "gains": gains, "tables": grid_tables(gains), "tables_peak": grid_tables(gains, "gain_peak"),
            "ci": ci_frame(gains), "best": best, "worst": worst, "alerts": alerts}


CELL_TABLE = ["cell_id", "baseline_id", "peak_val", "final_val", "baseline_final", "gain_peak", "gain_final",
              "state", "failure_modes", "alerts"]


def markdown(result: dict) -> str:
    parts = ["# Multi-agent RL vs single-agent baselines", ""]
    for task, table in result["tables"].items():
        parts += [f"## Task {task}: final validation accuracy minus the paired baseline's "
                  f"(mean [95% CI] over seeds)", "", seeds_sentence(result["ci"]), "", to_markdown(table.reset_index()), ""]
    gains = result["gains"]
    if len(gains):
        parts += ["## Cells", "", to_markdown(gains[CELL_TABLE]), ""]
        parts += ["## Best cells", "", to_markdown(result["best"]), "",
                  "## Worst cells", "", to_markdown(result["worst"]), ""]
    return "\n".join(parts)


def write_outputs(result: dict, out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(name: str, text: str) -> None:
        (out / name).write_text(text)
        written.append(out / name)

    save("cells.csv", result["cells"].to_csv(index=False))
    save("gains.csv", result["gains"].to_csv(index=False))
    save("ci.csv", result["ci"].to_csv(index=False))
    save("comparison.md", markdown(result))
    for task, table in result["tables"].items():
        save(f"grid_{task}.csv", table.to_csv())
        save(f"grid_{task}.tex", table.to_latex(caption=f"Final validation accuracy gain over the single-agent "
                                                        f"baseline, task {task} (mean [95\\% CI])",
                                                label=f"tab:gain-{task}"))
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="sweep (or run) directories")
    parser.add_argument("--out", required=True, help="where to write CSV, Markdown and LaTeX")
    args = parser.parse_args(argv)
    try:
        result = compare(args.dirs)
    except RunsNotFound as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    for path in write_outputs(result, Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
