"""RL actually learns on the embedded default: 100 real GRPO steps on the warm tiny model."""
from statistics import mean

import pytest

from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell

MARGIN = 0.05  # sampled reward, mean of the last 20 steps over the first 20


GAE = ("algo.adv_estimator=gae", "algo.lr=2e-3")  # PPO with a critic per policy (UnityMAS-O's estimator)


@pytest.mark.parametrize("topology,sharing,task,extra", [
    ("single", "sp", "arith", ()), ("voting", "ip", "arith", ()), ("single", "sp", "code-synth", ()),
    ("single", "sp", "arith", GAE), ("eval_opt", "ip", "arith", GAE)])
def test_reward_rises_over_100_steps(tmp_path, warm_model_dir, topology, sharing, task, extra):
    """code-synth: every answer is a program graded in the sandbox."""
    cfg = cell(tmp_path, f"topology={topology}", f"sharing={sharing}", f"task={task}", "steps=100",
               "samples_every=50", *extra)
    run_cell(cfg, log=lambda *_: None)
    metrics = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(100))
    rewards = [m["reward/mean"] for m in metrics]
    first, last = mean(rewards[:20]), mean(rewards[-20:])
    print(f"{topology}+{sharing} on {task} {' '.join(extra)}: reward first 20 {first:.3f}, last 20 {last:.3f}")
    assert last - first >= MARGIN, (first, last)
    if topology == "single":  # a clean baseline raises no alert
        assert read_jsonl(run_dir_of(cfg).file("alerts.jsonl")) == []
