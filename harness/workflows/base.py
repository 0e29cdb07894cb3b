"""The agent handle that workflows talk to (episodes and turns: harness/episodes.py).

A workflow is an `async def episode(problem, agents)` that reads like its protocol. `Agents.ask`
never calls a model: it files a request with the `Scheduler`, which waits until every episode
of the step is blocked, then serves each (policy, token budget) as one batched generate.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

from harness.episodes import Episode, GenerateFn, Generation, PromptTooLong, Sampling, Turn
from harness.tasks import Grade, Problem, Task


@dataclass(frozen=True)
class RoleSpec:
    name: str
    contract: str  # "answer" | "verdict" | "index" | "subtasks" | "search" | "text"
    instances: int = 1
    # GRPO's trajectory grouping: "role" (all of the role's calls in a problem's episodes form one
    # group) or "instance" (each instance its own group, as the study's voters generator0..n-1)
    trajectory: str = "role"




class Scheduler:
    """Collects concurrent generate requests from all episodes and serves them per policy."""

    TOOL_WORKERS = 4  # tool calls of one round run side by side (sandbox runs are subprocesses)

    def __init__(self, generate: GenerateFn):
        self._generate = generate
        self._pending: List[Tuple[str, str, Sampling, asyncio.Future]] = []
        self._tools: List[Tuple[Callable[..., Any], Dict[str, Any], asyncio.Future]] = []
        self.calls: List[Tuple[str, int]] = []  # (policy, batch size) of each batched generate

    def call_tool(self, tool: Callable[..., Any], kwargs: Dict[str, Any]) -> Awaitable[Any]:
        """A workflow's tool call (retrieval, running code), served with every other episode's tool
        calls of the same round at once, results handed back in request order (deterministic)."""
        future = asyncio.get_running_loop().create_future()
        self._tools.append((tool, kwargs, future))
        return future

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
            if self._tools:
                self._run_tools()
            elif self._pending:
                self._flush()
            elif not all(t.done() for t in tasks):
                await asyncio.sleep(0)
        return [t.result() for t in tasks]  # re-raises a workflow's exception

    def _run_tools(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        pending, self._tools = self._tools, []
        if len(pending) == 1:
            results = [_outcome(pending[0][0], pending[0][1])]
        else:
            with ThreadPoolExecutor(max_workers=min(self.TOOL_WORKERS, len(pending))) as pool:
                results = list(pool.map(lambda item: _outcome(item[0], item[1]), pending))
        for (_, _, future), (value, error) in zip(pending, results):
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

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


def _outcome(tool: Callable[..., Any], kwargs: Dict[str, Any]) -> Tuple[Any, Optional[BaseException]]:
    try:
        return tool(**kwargs), None
    except Exception as exc:  # noqa: BLE001 - re-raised in the episode that called the tool
        return None, exc


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
                 prompts: Dict[str, str], budgets: Dict[str, int], temperature: float, greedy: bool,
                 chat: str = "template", max_prompt_tokens: Optional[int] = None):
        self._scheduler = scheduler
        self.max_prompt_tokens = max_prompt_tokens  # a longer prompt ends the episode (PromptTooLong)
        self._chat = chat  # harness/chat.py: how a prompt is framed for the model
        self.conversation: List[Tuple[str, str]] = []  # the episode's shared chat (the study's Eval-Opt history)
        self._policy_of = policy_of
        self._prompts = prompts
        self._budgets = budgets
        self._temperature = temperature
        self._greedy = greedy
        self.turns: List[Turn] = []
        self._frontier = 0  # the stage the episode's next request starts at

    async def ask(self, role: str, instance: int = 0, template: Optional[str] = None, conversation: bool = False,
                  **fields: str) -> Turn:
        """One call of a role. With `conversation` (under the study's chat) the prompt follows the
        episode's shared chat, as upstream's share_conversation_history: the first such turn's user
        message, then every such turn's reply (rllm/workflows/evaluator_optimizer_workflow.py:311-430;
        the later user prompts are not kept)."""
        from harness.chat import frame, reply_content

        text = self._prompts[template or role].format(**fields)
        shared = conversation and self._chat == "study"
        prompt = frame(self._chat, self.conversation if shared else (), text)
        policy = self._policy_of(role, instance)
        sampling = Sampling(self._budgets[role], self._temperature, self._greedy, self.max_prompt_tokens)
        depth = self._frontier  # requests filed together (a gather: voters, workers) are one stage;
        generation = await self._scheduler.request(policy, prompt, sampling)  # the scheduler serves a round
        self._frontier = max(self._frontier, depth + 1)  # only once every episode has filed its requests
        if generation.over_prompt_cap:
            raise PromptTooLong(f"{role}'s prompt has {len(generation.prompt_ids)} tokens, over the cap of "
                                f"{self.max_prompt_tokens} (data.max_prompt_length)")
        turn = Turn(role, instance, policy, prompt, generation.prompt_ids, generation.response_ids,
                    generation.text, generation.truncated, index=len(self.turns), depth=depth,
                    rollout_log_probs=generation.log_probs)
        self.turns.append(turn)
        if shared:
            if not self.conversation:
                self.conversation.append(("user", text))
            self.conversation.append(("assistant", reply_content(turn.text)))
        return turn

    async def tool(self, tool: Callable[..., Any], **kwargs: Any) -> Any:
        """A tool node's call, batched with the other episodes' (see Scheduler.call_tool)."""
        return await self._scheduler.call_tool(tool, kwargs)


class Workflow(ABC):
    """A topology: its roles and its episode program."""

    name: str = "workflow"

    def __init__(self, task: Task, cfg):
        from harness.workflows.prompts import style_of

        self.task = task
        self.cfg = cfg  # the cell's WorkflowConfig
        self.style = style_of(cfg)  # how its judging roles' replies are read

    @property
    def chat(self) -> str:
        """How its prompts reach the model (harness/chat.py): workflow.chat, or (auto) its prompt set's way."""
        chosen = getattr(self.cfg, "chat", "auto")
        return self.style.chat if chosen == "auto" else chosen

    @abstractmethod
    def roles(self) -> List[RoleSpec]:
        ...

    @abstractmethod
    async def episode(self, problem: Problem, agents: Agents) -> Episode:
        ...

    def templates(self) -> Dict[str, str]:
        """Prompt templates the workflow brings itself (a graph's `prompts:`), besides the cell's."""
        return {}

    def template_names(self) -> List[str]:
        """The templates of its own that `workflow.prompts.<name>=...` may override, besides the built-in ones."""
        return sorted(self.templates())

    def role_budgets(self) -> Dict[str, int]:
        """The fewest new tokens a role needs (a graph's `max_new_tokens`), raising the cell's default
        for it; a cell's workflow.role_max_new_tokens wins."""
        return {}

    def sharing_maps(self) -> Dict[str, Dict[str, List[str]]]:
        """The workflow's own policy groups by sharing mode (`partial`, `paper`: policy -> roles);
        {} when it declares none."""
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
        if grade.score is not None:  # code: the share of the tests it passed; QA: the answer's token F1
            turn.stats["pass_rate" if self.task.kind == "code" else "f1"] = grade.score
        return grade

    def mark_format(self, turn: Turn, parsed: Optional[str]) -> None:
        """An answer turn's format: no answer found is a fallback; under the real-model contracts
        the answer must also be stated as instructed (`\\boxed{}` for math, a fenced block for code)."""
        turn.fallback = parsed is None
        turn.malformed = turn.fallback or (self.style.tolerant and not self.task.states_answer_exactly(turn.text))

    def _study_parse(self) -> bool:
        """The real-model contracts read as the study's code reads them (workflow.parse=study)."""
        return self.style.tolerant and getattr(self.cfg, "parse", "study") == "study"

    def mark_pick(self, pick: Turn, candidates: List[Turn]) -> int:
        """An aggregator's pick among marked candidate turns: its index, format and whether it chose
        a right one."""
        from harness.workflows.contracts import parse_index, study_index

        pick.stats["distinct_candidates"] = float(len({self.answer_of(t) for t in candidates}))  # 1: cannot matter
        if self._study_parse():
            index, pick.malformed, pick.fallback = study_index(pick.text, len(candidates), self.style.index_base)
        else:
            index, pick.malformed, pick.fallback = parse_index(pick.text, len(candidates), self.style.tolerant,
                                                               self.style.index_base)
        pick.role_correct = (not pick.fallback) and bool(candidates[index].role_correct)
        return index

    def mark_verdict(self, judgement: Turn, draft_correct: bool):
        """An evaluator's verdict on a draft: its format, and whether it judged the draft right (a
        verdict read from reasoning still judged; the tiny contract also wants its feedback vocabulary)."""
        from harness.workflows.contracts import ACCEPT, parse_verdict, study_verdict

        vocabulary = getattr(self.task, "feedback_vocabulary", lambda: [])()
        verdict = (study_verdict(judgement.text, self.style.unparsed_verdict) if self._study_parse() else
                   parse_verdict(judgement.text, vocabulary, self.style.tolerant, self.style.unparsed_verdict))
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

    def mark_search(self, turn: Turn, problem: Problem, check: Optional[str], fields: Dict[str, Any]) -> Dict[str, Any]:
        """A search role's action (`SEARCH: <query>` or `STOP`), its format, and whether the task
        judges it right (`check`, e.g. a query that finds a needed passage; stopping once the notes
        hold every needed fact)."""
        from harness.workflows.contracts import parse_search

        action = parse_search(turn.text, self.style.tolerant)
        turn.malformed, turn.fallback = action.malformed, action.fallback
        turn.stats["stop"] = float(action.stop)
        text = "STOP" if action.stop else f"SEARCH: {action.query}"
        if check and not action.fallback:
            turn.role_correct = self.task.check_text(check, problem, text, fields)
        elif check:
            turn.role_correct = False
        return {"search": not action.stop, "stop": action.stop, "query": action.query, "text": text}

    def mark_text(self, turn: Turn, problem: Problem, check: Optional[str], fields: Dict[str, Any]) -> str:
        """A free-text role's reply (evidence, notes, a plan), its format, and the task's check of it."""
        from harness.workflows.contracts import parse_text

        text, turn.malformed, turn.fallback = parse_text(turn.text, self.style.tolerant)
        if check:
            turn.role_correct = (not turn.fallback) and bool(self.task.check_text(check, problem, text, fields))
        return text

    def numbered(self, turns: List[Turn], labels: Optional[List[str]] = None) -> str:
        """Full replies as the real-model prompts show them ('--- Solution 1 ---'), numbered from
        the contract's index base; each reply as the study keeps it (its content: harness/chat.py)."""
        from harness.chat import reply_content

        base = self.style.index_base
        return "".join(f"\n--- Solution {i + base}{f' (Strategy: {labels[i]})' if labels else ''} ---\n"
                       f"{reply_content(t.text)}\n" for i, t in enumerate(turns))
