"""Per-role-instance gradients, read as the change in `.grad` around each instance's backward.

Within one optimizer step (one PPO mini-batch of one policy) micro-batches are grouped by role
instance, so after an instance's last backward the policy's accumulated `.grad` has grown by
exactly that instance's gradient g_i. The probe keeps each g_i (exact for adapters, whose
parameters are small) until the mini-batch is done, then keeps only the Gram matrix
G_ij = g_i·g_j: every per-role statistic is a function of it. A policy that takes several
optimizer steps in a training step gets one Gram matrix per step (`rounds`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

Slot = Tuple[str, int]  # (role, instance)


def flat_grad(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
                      for p in params])


@dataclass
class PolicyGradients:
    slots: List[Slot]
    gram: torch.Tensor  # (n_slots, n_slots), float64


class GradientProbe:
    def __init__(self) -> None:
        self.rounds: Dict[str, List[PolicyGradients]] = {}  # per policy, one per optimizer step in order
        self._vectors: Dict[Slot, torch.Tensor] = {}
        self._before: torch.Tensor | None = None

    def begin(self, policy: str, slot: Slot, params: Sequence[torch.Tensor]) -> None:
        has_grad = any(p.grad is not None for p in params)
        self._before = flat_grad(params) if has_grad else None

    def end(self, policy: str, slot: Slot, params: Sequence[torch.Tensor]) -> None:
        after = flat_grad(params)
        g = after if self._before is None else after - self._before
        self._vectors[slot] = self._vectors[slot] + g if slot in self._vectors else g
        self._before = None

    def finish_policy(self, policy: str) -> None:
        """The policy's current mini-batch is done: keep its Gram matrix as the next round."""
        slots = list(self._vectors)
        matrix = torch.stack([self._vectors[s] for s in slots]).double()
        self.add(policy, PolicyGradients(slots, matrix @ matrix.T))
        self._vectors = {}

    def add(self, policy: str, gradients: PolicyGradients) -> None:
        self.rounds.setdefault(policy, []).append(gradients)

    @property
    def policies(self) -> Dict[str, PolicyGradients]:
        """Each policy's first optimizer step (on-policy: the PPO ratio is 1 there)."""
        return {policy: rounds[0] for policy, rounds in self.rounds.items()}

    def round(self, k: int) -> Dict[str, PolicyGradients]:
        """The k-th optimizer step of every policy that took at least k + 1 steps."""
        return {policy: rounds[k] for policy, rounds in self.rounds.items() if k < len(rounds)}

    @property
    def n_rounds(self) -> int:
        return max((len(r) for r in self.rounds.values()), default=0)
