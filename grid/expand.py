"""Sweep -> cells: the cartesian product of the sweep's axes, plus the paired single-agent
baseline of every (scale, task, seed), each with a stable readable id and its resources.

Axis values are files of the config groups in grid/conf/<axis>/<value>.yaml holding the cell
overrides that value implies; the topology axis also takes a path to a workflow graph .yaml file
(its cells are labelled by the file's stem and run the graph); the task axis (math, code) maps to a concrete task per kind of
scale (the tiny CPU model trains on the synthetic task, Qwen3 checkpoints on the real one).
"""
from __future__ import annotations

import copy
import itertools
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent / "conf"
AXES = ("topology", "scale", "task", "sharing", "seed")


class GridError(ValueError):
    """A sweep that cannot be expanded or launched; the message names the valid choices."""


@dataclass(frozen=True)
class Resources:
    nodes: int
    gpus: int
    cpus: int
    mem_gb: int
    time_min: int
    gpu_type: Optional[str] = None  # a key of the profile's gpu_types: its sbatch constraint and token budgets

    def label(self) -> str:
        gpus = f"{self.gpus}g" + (f" {self.gpu_type}" if self.gpu_type else "")
        return f"{self.nodes}n {gpus} {self.cpus}c {self.mem_gb}G {self.time_min}m"

    @property
    def gpu_hours(self) -> float:
        """GPU-hours the cell reserves: every GPU of its nodes for its whole time limit (an upper
        bound on what it uses: a cell that finishes early gives its GPUs back)."""
        return self.nodes * self.gpus * self.time_min / 60


@dataclass
class Cell:
    cell_id: str
    axes: Dict[str, Any]
    overrides: Dict[str, Any]  # a nested dict of harness.config.CellConfig fields
    resources: Resources
    baseline_id: Optional[str] = None  # the paired single-agent cell (None for a baseline itself)
    notes: List[str] = field(default_factory=list)  # problems a dry run reports, e.g. a missing model

    @property
    def is_baseline(self) -> bool:
        return self.axes["topology"] == "single"


def choices(axis: str) -> List[str]:
    return sorted(p.stem for p in (CONF_DIR / axis).glob("*.yaml"))


def _axis_overrides(axis: str, value: Any) -> Dict[str, Any]:
    return copy.deepcopy(_load_axis(axis, str(value)))


@lru_cache(maxsize=None)
def _load_axis(axis: str, value: str) -> Dict[str, Any]:
    """An axis value's overrides, read once per expansion (cells share them)."""
    path = CONF_DIR / axis / f"{value}.yaml"
    if not path.is_file():
        raise GridError(f"unknown {axis} '{value}' in the sweep; valid choices: {_valid(axis)}")
    return OmegaConf.to_container(OmegaConf.load(path)) or {}


def _valid(axis: str) -> str:
    """An axis's valid values as an error lists them (the topology axis also takes graph files)."""
    extra = ", or a path to a workflow graph .yaml file" if axis == "topology" else ""
    return ", ".join(choices(axis)) + extra


def topology_axis(values: List[Any]) -> Dict[str, Optional[str]]:
    """The topology axis as label -> graph file: a name of grid/conf/topology maps to None; a path to
    a workflow graph .yaml maps its stem (the readable label cell ids, exclusions and tables use) to
    the absolute path its cells run (a job may start in another directory). A missing or broken
    graph file, or a label two values would share, is a GridError before any cell is made."""
    from harness.config import GRAPH_FILE_SUFFIXES, ConfigError
    from harness.workflows.graph import load_graph

    axis: Dict[str, Optional[str]] = {}
    for value in map(str, values):
        if not value.endswith(GRAPH_FILE_SUFFIXES):
            _axis_overrides("topology", value)
            label, graph = value, None
        else:
            path = Path(value).expanduser().resolve()
            if not path.is_file():
                raise GridError(f"unknown topology '{value}' in the sweep: no such graph file; "
                                f"valid choices: {_valid('topology')}")
            label, graph = path.stem, str(path)
            if label in choices("topology"):
                raise GridError(f"graph file {value} has the name of the built-in topology {label}: "
                                f"rename the file so its cells' ids tell the two apart")
            try:
                load_graph(path)
            except ConfigError as exc:
                raise GridError(f"topology {value}: {exc}") from None
        if label in axis and axis[label] != graph:
            raise GridError(f"topology axis: two graph files are named {label}: rename one so their cells' ids differ")
        axis[label] = graph
    return axis


TASK_DATA = ("checkpoint", "study")  # sweep.task_data: what the task axis maps to on Qwen3 scales
DATA_ROOT_ENV = "MARL_DATA_ROOT"


def task_overrides(task_axis: str, scale: str, task_data: str, data_root: Optional[str],
                   topology: str = "single") -> Dict[str, Any]:
    """The cell settings a task axis value implies: its concrete task (a tiny model trains on the
    synthetic task; a Qwen3 checkpoint on the sweep's `task_data`: `checkpoint`'s offline set, or
    `study`'s files under the site data root, with the study's split and validation set)."""
    from harness.models import SCALES, is_tiny

    if scale not in SCALES:
        raise GridError(f"unknown scale '{scale}' in the sweep; valid choices: {', '.join(SCALES)}")
    if task_data not in TASK_DATA:
        raise GridError(f"unknown sweep.task_data '{task_data}'; valid choices: {', '.join(TASK_DATA)}")
    mapping = _axis_overrides("task", task_axis)
    if is_tiny(scale) or task_data == "checkpoint":
        return {"task": mapping["tiny" if is_tiny(scale) else "checkpoint"]}
    study = mapping.get(task_data)
    if not study:
        raise GridError(f"task axis '{task_axis}' has no {task_data} data set (grid/conf/task/{task_axis}.yaml)")
    root = data_root or os.environ.get(DATA_ROOT_ENV) or f"${DATA_ROOT_ENV}"
    files = {key: str(Path(root).expanduser() / name) for key, name in (study.get("files") or {}).items()}
    per_topology = (study.get("topology") or {}).get(topology) or {}
    per_scale = (study.get("scale") or {}).get(scale) or {}
    return _merge(study.get("cell") or {}, per_topology, per_scale, {"task": study["task"], "data": files})


def missing_data(overrides: Dict[str, Any]) -> List[str]:
    """The data files a cell reads that are not on this machine (its train and validation files,
    a retrieval corpus)."""
    data = overrides.get("data") or {}
    return [str(data[key]) for key in ("path", "val_path", "corpus")
            if data.get(key) and not Path(os.path.expandvars(str(data[key]))).expanduser().is_file()]


def cell_id(axes: Dict[str, Any], extra: Dict[str, str]) -> str:
    """Same axis values -> same id on every machine: readable, no hashes. `axes["task"]` is the task
    the cell runs (the `math` axis runs arith on a tiny model), so the id says what trained."""
    head = ("single" if axes["topology"] == "single" else f"{axes['topology']}-{axes['sharing']}")
    tail = "".join(f"-{k}={v}" for k, v in sorted(extra.items()))
    return f"{head}-{axes['task']}-{axes['scale']}-s{axes['seed']}{tail}"


def resources_for(cluster: DictConfig, scale: str) -> Resources:
    table = cluster.resources
    if scale not in table:
        raise GridError(f"cluster profile '{cluster.name}' has no resources for scale '{scale}'; "
                        f"it lists: {', '.join(table.keys())}")
    resources = Resources(**OmegaConf.to_container(table[scale]))
    types = cluster.get("gpu_types") or {}
    if resources.gpu_type is not None and resources.gpu_type not in types:
        raise GridError(f"cluster profile '{cluster.name}': scale {scale} asks for gpu_type '{resources.gpu_type}', "
                        f"which its gpu_types do not list ({', '.join(types) or 'none'})")
    return resources


def gpu_type_overrides(cluster: DictConfig, resources: Resources, scale: str) -> Dict[str, Any]:
    """The token budget per GPU a scale can train with on the cell's GPU type (the study's
    ppo_max_token_len_per_gpu: it depends on GPU memory and model size)."""
    if resources.gpu_type is None:
        return {}
    budgets = (cluster.gpu_types[resources.gpu_type].get("max_token_len_per_gpu") or {})
    return {"verl": {"max_token_len_per_gpu": int(budgets[scale])}} if scale in budgets else {}


def _merge(*parts: Dict[str, Any]) -> Dict[str, Any]:
    """Later parts win; dicts merge key by key, anything else (lists too) is replaced, as OmegaConf merges."""
    merged: Dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


def expand(sweep: DictConfig, cluster: DictConfig, root: str) -> List[Cell]:
    axes = {name: list(sweep.axes[name]) for name in AXES}
    graphs = topology_axis(axes["topology"])
    axes["topology"] = list(graphs)
    for name in ("sharing", "scale", "task"):
        for value in axes[name]:
            _axis_overrides(name, value)  # unknown values fail before anything else happens
    bad_seeds = [s for s in axes["seed"] if isinstance(s, bool) or not str(s).lstrip("-").isdigit() or int(s) < 0]
    if bad_seeds:
        raise GridError(f"sweep.axes.seed must be non-negative integers, got {', '.join(map(str, bad_seeds))}")
    extra_axes = _extra_axes(sweep)
    paired = _paired_axes(sweep, extra_axes)
    excluded = _exclusions(sweep)
    base = OmegaConf.to_container(sweep.cell) if sweep.get("cell") is not None else {}
    own = _topology_cells(sweep, axes["topology"])
    data = (str(sweep.get("task_data") or "checkpoint"), (base.get("data") or {}).get("root"))
    cells: Dict[str, Cell] = {}
    extra_product = list(itertools.product(*[[(name, label) for label in labels]
                                             for name, labels in sorted(extra_axes.items())])) or [()]
    for topology, scale, task, sharing, seed in itertools.product(*[axes[n] for n in AXES]):
        point = {"topology": topology, "scale": scale, "task": task, "sharing": sharing, "seed": int(seed)}
        baseline_point = {**point, "topology": "single", "sharing": "sp"}
        for extras in extra_product:
            extra = dict(extras)
            if any(_matches({**point, **extra}, rule) for rule in excluded):
                continue
            extra_overrides = [extra_axes[name][label] or {} for name, label in extras]
            cell = _make_cell(point, extra, _merge(base, own.get(topology, {})), extra_overrides, sweep.name, root,
                              cluster, data, graphs[topology])
            if sweep.get("baseline", True) and topology != "single":
                shared = [(name, label) for name, label in extras if name in paired]
                baseline = _make_cell(baseline_point, dict(shared), base,
                                      [extra_axes[name][label] or {} for name, label in shared],
                                      sweep.name, root, cluster, data)
                _add(cells, baseline)
                cell.baseline_id = baseline.cell_id
                _reference_run(cell, baseline)
            _add(cells, cell)
    return list(cells.values())


def _topology_cells(sweep: DictConfig, topologies: List[str]) -> Dict[str, Dict[str, Any]]:
    """`topology_cell: {<topology>: {...}}`: one workflow's own cell settings within the sweep, over
    `cell` (D's reward allocator in sweep=unitymas); a topology the sweep does not run is an error."""
    own = _plain(sweep.get("topology_cell")) or {}
    unknown = sorted(set(own) - set(topologies))
    if unknown:
        raise GridError(f"sweep.topology_cell names {', '.join(unknown)}, not on the sweep's topology axis; "
                        f"valid: {', '.join(topologies)}")
    return {name: dict(settings or {}) for name, settings in own.items()}


def _add(cells: Dict[str, Cell], cell: Cell) -> None:
    """A cell under its id, once. Two task axes may run one task at a scale (`math` and `arith` both
    train arith on a tiny model): those cells are one run; a multi-agent id shared by cells that differ
    otherwise is a GridError, never a cell silently dropped. A single agent's id has no sharing mode
    (one role, one policy): the first of its sharing-axis twins stands for it, as it always has."""
    known = cells.setdefault(cell.cell_id, cell)

    def setting(c: Cell) -> Dict[str, Any]:
        return {**c.overrides, "extra": {k: v for k, v in c.overrides.get("extra", {}).items() if k != "task_axis"}}

    if known is not cell and not cell.is_baseline and setting(known) != setting(cell):
        raise GridError(f"two cells of the sweep would both be {cell.cell_id} with different settings "
                        f"(task axes {known.axes['task']} and {cell.axes['task']}): drop one of the task axes")


def _extra_axes(sweep: DictConfig) -> Dict[str, Dict[str, Any]]:
    """`extra_axes: {name: {label: overrides}}`, or `{name: [label, ...]}` for an axis that is itself a
    cell setting (mitigation: each label sets `mitigation=<label>`)."""
    raw = _plain(sweep.get("extra_axes")) or {}
    if not isinstance(raw, dict):
        raise GridError(f"sweep.extra_axes must map an axis name to its labels, got {raw!r}")
    axes: Dict[str, Dict[str, Any]] = {}
    for name, values in raw.items():
        if isinstance(values, list):
            axes[name] = {str(label): {name: str(label)} for label in values}
        elif isinstance(values, dict):
            axes[name] = values
        else:
            raise GridError(f"sweep.extra_axes.{name} must be a list of labels or a mapping label -> overrides, "
                            f"got {values!r}")
    return axes


def _paired_axes(sweep: DictConfig, extra_axes: Dict[str, Dict[str, Any]]) -> List[str]:
    """`paired_axes: [setting]`: extra axes the paired single-agent baseline shares with its cells
    (a training setting such as lr: a cell must be compared with a baseline trained the same way);
    the others (a mitigation, an induced failure) leave the baseline as it is."""
    names = _plain(sweep.get("paired_axes")) or []
    if not isinstance(names, list) or any(name not in extra_axes for name in names):
        raise GridError(f"sweep.paired_axes must list extra axes of the sweep ({', '.join(extra_axes) or 'none'}), "
                        f"got {names!r}")
    return [str(name) for name in names]


def _exclusions(sweep: DictConfig) -> List[Dict[str, str]]:
    """`exclude: [{sharing: sp, mitigation: role_count_scaling}, ...]`: drop every cell matching all of
    one entry's axis values (so a sweep need not run a mitigation where it cannot act)."""
    rules = _plain(sweep.get("exclude")) or []
    if not isinstance(rules, list) or not all(isinstance(r, dict) and r for r in rules):
        raise GridError(f"sweep.exclude must be a list of {{axis: value}} mappings, got {rules!r}")
    return [{str(k): str(v) for k, v in rule.items()} for rule in rules]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _matches(axes: Dict[str, Any], rule: Dict[str, str]) -> bool:
    return all(str(axes.get(axis)) == value for axis, value in rule.items())


def _reference_run(cell: Cell, baseline: Cell) -> None:
    """The amplification detector compares a cell's drift with its paired single-agent run's, the
    collapse detector its training accuracy (on the same problems, step for step)."""
    monitors = cell.overrides.setdefault("monitors", {})
    if monitors.get("reference_run") is None:
        monitors["reference_run"] = str(Path(baseline.overrides["root"]) / baseline.overrides["sweep"]
                                        / baseline.cell_id)


def _make_cell(point: Dict[str, Any], extra: Dict[str, str], base: Dict[str, Any], extra_overrides: List[dict],
               sweep_name: str, root: str, cluster: DictConfig, data: Tuple[str, Optional[str]],
               graph: Optional[str] = None) -> Cell:
    """One cell; `graph` is the workflow graph file a topology label stands for (None: a named topology)."""
    resources = resources_for(cluster, point["scale"])
    task = task_overrides(point["task"], point["scale"], *data, topology=point["topology"])
    identity = cell_id({**point, "task": task["task"]}, extra)
    overrides = _merge(
        _budgets(point["task"], point["scale"], point["topology"]),
        _engine_placement(resources),
        {k: v for k, v in task.items() if k != "task"},
        base,
        {} if graph else _axis_overrides("topology", point["topology"]),
        _axis_overrides("sharing", point["sharing"]),
        _axis_overrides("scale", point["scale"]),
        gpu_type_overrides(cluster, resources, point["scale"]),
        *extra_overrides,
        {"topology": graph or point["topology"], "sharing": point["sharing"], "scale": point["scale"],
         "task": task["task"], "seed": point["seed"],
         "sweep": sweep_name, "root": str(root), "cell_id": identity,
         "extra": {"task_axis": point["task"], **extra}},
    )
    return Cell(identity, {**point, **extra}, overrides, resources)


def _budgets(task_axis: str, scale: str, topology: str) -> Dict[str, Any]:
    """The task axis's token budgets for Qwen3 scales: its `default`, then the topology's own."""
    from harness.models import is_tiny

    budgets = _axis_overrides("task", task_axis).get("checkpoint_budgets") or {}
    if is_tiny(scale):
        return {}
    return _merge(budgets.get("default") or {}, budgets.get(topology) or {})


def _engine_placement(resources: Resources) -> Dict[str, Any]:
    """engine=verl on a cell with GPUs: every policy's worker group spans all of them (colocated).
    The sweep or scale files may still override it (e.g. placement=split with fewer per policy)."""
    if resources.gpus <= 0:
        return {}
    return {"verl": {"gpus_per_policy": resources.gpus * resources.nodes}}


def check_cells(cells: List[Cell], strict: bool) -> int:
    """Validate every cell's config as harness.run would. strict: raise on the first problem
    (launch); otherwise record problems in cell.notes (dry run) and return how many cells are
    invalid (a missing data file alone does not make a cell invalid: the dry run lists it)."""
    from harness.config import ConfigError
    from harness.validation import config_from_dict

    invalid = 0
    for cell in cells:
        missing = missing_data(cell.overrides)
        if missing:
            hint = (f" (set sweep.cell.data.root= or ${DATA_ROOT_ENV})"
                    if any(f"${DATA_ROOT_ENV}" in m for m in missing) else "")
            if strict:
                raise GridError(f"cell {cell.cell_id}: missing data files: {', '.join(missing)}{hint}")
            cell.notes.append(f"missing data: {', '.join(missing)}{hint}")
        try:
            config_from_dict(cell.overrides)
        except ConfigError as exc:
            if strict:
                raise GridError(f"cell {cell.cell_id}: {exc}") from None
            if not (missing and str(exc).startswith("data.")):  # already listed above
                cell.notes.append(str(exc).splitlines()[0])
                invalid += 1
    return invalid


def table(cells: List[Cell]) -> str:
    rows: List[Tuple[str, ...]] = [("cell", "baseline", "resources", "GPU-h", "task", "check")]
    for c in cells:
        rows.append((c.cell_id, c.baseline_id or "-", c.resources.label(), f"{c.resources.gpu_hours:g}",
                     c.overrides["task"], "; ".join(c.notes) or "ok"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)
