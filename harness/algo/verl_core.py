"""verl's estimators the local engine uses, written out with torch alone.

The local engine must import where neither Ray nor verl is installed (a lone GPU machine with
torch, transformers and peft; `bench/gpu_check.sh`), and importing verl imports Ray. These are
verl 0.9's functions for the modes the harness uses, line for line in what they compute;
tests/test_verl_core.py checks each against verl's own on random inputs, so a change on either
side shows up there.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """verl.utils.torch_functional.masked_sum: NaNs outside the mask do not reach the sum."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str, batch_num_tokens: Optional[float] = None,
             global_batch_size: Optional[float] = None) -> torch.Tensor:
    """verl.trainer.ppo.core_algos.agg_loss (one data-parallel rank) for `token-mean` and
    `seq-mean-token-mean`, normalised by whole-batch counts when given."""
    if mode == "token-mean":
        total = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        return masked_sum(loss_mat, loss_mask) / total
    if mode == "seq-mean-token-mean":
        per_sequence = loss_mask.sum(dim=-1)
        seq_losses = (loss_mat * loss_mask).sum(dim=-1) / (per_sequence + 1e-8)
        seq_mask = (per_sequence > 0).float()
        total = seq_mask.sum() if global_batch_size is None else global_batch_size
        return masked_sum(seq_losses, seq_mask) / total
    raise ValueError(f"unknown loss aggregation '{mode}'; valid: token-mean, seq-mean-token-mean")


def low_var_kl(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """verl's `kl_penalty(..., "low_var_kl")` (k3, Schulman 2020), clamped as verl clamps it."""
    kl = torch.clamp(ref_log_prob - log_prob, min=-20, max=20)
    return torch.clamp((torch.exp(kl) - kl - 1).contiguous(), min=-10, max=10)


def grpo_outcome_advantage(scores: torch.Tensor, index: Sequence, epsilon: float = 1e-6,
                           norm_by_std: bool = True) -> torch.Tensor:
    """verl's `compute_grpo_outcome_advantage` for one score per row (bs,): each score less its
    group's mean, over the group's unbiased std + epsilon when `norm_by_std`; a one-member group
    keeps its raw score (mean 0, std 1), as verl does."""
    members: Dict[object, List[int]] = defaultdict(list)
    for row, key in enumerate(index):
        members[key].append(row)
    out = scores.clone()
    with torch.no_grad():
        for rows in members.values():
            group = scores[rows]
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = group.mean(), group.std()
            out[rows] = (group - mean) / (std + epsilon) if norm_by_std else group - mean
    return out


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int, step: int) -> float:
    """verl's LR multiplier at `step` (zero-indexed): `get_constant_schedule_with_warmup`, or
    `get_cosine_schedule_with_warmup` with min_lr_ratio 0 and half a cycle."""
    if schedule == "cosine":
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
        return max(0.0, math.cos(math.pi * 0.5 * 2.0 * progress) * 0.5 + 0.5)
    if schedule == "constant":
        return float(step) / float(max(1.0, warmup_steps)) if step < warmup_steps else 1.0
    raise ValueError(f"unknown lr schedule '{schedule}'; valid: constant, cosine")
