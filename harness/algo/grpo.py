"""Group-relative advantages with verl's GRPO estimator: the G episodes of one problem form a group.

`trajectory` grouping (default, the SP/IP study's): every model call is its own one-step trajectory,
named after its role (`generator`, `evaluator`, `aggregator`, `worker`...) or, for roles whose
instances are separate trajectories (Voting's voters, named `generator{i}` upstream "for separate
GRPO groups"), after its role instance. A group is (problem, trajectory name, step): all of a
role's calls over the group's G episodes, each scored by its own reward. In Eval-Opt a revising
episode puts every draft (and every verdict) into its role's group; in Voting each voter index
is a group of G. This is the study's trainer: `uid = step_ids` with `stepwise_advantage: per_step`,
`step_ids = f"{task_id}_{trajectory.name}_step{i}"`, `task_id` shared by a problem's n rollouts
(XHMY/marl-llm-workflows: rllm/trainer/verl/agent_workflow_trainer.py, the "adv" block;
rllm/engine/agent_workflow_engine.py, transform_results_for_verl; rllm/workflows/
evaluator_optimizer_workflow.py, voting_workflow.py, orchestrator_workers_workflow.py).

`episode` grouping: a role's turns in one episode share one advantage, its episode's score
normalised over the group's episodes; the score is the mean reward of the role's turns in the
episode, which under outcome rewards is the outcome itself. An Eval-Opt episode that revised
twice therefore counts once in its group's baseline.

`turn` grouping (for turn-level rewards): every turn is scored alone and compared with the turns
of the same role that saw the same input in the group's episodes (the G x n voters of a problem,
the workers given the same subtask), never by position.

A group with one member has no baseline: its advantage is 0 (verl would pass the raw score
through; docs/study-settings.md lists the difference).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Collection, Dict, List

import numpy as np
import torch

from harness.algo.verl_core import grpo_outcome_advantage
from harness.episodes import Episode, Turn


def _grpo(scores: List[float], keys: List[str], norm_by_std: bool, epsilon: float) -> List[float]:
    """verl's GRPO advantage of each score within its key's group; 0 where a group has one member."""
    advantages = grpo_outcome_advantage(torch.tensor(scores, dtype=torch.float32), keys, epsilon, norm_by_std)
    sizes: Dict[str, int] = defaultdict(int)
    for key in keys:
        sizes[key] += 1
    return [a if sizes[k] > 1 else 0.0 for a, k in zip(advantages.tolist(), keys)]


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


def assign_advantages(episodes: List[Episode], norm_by_std: bool = True, grouping: str = "trajectory",
                      epsilon: float = 1e-6, norm: str = "group", per_instance: Collection[str] = ()) -> None:
    """Writes turn.advantage for every turn of every episode. `norm`: group (GRPO: the group's std,
    if norm_by_std) or agent (the role's std over the batch, Dr. MAS). `per_instance`: roles whose
    instances are separate trajectories under `trajectory` grouping (RoleSpec.trajectory)."""
    if norm not in ("group", "agent"):
        raise ValueError(f"unknown advantage normalisation '{norm}'; valid: group, agent")
    members = _members(episodes, grouping, set(per_instance))
    if not members:
        return
    scores, keys, roles = [m.score for m in members], [m.key for m in members], [m.role for m in members]
    if norm == "agent":
        computed = _agent_norm(scores, keys, roles, epsilon)
    else:
        computed = _grpo(scores, keys, norm_by_std, epsilon)
    spread: Dict[str, set] = defaultdict(set)
    for member in members:
        spread[member.key].add(member.score)
    for member, advantage in zip(members, computed):
        for t in member.turns:
            t.advantage = advantage
            # its group's scores all alike: GRPO gives it no learning signal (role/<r>/zero_variance_groups)
            t.stats["zero_variance_groups"] = float(len(spread[member.key]) == 1)


@dataclass
class _Member:
    """One member of a GRPO group: the turns that share its advantage, its score, its group's key."""

    turns: List[Turn]
    score: float
    key: str
    role: str


def _members(episodes: List[Episode], grouping: str, per_instance: set) -> List[_Member]:
    if grouping == "trajectory":
        return [_Member([t], t.reward, f"{e.group}|{trajectory_name(t, per_instance)}|step0", t.role)
                for e in episodes for t in e.turns]
    if grouping == "turn":
        return [_Member([t], t.reward, f"{e.group}|{t.role}|{t.prompt}", t.role) for e in episodes for t in e.turns]
    if grouping != "episode":
        raise ValueError(f"unknown advantage grouping '{grouping}'; valid: trajectory, episode, turn")
    members: List[_Member] = []
    for e in episodes:
        by_role: Dict[str, List[Turn]] = defaultdict(list)
        for t in e.turns:
            by_role[t.role].append(t)
        members += [_Member(turns, mean(t.reward for t in turns), f"{e.group}|{role}", role)
                    for role, turns in by_role.items()]
    return members


def trajectory_name(turn: Turn, per_instance: Collection[str]) -> str:
    """The study's trajectory name of a call: its role, or its role instance (`voter1`) where the
    role's instances are separate trajectories."""
    return f"{turn.role}{turn.instance}" if turn.role in per_instance else turn.role
