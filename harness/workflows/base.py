"""Episodes, turns and the agent handle that workflows talk to.

A workflow is an `async def episode(problem, agents)` that reads like its protocol. `Agents.ask`
never calls a model: it files a request with the `Scheduler`, which waits until every episode
of the step is blocked, then serves each (policy, token budget) as one batched generate.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

from harness.tasks import Grade, Problem, Task


@dataclass(frozen=True)
class RoleSpec:
    name: str
    contract: str  # "answer" | "verdict" | "index" | "subtasks"
    instances: int = 1


@dataclass
class Generation:
    prompt_ids: List[int]
    response_ids: List[int]
    text: str
    truncated: bool  # hit the token budget without an end-of-turn token


@dataclass
class Turn:
    role: str
    instance: int
    policy: str
    prompt: str
    prompt_ids: List[int]
    response_ids: List[int]
    text: str
    truncated: bool
    index: int  # position in the episode
    malformed: bool = False  # the reply does not follow its contract's exact format
    fallback: bool = False  # nothing of the contract could be read: the documented default was used
    role_correct: Optional[bool] = None  # the role did its own job (voter right, verdict right...)
    reward: float = 0.0
    advantage: float = 0.0
    stats: Dict[str, float] = field(default_factory=dict)  # role-specific numbers, averaged per role in metrics

    @property
    def slot(self) -> Tuple[str, int]:
        return (self.role, self.instance)


@dataclass
class Episode:
    problem: Problem
    turns: List[Turn] = field(default_factory=list)
    final_text: str = ""
    grade: Optional[Grade] = None
    group: int = 0  # which problem of the step (GRPO group)


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False


GenerateFn = Callable[[str, List[str], Sampling], List[Generation]]


class Scheduler:
    """Collects concurrent generate requests from all episodes and serves them per policy."""

    def __init__(self, generate: GenerateFn):
        self._generate = generate
        self._pending: List[Tuple[str, str, Sampling, asyncio.Future]] = []
        self.calls: List[Tuple[str, int]] = []  # (policy, batch size) of each batched generate

    def request(self, policy: str, prompt: str, sampling: Sampling) -> Awaitable[Generation]:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((policy, prompt, sampling, future))
        return future

    def run(self, coroutines: Sequence[Awaitable[Any]]) -> List[Any]:
        return asyncio.run(self._drive(list(coroutines)))

    async def _drive(self, coroutines):
        tasks = [asyncio.ensure_future(c) for c in coroutines]
        while not all(t.done() for t in tasks):
            await _settle()
            if self._pending:
                self._flush()
            elif not all(t.done() for t in tasks):
                await asyncio.sleep(0)
        return [t.result() for t in tasks]  # re-raises a workflow's exception

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        batches: Dict[Tuple[str, Sampling], list] = {}
        for item in pending:  # insertion order: deterministic batches
            batches.setdefault((item[0], item[2]), []).append(item)
        for (policy, sampling), items in batches.items():
            outputs = self._generate(policy, [prompt for _, prompt, _, _ in items], sampling)
            self.calls.append((policy, len(items)))
            for (_, _, _, future), output in zip(items, outputs):
                future.set_result(output)


async def _settle() -> None:
    """Yield until no callback is ready, i.e. every episode waits on a pending request."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    if ready is None:  # an event loop without the CPython internals: yield generously
        for _ in range(64):
            await asyncio.sleep(0)
        return
    await asyncio.sleep(0)
    while ready:
        await asyncio.sleep(0)


class Agents:
    """The only door from a workflow to the models: renders the role's prompt, routes it to the
    role instance's policy through the scheduler, and returns the finished Turn."""

    def __init__(self, scheduler: Scheduler, policy_of: Callable[[str, int], str],
                 prompts: Dict[str, str], budgets: Dict[str, int], temperature: float, greedy: bool):
        self._scheduler = scheduler
        self._policy_of = policy_of
        self._prompts = prompts
        self._budgets = budgets
        self._temperature = temperature
        self._greedy = greedy
        self.turns: List[Turn] = []

    async def ask(self, role: str, instance: int = 0, template: Optional[str] = None, **fields: str) -> Turn:
        prompt = self._prompts[template or role].format(**fields)
        policy = self._policy_of(role, instance)
        sampling = Sampling(self._budgets[role], self._temperature, self._greedy)
        generation = await self._scheduler.request(policy, prompt, sampling)
        turn = Turn(role, instance, policy, prompt, generation.prompt_ids, generation.response_ids,
                    generation.text, generation.truncated, index=len(self.turns))
        self.turns.append(turn)
        return turn


class Workflow(ABC):
    """A topology: its roles and its episode program."""

    name: str = "workflow"

    def __init__(self, task: Task, cfg):
        from harness.workflows.prompts import style_of

        self.task = task
        self.cfg = cfg  # the cell's WorkflowConfig
        self.style = style_of(cfg)  # how its judging roles' replies are read

    @abstractmethod
    def roles(self) -> List[RoleSpec]:
        ...

    @abstractmethod
    async def episode(self, problem: Problem, agents: Agents) -> Episode:
        ...

    def templates(self) -> Dict[str, str]:
        """Prompt templates the workflow brings itself (a graph's `prompts:`), besides the cell's."""
        return {}

    def role_instances(self) -> List[Tuple[str, int]]:
        return [(r.name, i) for r in self.roles() for i in range(r.instances)]

    def answer_of(self, turn: Turn) -> str:
        """What a later role sees of an answer turn: the stated answer, or '?' when none."""
        answer = self.task.extract_answer(turn.text)
        return answer if answer is not None else "?"

    def mark_answer(self, turn: Turn, problem: Problem) -> Grade:
        grade = self.task.grade(problem, turn.text)
        self.mark_format(turn, grade.parsed)
        turn.role_correct = grade.correct
        return grade

    def mark_format(self, turn: Turn, parsed: Optional[str]) -> None:
        """An answer turn's format: no answer found is a fallback; under the real-model contracts
        the answer must also be stated as instructed (`\\boxed{}` for math, a fenced block for code)."""
        turn.fallback = parsed is None
        turn.malformed = turn.fallback or (self.style.tolerant and not self.task.states_answer_exactly(turn.text))

    def mark_pick(self, pick: Turn, candidates: List[Turn]) -> int:
        """An aggregator's pick among marked candidate turns: its index, format and whether it chose
        a right one."""
        from harness.workflows.contracts import parse_index

        pick.stats["distinct_candidates"] = float(len({self.answer_of(t) for t in candidates}))  # 1: cannot matter
        index, pick.malformed, pick.fallback = parse_index(pick.text, len(candidates), self.style.tolerant,
                                                           self.style.index_base)
        pick.role_correct = (not pick.fallback) and bool(candidates[index].role_correct)
        return index

    def mark_verdict(self, judgement: Turn, draft_correct: bool):
        """An evaluator's verdict on a draft: its format, and whether it judged the draft right (a
        verdict read from reasoning still judged; the tiny contract also wants its feedback vocabulary)."""
        from harness.workflows.contracts import ACCEPT, parse_verdict

        vocabulary = getattr(self.task, "feedback_vocabulary", lambda: [])()
        verdict = parse_verdict(judgement.text, vocabulary, self.style.tolerant, self.style.unparsed_verdict)
        judgement.malformed, judgement.fallback = verdict.malformed, verdict.fallback
        judged = not verdict.fallback and (self.style.tolerant or not verdict.malformed)
        judgement.role_correct = judged and ((verdict.verdict == ACCEPT) == draft_correct)
        return verdict

    def mark_plan(self, plan: Turn, problem: Problem) -> List[str]:
        """An orchestrator's subtasks (at most workflow.max_subtasks), its format and whether they cover the problem."""
        from harness.workflows.contracts import parse_subtasks

        subtasks, plan.malformed, plan.fallback = parse_subtasks(plan.text, self.cfg.max_subtasks, problem.question,
                                                                 self.style.tolerant)
        plan.role_correct = self.task.check_plan(problem, subtasks)
        return subtasks

    def mark_worker(self, result: Turn, problem: Problem, subtask: str) -> None:
        """A worker's format and job: tiny workers solve their part; the study's solve the whole problem their own way."""
        self.mark_format(result, self.task.extract_answer(result.text))
        result.role_correct = (self.task.grade(problem, result.text).correct if self.style.tolerant
                               else self.task.grade_subtask(subtask, result.text))

    def numbered(self, turns: List[Turn], labels: Optional[List[str]] = None) -> str:
        """Full replies as the real-model prompts show them ('--- Solution 1 ---'), numbered from
        the contract's index base."""
        base = self.style.index_base
        return "".join(f"\n--- Solution {i + base}{f' (Strategy: {labels[i]})' if labels else ''} ---\n"
                       f"{t.text.strip()}\n" for i, t in enumerate(turns))
