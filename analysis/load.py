"""Run directories -> tidy pandas DataFrames: cells, per-step metrics, alerts.

Accepts a run directory, a sweep directory or a root holding several sweeps; tolerates running
cells (status.json says running, metrics still growing), torn last lines and missing files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Union

import pandas as pd
import yaml

from harness.logging import iter_jsonl

PathLike = Union[str, Path]
CELL_COLUMNS = ["cell_id", "sweep", "sweep_dir", "topology", "sharing", "task", "task_axis", "scale", "seed", "steps", "state",
                "step", "reason", "best_val", "run_dir"]


def find_runs(paths: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """Every run directory (one holding cell.yaml) at or below the given paths, sorted."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found = set()
    for path in map(Path, paths):
        if (path / "cell.yaml").is_file():
            found.add(path)
        elif path.is_dir():
            found.update(p.parent for p in path.glob("*/cell.yaml"))
            found.update(p.parent for p in path.glob("*/*/cell.yaml"))
    return sorted(found)


def _cell_row(run: Path) -> dict:
    cfg = yaml.safe_load((run / "cell.yaml").read_text()) or {}
    try:
        status = json.loads((run / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        status = {}
    extra = cfg.get("extra") or {}
    row = {
        "cell_id": cfg.get("cell_id") or run.name, "sweep": cfg.get("sweep"), "sweep_dir": str(run.parent),
        "topology": cfg.get("topology"),
        "sharing": "sp" if cfg.get("topology") == "single" else cfg.get("sharing"), "task": cfg.get("task"),
        "task_axis": extra.get("task_axis", cfg.get("task")), "scale": cfg.get("scale"), "seed": cfg.get("seed"),
        "steps": cfg.get("steps"), "state": status.get("state", "pending"), "step": status.get("step", 0),
        "reason": status.get("reason"), "best_val": status.get("best_val"), "run_dir": str(run),
    }
    for key, value in extra.items():  # extra grid axes (e.g. mitigation) become columns
        if key != "task_axis":
            row[key] = value
    return row


def load_cells(paths) -> pd.DataFrame:
    rows = [_cell_row(run) for run in find_runs(paths)]
    frame = pd.DataFrame(rows)
    return frame if rows else pd.DataFrame(columns=CELL_COLUMNS)


def _records(runs: Iterable[Path], name: str) -> List[dict]:
    records = []
    for run in runs:
        cell_id = run.name
        for record in iter_jsonl(run / name):
            record["cell_id"] = cell_id
            record["run_dir"] = str(run)
            records.append(record)
    return records


def load_metrics(paths, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per (cell, step); metric keys are columns. `columns` keeps only those keys."""
    records = _records(find_runs(paths), "metrics.jsonl")
    if columns is not None:
        keep = set(columns) | {"cell_id", "run_dir", "step"}
        records = [{k: v for k, v in r.items() if k in keep} for r in records]
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame(columns=["cell_id", "step"])
    for column in frame.columns:  # non-finite values are logged as strings ("nan", "inf")
        if frame[column].dtype == object and column not in ("cell_id", "run_dir"):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame.sort_values(["cell_id", "step"], kind="stable").reset_index(drop=True)


def load_alerts(paths) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(_records(find_runs(paths), "alerts.jsonl"))
    if frame.empty:
        return pd.DataFrame(columns=["cell_id", "step", "kind", "role", "policy", "value", "threshold", "message",
                                     "action", "signal"])
    return frame.sort_values(["cell_id", "step"], kind="stable").reset_index(drop=True)


def load_samples(run: PathLike) -> List[dict]:
    return list(iter_jsonl(Path(run) / "samples.jsonl"))
