"""What a rollout produces, in the terms every part speaks: a `Generation` from an engine, a `Turn` of one
role, an `Episode` of one problem, and the `Sampling` asked for. Workflows write them; engines, the
advantage estimators, rewards and instrumentation read them, without depending on any workflow."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from harness.tasks import Grade, Problem


@dataclass
class Generation:
    prompt_ids: List[int]
    response_ids: List[int]
    text: str
    truncated: bool  # hit the token budget without an end-of-turn token
    log_probs: Optional[List[float]] = None  # each response token's log-prob as the sampler drew it
    over_prompt_cap: bool = False  # not sampled: the prompt is longer than Sampling.max_prompt_tokens


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
    index: int  # position in the episode, in order of completion
    depth: int = 0  # stage on the episode's path through the workflow graph: parallel siblings share it
    malformed: bool = False  # the reply does not follow its contract's exact format
    fallback: bool = False  # nothing of the contract could be read: the documented default was used
    role_correct: Optional[bool] = None  # the role did its own job (voter right, verdict right...)
    reward: float = 0.0
    advantage: float = 0.0
    stats: Dict[str, float] = field(default_factory=dict)  # role-specific numbers, averaged per role in metrics
    rollout_log_probs: Optional[List[float]] = None  # the sampler's log-prob of each response token

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
    stats: Dict[str, float] = field(default_factory=dict)  # episode-level numbers (rounds used), averaged as episode/<name>


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    max_prompt_tokens: Optional[int] = None  # a longer prompt is not sampled (the study's data.max_prompt_length)


class PromptTooLong(Exception):
    """A role's prompt is over the cell's prompt cap: the episode ends there, as upstream's engine ends it
    (TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED), its earlier turns kept, each paid its own correctness
    (harness/rewards.py)."""


GenerateFn = Callable[[str, List[str], Sampling], List[Generation]]
