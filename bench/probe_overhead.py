"""Side-by-side ratios on the embedded default (tiny-m, CPU, one thread):

1. an instrumented update step (gradient probe on) over a plain one, same samples (target <= 1.05);
2. a Voting episode batch (3 voters + aggregator, IP) over a single-agent batch, same problems
   (target <= 2.0: the scheduler batches the three voters into one generate call).

Runs are interleaved (A, B, A, B, ...) and the medians compared, so machine noise hits both.
Usage: python bench/probe_overhead.py [--repeats 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.algo.grpo import assign_advantages
from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.instrument.probe import GradientProbe
from harness.warmup import prepare_model
from harness.rewards import assign_rewards
from harness.validation import load_config
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.workflows import build_workflow


def controller_for(*overrides: str) -> Controller:
    cfg = load_config(["progress=false", *overrides])
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    engine = LocalEngine(prepare_model(cfg, task), policy_map.policies, cfg, seed=0)
    return Controller(cfg, task, workflow, policy_map, engine)


def interleaved(a, b, repeats: int) -> tuple[float, float]:
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, times in ((a, times_a), (b, times_b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times_a), statistics.median(times_b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)

    voting = controller_for("topology=voting", "sharing=ip")
    torch.manual_seed(0)
    episodes, _ = voting.rollout(voting.problems_for(0), voting.cfg.algo.group_size, greedy=False)
    for e in episodes:
        assign_rewards(e, voting.cfg.reward)
    assign_advantages(episodes)
    turns = [t for e in episodes for t in e.turns]
    plain, probed = interleaved(lambda: voting.engine.update(turns, None, step=1),
                                lambda: voting.engine.update(turns, GradientProbe(), step=1), args.repeats)
    print(f"update step, voting+ip, {len(turns)} turns: plain {plain * 1e3:.1f} ms, "
          f"instrumented {probed * 1e3:.1f} ms, ratio {probed / plain:.3f} (target <= 1.05)")

    single = controller_for("topology=single")
    problems = voting.problems_for(1)
    group = voting.cfg.algo.group_size
    one, many = interleaved(lambda: single.rollout(problems, group, greedy=False),
                            lambda: voting.rollout(problems, group, greedy=False), args.repeats)
    work = {name: tokens_computed(c.rollout(problems, group, greedy=False)[0])
            for name, c in (("single", single), ("voting", voting))}
    print(f"episode batch, {len(problems)} problems x {group}: single {one * 1e3:.1f} ms, "
          f"voting (3 voters + aggregator) {many * 1e3:.1f} ms, ratio {many / one:.3f} (target <= 2.0); "
          f"tokens computed (distinct prompts + responses) single {work['single']}, voting {work['voting']}, "
          f"ratio {work['voting'] / work['single']:.2f}")


def tokens_computed(episodes) -> int:
    """Prefill tokens of distinct (policy, prompt) pairs plus every sampled token: the forward work
    of a rollout on a CPU, where cost follows tokens rather than the number of generate calls."""
    turns = [t for e in episodes for t in e.turns]
    distinct = {(t.policy, tuple(t.prompt_ids)) for t in turns}
    return sum(len(ids) for _, ids in distinct) + sum(len(t.response_ids) for t in turns)


if __name__ == "__main__":
    main()
