"""The Task interface: problems, prompt text, answer extraction and a grader.

It is deliberately small so that GSM8K, MATH, HumanEval and MBPP fit the same shape: a task
yields `Problem`s for a split and grades a response text against one. Decomposition hooks
(`decompose`, `grade_subtask`) serve the orchestrator/worker roles; `WarmupSupport` serves the
supervised warm-up of tiny models and is only implemented by tasks a tiny model can learn.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class Problem:
    uid: str
    question: str
    answer: str  # the reference answer, normalised by the task
    meta: Dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Grade:
    correct: bool
    parsed: Optional[str]  # the extracted answer, None when nothing parsed
    reason: str = ""  # why it failed: "no answer found", "wrong value 41 != 42", ...
    score: Optional[float] = None  # partial credit in [0, 1] where the task has one (QA: token F1); else None


class Task(ABC):
    name: str = "task"
    kind: str = "math"  # "math" | "code": the grid's task axis
    _splits: Dict[str, List[Problem]]  # set by each task's constructor: {"val": [...], "train": [...]}

    def problems(self, split: str) -> List[Problem]:
        """All problems of a split ("train" or "val"), in a fixed order."""
        if split not in self._splits:
            raise ValueError(f"unknown split '{split}'; valid: {', '.join(self._splits)}")
        return self._splits[split]

    @abstractmethod
    def extract_answer(self, text: str) -> Optional[str]:
        """The answer a response states, normalised; None when it states none."""

    def states_answer_exactly(self, text: str) -> bool:
        """The answer is stated as the real-model prompts instruct: in `\\boxed{}` (math), in a
        fenced block (code). Format compliance only; the grade reads answers more leniently."""
        return ("```" in text) if self.kind == "code" else ("\\boxed{" in text or "\\fbox{" in text)

    def grade(self, problem: Problem, text: str) -> Grade:
        parsed = self.extract_answer(text)
        if parsed is None:
            return Grade(False, None, "no answer found")
        if parsed == problem.answer:
            return Grade(True, parsed)
        return Grade(False, parsed, f"wrong answer {parsed} != {problem.answer}")

    # -- decomposition (orchestrator / workers); a task that cannot split returns [question]
    def decompose(self, problem: Problem) -> List[str]:
        return [problem.question]

    def grade_subtask(self, subtask: str, text: str) -> Optional[bool]:
        """Whether a worker solved a subtask; None when the task cannot tell."""
        return None

    def check_plan(self, problem: Problem, subtasks: List[str]) -> Optional[bool]:
        """Whether subtasks cover the problem exactly; None when the task cannot tell."""
        return None

    def check_text(self, check: str, problem: Problem, text: str, fields: Dict[str, Any]) -> Optional[bool]:
        """Whether a search or free-text role did its job (`check:` of a graph node names what: the
        task's own words, e.g. 'evidence', 'notes'), given the reply and the node's inputs; None
        when the task cannot tell."""
        return None


class WarmupSupport(ABC):
    """What the warm-up needs to write imperfect demonstrations of every role's contract."""

    @abstractmethod
    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        """A plausible but wrong answer (a near miss)."""

    @abstractmethod
    def direction(self, problem: Problem, answer: str) -> str:
        """Short feedback for a wrong answer, e.g. 'too high'."""

    @abstractmethod
    def solve_subtask(self, subtask: str) -> str:
        """The reference answer of a subtask written by `decompose`."""

    @abstractmethod
    def combine(self, problem: Problem, results: List[str]) -> str:
        """The answer a synthesizer should state from the workers' results."""

    @abstractmethod
    def feedback_vocabulary(self) -> List[str]:
        """Every feedback phrase `direction` can produce (the evaluator's contract)."""
