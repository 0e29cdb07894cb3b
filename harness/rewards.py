"""Reward per turn: r = λ_node·r_node + λ_turn·r_turn + λ_traj·r_traj (+ λ_len·tokens).

Defaults follow the seed study: the final outcome is copied to every turn (λ_traj=1, others 0).
r_node is the role's own job (voter correct, aggregator picked a correct candidate, evaluator's
verdict right, worker solved its subtask); r_turn is format compliance with the role's contract.
`reward.per_role.<role>.<term>` overrides a weight for one role.
"""
from __future__ import annotations

from typing import Dict

from harness.config import RewardConfig
from harness.workflows import Episode

TERMS = ("node", "turn", "traj", "length")


def weights_for(cfg: RewardConfig, role: str) -> Dict[str, float]:
    weights = {term: float(getattr(cfg, term)) for term in TERMS}
    overrides = cfg.per_role.get(role, {})
    unknown = set(overrides) - set(TERMS)
    if unknown:
        raise ValueError(f"reward.per_role.{role} has unknown term(s) {sorted(unknown)}; valid: {', '.join(TERMS)}")
    weights.update({k: float(v) for k, v in overrides.items()})
    return weights


def assign_rewards(episode: Episode, cfg: RewardConfig) -> None:
    """Writes turn.reward for every turn of the episode."""
    outcome = 1.0 if episode.grade is not None and episode.grade.correct else 0.0
    for turn in episode.turns:
        w = weights_for(cfg, turn.role)
        node = outcome if turn.role_correct is None else float(turn.role_correct)
        turn.reward = (w["node"] * node + w["turn"] * float(not turn.malformed) + w["traj"] * outcome
                       + w["length"] * len(turn.response_ids))
