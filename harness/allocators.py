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


def mask_turn_level(episode: Episode, cfg) -> List[float]:
    """Workflow C (mask_search) as UnityMAS-O's MAskTurnLevelRewardAllocator pays it
    (verl/experimental/star_ppo/reward_allocators/mask_turn_level.py ~l.108-175): with F1_r the token F1
    of round r's answer, the answerer of round r gets F1_r; the query that opened round r (the planner's
    in the first round, the searcher's after) and round r's summary and notes update get the round's gain
    F1_r - F1_{r-1} (F1_r in the first round); a search role that stops gets 0; every turn
    FORMAT_WEIGHT x (0 if its reply follows its contract, else -1). Upstream's planner also predicts an
    answer, paid its F1, and an answer_0 from the plan comes before the first search, so upstream's first
    round is paid its gain over answer_0's F1; here the planner writes the first query only and the first
    round is paid its F1 (docs/unitymas.md)."""
    f1 = [t.stats.get("f1", float(bool(t.role_correct))) for t in episode.turns if t.role == "answerer"]
    rewards, round_ = [], 0
    for turn in episode.turns:
        gain = f1[round_] - (f1[round_ - 1] if round_ > 0 else 0.0) if round_ < len(f1) else 0.0
        if turn.role == "answerer":
            task, round_ = f1[round_], round_ + 1
        elif turn.role in ("planner", "searcher"):  # a query opens the next round; a stop opens none
            task = 0.0 if turn.stats.get("stop") else gain
        elif turn.role in ("summarizer", "updater"):
            task = gain
        else:
            raise ValueError(f"mask_turn_level pays workflow C's planner, summarizer, updater, answerer and searcher; "
                             f"got role {turn.role}")
        rewards.append(task - FORMAT_WEIGHT * float(turn.malformed))
    return rewards
