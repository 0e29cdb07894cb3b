"""Reward per turn: r = λ_node·r_node + λ_turn·r_turn + λ_traj·r_traj (+ λ_len·tokens), then the
discount of UnityMAS-O's objective Σ_v Σ_t γ^(t-1)·r_{v,t}: the turn at workflow step t counts
γ^(t-1), t its stage on the episode's path through the graph (Turn.depth + 1: three voters answering
at once are one step, the aggregator after them the next), not its place in completion order.
Under GAE this discount comes on top of `algo.gae_gamma`, which discounts the successor's value
stage by stage as well: leave one of them at 1.

Where the outcome lands (`outcome_share_mode`, default `auto`): `full` copies it to every turn (the
seed study's GRPO, where each turn's advantage compares it with its group and nothing sums over
turns); `last` pays it once, to the turns of the episode's last stage (`auto`'s choice under GAE:
a return sums the rewards after a turn, so an outcome copied to every turn would pay a correct
three-round loop three times a correct one-round episode, a reward for longer loops); `split`
divides it equally among the episode's roles and a role's share among its turns (paid once, spread).
The outcome is 1 for a correct episode (`outcome_metric=exact`) or, on QA tasks, the answer's token
F1 (`f1`, `auto`'s choice there: UnityMAS-O's metric, partial credit for a near answer).
r_node is the role's own job (voter correct, aggregator picked a correct candidate, evaluator's
verdict right, worker solved its subtask); r_turn is format compliance with the role's contract.
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
from harness.episodes import Episode


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


def resolved_share_mode(mode: str, adv_estimator: str, gae_scope: str = "graph") -> str:
    """`auto`: `last` under GAE over the graph (returns sum rewards over turns), `full` under GRPO (the
    study's) and under GAE where every turn is its own episode (algo.gae_scope=turn: nothing sums)."""
    if mode != "auto":
        return mode
    return "last" if adv_estimator == "gae" and gae_scope == "graph" else "full"


def outcome_shares(episode: Episode, mode: str) -> List[float]:
    """Each turn's share of the outcome: 1 each (full), 1 on the last stage's turns (last), or
    1/(roles x the role's turns) (split)."""
    if mode == "full":
        return [1.0] * len(episode.turns)
    if mode == "last":
        final = max((t.depth for t in episode.turns), default=0)
        return [float(t.depth == final) for t in episode.turns]
    if mode != "split":
        raise ValueError(f"unknown outcome share mode '{mode}'; valid: full, last, split")
    per_role = Counter(t.role for t in episode.turns)
    return [1.0 / (len(per_role) * per_role[t.role]) for t in episode.turns]


def episode_outcome(episode: Episode, metric: str) -> float:
    """The outcome r_traj: the grade's partial credit under f1 (and auto, where the task gives one:
    QA's token F1), else 1 for a correct episode and 0 otherwise."""
    grade = episode.grade
    if grade is None:
        return 0.0
    if metric in ("f1", "auto") and grade.score is not None:
        return float(grade.score)
    return 1.0 if grade.correct else 0.0


def assign_rewards(episode: Episode, cfg: RewardConfig, adv_estimator: str = "grpo") -> None:
    """Writes turn.reward for every turn of the episode (`auto` resolved for the cell's estimator)."""
    if cfg.allocator:
        rewards = [float(r) for r in load_allocator(cfg.allocator)(episode, cfg)]
        if len(rewards) != len(episode.turns):
            raise ValueError(f"reward.allocator '{cfg.allocator}' returned {len(rewards)} rewards for "
                             f"{len(episode.turns)} turns")
    else:
        outcome = episode_outcome(episode, cfg.outcome_metric)
        # an episode ended by the prompt cap has no outcome to share: each turn's trajectory term is its own
        # correctness, as upstream's committed trajectories keep their own rewards (the final outcome is
        # propagated to them only when the workflow completes: evaluator_optimizer_workflow.py:436-442)
        capped = bool(episode.stats.get("prompt_capped"))
        rewards = []
        for turn, share in zip(episode.turns, outcome_shares(episode, resolved_share_mode(cfg.outcome_share_mode, adv_estimator))):
            w = weights_for(cfg, turn.role)
            node = outcome if turn.role_correct is None else float(turn.role_correct)
            traj = float(bool(turn.role_correct)) if capped else outcome * share
            rewards.append(w["node"] * node + w["turn"] * float(not turn.malformed) + w["traj"] * traj
                           + w["length"] * len(turn.response_ids)
                           - w["length_hold"] * abs(len(turn.response_ids) - w["length_target"]))
    for turn, reward in zip(episode.turns, rewards):
        turn.reward = reward * cfg.gamma ** turn.depth
