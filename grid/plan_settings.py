"""What a dry run says about how the cells train, beside their resources: the loop sizes each workflow
runs with per task, what validation reads, the checkpoint cadence, and how the study's own figures
are scored afterwards. A reader checks these against the paper before spending GPU-hours."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence, Set

LOOP_SIZES = {  # topology -> (the workflow setting, what its value counts)
    "eval_opt": ("max_iterations", "drafts at most, each judged"),
    "orch_workers": ("max_subtasks", "subtasks at most"),
    "voting": ("n_votes", "voters"),
}


def _joined(values: Set[str]) -> str:
    return ", ".join(sorted(values))


def validation_source(cfg) -> str:
    """Where a cell's validation problems come from: their own file, or held out from the training file."""
    data = cfg.data
    if data.val_path:
        return Path(data.val_path).name
    if data.split == "hf":
        size = f"{data.test_size:g}" if data.test_size < 1 else f"{int(data.test_size)} problems"
        return f"the training file's held-out part (test_size {size}, seed {data.split_seed})"
    return f"{data.val_size} problems held out of the training set"


def settings_lines(configs: Sequence) -> List[str]:
    """A few lines over every cell's resolved config: loop sizes per (topology, task), validation per
    task, checkpoints, steps."""
    loops: Dict[str, Dict[str, Set[str]]] = defaultdict(lambda: defaultdict(set))
    validation: Dict[str, Set[str]] = defaultdict(set)
    cadence: Set[str] = set()
    for cfg in configs:
        if cfg.topology in LOOP_SIZES:
            key, _ = LOOP_SIZES[cfg.topology]
            loops[cfg.topology][str(getattr(cfg.workflow, key))].add(cfg.task)
        validation[cfg.task].add(f"every {cfg.val_every} steps, {cfg.val_problems or 'all'} problems x "
                                 f"{cfg.val_samples} on {validation_source(cfg)}")
        cadence.add(f"{cfg.steps} steps, a checkpoint every {cfg.ckpt_every} ({cfg.ckpt_keep} kept)")
    lines = []
    for topology, by_value in sorted(loops.items()):
        _, what = LOOP_SIZES[topology]
        parts = [f"{value} {what} on {_joined(tasks)}" for value, tasks in sorted(by_value.items())]
        lines.append(f"loops: {topology}: " + "; ".join(parts))
    for task, sources in sorted(validation.items()):
        lines.append(f"validation: {task}: {_joined(sources)}")
    if cadence:
        lines.append(f"training: {_joined(cadence)}")
    if any(cfg.task == "dapo-math" for cfg in configs):
        lines.append("the paper's math figures: every checkpoint on DAPO-Math's held-out split, after training: "
                     "action=evaluate evaluate.split=held_out evaluate.problems=null evaluate.lengths=study")
    return lines
