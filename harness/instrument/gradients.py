"""Per-role and per-policy gradient statistics from the probe's Gram matrices.

The gradient of the whole update is the concatenation of every policy's gradient (policies
own disjoint parameters), so instances on different policies are orthogonal by construction:
    role grad norm   ‖Σ_{i∈role} g_i‖
    grad share       g_role·g_total / ‖g_total‖²       (shares of all roles sum to 1)
    coherence        ‖Σ_{i∈S} g_i‖² / Σ_{i∈S} ‖g_i‖²   (≈1 orthogonal, ≈n aligned; n same-type instances)
    amplification    max over policies P of ‖Σ_{i∈role∩P} g_i‖ / mean_{i∈role∩P} ‖g_i‖ within one optimizer
                     step: how the role's same-type instances' gradients add up on the policy they share
                     (1 when every instance has its own policy; sqrt(n) orthogonal; n aligned). Under a
                     mean loss this is alignment, not speed: the faster update of a shared adapter is its
                     extra optimizer steps (policy/<p>/optimizer_steps, drift)
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict

from harness.instrument.probe import GradientProbe, PolicyGradients
from harness.metric_keys import instance_key, policy_key, role_key


MEAN_SUFFIX = "_mb_mean"


def gradient_metrics(probe: GradientProbe) -> Dict[str, float]:
    """The first optimizer step's statistics under their plain keys, and each statistic's mean over
    all optimizer steps of the training step under `<key>_mb_mean` (a key absent from a round,
    e.g. a policy with fewer mini-batches, is averaged over the rounds that have it)."""
    rounds = [round_metrics(probe.round(k)) for k in range(probe.n_rounds)]
    metrics = dict(rounds[0]) if rounds else round_metrics({})
    every: Dict[str, list] = defaultdict(list)
    for values in rounds:
        for key, value in values.items():
            every[key].append(value)
    metrics.update({f"{key}{MEAN_SUFFIX}": sum(values) / len(values) for key, values in every.items()})
    return metrics


def round_metrics(policies: Dict[str, PolicyGradients]) -> Dict[str, float]:
    """Per-role statistics of one optimizer step of each policy in `policies`."""
    metrics: Dict[str, float] = {}
    role_sq: Dict[str, float] = defaultdict(float)  # ‖g_role‖² summed over policies
    role_dot_total: Dict[str, float] = defaultdict(float)
    role_self: Dict[str, float] = defaultdict(float)  # Σ ‖g_i‖²
    role_norms: Dict[str, list] = defaultdict(list)
    role_amplification: Dict[str, float] = defaultdict(float)
    role_instances_per_policy: Dict[str, int] = defaultdict(int)
    total_sq = 0.0
    for policy, pg in policies.items():
        gram = pg.gram
        policy_sq = float(gram.sum())
        total_sq += policy_sq
        metrics[policy_key(policy, "grad_norm_probe")] = math.sqrt(max(policy_sq, 0.0))
        if len(pg.slots) > 1:
            metrics[policy_key(policy, "coherence")] = policy_sq / max(float(gram.diag().sum()), 1e-30)
        roles = [slot[0] for slot in pg.slots]
        for role in set(roles):
            idx = [k for k, r in enumerate(roles) if r == role]
            role_sq[role] += float(gram[idx][:, idx].sum())
            role_dot_total[role] += float(gram[idx].sum())
            role_self[role] += float(gram.diag()[idx].sum())
            norms = [math.sqrt(max(float(gram[k, k]), 0.0)) for k in idx]
            role_norms[role] += norms
            # only instances that pushed at all: an all-zero-advantage slot would halve the mean
            active = [k for k, n in zip(idx, norms) if n > 0]
            if active:
                summed = math.sqrt(max(float(gram[active][:, active].sum()), 0.0))
                mean_single = sum(norms[idx.index(k)] for k in active) / len(active)
                role_amplification[role] = max(role_amplification[role], summed / mean_single)
            role_instances_per_policy[role] = max(role_instances_per_policy[role], len(active))
            metrics[policy_key(policy, "instances")] = float(len(pg.slots))
        for k, (role, instance) in enumerate(pg.slots):
            metrics[instance_key(role, instance, "grad_norm")] = math.sqrt(max(float(gram[k, k]), 0.0))
    for role in role_sq:
        norm = math.sqrt(max(role_sq[role], 0.0))
        metrics[role_key(role, "grad_norm")] = norm
        metrics[role_key(role, "grad_share")] = role_dot_total[role] / total_sq if total_sq > 0 else 0.0
        if len(role_norms[role]) > 1:
            metrics[role_key(role, "coherence")] = role_sq[role] / max(role_self[role], 1e-30)
            metrics[role_key(role, "amplification")] = role_amplification[role]
            metrics[role_key(role, "instances_per_policy")] = float(role_instances_per_policy[role])
    metrics["grad/total_norm"] = math.sqrt(max(total_sq, 0.0))
    return metrics
