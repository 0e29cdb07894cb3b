"""engine=verl over engine=local on the embedded default (tiny-m, CPU): the same voting+IP batch,
update step and episode batch, interleaved (local, verl, local, ...), medians compared.

What the ratio shows on a CPU is the price of the distributed stack for a 0.5 M-parameter model
(Ray calls, FSDP2 all-gathers, verl's padding removal, the weight sync to the rollout replicas
inside the update, the episodes sampled by the HF rollout servers), not a speed-up: the verl
engine exists for GPU clusters. Also prints the largest per-role difference between the engines on that batch.
Usage: python bench/engine_compare.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from probe_overhead import controller_for, interleaved  # bench/ is the script dir
from harness.algo.grpo import assign_advantages
from harness.controller import Controller
from harness.engines.verl.engine import VerlEngine
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe
from harness.warmup import prepare_model
from harness.rewards import assign_rewards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    local = controller_for("topology=voting", "sharing=ip", "verl.device=cpu")
    cfg = local.cfg
    engine = VerlEngine(prepare_model(cfg, local.task), local.engine.policies, cfg, seed=0,
                        work_dir=Path(tempfile.mkdtemp(prefix="engine_compare-")))
    verl = Controller(cfg, local.task, local.workflow, local.policy_map, engine)
    try:
        torch.manual_seed(0)
        episodes, _ = local.rollout(local.problems_for(0), cfg.algo.group_size, greedy=False)
        for e in episodes:
            assign_rewards(e, cfg.reward)
        assign_advantages(episodes)
        turns = [t for e in episodes for t in e.turns]
        probes = [GradientProbe(), GradientProbe()]
        local.engine.update(turns, probes[0])
        engine.update(turns, probes[1])
        a, b = gradient_metrics(probes[0]), gradient_metrics(probes[1])
        worst = max(abs(a[k] - b[k]) for k in a)
        print(f"same batch ({len(turns)} turns), first update: largest per-role metric difference {worst:.2e}")
        t_local, t_verl = interleaved(lambda: local.engine.update(turns, GradientProbe()),
                                      lambda: engine.update(turns, GradientProbe()), args.repeats)
        print(f"update step: local {t_local * 1e3:.0f} ms, verl {t_verl * 1e3:.0f} ms, ratio {t_verl / t_local:.2f}")
        problems = local.problems_for(1)
        g_local, g_verl = interleaved(lambda: local.rollout(problems, cfg.algo.group_size, greedy=False),
                                      lambda: verl.rollout(problems, cfg.algo.group_size, greedy=False), args.repeats)
        print(f"episode batch ({len(problems)} problems x {cfg.algo.group_size}): local {g_local * 1e3:.0f} ms, "
              f"verl {g_verl * 1e3:.0f} ms, ratio {g_verl / g_local:.2f}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
