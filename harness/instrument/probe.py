"""Per-role-instance gradients, read as the change in `.grad` around each instance's backward.

Micro-batches are grouped by (policy, role instance), so after an instance's last backward the
policy's accumulated `.grad` has grown by exactly that instance's gradient g_i. The probe keeps
each g_i (exact for adapters, whose parameters are small) until the policy is done, then keeps
only the Gram matrix G_ij = g_i·g_j: every per-role statistic is a function of it.
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
        self.policies: Dict[str, PolicyGradients] = {}
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
        slots = list(self._vectors)
        matrix = torch.stack([self._vectors[s] for s in slots]).double()
        self.policies[policy] = PolicyGradients(slots, matrix @ matrix.T)
        self._vectors = {}
