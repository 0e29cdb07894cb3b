"""The study's I6 coherence regulariser, as upstream defines it
(XHMY/marl-llm-workflows docs/multi-agent/interventions/i6-coherence-regularizer.md;
verl/workers/actor/dp_actor.py `_apply_coherence_regularizer`).

At each mini-batch boundary, after the gradient is accumulated and before clipping and the optimizer
step, a policy's gradient g is scaled by `1 - λ · clamp(cos(g, ḡ), 0, 1)`, cos one scalar over the
whole adapter, ḡ an exponential moving average (τ = 1 - 1/window) lazily started at the first
gradient and updated toward the scaled one. An update aligned with the policy's history is damped,
an orthogonal or opposed one passes. λ is per policy (under IP the policy id is the role name, as
upstream's per-role weights); upstream applies it under IP only. The harness's own `coherence_reg`
(algo/coherence.py) instead divides the learning rate by a design effect of same-type instances.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch


class CoherenceDamping:
    """Per-policy EMA of the gradient and the step-scaling surgery; its EMA is checkpointed."""

    def __init__(self, weights: Dict[str, float], window: int, eps: float = 1e-8):
        self.weights = {p: float(w) for p, w in weights.items() if float(w) > 0}
        self.tau = 1.0 - 1.0 / window
        self.eps = eps
        self.ema: Dict[str, List[torch.Tensor]] = {}

    def apply(self, policy: str, grads: List[Optional[torch.Tensor]]) -> Optional[Tuple[float, float]]:
        """Scale `grads` in place; returns (cos, scale), or None where the policy has no weight."""
        weight = self.weights.get(policy, 0.0)
        if weight <= 0:
            return None
        present = [g for g in grads if g is not None]
        if policy not in self.ema:  # lazy start: the first step's cosine is 1
            self.ema[policy] = [g.detach().clone() for g in present]
        ema = self.ema[policy]
        with torch.no_grad():
            gg = sum(float((g.float() * g.float()).sum()) for g in present)
            ee = sum(float((e.float() * e.float()).sum()) for e in ema)
            ge = sum(float((g.float() * e.float()).sum()) for g, e in zip(present, ema))
            cos = ge / (gg ** 0.5 * ee ** 0.5 + self.eps)
            scale = 1.0 - weight * min(max(cos, 0.0), 1.0)
            for g, e in zip(present, ema):
                g.mul_(scale)
                e.mul_(self.tau).add_(g, alpha=1.0 - self.tau)  # toward the scaled gradient (upstream: post-surgery)
        return cos, scale

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {f"coherence_ema/{p}/{i}": t.detach().contiguous() for p, ts in self.ema.items() for i, t in enumerate(ts)}

    def load(self, tensors: Dict[str, torch.Tensor]) -> None:
        """The EMA a checkpoint holds (none: a cold start, as upstream on a missing file)."""
        self.ema = {}
        for key in sorted(k for k in tensors if k.startswith("coherence_ema/")):
            _, policy, index = key.split("/")
            self.ema.setdefault(policy, []).append((int(index), tensors[key].clone()))
        self.ema = {p: [t for _, t in sorted(ts, key=lambda it: it[0])] for p, ts in self.ema.items()}
