"""Submit cells through submitit: local processes (bounded parallelism) or SLURM job arrays.

Idempotent: a cell that finished or stopped early is skipped; one that is running (its lock is
held, or its SLURM job is still queued or running) is left alone; anything else — never run,
failed, cancelled, timed out — is submitted and resumes from its own checkpoint. Each job runs
`harness.run` for its cell; jobs are Checkpointable, so a preempted or timed-out job requeues
itself and resumes where its last checkpoint left it.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import submitit

from grid.expand import Cell, GridError, Resources


class CellJob(submitit.helpers.Checkpointable):
    """The callable a job runs: train (or resume) one cell. On timeout or preemption submitit
    calls `checkpoint`, which requeues the same call; the cell resumes from its checkpoint."""

    def __call__(self, overrides: Dict) -> str:
        os.environ.pop("WANDB_SERVICE", None)  # the job owns its wandb service
        os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        from harness.run import run_cell
        from harness.validation import config_from_dict

        if int(os.environ.get("SLURM_PROCID", "0")) > 0:  # a multi-node cell's task on another node: the cell
            return "worker"  # runs once, from the first task; Ray's workers there are ray-up's own job steps
        cfg = config_from_dict(overrides)
        path = Path(cfg.root) / cfg.sweep / cfg.cell_id
        deadline = time.time() + 120
        while lock_held(path) and time.time() < deadline:  # a cancelled predecessor still dying
            time.sleep(1)
        if needs_ray_up(cfg):
            return run_under_ray_up(cfg, overrides, path)
        return run_cell(cfg)


def needs_ray_up(cfg) -> bool:
    """engine=verl cells spanning SLURM nodes (or asking to) get a Ray cluster over the allocation."""
    if cfg.engine != "verl" or os.environ.get("RAY_ADDRESS") or "SLURM_JOB_ID" not in os.environ:
        return False
    if cfg.verl.ray_up == "always":
        return True
    return cfg.verl.ray_up == "auto" and int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) > 1


def run_under_ray_up(cfg, overrides: Dict, path: Path) -> str:
    """slurm/ray-up.sh starts Ray on every node of the job, then this cell runs against it."""
    import sys

    from harness.engines.verl.engine import logical_resources, resolve_device
    from harness.sharing import PolicyMap
    from harness.workflows import build_workflow

    spec = path.parent / ".grid" / f"{cfg.cell_id}.overrides.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps(overrides))
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)  # the job's environment: its `ray`, its python
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    if resolve_device(cfg) == "cpu":  # verl's resource pools ask for GPUs: declare logical ones
        workflow = build_workflow(cfg)
        n_policies = len(PolicyMap.from_config(cfg, workflow.role_instances(), workflow.sharing_maps()).policies)
        cpus, gpus = logical_resources(cfg, n_policies)
        env.update(RAY_UP_NUM_CPUS=str(cpus), RAY_UP_NUM_GPUS=str(gpus))
    repo = Path(__file__).resolve().parents[1]
    subprocess.run(["bash", str(repo / "slurm" / "ray-up.sh"), sys.executable, "-m", "grid.cell_job", str(spec)],
                   cwd=repo, env=env, check=True)
    return (read_status(path) or {}).get("state", "unknown")


# ----------------------------------------------------------------------------- bookkeeping
class Ledger:
    """<root>/<sweep>/.grid/jobs.json: the last job submitted for each cell (another action's jobs keep
    a ledger of their own name beside it, e.g. evaluate.json)."""

    def __init__(self, sweep_dir: Path, name: str = "jobs.json"):
        self.path = sweep_dir / ".grid" / name

    def read(self) -> Dict[str, dict]:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def record(self, entries: Dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**self.read(), **entries}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=2))
        os.replace(tmp, self.path)


def run_dir(root: str, sweep: str, cell: Cell) -> Path:
    return Path(root) / sweep / cell.cell_id


def read_status(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def lock_held(path: Path) -> bool:
    """A live harness.run process holds the cell's lock."""
    lock = path / ".lock"
    if not lock.exists():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


TERMINAL_SLURM_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                         "BOOT_FAIL", "DEADLINE"}


def slurm_state(entry: Optional[dict]) -> Optional[str]:
    """The scheduler's state of the cell's last job, asked of squeue then sacct directly (submitit's
    own watcher caches and reads UNKNOWN right after a submission). A job neither tool knows yet
    counts as PENDING: a cell is never submitted twice because the accounting lagged."""
    if not entry or entry.get("launcher") != "slurm":
        return None
    job_id = entry["job_id"]
    for command in (["squeue", "-h", "-j", job_id, "-o", "%T"], ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]):
        try:
            lines = [l for l in subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.splitlines()
                     if l.strip()]
        except (OSError, subprocess.TimeoutExpired):
            continue
        if lines:  # the last attempt of a requeued job; "CANCELLED by 0" -> CANCELLED
            return lines[-1].split()[0].rstrip("+")
    return "PENDING"


@dataclass
class CellState:
    cell: Cell
    state: str  # pending | queued | running | finished | stopped_early | failed | cancelled | timeout
    step: int
    steps: int
    reason: str
    log: str


def cell_state(cell: Cell, root: str, sweep: str, ledger: Dict[str, dict]) -> CellState:
    path = run_dir(root, sweep, cell)
    status = read_status(path) or {}
    steps = int(cell.overrides.get("steps", 0))
    step = int(status.get("step", 0))
    entry = ledger.get(cell.cell_id)
    log = entry.get("stderr", "") if entry else ""
    state = status.get("state")
    if state == "stopped_early" or (state == "finished" and step >= steps):
        return CellState(cell, state, step, steps, status.get("reason") or "", log)
    if lock_held(path):
        return CellState(cell, "running", step, steps, "", log)
    scheduler = slurm_state(entry)
    if scheduler is not None and scheduler not in TERMINAL_SLURM_STATES:
        return CellState(cell, "running" if scheduler == "RUNNING" else "queued", step, steps, scheduler, log)
    if state == "failed":
        return CellState(cell, "failed", step, steps, status.get("reason") or "", log)
    if scheduler in TERMINAL_SLURM_STATES - {"COMPLETED"}:
        return CellState(cell, scheduler.lower() if scheduler in ("CANCELLED", "TIMEOUT") else "failed",
                         step, steps, f"slurm: {scheduler}", log)
    if state == "running":  # the process died without a word (SIGKILL, node loss)
        return CellState(cell, "failed", step, steps, "process ended while running (killed?)", log)
    return CellState(cell, "pending", step, steps, "", log)


def needs_submission(state: CellState) -> bool:
    return state.state not in ("finished", "stopped_early", "running", "queued")


# ----------------------------------------------------------------------------- executors
def _slurm_parameters(cluster, launcher, resources: Resources) -> dict:
    params = dict(timeout_min=resources.time_min, nodes=resources.nodes, tasks_per_node=1,
                  cpus_per_task=resources.cpus, mem_gb=resources.mem_gb, slurm_partition=cluster.partition,
                  slurm_array_parallelism=int(launcher.array_parallelism),
                  slurm_signal_delay_s=int(cluster.get("signal_delay_s", 30)))
    if resources.gpus:
        params["gpus_per_node"] = resources.gpus
    for key, value in _site_options(cluster, resources).items():
        params[f"slurm_{key}"] = value
    extra = dict(cluster.get("extra_sbatch") or {})
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


def _site_options(cluster, resources: Resources) -> dict:
    """account, qos and constraint for sbatch; a GPU type's own constraint (e.g. h100) replaces the profile's."""
    options = {key: cluster[key] for key in ("account", "qos", "constraint") if cluster.get(key)}
    if resources.gpu_type is not None:
        constraint = (cluster.get("gpu_types") or {})[resources.gpu_type].get("constraint")
        if constraint:
            options["constraint"] = constraint
    return options


def sbatch_test_only(cluster, resources: Resources) -> None:
    """Ask SLURM whether it could ever run this shape, without submitting anything."""
    args = ["sbatch", "--test-only", f"--partition={cluster.partition}", f"--nodes={resources.nodes}",
            f"--cpus-per-task={resources.cpus}", f"--mem={resources.mem_gb}G", f"--time={resources.time_min}",
            "--wrap=true"]
    if resources.gpus:
        args.append(f"--gpus-per-node={resources.gpus}")
    args += [f"--{key}={value}" for key, value in _site_options(cluster, resources).items()]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise GridError("launcher=slurm needs sbatch on PATH (start a cluster: slurm/local-cluster.sh start)") from None
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise GridError(f"the cluster cannot run cells of shape {resources.label()} on partition "
                        f"'{cluster.partition}': {message[-1] if message else 'sbatch refused'}\n  "
                        f"command: {' '.join(shlex.quote(a) for a in args)}")


def cell_submission(cell: Cell) -> tuple:
    """What a cell's job calls: train (or resume) the cell (another action passes its own, e.g. an evaluation)."""
    return CellJob(), cell.overrides


def submit_slurm(cells: List[Cell], cluster, launcher, ledger: Ledger,
                 submission: Callable[[Cell], tuple] = cell_submission) -> Dict[str, dict]:
    by_shape: Dict[Resources, List[Cell]] = defaultdict(list)
    for cell in cells:
        by_shape[cell.resources].append(cell)
    for shape in by_shape:  # every shape is checked before anything is submitted
        sbatch_test_only(cluster, shape)
    entries: Dict[str, dict] = {}
    for shape, group in by_shape.items():
        executor = submitit.AutoExecutor(folder=str(launcher.folder), cluster="slurm",
                                         slurm_max_num_timeout=int(launcher.get("max_requeues", 30)))
        executor.update_parameters(name=f"marl-{group[0].overrides['sweep']}",
                                   **_slurm_parameters(cluster, launcher, shape))
        with executor.batch():
            jobs = [executor.submit(*submission(cell)) for cell in group]
        for cell, job in zip(group, jobs):
            entries[cell.cell_id] = {"launcher": "slurm", "job_id": job.job_id, "folder": str(launcher.folder),
                                     "stderr": str(job.paths.stderr), "submitted": time.strftime("%Y-%m-%dT%H:%M:%S")}
        ledger.record({k: entries[k] for k in (c.cell_id for c in group)})
    return entries


def warm_models(cells: List[Cell], log=print) -> None:
    """Build or warm each tiny base model the cells need, once, here, before any cell starts: a local
    sweep's first minutes show the warm-up's progress instead of silence, and the cells find the model
    cached. A cell whose config cannot be read here is left to report that itself."""
    from harness.models import resolve_model_path
    from harness.tasks import build_task
    from harness.validation import config_from_dict
    from harness.warmup import prepare_model

    seen = set()
    for cell in cells:
        try:
            cfg = config_from_dict(cell.overrides)
        except Exception:  # noqa: BLE001 (the cell's own run says what is wrong)
            continue
        shape = (cfg.scale, cfg.task, cfg.topology)
        if shape in seen or resolve_model_path(cfg) is not None:  # a checkpoint on disk: nothing to warm
            continue
        seen.add(shape)
        try:
            prepare_model(cfg, build_task(cfg), log=log)
        except Exception as exc:  # noqa: BLE001 (each cell tries again and records its own reason)
            log(f"[models] could not prepare {cfg.scale} for {cfg.task} here ({exc}); the cells will try themselves")


def run_local(cells: List[Cell], launcher, ledger: Ledger, log=print,
              submission: Callable[[Cell], tuple] = cell_submission, warm: bool = True) -> Dict[str, str]:
    """Run cells' jobs as local processes, at most `parallelism` at once; block until all end. `warm`:
    build the tiny models the cells train from first (an evaluation's runs have theirs already)."""
    if warm:
        warm_models(cells, log)
    executor = submitit.AutoExecutor(folder=str(launcher.folder), cluster="local")
    executor.update_parameters(timeout_min=24 * 60)
    queue, running, outcome = list(cells), {}, {}
    while queue or running:
        while queue and len(running) < int(launcher.parallelism):
            cell = queue.pop(0)
            job = executor.submit(*submission(cell))
            running[cell.cell_id] = job
            ledger.record({cell.cell_id: {"launcher": "local", "job_id": job.job_id, "folder": str(launcher.folder),
                                          "stderr": str(job.paths.stderr),
                                          "submitted": time.strftime("%Y-%m-%dT%H:%M:%S")}})
            log(f"started {cell.cell_id}")
        for cell_id, job in list(running.items()):
            if job.done():
                del running[cell_id]
                try:
                    outcome[cell_id] = job.result()
                except Exception as exc:  # the cell's own status.json holds the details
                    outcome[cell_id] = f"failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"
                log(f"{outcome[cell_id]:<14} {cell_id}")
        time.sleep(0.5)
    return outcome
