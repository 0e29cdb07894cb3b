"""Turns -> verl's batch layout (a TensorDict as `RayPPOTrainer` hands it to its workers).

verl's FSDP engine reads left-padded `prompts`, right-padded `responses`, their concatenation as
`input_ids` with `attention_mask`/`position_ids`, and a `response_mask`; it then drops padding
(`left_right_2_no_padding`). Each turn's sequence-level advantage rides along as `seq_advantages`.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict

from harness.episodes import Turn


def turns_to_batch(turns: Sequence[Turn], pad_id: int) -> TensorDict:
    """A padded TensorDict of `turns` (prompt + response ids, advantages) in verl's layout."""
    n = len(turns)
    prompt_width = max(len(t.prompt_ids) for t in turns)
    response_width = max(max(len(t.response_ids) for t in turns), 1)
    prompts = torch.full((n, prompt_width), pad_id, dtype=torch.long)
    responses = torch.full((n, response_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_width), dtype=torch.long)
    response_mask = torch.zeros((n, response_width), dtype=torch.long)
    for row, turn in enumerate(turns):
        p, r = turn.prompt_ids, turn.response_ids
        prompts[row, prompt_width - len(p):] = torch.tensor(p)
        prompt_mask[row, prompt_width - len(p):] = 1
        if r:
            responses[row, : len(r)] = torch.tensor(r)
            response_mask[row, : len(r)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    rollout_log_probs = torch.zeros((n, response_width), dtype=torch.float32)
    rollout_mask = torch.zeros((n, response_width), dtype=torch.long)  # 1 where the sampler's log-prob is known
    for row, turn in enumerate(turns):
        if turn.rollout_log_probs is not None and turn.response_ids:
            rollout_log_probs[row, : len(turn.rollout_log_probs)] = torch.tensor(turn.rollout_log_probs)
            rollout_mask[row, : len(turn.rollout_log_probs)] = 1
    return TensorDict({
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "seq_advantages": torch.tensor([t.advantage for t in turns], dtype=torch.float32),  # the harness loss's
        "rollout_log_probs": rollout_log_probs,  # verl's rollout-vs-trainer check (worker.begin_update)
        "rollout_mask": rollout_mask,
    }, batch_size=n)


def shard_rows(batch: TensorDict, rank: int, world: int) -> TensorDict:
    """This data-parallel rank's rows. A rank left without rows gets row 0 with its loss masked
    out: FSDP needs every rank in every forward and backward, and a masked row adds nothing."""
    rows = list(range(rank, batch.batch_size[0], world))
    if rows:
        return batch[torch.tensor(rows)]
    filler = batch[:1].clone()
    filler["response_mask"] = torch.zeros_like(filler["response_mask"])
    filler["seq_advantages"] = torch.zeros_like(filler["seq_advantages"])
    if "rollout_mask" in filler.keys():
        filler["rollout_mask"] = torch.zeros_like(filler["rollout_mask"])
    return filler
