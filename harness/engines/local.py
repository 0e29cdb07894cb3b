"""In-process engine: one frozen base model, one LoRA adapter per policy (peft), HF generate.

The update runs micro-batches grouped by (policy, role instance): each policy is updated in
turn with its adapter active, its own AdamW and its own gradient clipping, and the gradient
probe reads the change in `.grad` after each role instance's micro-batches.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import List, Sequence

import torch

from harness.algo.loss import BatchNorm, aggregate, kl_to_reference, ppo_clip_loss
from harness.engines.adapters import attach_adapters
from harness.engines.base import UpdateResult, policy_batches
from harness.engines.sampling import generate_grouped, sample_repeated
from harness.workflows import Generation, Sampling, Turn


class LocalEngine:
    def __init__(self, model_dir: Path, policies: List[str], cfg, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.policies = list(policies)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.full_finetune = bool(cfg.sharing_cfg.full_finetune)
        torch.manual_seed(seed)
        if self.full_finetune:
            assert self.policies == ["shared"], "full fine-tuning trains one shared policy"
            self.model = base
            self.params = {"shared": [p for p in base.parameters()]}
        else:
            self.model = attach_adapters(base, self.policies, cfg, seed)
            self.params = {p: [t for n, t in self.model.named_parameters() if f".{p}." in n and "lora_" in n]
                           for p in self.policies}
        self.optimizers = {p: torch.optim.AdamW(self.params[p], lr=cfg.algo.lr, weight_decay=cfg.algo.weight_decay)
                           for p in self.policies}
        self.model.eval()  # no dropout anywhere; gradients still flow

    # ---------------------------------------------------------------- generate
    def _activate(self, policy: str) -> None:
        if not self.full_finetune:
            self.model.set_adapter(policy)  # also makes only this adapter trainable
        for p in self.params[policy]:
            p.requires_grad_(True)

    @torch.no_grad()
    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        """Sample one response per prompt with the policy's adapter; duplicates share a prefill."""
        self._activate(policy)
        tok = self.tokenizer

        def sample(input_ids, attention_mask, copies):
            return sample_repeated(self.model, input_ids, attention_mask, copies, sampling.max_new_tokens,
                                   sampling.temperature, sampling.greedy, tok.eos_token_id, tok.pad_token_id).tolist()

        return generate_grouped(tok, prompts, sample)

    # ---------------------------------------------------------------- update
    def _log_probs(self, batch: Sequence[Turn]):
        """Token log-probs of each response (bs, T), its mask, and the logits' entropy."""
        rows = [t.prompt_ids + t.response_ids for t in batch]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        mask = torch.zeros((len(rows), width - 1))
        for b, (turn, row) in enumerate(zip(batch, rows)):
            ids[b, : len(row)] = torch.tensor(row)
            attention[b, : len(row)] = 1
            mask[b, len(turn.prompt_ids) - 1: len(row) - 1] = 1.0  # positions predicting response tokens
        logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        log_softmax = torch.log_softmax(logits, dim=-1)
        log_prob = log_softmax.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        return log_prob, mask, entropy, ids, attention

    def micro_batch_loss(self, batch: Sequence[Turn], norm: BatchNorm, role: str, stats: dict) -> torch.Tensor:
        """Loss of one micro-batch of one role instance, normalised by whole-batch counts."""
        algo = self.cfg.algo
        log_prob, mask, entropy, ids, attention = self._log_probs(batch)
        advantages = torch.tensor([[t.advantage] for t in batch], dtype=torch.float32)
        loss_mat = ppo_clip_loss(log_prob, log_prob.detach(), advantages, algo.clip_ratio)  # one on-policy step
        if algo.kl_coef > 0 or (self.cfg.instrument.kl_to_base and not self.full_finetune):
            with torch.no_grad(), self.model.disable_adapter():
                ref_logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
                ref = torch.log_softmax(ref_logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            kl = kl_to_reference(log_prob, ref)
            if algo.kl_coef > 0:
                loss_mat = loss_mat + algo.kl_coef * kl
            stats["kl"][role] += float((kl.detach() * mask).sum())
        stats["entropy"][role] += float((entropy * mask).sum())
        stats["tokens"][role] += float(mask.sum())
        return aggregate(loss_mat, mask, algo.loss_agg, norm, role)

    def update(self, samples: Sequence[Turn], probe=None) -> UpdateResult:
        algo = self.cfg.algo
        batches = policy_batches(samples)
        stats = {"entropy": defaultdict(float), "kl": defaultdict(float), "tokens": defaultdict(float),
                 "loss": defaultdict(float)}
        result = UpdateResult(0.0, {}, {}, {})
        for policy in self.policies:
            if policy not in batches:
                continue
            self._activate(policy)
            params = self.params[policy]
            optimizer = self.optimizers[policy]
            optimizer.zero_grad(set_to_none=True)
            norm = batches[policy].norm
            for slot, group in batches[policy].slots.items():
                if probe is not None:
                    probe.begin(policy, slot, params)
                for start in range(0, len(group), algo.micro_batch_size):
                    loss = self.micro_batch_loss(group[start: start + algo.micro_batch_size], norm, slot[0], stats)
                    loss.backward()
                    result.loss += float(loss.detach())
                    stats["loss"][slot[0]] += float(loss.detach())
                if probe is not None:
                    probe.end(policy, slot, params)
            if probe is not None:
                probe.finish_policy(policy)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, algo.max_grad_norm))
            if not math.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                result.skipped.append(policy)
                continue
            before = [p.detach().clone() for p in params]
            optimizer.step()
            with torch.no_grad():
                result.policy_update_norm[policy] = math.sqrt(sum(float((p - b).pow(2).sum()) for p, b in zip(params, before)))
                result.policy_param_norm[policy] = math.sqrt(sum(float(p.pow(2).sum()) for p in params))
            result.policy_grad_norm[policy] = grad_norm
            optimizer.zero_grad(set_to_none=True)
        tokens = stats["tokens"]
        result.entropy = {r: stats["entropy"][r] / tokens[r] for r in tokens if tokens[r]}
        result.role_loss = dict(stats["loss"])
        if stats["kl"]:
            result.kl = {r: stats["kl"][r] / tokens[r] for r in tokens if tokens[r]}
        return result

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {"params": {p: [t.detach().clone() for t in self.params[p]] for p in self.policies},
                "optimizers": {p: self.optimizers[p].state_dict() for p in self.policies}}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for policy in self.policies:
                for target, value in zip(self.params[policy], state["params"][policy]):
                    target.copy_(value)
                self.optimizers[policy].load_state_dict(state["optimizers"][policy])

    def save(self, path: Path) -> None:
        torch.save(self.state_dict(), Path(path) / "engine.pt")

    def load(self, path: Path) -> None:
        self.load_state_dict(torch.load(Path(path) / "engine.pt", weights_only=False))
