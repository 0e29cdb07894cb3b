"""Group-relative advantages with verl's GRPO estimator: the G episodes of one problem form a group.

`episode` grouping (default, the study's): a role's turns in one episode share one advantage,
its episode's score normalised over the group's episodes; the score is the mean reward of the
role's turns in the episode, which under outcome rewards is the outcome itself. An Eval-Opt
episode that revised twice therefore counts once in its group's baseline.

`turn` grouping (for turn-level rewards): every turn is scored alone and compared with the turns
of the same role that saw the same input in the group's episodes (the G x n voters of a problem,
the workers given the same subtask), never by position.

A role (or input) that occurs in only one episode of its group has no baseline: its advantage is
0 (verl would pass the raw score through).
"""
from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Dict, List, Tuple

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from harness.workflows import Episode, Turn


def _grpo(scores: List[float], keys: List[str], norm_by_std: bool, epsilon: float) -> List[float]:
    """verl's GRPO advantage of each score within its key's group; 0 where a group has one member."""
    index = np.array(keys, dtype=object)
    tensor = torch.tensor([[s] for s in scores], dtype=torch.float32)
    advantages, _ = compute_grpo_outcome_advantage(tensor, torch.ones_like(tensor), index, epsilon, norm_by_std)
    sizes: Dict[str, int] = defaultdict(int)
    for key in keys:
        sizes[key] += 1
    return [a if sizes[k] > 1 else 0.0 for a, k in zip(advantages[:, 0].tolist(), keys)]


def _agent_norm(scores: List[float], keys: List[str], roles: List[str], epsilon: float) -> List[float]:
    """Dr. MAS's agent-wise normalisation: each score less its group's mean, divided by the standard
    deviation of its role's scores over the whole batch (not the group's), so a role whose rewards
    barely vary in a group is not blown up to unit scale and every agent's advantages share one scale."""
    centred = _grpo(scores, keys, False, epsilon)
    by_role: Dict[str, List[float]] = defaultdict(list)
    for score, role in zip(scores, roles):
        by_role[role].append(score)
    std = {role: float(np.std(values, ddof=1)) if len(values) > 1 else 0.0 for role, values in by_role.items()}
    return [a / (std[role] + epsilon) for a, role in zip(centred, roles)]


def assign_advantages(episodes: List[Episode], norm_by_std: bool = True, grouping: str = "episode",
                      epsilon: float = 1e-6, norm: str = "group") -> None:
    """Writes turn.advantage for every turn of every episode. `norm`: group (GRPO: the group's std,
    if norm_by_std) or agent (the role's std over the batch, Dr. MAS)."""
    if norm not in ("group", "agent"):
        raise ValueError(f"unknown advantage normalisation '{norm}'; valid: group, agent")

    def advantages(scores: List[float], keys: List[str], roles: List[str]) -> List[float]:
        if norm == "agent":
            return _agent_norm(scores, keys, roles, epsilon)
        return _grpo(scores, keys, norm_by_std, epsilon)

    if grouping == "turn":
        turns = [t for e in episodes for t in e.turns]
        keys = [f"{e.group}|{t.role}|{t.prompt}" for e in episodes for t in e.turns]
        for turn, advantage in zip(turns, advantages([t.reward for t in turns], keys, [t.role for t in turns])):
            turn.advantage = advantage
        return
    if grouping != "episode":
        raise ValueError(f"unknown advantage grouping '{grouping}'; valid: episode, turn")
    members: List[Tuple[List[Turn], str, str]] = []  # one entry per (episode, role)
    for e in episodes:
        by_role: Dict[str, List[Turn]] = defaultdict(list)
        for t in e.turns:
            by_role[t.role].append(t)
        members += [(turns, f"{e.group}|{role}", role) for role, turns in by_role.items()]
    if not members:
        return
    scores = [mean(t.reward for t in turns) for turns, _, _ in members]
    computed = advantages(scores, [k for _, k, _ in members], [r for _, _, r in members])
    for (turns, _, _), advantage in zip(members, computed):
        for t in turns:
            t.advantage = advantage
