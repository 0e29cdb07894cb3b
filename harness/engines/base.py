"""The engine protocol: what the controller needs from whatever holds the policies.

`local` runs in-process (transformers + peft, one adapter per policy on one frozen base);
a distributed engine (Ray + verl worker groups) implements the same four calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Protocol, Sequence

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
