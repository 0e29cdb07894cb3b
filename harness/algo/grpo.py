"""Group-relative advantages: the G episodes of one problem form a group, and rewards are
normalised within the group per role slot (role, instance) with verl's GRPO estimator.

A slot that occurs in only one episode of its group (a second worker that only one plan asked
for) has no baseline; verl would pass its raw score through, here its advantage is 0.
"""
from __future__ import annotations

from collections import Counter
from typing import List

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from harness.workflows import Episode


def assign_advantages(episodes: List[Episode], norm_by_std: bool = True, epsilon: float = 1e-6) -> None:
    """Writes turn.advantage for every turn of every episode."""
    turns = [t for e in episodes for t in e.turns]
    if not turns:
        return
    index = np.array([f"{e.group}|{t.role}|{t.instance}" for e in episodes for t in e.turns], dtype=object)
    episodes_per_key = Counter(key for e in episodes for key in {f"{e.group}|{t.role}|{t.instance}" for t in e.turns})
    scores = torch.tensor([[t.reward] for t in turns], dtype=torch.float32)
    advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index, epsilon, norm_by_std)
    for turn, key, advantage in zip(turns, index, advantages[:, 0].tolist()):
        turn.advantage = advantage if episodes_per_key[key] > 1 else 0.0
