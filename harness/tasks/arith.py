"""Seeded arithmetic problems ("12+7+25") that a sub-million-parameter model can learn.

Sums of 2..max_terms numbers: two-term problems are single-step, three-term ones can be
split by an orchestrator ("12+7; 25") so every topology has a job to do.
"""
from __future__ import annotations

import random
import re
from typing import List, Optional

from harness.config import ArithConfig
from harness.tasks.base import Problem, Task, WarmupSupport

_INT = re.compile(r"-?\d+")


def _eval_sum(expr: str) -> Optional[int]:
    """Value of 'a+b+c' (integers and '+' only); None for anything else."""
    parts = [p.strip() for p in expr.split("+")]
    if not parts or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        return None
    return sum(int(p) for p in parts)


class ArithTask(Task, WarmupSupport):
    name = "arith"
    kind = "math"

    def __init__(self, cfg: ArithConfig, seed: int = 1234):
        if cfg.min_terms < 2 or cfg.max_terms < cfg.min_terms:
            raise ValueError("arith needs 2 <= min_terms <= max_terms")
        self.cfg = cfg
        rng = random.Random(seed)  # the data seed is fixed: every cell sees the same splits
        seen, problems = set(), []
        budget = cfg.n_train + cfg.n_val
        for _ in range(budget * 50):
            if len(problems) == budget:
                break
            terms = [rng.randint(0, cfg.max_value) for _ in range(rng.randint(cfg.min_terms, cfg.max_terms))]
            question = "+".join(map(str, terms))
            if question in seen:
                continue
            seen.add(question)
            problems.append(Problem(f"arith-{len(problems)}", question, str(sum(terms)), {"terms": terms}))
        if len(problems) < budget:
            raise ValueError(f"arith: only {len(problems)} distinct problems for n_train+n_val={budget}")
        self._splits = {"val": problems[: cfg.n_val], "train": problems[cfg.n_val:]}

    def extract_answer(self, text: str) -> Optional[str]:
        numbers = _INT.findall(text)
        return str(int(numbers[-1])) if numbers else None

    def decompose(self, problem: Problem) -> List[str]:
        terms = problem.meta["terms"]
        if len(terms) <= 2:
            return [problem.question]
        head = "+".join(map(str, terms[:2]))
        tail = "+".join(map(str, terms[2:]))
        return [head, tail]

    def grade_subtask(self, subtask: str, text: str) -> Optional[bool]:
        value = _eval_sum(subtask)
        if value is None:
            return False  # a malformed subtask cannot be solved
        return self.extract_answer(text) == str(value)

    def check_plan(self, problem: Problem, subtasks: List[str]) -> Optional[bool]:
        values = [_eval_sum(s) for s in subtasks]
        return None not in values and sum(values) == int(problem.answer)

    # -- warm-up support
    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        value = int(problem.answer)
        delta = rng.choice([-10, -2, -1, 1, 2, 10])
        return str(max(0, value + delta) if value + delta != value else value + 1)

    def direction(self, problem: Problem, answer: str) -> str:
        return "too high" if int(answer) > int(problem.answer) else "too low"

    def solve_subtask(self, subtask: str) -> str:
        value = _eval_sum(subtask)
        return "0" if value is None else str(value)

    def combine(self, problem: Problem, results: List[str]) -> str:
        values = [self.extract_answer(r) for r in results]
        return str(sum(int(v) for v in values if v is not None))

    def feedback_vocabulary(self) -> List[str]:
        return ["too high", "too low"]
