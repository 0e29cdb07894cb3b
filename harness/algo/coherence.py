"""`coherence_reg`: count the coherent part of same-type instances' push once.

Three voters on one adapter are, per optimizer step, n samples of one role's gradient. When their
gradients agree they carry the information of fewer independent instances; that is Kish's design
effect for clustered samples, d = 1 + (n − 1)·ρ, with ρ the instances' mean pairwise alignment.
From one mini-batch's Gram matrix G_ij = g_i·g_j over the role's instances:

    coherence c = ‖Σ_i g_i‖² / Σ_i ‖g_i‖²        (1 orthogonal, n aligned; 1 + (n − 1)ρ)
    d           = max(1, 1 + λ·(c − 1))          (λ = `algo.coherence_reg`)

and the optimizer step's learning rate is divided by d (by the largest d over the policy's roles):
n aligned instances then move the adapter as far in their n steps as one instance in one, while
orthogonal ones (independent information) are not slowed. The learning rate, not the gradient, is
scaled because Adam divides a gradient's scale out of its step.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

Slot = Tuple[str, int]


def design_effect(slots: Sequence[Slot], gram: torch.Tensor, strength: float) -> float:
    """d ≥ 1 of one optimizer step of one policy: the largest over its roles with ≥ 2 instances
    that pushed (an instance with a zero gradient adds nothing to either sum)."""
    if strength <= 0:
        return 1.0
    roles = [slot[0] for slot in slots]
    worst = 1.0
    for role in set(roles):
        idx = [k for k, r in enumerate(roles) if r == role]
        if len(idx) < 2:
            continue
        sub = gram[idx][:, idx].double()
        self_sq = float(sub.diag().sum())
        if self_sq <= 0:
            continue
        coherence = float(sub.sum()) / self_sq
        worst = max(worst, 1.0 + strength * (coherence - 1.0))
    return worst
