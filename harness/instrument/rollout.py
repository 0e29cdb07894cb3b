"""Per-role statistics of a step's episodes: turns and tokens (and their shares), response
length, format compliance, reward and the role's own accuracy; and what UnityMAS-O reports per
agent (reward and advantage means, samples, prompt and output tokens, calls per episode,
format-legal rate = format_ok), with the episode's own numbers (QA's EM and token F1, a loop's
rounds used) as episode/<name>.

`role/<r>/selection_<signal>` is the covariance, over the role's turns, of each turn's advantage with
its length, format compliance or own accuracy: the selection pressure on that signal (`_se`: its
standard error). A policy-gradient step raises the probability of a turn in proportion to its
advantage, so the role's mean signal moves in the direction of this covariance (Price's equation)
before the mean itself has moved: a role paid to leave its contract shows it here first.
`selection_length_net` is the length's covariance within the turns that did the role's job right and
within those that did not, pooled: what the reward pays for length beyond what the job pays (an
evaluator paid for right verdicts, whose right verdicts are the longer ones, shows pressure on length
but none net of its job)."""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean, pstdev
from typing import Callable, Dict, Hashable, List, Optional, Tuple

from harness.episodes import Episode, Turn


# a turn's signals whose selection pressure is logged (role/<r>/selection_<name>); None: not judged
SELECTED_SIGNALS: Dict[str, Callable[[Turn], Optional[float]]] = {
    "length": lambda t: float(len(t.response_ids)),
    "format": lambda t: float(not t.malformed),
    "accuracy": lambda t: None if t.role_correct is None else float(t.role_correct),
}


def rollout_metrics(episodes: List[Episode], prefix: str = "", selection_pressure: bool = True) -> Dict[str, float]:
    metrics: Dict[str, float] = {}
    outcomes = [1.0 if e.grade is not None and e.grade.correct else 0.0 for e in episodes]
    if not outcomes:
        return metrics
    metrics[f"{prefix}accuracy"] = mean(outcomes)
    turns_by_role = defaultdict(list)
    for e in episodes:
        for t in e.turns:
            turns_by_role[t.role].append(t)
    all_turns = [t for ts in turns_by_role.values() for t in ts]
    rewards = [t.reward for t in all_turns]
    metrics[f"{prefix}reward/mean"] = mean(rewards)
    metrics[f"{prefix}reward/std"] = pstdev(rewards)
    metrics[f"{prefix}episode/turns"] = len(all_turns) / len(episodes)
    qa = [e for e in episodes if "answers" in e.problem.meta]  # open-domain QA: EM is accuracy, F1 beside it
    if qa:  # the grade's token F1 (Grade.score, what an f1 cell is paid), computed once when it was graded
        metrics[f"{prefix}episode/em"] = mean(1.0 if e.grade is not None and e.grade.correct else 0.0 for e in qa)
        metrics[f"{prefix}episode/f1"] = mean(e.grade.score or 0.0 if e.grade is not None else 0.0 for e in qa)
    for name in sorted({n for e in episodes for n in e.stats}):
        metrics[f"{prefix}episode/{name}"] = mean(e.stats[name] for e in episodes if name in e.stats)
    total_tokens = sum(len(t.response_ids) for t in all_turns) or 1
    for role, turns in sorted(turns_by_role.items()):
        lengths = [len(t.response_ids) for t in turns]
        key = f"{prefix}role/{role}"
        metrics[f"{key}/turns"] = float(len(turns))
        metrics[f"{key}/turn_share"] = len(turns) / len(all_turns)
        metrics[f"{key}/token_share"] = sum(lengths) / total_tokens
        metrics[f"{key}/response_length"] = mean(lengths)
        metrics[f"{key}/response_length_p90"] = float(_quantile(lengths, 0.9))
        metrics[f"{key}/response_length_max"] = float(max(lengths))
        metrics[f"{key}/truncated"] = mean(float(t.truncated) for t in turns)
        metrics[f"{key}/format_ok"] = mean(float(not t.malformed) for t in turns)
        metrics[f"{key}/fallback"] = mean(float(t.fallback) for t in turns)
        metrics[f"{key}/reward"] = mean(t.reward for t in turns)
        metrics[f"{key}/advantage_mean"] = mean(t.advantage for t in turns)
        metrics[f"{key}/samples"] = float(len(turns))
        metrics[f"{key}/calls"] = len(turns) / len(episodes)  # calls per episode
        metrics[f"{key}/prompt_tokens"] = mean(len(t.prompt_ids) for t in turns)
        metrics[f"{key}/output_tokens"] = float(sum(lengths))
        judged = [float(t.role_correct) for t in turns if t.role_correct is not None]
        if judged:
            metrics[f"{key}/accuracy"] = mean(judged)
        for name in sorted({n for t in turns for n in t.stats}):
            metrics[f"{key}/{name}"] = mean(t.stats[name] for t in turns if name in t.stats)
        if selection_pressure:
            metrics.update(selection_metrics(episodes, role, key, judged=bool(judged)))
    return metrics


def selection_metrics(episodes: List[Episode], role: str, key: str, judged: bool) -> Dict[str, float]:
    """`<key>/selection_<signal>` and `_se` for each of SELECTED_SIGNALS, and the length's net of the
    role's own job where it is judged."""
    pressures = {name: selection(episodes, role, signal) for name, signal in SELECTED_SIGNALS.items()}
    if judged:
        pressures["length_net"] = selection(episodes, role, SELECTED_SIGNALS["length"], stratum=lambda t: t.role_correct)
    metrics: Dict[str, float] = {}
    for name, pressure in pressures.items():
        if pressure is not None:
            metrics[f"{key}/selection_{name}"], metrics[f"{key}/selection_{name}_se"] = pressure
    return metrics


def selection(episodes: List[Episode], role: str, signal: Callable[[Turn], Optional[float]],
              stratum: Optional[Callable[[Turn], Optional[Hashable]]] = None) -> Optional[Tuple[float, float]]:
    """(covariance of the role's turns' advantage with `signal`, its standard error), or None with
    fewer than two episodes to compare. The error is clustered by episode (a role's turns in one
    episode share their advantage, so they are not independent draws). With `stratum`, the
    covariance within each stratum, pooled (signal and advantage centred on their stratum's means;
    turns whose stratum is None left out): the pressure the strata do not explain."""
    key = stratum or (lambda t: 0)
    clusters = [[(x, t.advantage, k) for t in e.turns
                 if t.role == role and (x := signal(t)) is not None and (k := key(t)) is not None]
                for e in episodes]
    clusters = [c for c in clusters if c]
    if len(clusters) < 2:
        return None
    by_stratum: Dict[Hashable, List[Tuple[float, float]]] = defaultdict(list)
    for x, a, k in (p for c in clusters for p in c):
        by_stratum[k].append((x, a))
    centre = {k: (mean(x for x, _ in v), mean(a for _, a in v)) for k, v in by_stratum.items()}
    products = [[(x - centre[k][0]) * (a - centre[k][1]) for x, a, k in c] for c in clusters]
    n = sum(len(c) for c in products)
    cov = sum(map(sum, products)) / n
    spread = sum(sum(p - cov for p in c) ** 2 for c in products)
    return cov, math.sqrt(spread) / n


def _quantile(values: List[int], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
