"""Reward per turn: r = λ_node·r_node + λ_turn·r_turn + λ_traj·r_traj (+ λ_len·tokens), then the
discount of UnityMAS-O's objective Σ_v Σ_t γ^(t-1)·r_{v,t}: the turn at workflow step t (its
position in the episode's trajectory, 1-based) counts γ^(t-1).

Defaults follow the seed study: the final outcome is copied to every turn (λ_traj=1, others 0,
γ=1, `outcome_share_mode=full`); `split` divides the outcome equally among the episode's roles and
a role's share equally among its turns, so an episode pays its outcome once. r_node is the role's
own job (voter correct, aggregator picked a correct candidate, evaluator's verdict right, worker
solved its subtask); r_turn is format compliance with the role's contract.
`reward.per_role.<role>.<term>` overrides a weight for one role. `reward.allocator` names a
user function (`package.module:function`) that receives the episode trace and the reward config and
returns one reward per turn in place of the terms (the discount still applies).
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Callable, Dict, List

from harness.config import REWARD_TERMS as TERMS, RewardConfig
from harness.imports import import_object
from harness.workflows import Episode


def weights_for(cfg: RewardConfig, role: str) -> Dict[str, float]:
    weights = {term: float(getattr(cfg, term)) for term in TERMS}
    overrides = cfg.per_role.get(role, {})
    unknown = set(overrides) - set(TERMS)
    if unknown:
        raise ValueError(f"reward.per_role.{role} has unknown term(s) {sorted(unknown)}; valid: {', '.join(TERMS)}")
    weights.update({k: float(v) for k, v in overrides.items()})
    return weights


@lru_cache(maxsize=None)
def load_allocator(path: str) -> Callable:
    """`package.module:function`, imported once; ValueError naming what is wrong."""
    function = import_object(path, "reward.allocator")
    if not callable(function):
        raise ValueError(f"reward.allocator '{path}' is not callable")
    return function


def outcome_shares(episode: Episode, mode: str) -> List[float]:
    """Each turn's share of the outcome: 1 each (full), or 1/(roles x the role's turns) (split)."""
    if mode == "full":
        return [1.0] * len(episode.turns)
    per_role = Counter(t.role for t in episode.turns)
    return [1.0 / (len(per_role) * per_role[t.role]) for t in episode.turns]


def assign_rewards(episode: Episode, cfg: RewardConfig) -> None:
    """Writes turn.reward for every turn of the episode."""
    if cfg.allocator:
        rewards = [float(r) for r in load_allocator(cfg.allocator)(episode, cfg)]
        if len(rewards) != len(episode.turns):
            raise ValueError(f"reward.allocator '{cfg.allocator}' returned {len(rewards)} rewards for "
                             f"{len(episode.turns)} turns")
    else:
        outcome = 1.0 if episode.grade is not None and episode.grade.correct else 0.0
        rewards = []
        for turn, share in zip(episode.turns, outcome_shares(episode, cfg.outcome_share_mode)):
            w = weights_for(cfg, turn.role)
            node = outcome if turn.role_correct is None else float(turn.role_correct)
            rewards.append(w["node"] * node + w["turn"] * float(not turn.malformed) + w["traj"] * outcome * share
                           + w["length"] * len(turn.response_ids))
    for turn, reward in zip(episode.turns, rewards):
        turn.reward = reward * cfg.gamma ** turn.index
