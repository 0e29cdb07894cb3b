"""PPO with a GAE critic (algo.adv_estimator=gae): the advantage and value loss match verl's on a
fixed batch, and a real run trains its critic, logs it per role and resumes it exactly."""
import math
import random

import torch
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_value_loss

from harness.algo.critic import explained_variance, turn_gae, value_loss, verl_gae, whiten, whiten_within
from harness.config import CellConfig, ConfigError
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell


def test_turn_gae_matches_verls_compute_gae_advantage_return():
    """Episodes of 1-5 turns padded into verl's (batch, length) layout: the turns are its tokens."""
    rng = random.Random(0)
    episodes = [([rng.uniform(-1, 1) for _ in range(n)], [rng.uniform(-1, 1) for _ in range(n)]) for n in (1, 3, 5, 2, 4, 5)]
    width = max(len(r) for r, _ in episodes)
    rewards, values, mask = (torch.zeros(len(episodes), width, dtype=torch.float64) for _ in range(3))
    for i, (r, v) in enumerate(episodes):
        rewards[i, :len(r)], values[i, :len(v)], mask[i, :len(r)] = torch.tensor(r), torch.tensor(v), 1.0
    for gamma, lam in ((1.0, 1.0), (0.9, 0.95), (0.5, 0.0)):
        verl_adv, verl_ret = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
        ours = [turn_gae(r, v, gamma, lam) for r, v in episodes]
        for i, (adv, ret) in enumerate(ours):
            assert torch.allclose(torch.tensor(ret, dtype=torch.float64), verl_ret[i, :len(ret)], atol=1e-6)
        flat = whiten([a for adv, _ in ours for a in adv])  # verl whitens over the batch's turns
        theirs = [float(verl_adv[i, t]) for i, (adv, _) in enumerate(ours) for t in range(len(adv))]
        assert max(abs(a - b) for a, b in zip(flat, theirs)) < 1e-6
        trainer_adv, trainer_ret = verl_gae(episodes, gamma, lam)  # the trainer's call: the same numbers
        assert max(abs(a - b) for a, b in zip([a for adv in trainer_adv for a in adv], flat)) < 1e-6
        assert max(abs(a - b) for (_, ret), mine in zip(ours, trainer_ret) for a, b in zip(ret, mine)) < 1e-6


def test_gae_by_hand_and_the_value_loss_is_verls():
    adv, ret = turn_gae([0.0, 0.0, 1.0], [0.2, 0.4, 0.5], gamma=0.9, lam=0.8)
    deltas = [0.0 + 0.9 * 0.4 - 0.2, 0.0 + 0.9 * 0.5 - 0.4, 1.0 - 0.5]
    by_hand = [deltas[0] + 0.72 * deltas[1] + 0.72 ** 2 * deltas[2], deltas[1] + 0.72 * deltas[2], deltas[2]]
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(adv, by_hand))
    assert all(math.isclose(r, a + v) for r, a, v in zip(ret, adv, [0.2, 0.4, 0.5]))
    torch.manual_seed(0)
    predicted, returns, old = torch.randn(16), torch.randn(16), torch.randn(16)
    ours, clipfrac = value_loss(predicted, returns, old, 0.5)
    theirs, their_clipfrac = compute_value_loss(predicted[None], returns[None], old[None], torch.ones(1, 16), 0.5)
    assert torch.allclose(ours, theirs, atol=1e-6) and math.isclose(clipfrac, float(their_clipfrac), abs_tol=1e-6)
    assert math.isclose(explained_variance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]), 1.0)
    # verl's epsilon: a batch whose returns all agree reads as a (very) poor critic, not as a non-finite value
    assert math.isclose(explained_variance([1.0, 1.0], [0.0, 2.0]), 1 - 2.0 / 1e-5)
    assert explained_variance([1.0], [0.0]) is None  # one turn: no variance, nothing logged


def test_a_gae_cell_trains_its_critic_logs_it_per_role_and_resumes_exactly(tmp_path, warm_model_dir):
    common = ("topology=eval_opt", "algo.adv_estimator=gae", "algo.gae_gamma=0.9", "val_every=100", "samples_every=0",
              "ckpt_every=2", "algo.problems_per_step=4")
    straight = cell(tmp_path / "straight", *common, "steps=6")
    assert run_cell(straight, log=lambda *_: None) == "finished"
    first = cell(tmp_path / "resumed", *common, "steps=4")
    assert run_cell(first, log=lambda *_: None) == "finished"
    continued = cell(tmp_path / "resumed", *common, "steps=6")  # resumes from step 4's checkpoint, critic included
    assert run_cell(continued, log=lambda *_: None) == "finished"
    want, got = read_jsonl(run_dir_of(straight).file("metrics.jsonl")), read_jsonl(run_dir_of(continued).file("metrics.jsonl"))
    assert [m["step"] for m in got] == list(range(6))
    for a, b in zip(got, want):
        for key in ("role/generator/value", "role/evaluator/value", "policy/generator/value_loss", "reward/mean"):
            assert math.isclose(a[key], b[key], rel_tol=1e-6, abs_tol=1e-9), (a["step"], key)
    last = want[-1]
    for role in ("generator", "evaluator"):
        assert {f"role/{role}/{k}" for k in ("value", "adv_mean", "value_loss", "explained_variance")} <= set(last)
    # the critic learns: its Adam steps fit each step's returns, on average and on most steps (the clipped loss
    # may rise on a step; across steps the targets move with the policy, so six steps promise no falling trend)
    for p in ("generator", "evaluator"):
        gains = [m[f"policy/{p}/value_loss"] - m[f"policy/{p}/value_loss_last"] for m in want]
        assert sum(gains) > 0 and sum(g > 0 for g in gains) >= 2 * len(gains) / 3, (p, gains)
    files = {p.name for p in (run_dir_of(straight).path / "checkpoints").glob("step_*/*")}
    assert {"critic.safetensors", "critic_optimizers.json"} <= files


def test_with_every_turn_alone_a_turns_advantage_is_its_reward_less_its_value(tmp_path, warm_model_dir):
    """algo.gae_scope=turn on a real run: per role and step, the mean raw advantage is the mean reward
    less the mean value (nothing from later turns); over the graph (the default) it is not."""
    common = ("topology=eval_opt", "algo.adv_estimator=gae", "val_every=100", "samples_every=0", "steps=2",
              "algo.problems_per_step=4")
    for scope, alone in (("turn", True), ("graph", False)):
        cfg = cell(tmp_path / scope, *common, f"algo.gae_scope={scope}")
        assert run_cell(cfg, log=lambda *_: None) == "finished"
        gaps = [m[f"role/{r}/adv_mean"] - (m[f"role/{r}/reward"] - m[f"role/{r}/value"])
                for m in read_jsonl(run_dir_of(cfg).file("metrics.jsonl")) for r in ("generator", "evaluator")]
        assert (max(map(abs, gaps)) < 1e-6) == alone, (scope, gaps)


def test_gae_on_the_verl_engine_trains_verls_critic_and_resumes_exactly(tmp_path, warm_model_dir):
    """engine=verl: verl's critic worker group (value-head FSDP engine, verl's value_loss) per policy.
    Its first value loss each step is the harness's clipped loss on the logged values and returns
    (the same formula, computed by verl), its checkpoint resumes the same numbers, and it learns. A
    voting cell: the voters' successor is the aggregator's stage (graph GAE), and the outcome lands on
    the aggregator, the last stage (outcome_share_mode auto -> last under GAE)."""
    import ray

    common = ("engine=verl", "topology=voting", "sharing=sp", "algo.adv_estimator=gae", "algo.gae_gamma=0.9",
              "val_every=100", "samples_every=0", "ckpt_every=2", "algo.problems_per_step=4", "algo.critic_steps=8",
              "algo.verl_critic_lr=1e-3")
    try:
        straight = cell(tmp_path / "straight", *common, "steps=3")
        assert run_cell(straight, log=lambda *_: None) == "finished"
        first = cell(tmp_path / "resumed", *common, "steps=2")
        assert run_cell(first, log=lambda *_: None) == "finished"
        continued = cell(tmp_path / "resumed", *common, "steps=3")  # from step 2's checkpoint, verl's critic included
        assert run_cell(continued, log=lambda *_: None) == "finished"
    finally:
        ray.shutdown()
    want, got = read_jsonl(run_dir_of(straight).file("metrics.jsonl")), read_jsonl(run_dir_of(continued).file("metrics.jsonl"))
    assert [m["step"] for m in got] == list(range(3))
    for a, b in zip(got, want):
        for key in ("role/voter/value", "role/aggregator/value", "policy/shared/value_loss", "reward/mean"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-7), (a["step"], key)
    for m in want:  # one policy: its first loss is over all turns, at V = V_old (nothing clipped yet)
        roles = [r for r in ("voter", "aggregator") if f"role/{r}/value" in m]
        assert m["role/voter/reward"] == 0.0 and math.isclose(m["role/aggregator/reward"], m["accuracy"])
        assert m["policy/shared/value_clipfrac"] == 0.0 and roles
        turns = {r: m[f"role/{r}/turns"] for r in roles}  # verl's loss over all turns = the harness's per role, pooled
        pooled = sum(turns[r] * m[f"role/{r}/value_loss"] for r in roles) / sum(turns.values())
        assert math.isclose(m["policy/shared/value_loss"], pooled, rel_tol=1e-4), (m["step"], pooled)
        assert {f"role/{r}/{k}" for r in roles for k in ("value", "adv_mean", "value_loss", "explained_variance")} <= set(m)
    assert (run_dir_of(straight).path / "checkpoints" / "step_0000002" / "verl_critic" / "shared").is_dir()
    # it learns: within every step its 8 updates fit the step's returns
    assert all(m["policy/shared/value_loss_last"] < m["policy/shared/value_loss"] for m in want)


def test_unknown_advantage_estimator_is_one_error(tmp_path):
    import pytest

    with pytest.raises(ConfigError, match="valid choices: grpo, gae"):
        cell(tmp_path, "algo.adv_estimator=ppo")


def test_advantages_can_be_whitened_within_each_policy():
    """UnityMAS-O's worker groups each whiten their own buffer: a policy whose raw advantages are ten
    times another's still gets unit scale, and one policy's whitening is verl's over the batch."""
    raw = [0.1, -0.2, 0.05, 3.0, -1.0, 2.0, -4.0]
    groups = ["a", "a", "a", "b", "b", "b", "b"]
    out = whiten_within(raw, groups)
    for group in ("a", "b"):
        mine = torch.tensor([o for o, g in zip(out, groups) if g == group], dtype=torch.float64)
        assert abs(float(mine.mean())) < 1e-9 and math.isclose(float(mine.var(unbiased=True)), 1.0, rel_tol=1e-6)
    assert whiten_within(raw, ["x"] * len(raw)) == whiten(raw)
    pooled = whiten(raw)
    assert max(abs(p) for p, g in zip(pooled, groups) if g == "a") < 0.2  # over the batch, policy a's barely move
    assert CellConfig().algo.adv_whiten == "cell"  # docs/unitymas.md: measured, not yet the default
