"""The engine protocol and the update plan both engines follow.

`local` runs in-process (transformers + peft, one adapter per policy on one frozen base);
a distributed engine (Ray + verl worker groups) implements the same four calls.

The update is verl's PPO actor update: each policy's rows (its turns, in episode order) are cut
into mini-batches of `ppo_mini_batch_size` problems' worth of rows (x group_size), optionally
shuffled per epoch, over `ppo_epochs`; every mini-batch is one optimizer step. A policy whose
roles emit three turns per episode (three voters on one adapter) therefore takes three optimizer
steps where a one-turn policy takes one. The plan is computed once here, so both engines cut the
same mini-batches. Steps run in rounds (the k-th mini-batch of every policy), which lets a
`cell` clipping scope take one gradient norm over all policies of a round.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from harness.algo.coherence import design_effect
from harness.algo.loss import BatchNorm
from harness.algo.verl_core import lr_lambda
from harness.config import kl_in_loss
from harness.episodes import Generation, Sampling, Turn

Slot = Tuple[str, int]


@dataclass
class UpdateResult:
    loss: float  # sum over policies of the mean loss of their optimizer steps
    policy_grad_norm: Dict[str, float]  # before clipping, first optimizer step
    policy_update_norm: Dict[str, float]  # Σ_k ‖Δθ_k‖ over the step's optimizer steps
    policy_param_norm: Dict[str, float]  # ‖θ‖ after the step
    entropy: Dict[str, float] = field(default_factory=dict)  # mean token entropy per role
    kl: Dict[str, float] = field(default_factory=dict)  # mean token KL to the base per role (kl_coef > 0)
    skipped: List[str] = field(default_factory=list)  # policies with a step skipped (non-finite)
    role_loss: Dict[str, float] = field(default_factory=dict)  # each role's part of `loss`
    optimizer_steps: Dict[str, int] = field(default_factory=dict)
    grad_norm_mean: Dict[str, float] = field(default_factory=dict)  # mean pre-clip norm over the steps
    drift: Dict[str, float] = field(default_factory=dict)  # ‖θ - θ_0‖ after the step
    drift_rate: Dict[str, float] = field(default_factory=dict)  # its change during this step
    clipfrac: Dict[str, float] = field(default_factory=dict)  # per role: tokens whose clipped term was taken
    ratio: Dict[str, float] = field(default_factory=dict)  # per role: mean PPO ratio over all passes
    minibatches: Dict[str, List[dict]] = field(default_factory=dict)  # per policy, per step: loss, clipfrac, grad_norm
    # per policy: mean and max over sampled tokens of |p_rollout - p_train| (verl's rollout_probs_diff_*)
    rollout_probs_diff: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    # per role: ratio_std, and the study's training_ppl, ppl_ratio, chi2_token (add_offpolicy)
    role_extra: Dict[str, Dict[str, float]] = field(default_factory=dict)
    # per policy, per optimizer step: (cos, scale) of the study's I6 damping (algo.coherence_damping)
    coherence_damping: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)


@dataclass
class MiniBatch:
    """One optimizer step of one policy: its normalisers (verl's loss is a per-mini-batch mean) and
    its turns grouped by role instance (the probe reads one gradient per instance)."""

    norm: BatchNorm
    slots: Dict[Slot, List[Turn]]

    @property
    def turns(self) -> List[Turn]:
        return [t for group in self.slots.values() for t in group]


def _minibatch(turns: Sequence[Turn]) -> MiniBatch:
    role_tokens: Dict[str, int] = defaultdict(int)
    slots: Dict[Slot, List[Turn]] = defaultdict(list)
    for t in turns:
        role_tokens[t.role] += len(t.response_ids)
        slots[t.slot].append(t)
    return MiniBatch(BatchNorm(sum(role_tokens.values()), len(turns), dict(role_tokens)), dict(slots))


def update_plan(samples: Sequence[Turn], algo, seed: int, step: int) -> Dict[str, List[MiniBatch]]:
    """{policy: its mini-batches in order, epoch after epoch}. Rows per mini-batch:
    ppo_mini_batch_size x group_size (x the policy's same-type instances under
    algo.role_count_scaling); the last one of an epoch may be smaller."""
    by_policy: Dict[str, List[Turn]] = defaultdict(list)
    for index in balanced_order(samples, algo):
        by_policy[samples[index].policy].append(samples[index])
    plan: Dict[str, List[MiniBatch]] = {}
    for policy, turns in by_policy.items():
        rows_per_batch = algo.ppo_mini_batch_size * algo.group_size
        if algo.role_count_scaling:  # n same-type instances take the optimizer steps one instance would
            rows_per_batch *= same_type_instances(turns)
        batches: List[MiniBatch] = []
        for epoch in range(algo.ppo_epochs):
            order = list(range(len(turns)))
            if algo.shuffle:
                generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + epoch)
                order = torch.randperm(len(turns), generator=generator).tolist()
            for start in range(0, len(order), rows_per_batch):
                batches.append(_minibatch([turns[i] for i in order[start: start + rows_per_batch]]))
        plan[policy] = batches
    return plan


def balanced_order(samples: Sequence[Turn], algo) -> List[int]:
    """The step's rows in the order verl's `_balance_batch` gives them (on by default in verl and in
    the study's trainer: `trainer.balance_batch`, ray_trainer.py), before each policy's rows are cut
    into mini-batches: each DP rank's rows sorted by workload (24576 s + s^2, s = prompt + response
    tokens: by length) and zig-zagged, `p[::2] + p[1::2][::-1]`, so mini-batches are stratified by
    length. With `balance_dp` > 1 ranks, verl's Karmarkar-Karp partition first (verl must be
    installed). `balance_batch=false`: the episodes' own order."""
    order = list(range(len(samples)))
    if not algo.balance_batch or not samples:
        return order
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in samples]
    if algo.balance_dp > 1:
        from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

        workload = [24576 * s + s * s for s in lengths]
        partitions = get_seqlen_balanced_partitions(workload, k_partitions=algo.balance_dp, equal_size=True)
    else:
        partitions = [order]
    ordered: List[int] = []
    for partition in partitions:
        ranked = sorted(partition, key=lambda i: (lengths[i], i))
        ordered += ranked[::2] + ranked[1::2][::-1]
    return ordered


def same_type_instances(turns: Sequence[Turn]) -> int:
    """The most instances of one role among a policy's turns (3 for IP voting's voter adapter)."""
    instances: Dict[str, set] = defaultdict(set)
    for turn in turns:
        instances[turn.role].add(turn.instance)
    return max((len(v) for v in instances.values()), default=1)


def record_minibatch(result: UpdateResult, role_loss: Dict[Tuple[str, str], float], policy: str,
                     losses: Dict[str, float], grad_norm: float, clipped: float, tokens: float, rows: int,
                     lr_scale: Optional[float] = None) -> None:
    """One optimizer step's numbers, as both engines record them (before stepping); `lr_scale`:
    the step's learning-rate factor under algo.coherence_reg."""
    for role, value in losses.items():
        role_loss[(policy, role)] += value
    record = {"loss": sum(losses.values()), "grad_norm": grad_norm, "clipfrac": clipped / max(tokens, 1.0),
              "tokens": tokens, "rows": rows}
    if lr_scale is not None:
        record["lr_scale"] = lr_scale
    result.minibatches.setdefault(policy, []).append(record)


def coherence_lr_scale(algo, gradients) -> Optional[float]:
    """The learning-rate factor 1/d of one optimizer step under algo.coherence_reg (None when off),
    from the step's PolicyGradients (algo/coherence.py)."""
    if algo.coherence_reg <= 0:
        return None
    return 1.0 / design_effect(gradients.slots, gradients.gram, algo.coherence_reg)


def record_step(result: UpdateResult, policy: str, moved: Optional[float]) -> None:
    """The policy stepped and moved ‖Δθ‖ = `moved`, or (None) its step was skipped as non-finite."""
    if moved is None:
        if policy not in result.skipped:
            result.skipped.append(policy)
        return
    result.policy_update_norm[policy] = result.policy_update_norm.get(policy, 0.0) + moved
    result.optimizer_steps[policy] = result.optimizer_steps.get(policy, 0) + 1


def finish_update(result: UpdateResult, plan: Dict[str, List[MiniBatch]], role_loss: Dict[Tuple[str, str], float],
                  sums: Dict[str, Dict[str, float]]) -> None:
    """Per-policy and per-role summaries from the recorded steps and each role's token sums
    (entropy, kl, clipped, ratio, tokens); the engine adds param norms and drift."""
    for policy in plan:
        steps = result.minibatches[policy]
        finite = [m["grad_norm"] for m in steps if math.isfinite(m["grad_norm"])]
        result.policy_grad_norm[policy] = steps[0]["grad_norm"]
        result.grad_norm_mean[policy] = sum(finite) / len(finite) if finite else float("nan")
        result.loss += sum(m["loss"] for m in steps) / len(steps)
        result.optimizer_steps.setdefault(policy, 0)  # every step skipped: no update norm either
    for (policy, role), value in role_loss.items():
        result.role_loss[role] = result.role_loss.get(role, 0.0) + value / len(plan[policy])
    tokens = sums["tokens"]

    def per_token(kind: str) -> Dict[str, float]:
        return {r: sums[kind][r] / tokens[r] for r in tokens if tokens[r]}

    result.entropy, result.clipfrac, result.ratio = per_token("entropy"), per_token("clipped"), per_token("ratio")
    if sums.get("kl"):
        result.kl = per_token("kl")
    extra: Dict[str, Dict[str, float]] = defaultdict(dict)
    for role in tokens:
        if sums.get("ratio_dev_sq") and tokens[role]:  # about 1: deviations from 1 keep float32 sums exact enough
            mean_dev = sums["ratio"][role] / tokens[role] - 1.0
            extra[role]["ratio_std"] = math.sqrt(max(sums["ratio_dev_sq"][role] / tokens[role] - mean_dev ** 2, 0.0))
        if sums.get("seqs") and sums["seqs"].get(role):
            extra[role]["training_ppl"] = sums["training_ppl"][role] / sums["seqs"][role]
        if sums.get("rollout_seqs") and sums["rollout_seqs"].get(role):
            extra[role]["ppl_ratio"] = sums["ppl_ratio"][role] / sums["rollout_seqs"][role]
            extra[role]["chi2_token"] = sums["chi2"][role] / sums["rollout_tokens"][role] - 1.0
    result.role_extra = dict(extra)


STAT_SUMS = ("entropy", "kl", "tokens", "clipped", "ratio", "ratio_dev_sq", "seqs", "training_ppl", "rollout_seqs",
             "ppl_ratio", "rollout_tokens", "chi2")
OFFPOLICY_BOUND = 20.0  # verl's SAFETY_BOUND on the log-ratio (trainer/ppo/rollout_corr_helper.py)


def add_offpolicy(sums: Dict[str, Dict[str, float]], role: str, log_prob: torch.Tensor, mask: torch.Tensor,
                  rollout: Sequence[Optional[Sequence[float]]]) -> None:
    """The study's per-role diagnostics of the current policy against the sampler, summed per role
    (finish_update divides), as verl's compute_offpolicy_metrics defines them
    (verl 0.6.1 trainer/ppo/rollout_corr_helper.py l.742-795, logged by the study's trainer as
    actor/<role>/training_ppl, ppl_ratio, chi2_token: rllm/trainer/verl/agent_workflow_trainer.py
    l.603-604): training_ppl = mean over sequences of exp(-mean token log pi); ppl_ratio = mean over
    sequences of exp(mean log pi_rollout - mean log pi) (training over rollout perplexity); chi2_token =
    token mean of exp(clamp(log pi - log pi_rollout, +-20))^2 - 1. `log_prob` (rows, M) is the policy
    during the update, at the sampling temperature."""
    for row, sampled in enumerate(rollout):
        where = mask[row].bool()
        mine = log_prob[row][where].double()
        if mine.numel() == 0:
            continue
        sums["seqs"][role] += 1
        sums["training_ppl"][role] += float(torch.exp(-mine.mean()))
        if sampled is None or len(sampled) != mine.numel():
            continue
        theirs = torch.as_tensor(list(sampled), dtype=torch.float64, device=mine.device)
        sums["rollout_seqs"][role] += 1
        sums["ppl_ratio"][role] += float(torch.exp(theirs.mean() - mine.mean()))
        rho = torch.exp((mine - theirs).clamp(-OFFPOLICY_BOUND, OFFPOLICY_BOUND))
        sums["chi2"][role] += float((rho * rho).sum())
        sums["rollout_tokens"][role] += float(mine.numel())


class ProbsDiff:
    """verl's rollout-vs-trainer check (`training/rollout_probs_diff_mean`/`_max`), per policy:
    |p_rollout - p_train| over every sampled token, p_train from the behaviour weights at the rollout's
    temperature. A gap means the trainer's ratio is not the sampler's (a temperature, a numerics gap
    between engines, an adapter the rollout did not get)."""

    def __init__(self) -> None:
        self.total, self.count, self.largest = 0.0, 0, 0.0

    def add(self, rollout_log_probs: Optional[Sequence[float]], trainer_log_probs: torch.Tensor) -> None:
        if rollout_log_probs is None or len(rollout_log_probs) == 0:
            return
        rollout = torch.as_tensor(list(rollout_log_probs), dtype=torch.float64)
        diff = (rollout.exp() - trainer_log_probs.detach().double().cpu().exp()).abs()
        self.total += float(diff.sum())
        self.count += int(diff.numel())
        self.largest = max(self.largest, float(diff.max()))

    def merge(self, total: float, count: int, largest: float) -> None:
        self.total, self.count, self.largest = self.total + total, self.count + count, max(self.largest, largest)

    def summary(self) -> Optional[Tuple[float, float]]:
        """(mean, max), or None when no sampled token carried the sampler's log-prob."""
        return (self.total / self.count, self.largest) if self.count else None


def clip_coefficients(norms: Dict[str, float], max_norm: float, scope: str) -> Dict[str, float]:
    """torch's clip_grad_norm_ factor min(1, max_norm / (norm + 1e-6)) per policy, where `norm` is the
    policy's own gradient norm (scope `policy`, verl's) or one norm over every finite policy of the
    round (scope `cell`, so k adapters do not get k times the clipping budget of one)."""
    def factor(norm: float) -> float:
        return min(1.0, max_norm / (norm + 1e-6))

    if scope == "cell":
        total = math.sqrt(sum(n * n for n in norms.values() if math.isfinite(n)))
        return {p: factor(total) for p in norms}
    return {p: factor(n) if math.isfinite(n) else 1.0 for p, n in norms.items()}


def kl_age(cfg, step: int) -> Optional[int]:
    """Steps since the KL-to-base metric was last measured, when it is measured on a cadence:
    every `instrument.kl_every` steps. None when it is in the loss (kl_coef > 0: every step) or off."""
    every = cfg.instrument.kl_every if cfg.instrument.kl_to_base else 0
    if kl_in_loss(cfg.algo) or every <= 0:
        return None
    return step % every


def measure_kl(cfg, step: int) -> bool:
    """KL to the base costs a forward with the adapter off: every step when it is in the loss, else
    on the metric's cadence (kl_age)."""
    return kl_in_loss(cfg.algo) or kl_age(cfg, step) == 0


def lr_spike(algo, step: int) -> float:
    """The induced learning-rate spike's factor at training step `step` (1 outside it): a failure
    whose cause and start are known, to score the detectors on (algo.lr_spike_*)."""
    inside = algo.lr_spike_start <= step < algo.lr_spike_start + algo.lr_spike_steps
    return algo.lr_spike_factor if inside else 1.0


def step_lr(algo, total_steps: int, step: int) -> float:
    """The learning rate of training step `step`: the schedule's, times the induced spike and lr_factor."""
    return algo.lr * algo.lr_factor * lr_multiplier(algo, total_steps, step) * lr_spike(algo, step)


def lr_multiplier(algo, total_steps: int, step: int) -> float:
    """verl's LR schedule (constant or cosine, linear warm-up) at training step `step`; verl steps its
    scheduler once per training step (algo/verl_core.py)."""
    return lr_lambda(algo.lr_schedule, algo.lr_warmup_steps, max(total_steps, 1), step)


class Engine(Protocol):
    policies: List[str]

    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        ...

    def update(self, samples: Sequence[Turn], probe=None, step: int = 0) -> UpdateResult:
        ...

    def save(self, path: Path) -> None:
        ...

    def load(self, path: Path) -> None:
        ...
