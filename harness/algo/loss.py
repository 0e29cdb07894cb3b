"""The policy loss of one micro-batch, normalised by whole-batch counts so that the gradients
of the micro-batches (one role instance each) add up exactly to the gradient of the full loss.

Aggregation modes: `token-mean` and `seq-mean-token-mean` are verl's `agg_loss` (algo/verl_core.py) with global
normalisers; `role-balanced` gives each role of a policy equal weight (token-mean within role),
a mitigation for role capture under a shared policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from harness.algo.verl_core import agg_loss, low_var_kl


@dataclass(frozen=True)
class BatchNorm:
    """Whole-batch counts of one policy's update."""

    n_tokens: int
    n_sequences: int
    role_tokens: Dict[str, int]


@dataclass(frozen=True)
class ClipConfig:
    """PPO's clipped ratio: [1 - low, 1 + high], and dual clip at `c` for negative advantages."""

    low: float
    high: float
    c: Optional[float] = None

    @classmethod
    def from_algo(cls, algo) -> "ClipConfig":
        low = algo.clip_ratio if algo.clip_ratio_low is None else algo.clip_ratio_low
        high = algo.clip_ratio if algo.clip_ratio_high is None else algo.clip_ratio_high
        return cls(float(low), float(high), None if algo.clip_ratio_c is None else float(algo.clip_ratio_c))


@dataclass
class PolicyLoss:
    loss_mat: torch.Tensor  # (bs, T) per-token loss
    ratio: torch.Tensor  # (bs, T) pi / pi_old, detached
    clipped: torch.Tensor  # (bs, T) 1.0 where the clipped term was taken (verl's pg_clipfrac)


def ppo_clip_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                  clip: ClipConfig) -> PolicyLoss:
    """verl's vanilla PPO policy loss per token (`compute_policy_loss_vanilla` before aggregation);
    advantages are per sequence (bs, 1)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip.low, 1.0 + clip.high)
    loss = torch.maximum(unclipped, clipped)
    if clip.c is not None:
        loss = torch.where(advantages < 0, torch.minimum(-advantages * clip.c, loss), loss)
    return PolicyLoss(loss, ratio.detach(), torch.gt(clipped, unclipped).float().detach())


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm: BatchNorm, role: str) -> torch.Tensor:
    if mode == "token-mean":
        return agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=max(norm.n_tokens, 1))
    if mode == "seq-mean-token-mean":
        return agg_loss(loss_mat, mask, "seq-mean-token-mean", global_batch_size=max(norm.n_sequences, 1))
    if mode == "role-balanced":
        role_loss = agg_loss(loss_mat, mask, "token-mean", batch_num_tokens=max(norm.role_tokens[role], 1))
        return role_loss / len(norm.role_tokens)
    raise ValueError(f"unknown loss aggregation '{mode}'")


def kl_to_reference(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """verl's low-variance KL estimator, per token."""
    return low_var_kl(log_prob, ref_log_prob)
