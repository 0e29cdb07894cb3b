"""Task registry: `task=<name>` in config picks one."""
from __future__ import annotations

from typing import Callable, Dict

from harness.tasks.base import Grade, Problem, Task, WarmupSupport


def _arith(cfg) -> Task:
    from harness.tasks.arith import ArithTask

    return ArithTask(cfg.arith)


TASKS: Dict[str, Callable] = {"arith": _arith}


def build_task(cfg) -> Task:
    if cfg.task not in TASKS:
        raise ValueError(f"unknown task '{cfg.task}'; valid choices: {', '.join(sorted(TASKS))}")
    return TASKS[cfg.task](cfg)


__all__ = ["Grade", "Problem", "Task", "WarmupSupport", "TASKS", "build_task"]
