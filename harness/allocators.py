"""Upstream reward allocators, for `reward.allocator=harness.allocators:<name>`.

UnityMAS-O's trainer pays each turn a turn-level reward of its own instead of a shared outcome; with
`algo.adv_estimator=gae algo.gae_scope=turn` (every turn a one-step episode of its policy) these give
a workflow the rewards its upstream configuration trains on.
"""
from __future__ import annotations

from typing import List

from harness.episodes import Episode

FORMAT_WEIGHT = 1.0  # upstream's CODE_{PLANNER,CODER,REFLECTION}_FORMAT_WEIGHT default (the trainer's config)


def code_turn_level(episode: Episode, cfg) -> List[float]:
    """Workflow D (reflective_code) as UnityMAS-O's CodeTurnLevelRewardAllocator pays it
    (verl/experimental/star_ppo/reward_allocators/code_turn_level.py ~l.97-126): with R_i round i's
    verification, the planner and the coder of round i get R_0 on the first round and R_i - R_{i-1}
    after, the reflector of round i gets R_{i+1} - R_i (0 without a next round), and every turn
    FORMAT_WEIGHT x (0 if its reply follows its contract, else -1). R_i is the share of the problem's
    tests round i's program passes, as upstream's verifier counts it (the coder turn's `pass_rate`,
    where the task counts its tests: code-synth, MBPP); else 1 if it passed them all, 0 if not."""
    passed = [t.stats.get("pass_rate", float(bool(t.role_correct))) for t in episode.turns if t.role == "coder"]
    rewards, round_ = [], -1
    for turn in episode.turns:
        if turn.role == "planner":
            round_ += 1
        here = passed[round_] if 0 <= round_ < len(passed) else 0.0
        if turn.role in ("planner", "coder"):
            task = here - (passed[round_ - 1] if round_ > 0 else 0.0)
        elif turn.role == "reflector":
            task = passed[round_ + 1] - here if round_ + 1 < len(passed) else 0.0
        else:
            raise ValueError(f"code_turn_level pays workflow D's planner, coder and reflector; got role {turn.role}")
        rewards.append(task - FORMAT_WEIGHT * float(turn.malformed))
    return rewards
