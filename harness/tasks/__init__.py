"""Task registry: `task=<name>` in config picks one."""
from __future__ import annotations

from typing import Callable, Dict

from harness.tasks.base import Grade, Problem, Task, WarmupSupport


def _arith(cfg) -> Task:
    from harness.tasks.arith import ArithTask

    return ArithTask(cfg.arith)


def _math(kind: str) -> Callable:
    def build(cfg) -> Task:
        from harness.tasks.math import BoxedMathTask, GSM8KTask

        return {"gsm8k": GSM8KTask, "math": BoxedMathTask}[kind](cfg.data)
    return build


def _study_math(kind: str) -> Callable:
    def build(cfg) -> Task:
        from harness.tasks.math import DapoMathTask, EvalMathTask

        return DapoMathTask(cfg.data) if kind == "dapo-math" else EvalMathTask(kind, cfg.data)
    return build


def _reasoning_gym(generator: str) -> Callable:
    def build(cfg) -> Task:
        from harness.tasks.math import ReasoningGymTask

        return ReasoningGymTask(generator, cfg.data)
    return build


def _code(kind: str) -> Callable:
    def build(cfg) -> Task:
        from harness.tasks.code import CodeSynthTask, DeepCoderTask, HumanEvalTask, MBPPTask

        if kind == "code-synth":
            return CodeSynthTask(cfg.code_synth, cfg.sandbox)
        return {"humaneval": HumanEvalTask, "mbpp": MBPPTask, "deepcoder": DeepCoderTask}[kind](cfg.data, cfg.sandbox)
    return build


def _qa(kind: str) -> Callable:
    def build(cfg) -> Task:
        from harness.tasks.qa import HotpotQATask, NQTask
        from harness.tasks.qa_synth import QASynthTask

        if kind == "qa-synth":
            return QASynthTask(cfg.qa_synth, cfg.model.cache_dir)
        return {"nq": NQTask, "hotpotqa": HotpotQATask}[kind](cfg.data)
    return build


# the grid's task axis maps math -> arith (tiny) / gsm8k (checkpoints), code -> code-synth / humaneval
TASKS: Dict[str, Callable] = {
    "arith": _arith, "gsm8k": _math("gsm8k"), "math": _math("math"),
    "rg-gsm_symbolic": _reasoning_gym("gsm_symbolic"), "rg-basic_arithmetic": _reasoning_gym("basic_arithmetic"),
    "rg-chain_sum": _reasoning_gym("chain_sum"),
    "humaneval": _code("humaneval"), "mbpp": _code("mbpp"), "code-synth": _code("code-synth"),
    # the SP/IP study's sets: DAPO-Math-17k and DeepCoder to train, AIME and MATH-500 to evaluate
    "dapo-math": _study_math("dapo-math"), "aime": _study_math("aime"), "math500": _study_math("math500"),
    "deepcoder": _code("deepcoder"),
    "nq": _qa("nq"), "hotpotqa": _qa("hotpotqa"),  # UnityMAS-O's search QA, EM and token F1
    "qa-synth": _qa("qa-synth"),  # a generated multi-hop world the tiny model can search
}
QA_TASKS = {"qa-synth", "nq", "hotpotqa"}  # graded by exact match, with token F1 as partial credit (Grade.score)
CODE_TASKS = {"humaneval", "mbpp", "code-synth", "deepcoder"}  # graded by running model-written code in the sandbox
NEEDS_PATH = {"math", "dapo-math", "aime", "math500", "deepcoder", "nq", "hotpotqa"}  # no offline source: the file must be given
WARMUP_TASKS = {"arith": "arith", "code-synth": "code_synth", "qa-synth": "qa_synth"}  # tasks a tiny model is warmed up on -> their config


def build_task(cfg) -> Task:
    if cfg.task not in TASKS:
        raise ValueError(f"unknown task '{cfg.task}'; valid choices: {', '.join(sorted(TASKS))}")
    task = TASKS[cfg.task](cfg)
    if cfg.data.val_path:
        task._splits = {"train": task.problems("train"), "val": validation_file_problems(cfg)}
    return task


def validation_file_problems(cfg):
    """Every problem of `data.val_path`, read by `data.val_task`'s loader (default: the cell's task):
    the study trains math on DAPO-Math-17k and validates on AIME 2025. The cell's task grades them
    (both are graded by their final answer; validation refuses a val task of another kind)."""
    import copy

    other = copy.deepcopy(cfg)
    other.task, other.data.path, other.data.val_path = cfg.data.val_task or cfg.task, cfg.data.val_path, None
    other.data.split, other.data.val_size = "harness", 1
    val_task = TASKS[other.task](other)
    return val_task.problems("train") + val_task.problems("val")


__all__ = ["Grade", "Problem", "Task", "WarmupSupport", "TASKS", "build_task"]
