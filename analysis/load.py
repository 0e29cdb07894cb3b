"""Run directories -> tidy pandas DataFrames: cells, per-step metrics (wide and long), alerts.

Accepts a run directory, a sweep directory or any folder above them (runs are found at any depth);
tolerates running cells (status.json says running, metrics still growing), torn last lines and
missing files. A path that does not exist, or holds no run directory, raises `RunsNotFound`
instead of returning empty frames that would read as "nothing happened".

    from analysis.load import load_cells, load_metrics, load_metrics_long
    cells = load_cells("runs/smoke")                        # one row per cell: its axes, state, run_dir
    wide = load_metrics("runs/smoke", columns=["val/accuracy"])  # one row per (cell, step)
    long = load_metrics_long("runs/smoke")                  # one row per (cell, step, role, metric)
    long[long.metric == "grad_norm"].pivot_table(index="step", columns="role", values="value")
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import pandas as pd
import yaml

from harness.config import topology_label
from harness.run_dir import iter_jsonl

PathLike = Union[str, Path]
CELL_COLUMNS = ["cell_id", "sweep", "sweep_dir", "topology", "sharing", "task", "task_axis", "scale", "seed", "steps", "state",
                "step", "reason", "best_val", "run_dir"]


class RunsNotFound(FileNotFoundError):
    """A path to load from does not exist, or holds no run directory (one with cell.yaml)."""


def _is_run(path: Path) -> bool:
    return (path / "cell.yaml").is_file()


def _walk_runs(top: Path) -> Iterator[Path]:
    """Run directories at or below `top`, at any depth. A run directory is not searched further
    (its checkpoints and wandb files hold no runs); symlinked folders are followed once each, so a
    root of links to several sweeps loads them all."""
    seen = set()
    for folder, subfolders, _ in os.walk(top, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        if _is_run(Path(folder)):
            subfolders[:] = []
            yield Path(folder)
        else:
            subfolders.sort()


def find_runs(paths: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """Every run directory (one holding cell.yaml) at or below the given paths, at any depth,
    sorted; an empty list where there is none (see `runs_under` for the loaders' strict form)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found = set()
    for path in map(Path, paths):
        if path.is_dir():
            found.update(_walk_runs(path))
    return sorted(found)


def runs_under(paths: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """`find_runs`, but a path that does not exist or a search that finds no run raises
    `RunsNotFound` with one line that says which."""
    listed = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not listed:
        raise RunsNotFound("no path given to load runs from")
    missing = [str(p) for p in listed if not Path(p).exists()]
    if missing:
        raise RunsNotFound(f"no such directory: {', '.join(missing)} (working directory {Path.cwd()})")
    runs = find_runs(listed)
    if not runs:
        raise RunsNotFound(f"no run directories (folders with cell.yaml) at any depth under "
                           f"{', '.join(map(str, listed))}")
    return runs


def repository_root() -> Optional[Path]:
    """The checkout this package was imported from (an editable install or PYTHONPATH), if any."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def find_sweep(path: PathLike) -> Path:
    """Where a sweep given on the command line or in $SWEEP_DIR is: an absolute path as it is; a
    relative one against the working directory, then against each folder above it, then against
    the repository root (a notebook's kernel runs in the notebook's folder, not at the root)."""
    path = Path(path).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        cwd = Path.cwd()
        candidates = [folder / path for folder in (cwd, *cwd.parents)]
        root = repository_root()
        if root is not None:
            candidates.append(root / path)
    for candidate in candidates:
        if candidate.is_dir():
            runs_under(candidate)  # exists but holds no run: say so here rather than later
            return candidate
    tried = ", ".join(dict.fromkeys(str(c) for c in candidates[:1] + candidates[-1:]))
    raise RunsNotFound(f"no such directory: {path} (looked in {tried} and the folders between)"
                       if len(candidates) > 1 else f"no such directory: {path}")


def _cell_row(run: Path) -> dict:
    cfg = yaml.safe_load((run / "cell.yaml").read_text()) or {}
    try:
        status = json.loads((run / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        status = {}
    extra = cfg.get("extra") or {}
    row = {
        "cell_id": cfg.get("cell_id") or run.name, "sweep": cfg.get("sweep"), "sweep_dir": str(run.parent),
        "topology": topology_label(cfg["topology"]) if cfg.get("topology") else None,  # a graph file by its stem
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
    """One row per run directory: its cell id, axes, state, step and path."""
    return pd.DataFrame([_cell_row(run) for run in runs_under(paths)])


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
    records = _records(runs_under(paths), "metrics.jsonl")
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


ROLE_KEY = r"^(?P<val>val/)?role/(?P<role>[^/]+)/(?P<tail>.+)$"  # role/<r>/<metric>, val/role/<r>/<metric>
LONG_COLUMNS = ["cell_id", "step", "role", "metric", "value", "run_dir"]


def load_metrics_long(paths, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per (cell, step, role, metric): the long form of `load_metrics`, for grouping and
    plotting across roles. `role/<r>/<m>` gives role r and metric m (`val/role/<r>/<m>`: metric
    `val/<m>`); every other key (`reward/mean`, `policy/<p>/drift`) has no role and keeps its full
    name as the metric. Steps where a metric was not logged have no row."""
    wide = load_metrics(paths, columns)
    keys = [c for c in wide.columns if c not in ("cell_id", "run_dir", "step")]
    long = wide.melt(id_vars=["cell_id", "run_dir", "step"], value_vars=keys, var_name="key", value_name="value")
    long = long.dropna(subset=["value"])
    parts = long["key"].str.extract(ROLE_KEY)
    is_role = parts["role"].notna()
    long["role"] = parts["role"]
    long["metric"] = long["key"].where(~is_role, parts["val"].fillna("") + parts["tail"])
    long["value"] = long["value"].astype(float)
    return long[LONG_COLUMNS].sort_values(["cell_id", "step", "metric"], kind="stable").reset_index(drop=True)


def load_alerts(paths) -> pd.DataFrame:
    """One row per alert record, with the cell it came from."""
    frame = pd.DataFrame.from_records(_records(runs_under(paths), "alerts.jsonl"))
    if frame.empty:
        return pd.DataFrame(columns=["cell_id", "step", "kind", "role", "policy", "value", "threshold", "message",
                                     "action", "signal"])
    return frame.sort_values(["cell_id", "step"], kind="stable").reset_index(drop=True)


def load_samples(run: PathLike) -> List[dict]:
    return list(iter_jsonl(Path(run) / "samples.jsonl"))
