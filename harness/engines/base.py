"""The engine protocol: what the controller needs from whatever holds the policies.

`local` runs in-process (transformers + peft, one adapter per policy on one frozen base);
a distributed engine (Ray + verl worker groups) implements the same four calls.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Protocol, Sequence, Tuple

from harness.algo.loss import BatchNorm
from harness.workflows import Generation, Sampling, Turn


@dataclass
class UpdateResult:
    loss: float
    policy_grad_norm: Dict[str, float]  # before clipping
    policy_update_norm: Dict[str, float]  # ‖Δθ‖ of the optimizer step
    policy_param_norm: Dict[str, float]  # ‖θ‖ after the step
    entropy: Dict[str, float] = field(default_factory=dict)  # mean token entropy per role
    kl: Dict[str, float] = field(default_factory=dict)  # mean token KL to the base per role (kl_coef > 0)
    skipped: List[str] = field(default_factory=list)  # policies whose step was skipped (non-finite)
    role_loss: Dict[str, float] = field(default_factory=dict)  # each role's share of its policy's loss


@dataclass
class PolicyBatch:
    """One policy's share of an update: its whole-batch normalisers and its turns grouped by role
    instance (the probe reads one gradient per instance, so micro-batches never mix instances)."""

    norm: BatchNorm
    slots: Dict[Tuple[str, int], List[Turn]]


def policy_batches(samples: Sequence[Turn]) -> Dict[str, PolicyBatch]:
    """{policy: PolicyBatch} for the policies that have turns in `samples`."""
    by_policy: Dict[str, List[Turn]] = defaultdict(list)
    for turn in samples:
        by_policy[turn.policy].append(turn)
    batches = {}
    for policy, turns in by_policy.items():
        role_tokens: Dict[str, int] = defaultdict(int)
        slots: Dict[Tuple[str, int], List[Turn]] = defaultdict(list)
        for t in turns:
            role_tokens[t.role] += len(t.response_ids)
            slots[t.slot].append(t)
        batches[policy] = PolicyBatch(BatchNorm(sum(role_tokens.values()), len(turns), dict(role_tokens)), dict(slots))
    return batches


class Engine(Protocol):
    policies: List[str]

    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        ...

    def update(self, samples: Sequence[Turn], probe=None) -> UpdateResult:
        ...

    def save(self, path: Path) -> None:
        ...

    def load(self, path: Path) -> None:
        ...
