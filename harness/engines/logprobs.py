"""Response log-probs for the update, computed only where they are needed.

Two savings over a plain forward of every (prompt + response) row:
- **Shared prompts.** A micro-batch holds each prompt many times (G episodes of a problem; the
  voters of an episode on one adapter). Each distinct prompt runs once, with gradients; its KV
  cache is gathered to its copies (an index_select, so gradients flow back to the one prompt
  forward) and only response tokens run per row. Same loss and gradients as the plain forward up
  to float rounding (tests/test_logprobs.py).
- **Logits at response positions only, chunked over the vocabulary.** The LM head runs on the
  hidden states that predict response tokens, never on prompt positions, and `ChunkedLogProb`
  takes the log-softmax over vocabulary chunks (an online log-sum-exp), recomputing each chunk's
  logits in the backward instead of keeping (tokens x vocab) of them: memory stays linear in
  tokens at Qwen3's 151,936-token vocabulary.

Log-probs and entropies are those of softmax(logits / T), T the rollout's sampling temperature, as
verl's actor computes them: the PPO ratio, its clipping and the gradient then belong to the policy
that sampled. The head is linear, so logits / T is the head applied to hidden / T.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

VOCAB_CHUNK = 16_384


class ChunkedLogProb(torch.autograd.Function):
    """log softmax(h W^T)[target] per row, and the distribution's entropy (no gradient), over
    vocabulary chunks; W is the LM head's (vocab, hidden) weight."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int):
        n, acc = hidden.shape[0], torch.promote_types(hidden.dtype, torch.float32)  # bf16 sums in fp32
        running_max = torch.full((n,), float("-inf"), dtype=acc, device=hidden.device)
        sum_exp = torch.zeros(n, dtype=acc, device=hidden.device)
        sum_exp_logit = torch.zeros(n, dtype=acc, device=hidden.device)
        for start in range(0, weight.shape[0], chunk):
            logits = (hidden @ weight[start: start + chunk].T).to(acc)
            new_max = torch.maximum(running_max, logits.max(-1).values)
            scale = torch.exp(running_max - new_max)
            shifted = torch.exp(logits - new_max[:, None])
            sum_exp = sum_exp * scale + shifted.sum(-1)
            sum_exp_logit = sum_exp_logit * scale + (shifted * logits).sum(-1)
            running_max = new_max
        lse = running_max + torch.log(sum_exp)
        target_logit = (hidden * weight[targets]).sum(-1).to(acc)
        entropy = lse - sum_exp_logit / sum_exp
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(entropy)
        return target_logit - lse, entropy

    @staticmethod
    def backward(ctx, grad_log_prob: torch.Tensor, _grad_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad = grad_log_prob.to(lse.dtype)
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, weight.shape[0], ctx.chunk):
            block = weight[start: start + ctx.chunk]
            probs = torch.exp((hidden @ block.T).to(lse.dtype) - lse[:, None])
            d_logits = (-probs * grad[:, None]).to(hidden.dtype)  # d log p[target] / d logits = onehot - p
            if grad_hidden is not None:
                grad_hidden += d_logits @ block
            if grad_weight is not None:
                grad_weight[start: start + ctx.chunk] += d_logits.T @ hidden
        if grad_hidden is not None:
            grad_hidden += grad[:, None].to(hidden.dtype) * weight[targets]
        if grad_weight is not None:
            grad_weight.index_add_(0, targets, grad[:, None].to(hidden.dtype) * hidden)
        return grad_hidden, grad_weight, None, None


def token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    chunk: int = VOCAB_CHUNK) -> Tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy of each row's distribution) for hidden states (n, hidden)."""
    return ChunkedLogProb.apply(hidden, weight, targets, chunk)


@dataclass
class ResponseLogProbs:
    """Per row, per response token (right-padded to the longest response)."""

    log_prob: torch.Tensor  # (rows, M)
    entropy: torch.Tensor  # (rows, M), no gradient
    mask: torch.Tensor  # (rows, M) 1.0 on response tokens


def _unwrap(model):
    """The causal LM under a peft wrapper: its decoder (`.model`) and LM head run separately."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _device(lm) -> torch.device:
    return lm.get_output_embeddings().weight.device


def _response_grid(responses: Sequence[List[int]], pad_id: int,
                   device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in responses)
    ids = torch.full((len(responses), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width))
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(response, dtype=torch.long)
        mask[row, : len(response)] = 1.0
    return ids.to(device), mask.to(device)


def _head(lm, predicting: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
          temperature: float = 1.0) -> ResponseLogProbs:
    """Log-probs of `targets` (rows, M) from the hidden states predicting them (rows, M, hidden),
    under softmax(logits / temperature)."""
    where = mask.bool()
    hidden = predicting[where] if temperature == 1.0 else predicting[where] / temperature
    picked, ent = token_log_probs(hidden, lm.get_output_embeddings().weight, targets[where])
    log_prob = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)
    entropy = torch.zeros(mask.shape, dtype=picked.dtype, device=picked.device)
    log_prob = log_prob.masked_scatter(where, picked)
    entropy[where] = ent.detach()
    return ResponseLogProbs(log_prob, entropy, mask)


def plain_log_probs(model, prompts: Sequence[List[int]], responses: Sequence[List[int]], pad_id: int,
                    temperature: float = 1.0) -> ResponseLogProbs:
    """One forward of every (prompt + response) row, right-padded; the reference path."""
    lm = _unwrap(model)
    device = _device(lm)
    rows = [p + r for p, r in zip(prompts, responses)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[b, : len(row)] = 1
    hidden = lm.model(input_ids=ids.to(device), attention_mask=attention.to(device)).last_hidden_state
    targets, mask = _response_grid(responses, pad_id, device)
    index = torch.zeros(mask.shape, dtype=torch.long)
    for b, prompt in enumerate(prompts):  # hidden state at position t predicts token t + 1
        index[b, : len(responses[b])] = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(responses[b]))
    index = index.to(device)
    predicting = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    return _head(lm, predicting, targets, mask, temperature)


def shared_prompt_log_probs(model, prompts: Sequence[List[int]], responses: Sequence[List[int]],
                            pad_id: int, temperature: float = 1.0) -> ResponseLogProbs:
    """Each distinct prompt once (left-padded, positions counting real tokens), its KV cache gathered
    to its rows, then the rows' response tokens but the last (nothing is predicted from it)."""
    lm = _unwrap(model)
    device = _device(lm)
    distinct: dict = {}
    owner = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], dtype=torch.long,
                         device=device)
    unique = list(distinct)
    prompt_width = max(len(p) for p in unique)
    prompt_ids = torch.full((len(unique), prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for b, prompt in enumerate(unique):
        prompt_ids[b, prompt_width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[b, prompt_width - len(prompt):] = 1
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = lm.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True)
    last = out.last_hidden_state[:, -1][owner]  # predicts each row's first response token
    targets, mask = _response_grid(responses, pad_id, device)
    width = targets.shape[1]
    if width == 1:
        return _head(lm, last[:, None], targets, mask, temperature)
    cache = out.past_key_values
    cache.reorder_cache(owner)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    inputs = targets[:, :-1]
    attention = torch.cat([prompt_mask[owner], mask[:, :-1].long()], dim=1)
    response_positions = lengths[:, None] + torch.arange(width - 1, device=device)[None]
    hidden = lm.model(input_ids=inputs, attention_mask=attention, position_ids=response_positions,
                      past_key_values=cache, use_cache=True).last_hidden_state
    return _head(lm, torch.cat([last[:, None], hidden], dim=1), targets, mask, temperature)


def response_log_probs(model, prompts: Sequence[List[int]], responses: Sequence[List[int]], pad_id: int,
                       shared_prompt: bool = True, temperature: float = 1.0) -> ResponseLogProbs:
    if shared_prompt:
        return shared_prompt_log_probs(model, prompts, responses, pad_id, temperature)
    return plain_log_probs(model, prompts, responses, pad_id, temperature)
