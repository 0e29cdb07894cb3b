"""verl's PPO update as the study runs it: mini-batches of problems, one optimizer step each, old
log-probs from the behaviour weights, clipping; and sampled validation."""
from statistics import mean

import pytest
import torch

from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.instrument.probe import GradientProbe
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.workflows import build_workflow
from tests.conftest import cell
from tests.test_probe import _setup, spread_advantages


def _metrics(tmp_path, *overrides):
    cfg = cell(tmp_path, *overrides)
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    return read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))


def test_three_voters_give_their_adapter_three_times_the_steps_and_it_drifts_faster(tmp_path, warm_model_dir):
    common = ("topology=voting", "steps=8", "val_every=100", "samples_every=0", "algo.ppo_mini_batch_size=4")
    ip = _metrics(tmp_path, "sharing=ip", *common)
    control = _metrics(tmp_path, "sharing=ip_instance", *common)
    for m in ip:  # 8 problems x 4 rollouts in mini-batches of 4 problems: 2 steps per instance's rows
        assert m["policy/aggregator/optimizer_steps"] == 2 and m["policy/voter/optimizer_steps"] == 6
    for m in control:
        assert all(m[f"policy/voter_{i}/optimizer_steps"] == 2 for i in range(3))
    ip_drift = [m["policy/voter/drift"] for m in ip]
    control_drift = [mean(m[f"policy/voter_{i}/drift"] for i in range(3)) for m in control]
    print(f"voter adapter drift ||theta_t - theta_0|| by step, IP (3 voters, one adapter): "
          f"{' '.join(f'{d:.3f}' for d in ip_drift)}; ip_instance (mean of 3 adapters): "
          f"{' '.join(f'{d:.3f}' for d in control_drift)}; rate (mean drift_rate) IP "
          f"{mean(m['policy/voter/drift_rate'] for m in ip):.4f} vs "
          f"{mean(mean(m[f'policy/voter_{i}/drift_rate'] for i in range(3)) for m in control):.4f}")
    assert all(a > 1.3 * b for a, b in zip(ip_drift, control_drift))
    assert ip_drift[-1] > ip_drift[0] and control_drift[-1] > control_drift[0]
    # the first mini-batch is on-policy (ratio 1, nothing clipped); later ones are not
    later = [m["policy/voter/clipfrac_later"] for m in ip]
    print("voter clipfrac after the first mini-batch, by step:", " ".join(f"{c:.3f}" for c in later))
    assert all(m["policy/voter/clipfrac_first"] == 0.0 for m in ip)
    assert mean(later) > 0 and sum(c > 0 for c in later) >= len(later) // 2


def test_old_log_probs_are_the_behaviour_policys_so_later_mini_batches_clip(tmp_path, warm_model_dir):
    cfg, engine, turns = _setup(tmp_path, warm_model_dir, "topology=voting", "sharing=ip", "algo.ppo_mini_batch_size=2")
    voter = [t for t in turns if t.policy == "voter"]
    before = engine._old_log_probs("voter", voter)
    result = engine.update(turns, GradientProbe(), step=0)
    after = engine._old_log_probs("voter", voter)
    assert any(not torch.allclose(before[id(t)], after[id(t)], atol=1e-4) for t in voter)
    steps = result.minibatches["voter"]
    print("voter clipfrac per mini-batch:", " ".join(f"{s['clipfrac']:.3f}" for s in steps))
    assert len(steps) == 12 and steps[0]["clipfrac"] == 0.0  # the first step is on-policy: ratio 1
    assert sum(s["clipfrac"] for s in steps[1:]) > 0
    assert result.ratio["voter"] != 1.0


def test_clip_ratio_high_changes_the_update(tmp_path, warm_model_dir):
    moved = {}
    for high in (0.28, 0.01):
        cfg, engine, turns = _setup(tmp_path / str(high), warm_model_dir, "topology=single", "algo.ppo_mini_batch_size=2",
                                    "algo.ppo_epochs=2", f"algo.clip_ratio_high={high}")
        result = engine.update(turns, None, step=0)
        moved[high] = torch.cat([p.detach().reshape(-1) for p in engine.params["shared"]])
        print(f"clip_ratio_high {high}: clipfrac {result.clipfrac['solver']:.4f}")
    assert (moved[0.28] - moved[0.01]).abs().max() > 1e-5


def test_sampled_validation_of_voting_sp_has_distinct_candidates_and_a_standard_error(tmp_path, warm_model_dir):
    def controller(*overrides):
        cfg = cell(tmp_path, "topology=voting", "sharing=sp", "val_problems=16", *overrides)
        task = build_task(cfg)
        workflow = build_workflow(cfg, task)
        policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
        return Controller(cfg, task, workflow, policy_map, LocalEngine(warm_model_dir, policy_map.policies, cfg, 0))

    sampled = controller("val_samples=4").validate(0)
    greedy = controller("val_greedy=true").validate(0)
    print(f"distinct candidates: sampled {sampled['val/role/aggregator/distinct_candidates']:.2f}, "
          f"greedy {greedy['val/role/aggregator/distinct_candidates']:.2f}; "
          f"accuracy {sampled['val/accuracy']:.3f} +- {sampled['val/accuracy_se']:.3f}")
    assert sampled["val/role/aggregator/distinct_candidates"] > 1.2
    assert greedy["val/role/aggregator/distinct_candidates"] == 1.0  # one policy, one prompt, greedy: 3 copies
    assert 0 < sampled["val/accuracy_se"] < 0.5


def test_an_lr_spike_multiplies_the_steps_inside_its_window_and_no_other(tmp_path, warm_model_dir):
    """The induced failure `algo.lr_spike_*`: the same batch from the same weights, updated at a step
    inside the window and at one outside it (Adam's first step is a function of the gradient's
    direction, so only the lr scales it: role_count_scaling gives each adapter one step on all its
    rows); the cell logs the spiked lr at exactly those steps."""
    spike = ("algo.lr_spike_factor=4", "algo.lr_spike_start=3", "algo.lr_spike_steps=2")
    norms = {}
    for step in (2, 3):
        _cfg, engine, turns = _setup(tmp_path / str(step), warm_model_dir, "topology=voting", "sharing=ip",
                                     "mitigation=role_count_scaling", *spike)
        spread_advantages(turns)
        norms[step] = engine.update(turns, GradientProbe(), step=step).policy_update_norm
    for policy in ("voter", "aggregator"):
        assert norms[3][policy] == pytest.approx(4 * norms[2][policy], rel=1e-5)
    metrics = _metrics(tmp_path / "run", "steps=6", "val_every=100", "samples_every=0", *spike)
    base = metrics[0]["lr"]
    assert [m["lr"] / base for m in metrics] == pytest.approx([1, 1, 1, 4, 4, 1])


def _rows(lengths, policy="shared"):
    from harness.episodes import Turn

    return [Turn("voter", 0, policy, "p", [1], [2] * (n - 1), "", False, i) for i, n in enumerate(lengths)]


def test_the_batch_is_balanced_as_verl_balances_it_before_mini_batching():
    """verl's _balance_batch (on by default in verl and the study): rows sorted by length and
    zig-zagged on one rank, Karmarkar-Karp first over two; the orders verl 0.6.1's code gives."""
    from harness.config import AlgoConfig
    from harness.engines.base import balanced_order, update_plan

    algo = AlgoConfig()
    assert balanced_order(_rows([50, 10, 40, 30, 20, 60, 70, 80]), algo) == [1, 3, 0, 6, 7, 5, 2, 4]
    assert balanced_order(_rows([5, 5, 5, 5, 9, 1]), algo) == [5, 1, 3, 4, 2, 0]
    two = AlgoConfig(balance_dp=2)
    assert balanced_order(_rows([50, 10, 40, 30, 20, 60, 70, 80]), two) == [4, 0, 7, 3, 1, 5, 6, 2]
    assert balanced_order(_rows([5, 5, 5, 5, 9, 1]), two) == [5, 4, 1, 0, 3, 2]
    assert balanced_order(_rows([50, 10, 40]), AlgoConfig(balance_batch=False)) == [0, 1, 2]
    # a policy's mini-batches are cut from the balanced order: the shortest rows come first
    rows = _rows([50, 10, 40, 30, 20, 60, 70, 80])
    plan = update_plan(rows, AlgoConfig(ppo_mini_batch_size=1, group_size=4), 0, 0)
    firsts = [t.index for slot in plan["shared"][0].slots.values() for t in slot]
    assert firsts == [1, 3, 0, 6]


def test_the_studys_off_policy_diagnostics_match_a_hand_computed_example():
    """training_ppl, ppl_ratio and chi2_token as verl's compute_offpolicy_metrics defines them (the
    study logs them per role): two sequences, the second without the sampler's log-probs."""
    import math
    from collections import defaultdict

    from harness.engines.base import STAT_SUMS, UpdateResult, add_offpolicy, finish_update

    sums = {k: defaultdict(float) for k in STAT_SUMS}
    log_prob = torch.tensor([[-0.5, -1.5, 0.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    add_offpolicy(sums, "voter", log_prob, mask, [[-1.0, -1.0], None])
    ratios = [1.0, 1.0 + 2e-3, 1.0 - 2e-3]  # a ratio spread far below float32's resolution of sum(r^2)
    sums["tokens"]["voter"], sums["ratio"]["voter"] = 3.0, sum(ratios)
    sums["ratio_dev_sq"]["voter"] = sum((r - 1.0) ** 2 for r in ratios)
    result = UpdateResult(0.0, {}, {}, {})
    finish_update(result, {}, {}, sums)
    got = result.role_extra["voter"]
    assert math.isclose(got["training_ppl"], (math.exp(1.0) + math.exp(2.0)) / 2)
    assert math.isclose(got["ppl_ratio"], math.exp(-1.0 - (-1.0)))  # mean log-probs equal: ratio 1
    assert math.isclose(got["chi2_token"], (math.exp(0.5) ** 2 + math.exp(-0.5) ** 2) / 2 - 1)
    assert math.isclose(got["ratio_std"], math.sqrt(8e-6 / 3), rel_tol=1e-6)
