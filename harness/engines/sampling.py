"""Batched sampling that prefills each distinct prompt once.

A step asks for the same prompt many times: G episodes of a problem, and under IP all n voters
of an episode too (same adapter, same prompt). HF `generate` would prefill every copy; here the
distinct prompts are prefilled once, their KV cache is repeated for the copies, and decoding
runs on the whole batch. Positions count real tokens only, as in the training forward.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from harness.models import chat_prompt
from harness.episodes import Generation


@torch.no_grad()
def sample_repeated(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int,
                    max_new_tokens: int, temperature: float, greedy: bool, eos_id: int,
                    pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B*repeats, T) new tokens for B left-padded prompts, each sampled `repeats` times
    (rows b*repeats .. b*repeats+repeats-1 belong to prompt b), pad after end of turn; and each
    token's log-prob under the distribution it was drawn from, softmax(logits / temperature)
    (greedy: at the same temperature), 0 on padding. The trainer computes its log-probs at the
    same temperature, so the two must agree (verl's rollout_probs_diff)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                logits_to_keep=1)  # only the last position samples (Qwen3: 151,936 logits per position)
    cache = out.past_key_values
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)
    logits = out.logits[:, -1].float().repeat_interleave(repeats, 0)
    mask = attention_mask.repeat_interleave(repeats, 0)
    position = position_ids[:, -1:].repeat_interleave(repeats, 0) + 1
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens, log_probs = [], []
    for t in range(max_new_tokens):
        if greedy:
            token = logits.argmax(-1)
        else:
            token = torch.multinomial(torch.softmax(logits / temperature, -1), 1).squeeze(-1)
        log_prob = torch.log_softmax(logits / temperature, -1).gather(-1, token[:, None]).squeeze(-1)
        log_probs.append(torch.where(done, torch.zeros_like(log_prob), log_prob))
        token = torch.where(done, torch.full_like(token, pad_id), token)
        tokens.append(token)
        done |= token == eos_id
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, past_key_values=cache,
                    use_cache=True)
        cache, logits, position = out.past_key_values, out.logits[:, -1].float(), position + 1
    return torch.stack(tokens, dim=1), torch.stack(log_probs, dim=1)


def group_duplicates(prompts: Sequence[str]) -> Dict[int, List[List[int]]]:
    """{copies: [[indices of one distinct prompt], ...]}: prompts grouped by how often they occur,
    so each group can be sampled in one call with a fixed repeat count."""
    where: Dict[str, List[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        where[prompt].append(i)
    groups: Dict[int, List[List[int]]] = defaultdict(list)
    for indices in where.values():
        groups[len(indices)].append(indices)
    return dict(groups)


Sampled = Tuple[List[List[int]], Optional[List[List[float]]]]  # new tokens per row, their log-probs (or None)


def generate_grouped(tokenizer, prompts: Sequence[str], sample: Callable[[torch.Tensor, torch.Tensor, int], Sampled],
                     max_prompt_tokens: Optional[int] = None):
    """One Generation per prompt: identical prompts are encoded once and sampled `copies` times by
    `sample(input_ids, attention_mask, copies)` (rows grouped per prompt, as `sample_repeated`),
    which returns the new tokens of each row and, where the sampler reports them, their log-probs.
    A prompt of more than `max_prompt_tokens` tokens is not sampled: its Generation says so
    (`over_prompt_cap`), as upstream's engine refuses it before generating."""
    def generation(prompt_ids: List[int], new: List[int], new_log_probs: Optional[List[float]]) -> Generation:
        eos = tokenizer.eos_token_id
        if eos in new:
            keep, truncated = list(range(new.index(eos) + 1)), False
        else:
            keep, truncated = [i for i, t in enumerate(new) if t != tokenizer.pad_token_id], True
        response = [new[i] for i in keep]
        log_probs = [float(new_log_probs[i]) for i in keep] if new_log_probs is not None else None
        return Generation(prompt_ids, response, tokenizer.decode(response, skip_special_tokens=True), truncated,
                          log_probs)

    results: List[Optional[Generation]] = [None] * len(prompts)
    for copies, groups in group_duplicates(prompts).items():
        distinct = [chat_prompt(tokenizer, prompts[indices[0]]) for indices in groups]
        if max_prompt_tokens is not None:
            ids = tokenizer(distinct, add_special_tokens=False)["input_ids"]
            for text_ids, indices in zip(ids, groups):
                for index in indices if len(text_ids) > max_prompt_tokens else ():
                    results[index] = Generation(list(text_ids), [], "", False, over_prompt_cap=True)
            groups = [g for g, text_ids in zip(groups, ids) if len(text_ids) <= max_prompt_tokens]
            distinct = [d for d, text_ids in zip(distinct, ids) if len(text_ids) <= max_prompt_tokens]
            if not groups:
                continue
        enc = tokenizer(distinct, return_tensors="pt", padding=True, add_special_tokens=False)
        new, new_log_probs = sample(enc["input_ids"], enc["attention_mask"], copies)
        for g, indices in enumerate(groups):
            prompt_ids = enc["input_ids"][g][enc["attention_mask"][g].bool()].tolist()
            for k, index in enumerate(indices):
                row = g * copies + k
                results[index] = generation(prompt_ids, new[row], None if new_log_probs is None else new_log_probs[row])
    return results
