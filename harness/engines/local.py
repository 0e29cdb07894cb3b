"""In-process engine: one frozen base model, one LoRA adapter per policy (peft), HF generate; on
the CPU in fp32 by default, or on a GPU (`local.device`, `local.dtype=bf16`).

The update is verl's PPO actor update (engines/base.py): each policy's rows cut into mini-batches,
one AdamW step each, old log-probs from the behaviour weights. Within a mini-batch, micro-batches
are grouped by role instance and the gradient probe reads the change in `.grad` after each
instance's micro-batches.
"""
from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from harness.algo.loss import BatchNorm, ClipConfig, aggregate, kl_to_reference, ppo_clip_loss
from harness.algo.coherence_damping import CoherenceDamping
from harness.config import kl_beta
from harness.engines.adapters import attach_adapters
from harness.engines.base import (STAT_SUMS, MiniBatch, ProbsDiff, UpdateResult, add_offpolicy, clip_coefficients,
                                  coherence_lr_scale, finish_update, measure_kl, record_minibatch, record_step, step_lr,
                                  update_plan)
from harness.engines.logprobs import ResponseLogProbs, response_log_probs
from harness.engines.sampling import generate_grouped, sample_repeated
from harness.instrument.probe import GradientProbe
from harness.episodes import Generation, Sampling, Turn


def norm_of(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of tensors taken as one vector (torch's fused norm, as for the gradient norm)."""
    return float(torch.nn.utils.get_total_norm(list(tensors))) if tensors else 0.0


def split_optimizer_state(state: dict, prefix: str, tensors: Dict[str, torch.Tensor]) -> dict:
    """An optimizer's state_dict without pickle: its tensors go into `tensors` under `prefix`, the
    plain rest (settings, step counts) is returned for JSON."""
    per_param: Dict[str, dict] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{prefix}{index}/{key}"] = value.detach().contiguous()
            else:
                per_param.setdefault(str(index), {})[key] = value
    return {"param_groups": state["param_groups"], "plain_state": per_param, "indices": [int(i) for i in state["state"]]}


def join_optimizer_state(entry: dict, prefix: str, tensors: Dict[str, torch.Tensor]) -> dict:
    """The state_dict `split_optimizer_state` took apart."""
    state = {}
    for index in entry["indices"]:
        values = dict(entry["plain_state"].get(str(index), {}))
        head = f"{prefix}{index}/"
        values.update({k[len(head):]: v for k, v in tensors.items() if k.startswith(head)})
        state[index] = values
    return {"state": state, "param_groups": entry["param_groups"]}


def local_device(cfg) -> torch.device:
    """local.device: `auto` is cuda when torch sees a GPU, else the CPU."""
    wanted = cfg.local.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class LocalEngine:
    def __init__(self, model_dir: Path, policies: List[str], cfg, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[cfg.local.dtype])
        self._setup(base, tokenizer, policies, cfg, seed)
        if cfg.local.rollout == "vllm":  # a vLLM server samples; this process trains (vllm_rollout.py)
            from harness.engines.vllm_rollout import VllmRollout

            served = max(len(self.policies), len(self.split_targets))
            length = min(int(base.config.max_position_embeddings), int(cfg.verl.rollout_max_model_len))
            self.rollout = VllmRollout(model_dir, base.config, served, int(cfg.model.lora_rank), length,
                                       cfg.local.dtype, tokenizer.eos_token_id)

    @classmethod
    def from_model(cls, base, tokenizer, policies: List[str], cfg, seed: int = 0) -> "LocalEngine":
        """An engine over a model already in memory (a random Qwen3 of the study's shape built on the
        GPU, bench/gpu_check_local.py): no round trip through the disk."""
        engine = cls.__new__(cls)
        engine._setup(base.to(DTYPES[cfg.local.dtype]), tokenizer, policies, cfg, seed)
        return engine

    def _setup(self, base, tokenizer, policies: List[str], cfg, seed: int) -> None:
        self.cfg = cfg
        # a branch that un-shares policies starts as its parent (the same adapters, drawn alike) and splits
        # them at the branch (apply_split): each new policy a copy of its parent policy
        self.split = dict(cfg.sharing_cfg.split_from)
        self.split_targets = list(policies) if self.split else []
        policies = sorted((set(policies) - set(self.split)) | set(self.split.values())) if self.split else policies
        self.policies = list(policies)
        self.tokenizer = tokenizer
        self.device = local_device(cfg)
        base = base.to(self.device)
        self.full_finetune = bool(cfg.sharing_cfg.full_finetune)
        torch.manual_seed(seed)
        if self.full_finetune:
            assert len(self.policies) == 1, "full fine-tuning trains one policy: the whole model"
            self.model = base
            self.params = {self.policies[0]: [p for p in base.parameters()]}
        else:
            self.model = attach_adapters(base, self.policies, cfg, seed).to(self.device)
            self.params = {p: [t for n, t in self.model.named_parameters() if f".{p}." in n and "lora_" in n]
                           for p in self.policies}
        self.seed = seed
        self.rollout = None  # local.rollout=vllm: the server that samples (set by __init__)
        self._active: Optional[str] = None
        self.initial = {p: [t.detach().clone() for t in self.params[p]] for p in self.policies}  # θ_0, for drift
        # fused: one kernel for all of a policy's tensors (the per-tensor loop is ~5x slower at LoRA sizes)
        algo = cfg.algo
        self.optimizers = {p: self._optimizer(self.params[p]) for p in self.policies}
        self.damping = CoherenceDamping(algo.coherence_damping, algo.coherence_damping_window)
        self.model.eval()  # no dropout anywhere; gradients still flow

    # ---------------------------------------------------------------- generate
    def _activate(self, policy: str) -> None:
        if not self.full_finetune and self._active != policy:  # set_adapter walks every module: once per switch
            self.model.set_adapter(policy)  # also makes only this adapter trainable
            self._active = policy
        for p in self.params[policy]:
            p.requires_grad_(True)

    @torch.no_grad()
    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        """Sample one response per prompt with the policy's adapter; duplicates share a prefill."""
        self._activate(policy)
        tok = self.tokenizer
        if self.rollout is not None:
            self.rollout.sync(self.model, self.params)  # the server gets what changed since it last sampled
            return generate_grouped(tok, prompts, lambda ids, mask, copies: self.rollout.sample(
                policy, ids, mask, copies, sampling.max_new_tokens, sampling.temperature, sampling.greedy),
                sampling.max_prompt_tokens)

        def sample(input_ids, attention_mask, copies):
            input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
            tokens, log_probs = sample_repeated(self.model, input_ids, attention_mask, copies, sampling.max_new_tokens,
                                                sampling.temperature, sampling.greedy, tok.eos_token_id,
                                                tok.pad_token_id)
            return tokens.tolist(), log_probs.tolist()

        return generate_grouped(tok, prompts, sample, sampling.max_prompt_tokens)

    @torch.no_grad()
    def prompt_features(self, policy: str, prompts: Sequence[List[int]]) -> torch.Tensor:
        """(n, hidden) final hidden state at each prompt's last token under the policy's weights:
        what its critic reads (algo.adv_estimator=gae)."""
        self._activate(policy)
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                         logits_to_keep=1)
        return out.hidden_states[-1][:, -1].float().cpu()  # the critic head lives on the CPU

    def hidden_size(self, policy: str = "") -> int:
        return int(self.model.config.hidden_size)

    # ---------------------------------------------------------------- update
    def _log_probs(self, batch: Sequence[Turn]) -> ResponseLogProbs:
        """Each response token's log-prob, the distribution's entropy and the response mask (rows, M),
        at the rollout's sampling temperature (logprobs.py)."""
        return response_log_probs(self.model, [t.prompt_ids for t in batch], [t.response_ids for t in batch],
                                  self.tokenizer.pad_token_id, shared_prompt=self.cfg.algo.shared_prompt_forward,
                                  temperature=self.cfg.algo.temperature)

    @torch.no_grad()
    def _old_log_probs(self, policy: str, turns: Sequence[Turn]) -> Dict[int, torch.Tensor]:
        """Response log-probs under the behaviour weights (before this step's first optimizer step),
        as verl's compute_log_prob: {id(turn): (len(response),)}."""
        self._activate(policy)
        old: Dict[int, torch.Tensor] = {}
        size = self.cfg.algo.micro_batch_size
        for start in range(0, len(turns), size):
            batch = turns[start: start + size]
            out = self._log_probs(batch)
            for row, turn in enumerate(batch):
                old[id(turn)] = out.log_prob[row][out.mask[row].bool()].clone()
        return old

    def micro_batch_loss(self, batch: Sequence[Turn], norm: BatchNorm, role: str, stats: dict,
                         old: Optional[Dict[int, torch.Tensor]] = None, with_kl: bool = False) -> torch.Tensor:
        """Loss of one micro-batch of one role instance, normalised by its mini-batch's counts.
        A turn without `old` log-probs is on-policy: its own log-probs (detached) are the old ones, and
        are kept in `old` when given, for later epochs."""
        algo = self.cfg.algo
        out = self._log_probs(batch)
        log_prob, mask = out.log_prob, out.mask
        old_log_prob = log_prob.detach().clone()
        for row, turn in enumerate(batch):
            where = mask[row].bool()
            if old is not None and id(turn) in old:
                old_log_prob[row][where] = old[id(turn)]
            elif old is not None:
                old[id(turn)] = old_log_prob[row][where].clone()
        advantages = torch.tensor([[t.advantage] for t in batch], dtype=torch.float32, device=self.device)
        policy_loss = ppo_clip_loss(log_prob, old_log_prob, advantages, ClipConfig.from_algo(algo))
        loss_mat = policy_loss.loss_mat
        beta = kl_beta(algo, role)
        if beta > 0 or with_kl:
            with torch.no_grad(), self.model.disable_adapter():
                ref = self._log_probs(batch).log_prob
            kl = kl_to_reference(log_prob, ref)
            if beta > 0:
                loss_mat = loss_mat + beta * kl
            stats["kl"][role] += float((kl.detach() * mask).sum())
        stats["entropy"][role] += float((out.entropy * mask).sum())
        stats["tokens"][role] += float(mask.sum())
        stats["clipped"][role] += float((policy_loss.clipped * mask).sum())
        stats["ratio"][role] += float((policy_loss.ratio * mask).sum())
        for kind in STAT_SUMS:  # a caller's own sums (tests) may hold only some of them
            stats.setdefault(kind, defaultdict(float))
        stats["ratio_dev_sq"][role] += float(((policy_loss.ratio.detach() - 1.0) ** 2 * mask).sum())
        add_offpolicy(stats, role, log_prob.detach(), mask, [t.rollout_log_probs for t in batch])
        return aggregate(loss_mat, mask, algo.loss_agg, norm, role)

    def _backward(self, policy: str, minibatch: MiniBatch, old, stats, probe, with_kl: bool) -> Dict[str, float]:
        """Every micro-batch of one mini-batch, grouped by role instance; returns each role's loss."""
        params, size = self.params[policy], self.cfg.algo.micro_batch_size
        losses: Dict[str, float] = defaultdict(float)
        for slot, group in minibatch.slots.items():
            if probe is not None:
                probe.begin(policy, slot, params)
            for start in range(0, len(group), size):
                loss = self.micro_batch_loss(group[start: start + size], minibatch.norm, slot[0], stats, old,
                                             with_kl)
                loss.backward()
                losses[slot[0]] += float(loss.detach())
            if probe is not None:
                probe.end(policy, slot, params)
        if probe is not None:
            probe.finish_policy(policy)
        return losses

    def _distance(self, policy: str) -> float:
        with torch.no_grad():
            return norm_of(torch._foreach_sub(self.params[policy], self.initial[policy]))

    def update(self, samples: Sequence[Turn], probe=None, step: int = 0) -> UpdateResult:
        """verl's actor update for every policy (engines/base.py): old log-probs from the behaviour
        weights, then the mini-batches in rounds, each one optimizer step with clipping per policy
        or over the cell; the LR follows the schedule at `step`."""
        algo = self.cfg.algo
        if probe is None and algo.coherence_reg > 0:  # the design effect needs each instance's gradient
            probe = GradientProbe()
        plan = update_plan(samples, algo, self.seed, step)
        policies = [p for p in self.policies if p in plan and p not in algo.frozen_policies]  # frozen: sample only
        lr = step_lr(algo, self.cfg.steps, step)  # set on each optimizer step below
        # on-policy rows (the first mini-batch, before any step) take their old log-probs from their own
        # forward; every other row gets one forward under the behaviour weights now, as verl does
        first = {id(t) for p in policies for t in plan[p][0].turns}
        old = {p: self._old_log_probs(p, [t for t in samples if t.policy == p and id(t) not in first]) for p in policies}
        kl_now = measure_kl(self.cfg, step) and not self.full_finetune
        drift_before = {p: self._distance(p) for p in policies}
        stats = {k: defaultdict(float) for k in STAT_SUMS}
        result = UpdateResult(0.0, {}, {}, {})
        role_loss: Dict[Tuple[str, str], float] = defaultdict(float)
        for k in range(max((len(plan[p]) for p in policies), default=0)):
            active = [p for p in policies if k < len(plan[p])]
            norms, losses = {}, {}
            counted = {}  # (clipped tokens, tokens) of each policy's mini-batch
            for policy in active:
                self._activate(policy)
                self.optimizers[policy].zero_grad(set_to_none=True)
                clipped, tokens = sum(stats["clipped"].values()), sum(stats["tokens"].values())
                losses[policy] = self._backward(policy, plan[policy][k], old[policy], stats, probe, kl_now)
                counted[policy] = (sum(stats["clipped"].values()) - clipped, sum(stats["tokens"].values()) - tokens)
                damped = self.damping.apply(policy, [p.grad for p in self.params[policy]])
                if damped is not None:  # I6: before clipping, as upstream
                    result.coherence_damping.setdefault(policy, []).append(damped)
                grads = [p.grad for p in self.params[policy] if p.grad is not None]
                norms[policy] = norm_of(grads)
            factors = clip_coefficients(norms, algo.max_grad_norm, algo.clip_scope)
            for policy in active:
                params, optimizer = self.params[policy], self.optimizers[policy]
                lr_scale = coherence_lr_scale(algo, probe.rounds[policy][-1]) if algo.coherence_reg > 0 else None
                record_minibatch(result, role_loss, policy, losses[policy], norms[policy], *counted[policy],
                                 rows=len(plan[policy][k].turns), lr_scale=lr_scale)
                if not math.isfinite(norms[policy]):
                    optimizer.zero_grad(set_to_none=True)
                    record_step(result, policy, None)
                    continue
                with torch.no_grad():
                    torch._foreach_mul_([p.grad for p in params if p.grad is not None], factors[policy])
                with torch.no_grad():
                    before = [p.clone() for p in params]
                for group in optimizer.param_groups:
                    group["lr"] = lr * (lr_scale if lr_scale is not None else 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                with torch.no_grad():
                    record_step(result, policy, norm_of(torch._foreach_sub(params, before)))
        finish_update(result, {p: plan[p] for p in policies}, role_loss, stats)
        for policy in policies:  # `old` now holds every row's behaviour log-probs
            diff = ProbsDiff()
            for turn in samples:
                if turn.policy == policy:
                    diff.add(turn.rollout_log_probs, old[policy][id(turn)])
            if diff.summary() is not None:
                result.rollout_probs_diff[policy] = diff.summary()
        for policy in policies:
            with torch.no_grad():
                result.policy_param_norm[policy] = norm_of(self.params[policy])
            result.drift[policy] = self._distance(policy)
            result.drift_rate[policy] = result.drift[policy] - drift_before[policy]
        return result

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
            self.rollout = None

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {"params": {p: [t.detach().clone() for t in self.params[p]] for p in self.policies},
                "optimizers": {p: self.optimizers[p].state_dict() for p in self.policies},
                "coherence_ema": dict(self.damping.tensors())}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for policy in self.policies:
                for target, value in zip(self.params[policy], state["params"][policy]):
                    target.copy_(value)
                self.optimizers[policy].load_state_dict(state["optimizers"][policy])
        self.damping.load(state.get("coherence_ema") or {})

    def save(self, path: Path) -> None:
        """Tensors in safetensors (no pickle), the optimizers' plain settings in JSON."""
        from safetensors.torch import save_file

        tensors, settings = {}, {}
        for policy in self.policies:
            for i, t in enumerate(self.params[policy]):
                tensors[f"param/{policy}/{i}"] = t.detach().contiguous()
            settings[policy] = split_optimizer_state(self.optimizers[policy].state_dict(), f"optim/{policy}/", tensors)
        tensors.update(self.damping.tensors())
        save_file(tensors, str(Path(path) / "engine.safetensors"))
        (Path(path) / "optimizers.json").write_text(json.dumps(settings))

    def _optimizer(self, params: List[torch.Tensor]) -> torch.optim.AdamW:
        algo = self.cfg.algo
        return torch.optim.AdamW(params, lr=algo.lr, weight_decay=algo.weight_decay, betas=tuple(algo.adam_betas),
                                 eps=algo.adam_eps, fused=True)

    def apply_split(self) -> None:
        """Un-share at the branch (sharing_cfg.split_from): each new policy gets its own adapter holding
        a copy of its parent policy's weights, starting point (for drift) and optimizer state; the
        parent policies it replaces stop training. Idempotent."""
        if not self.split or self.policies == self.split_targets:
            return
        from harness.engines.adapters import lora_config

        with torch.random.fork_rng(devices=[]):  # a new adapter's random init must not move the run's streams
            for target, source in sorted(self.split.items()):
                self.model.add_adapter(target, lora_config(self.cfg))
                self.model.to(self.device)
                self.params[target] = [t for n, t in self.model.named_parameters() if f".{target}." in n and "lora_" in n]
                with torch.no_grad():
                    for mine, theirs in zip(self.params[target], self.params[source]):
                        mine.copy_(theirs)
                self.initial[target] = [t.clone() for t in self.initial[source]]
                self.optimizers[target] = self._optimizer(self.params[target])
                # a deep copy: load_state_dict keeps the source's moment tensors as they are, and copies
                # sharing them would step each other's Adam state
                self.optimizers[target].load_state_dict(copy.deepcopy(self.optimizers[source].state_dict()))
        for gone in set(self.policies) - set(self.split_targets):
            del self.params[gone], self.optimizers[gone], self.initial[gone]
        self.policies = list(self.split_targets)
        self._active = None

    def load(self, path: Path) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(Path(path) / "engine.safetensors"))
        if self.split and self.policies != self.split_targets:
            if any(key.startswith(f"param/{target}/") for target in self.split for key in tensors):
                self.apply_split()  # the arm's own checkpoint, after the split: split, then load it
            else:  # the parent's checkpoint at the branch: load it as the parent, then split
                self._load(tensors, path)
                self.apply_split()
                return
        self._load(tensors, path)

    def _load(self, tensors: Dict[str, torch.Tensor], path: Path) -> None:
        settings = json.loads((Path(path) / "optimizers.json").read_text())
        params = {p: [tensors[f"param/{p}/{i}"] for i in range(len(self.params[p]))] for p in self.policies}
        optimizers = {p: join_optimizer_state(settings[p], f"optim/{p}/", tensors) for p in self.policies}
        self.load_state_dict({"params": params, "optimizers": optimizers,
                              "coherence_ema": {k: v for k, v in tensors.items() if k.startswith("coherence_ema/")}})
