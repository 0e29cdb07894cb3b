"""action=evaluate: score every ended cell's checkpoints as the study does (analysis/evaluate.py), as
jobs of the sweep's own launcher: local processes, or SLURM jobs with each cell's resources.

    python grid/launch.py sweep=full_matrix action=evaluate evaluate.split=held_out \
        [launcher=slurm wait=true] [dry_run=true]

Each job scores only the checkpoints that have no row of the same mode, split, k and samples yet
(analysis.evaluate's `--resume`), so a killed or requeued job, or a second launch, repeats nothing.
The dry run lists what each cell would score; the jobs' ledger is `<sweep>/.grid/evaluate.json`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import submitit

from grid.expand import Cell, GridError

ENDED = ("finished", "stopped_early")


@dataclass
class EvaluateOptions:
    """action=evaluate: how each checkpoint is scored (analysis/evaluate.py's options)."""

    mode: str = "trained"  # trained | base | single_agent_transfer
    split: str = "validation"  # validation | held_out (the training set's own held-out part: the study's math)
    k: int = 1
    samples: Optional[int] = None  # sampled episodes per problem; default: k
    problems: Optional[int] = 32  # null: all
    temperature: Optional[float] = None  # default: the run's algo.temperature
    lengths: str = "run"  # run (training budgets) | study (the study's evaluation budgets: math 8192, code 5120)


class EvalJob(submitit.helpers.Checkpointable):
    """The callable an evaluation job runs: one run's checkpoints, resumable. On a timeout or
    preemption submitit requeues the same call, which skips the checkpoints already scored."""

    def __call__(self, run: str, options: dict) -> str:
        os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        from analysis.evaluate import evaluate_run

        rows = evaluate_run(Path(run), options["mode"], options["k"], options["samples"], options["problems"],
                            temperature=options["temperature"], split=options["split"], resume=True,
                            lengths=options["lengths"])
        return f"scored {len(rows)}"


def checked_options(raw) -> dict:
    """The evaluate.* options as analysis.evaluate takes them, or a GridError naming the valid choices."""
    from analysis.evaluate import options_problem

    options = {key: raw.get(key) for key in EvaluateOptions.__dataclass_fields__}
    options["samples"] = options["samples"] or options["k"]
    problem = options_problem(options["mode"], options["split"], options["k"], options["samples"], options["problems"],
                              choice="evaluate.", flag="evaluate.", lengths=options["lengths"])
    if problem:
        raise GridError(problem)
    return options


def unscored(run: Path, options: dict) -> List[str]:
    """The run's checkpoints without a scored row of these options (what a job would evaluate)."""
    from analysis.evaluate import checkpoints_of, evaluation_budget, evaluation_prompt_cap, scored
    from harness.run_dir import stored_cell_config
    from harness.tasks import CODE_TASKS, QA_TASKS

    cfg = stored_cell_config(run)
    kind = "code" if cfg.task in CODE_TASKS else "qa" if cfg.task in QA_TASKS else "math"
    try:
        budget = evaluation_budget(cfg, kind, options["lengths"])
    except ValueError as exc:
        raise GridError(f"{run.name}: {exc}") from None
    names = ["base"] if options["mode"] == "base" else [name for name, _, _ in checkpoints_of(run)]
    done = scored(run, options["mode"], options["split"], options["k"], options["samples"], max_new_tokens=budget,
                  max_prompt_length=evaluation_prompt_cap(cfg, kind, options["lengths"]))
    return [name for name in names if name not in done]


def wait_for_jobs(entries: dict, poll_s: float = 2.0) -> dict:
    """wait=true on SLURM: block until every evaluation job has ended; cell id -> its final state."""
    import time

    from grid.submit import TERMINAL_SLURM_STATES, slurm_state

    while True:
        states = {cell_id: slurm_state(entry) for cell_id, entry in entries.items()}
        if all(state in TERMINAL_SLURM_STATES for state in states.values()):
            return states
        time.sleep(poll_s)


def evaluate(cells: Sequence[Cell], cfg, out=print) -> int:
    """Submit one evaluation job per ended cell with checkpoints left to score; then the sweep report."""
    from grid.submit import Ledger, read_status, run_local, submit_slurm

    options = checked_options(cfg.evaluate)
    sweep_dir = Path(cfg.root) / cfg.sweep.name
    todo = []
    for cell in cells:
        run = sweep_dir / cell.cell_id
        state = (read_status(run) or {}).get("state")
        if state not in ENDED:
            out(f"skip {cell.cell_id}: {state or 'not run'}, not ended")
            continue
        if options["mode"] == "single_agent_transfer" and cell.is_baseline:
            continue
        left = unscored(run, options)
        out(f"{cell.cell_id}: {len(left)} checkpoint(s) to score{': ' + ', '.join(left) if left else ''}")
        if left:
            todo.append(cell)
    total = f"{len(todo)} evaluation job(s) ({options['mode']}, split {options['split']}, pass@{options['k']} " \
            f"of {options['samples']} samples on {options['problems'] or 'all'} problems, {options['lengths']} lengths)"
    if cfg.dry_run or not todo:
        out(f"{total}; {'dry run: nothing run' if cfg.dry_run else 'nothing to score'}")
        return 0
    ledger = Ledger(sweep_dir, "evaluate.json")

    def submission(cell: Cell):
        return EvalJob(), str(sweep_dir / cell.cell_id), options

    out(total)
    if cfg.launcher.name == "slurm":
        entries = submit_slurm(todo, cfg.cluster, cfg.launcher, ledger, submission)
        out(f"submitted {len(entries)} evaluation jobs to SLURM; rows go to each run's eval_results.jsonl")
        if not cfg.get("wait"):
            return 0
        states = wait_for_jobs(entries)
        for cell_id, state in sorted(states.items()):
            out(f"{state:<14} {cell_id}")
        return 0 if all(state == "COMPLETED" for state in states.values()) else 1
    outcome = run_local(todo, cfg.launcher, ledger, log=out, submission=submission, warm=False)
    from grid.launch import sweep_report

    sweep_report(sweep_dir, out)
    return 0 if all(str(v).startswith("scored") for v in outcome.values()) else 1
