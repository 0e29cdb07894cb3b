"""The gradient probe against brute force: a separate backward per role instance."""
import math
import random

import pytest
import torch

from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe, flat_grad
from harness.algo.grpo import assign_advantages
from harness.algo.loss import BatchNorm
from harness.engines.base import update_plan
from harness.rewards import assign_rewards
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.workflows import build_workflow
from tests.conftest import cell


def _setup(tmp_path, warm_model_dir, *overrides):
    cfg = cell(tmp_path, *overrides)
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    engine = LocalEngine(warm_model_dir, policy_map.policies, cfg, seed=0)
    controller = Controller(cfg, task, workflow, policy_map, engine)
    torch.manual_seed(3)
    episodes, _ = controller.rollout(controller.problems_for(0), cfg.algo.group_size, greedy=False)
    for e in episodes:
        assign_rewards(e, cfg.reward)
    assign_advantages(episodes)
    return cfg, engine, [t for e in episodes for t in e.turns]


def spread_advantages(turns, seed: int = 0) -> None:
    """Seeded advantages in [-1, 1] on every turn: which groups of a rollout happen to score all alike
    (advantage 0) depends on the warm model's build, and a mini-batch of zero advantages has no
    gradient to compare. The probe and the engines are exact for any advantages."""
    rng = random.Random(seed)
    for turn in turns:
        turn.advantage = rng.uniform(-1.0, 1.0)


def _brute_force(engine, turns):
    """g_i for every (policy, slot) of each policy's first mini-batch from its own backward, with the
    mini-batch's normalisers (the first optimizer step is on-policy: ratio 1)."""
    grads = {}
    plan = update_plan(turns, engine.cfg.algo, engine.seed, 0)
    for policy in engine.policies:
        mine = plan[policy][0].turns
        role_tokens = {}
        for t in mine:
            role_tokens[t.role] = role_tokens.get(t.role, 0) + len(t.response_ids)
        norm = BatchNorm(sum(role_tokens.values()), len(mine), role_tokens)
        engine._activate(policy)
        for slot in dict.fromkeys(t.slot for t in mine):
            engine.optimizers[policy].zero_grad(set_to_none=True)
            stats = {k: {slot[0]: 0.0} for k in ("entropy", "kl", "tokens", "clipped", "ratio")}
            engine.micro_batch_loss([t for t in mine if t.slot == slot], norm, slot[0], stats).backward()
            grads[(policy, slot)] = flat_grad(engine.params[policy]).double()
        engine.optimizers[policy].zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("topology,sharing,loss_agg", [
    ("voting", "ip", "token-mean"), ("voting", "sp", "seq-mean-token-mean"),
    ("orch_workers", "ip", "role-balanced"), ("eval_opt", "sp", "token-mean"),
])
def test_probe_matches_brute_force(tmp_path, warm_model_dir, topology, sharing, loss_agg):
    cfg, engine, turns = _setup(tmp_path, warm_model_dir, f"topology={topology}", f"sharing={sharing}",
                                f"algo.loss_agg={loss_agg}", "algo.micro_batch_size=7")
    spread_advantages(turns)
    expected = _brute_force(engine, turns)
    assert any(g.norm() > 0 for g in expected.values())
    probe = GradientProbe()
    result = engine.update(turns, probe)
    for policy, pg in probe.policies.items():
        vectors = torch.stack([expected[(policy, slot)] for slot in pg.slots])
        assert torch.allclose(pg.gram, vectors @ vectors.T, atol=1e-5, rtol=1e-4)
        # the instances add up to the policy's own (pre-clipping) gradient norm
        assert math.isclose(math.sqrt(pg.gram.sum()), result.policy_grad_norm[policy], rel_tol=1e-4)
    # every later (off-policy) mini-batch too: its instances add up to that optimizer step's own norm
    plan = update_plan(turns, cfg.algo, engine.seed, 0)
    for policy, rounds in probe.rounds.items():
        assert len(rounds) == len(plan[policy]) == len(result.minibatches[policy]) == result.optimizer_steps[policy]
        for pg, minibatch, step in zip(rounds, plan[policy], result.minibatches[policy]):
            assert set(pg.slots) == set(minibatch.slots)
            assert math.isclose(math.sqrt(pg.gram.sum()), step["grad_norm"], rel_tol=1e-4)
    metrics = gradient_metrics(probe)
    shares = [v for k, v in metrics.items() if k.endswith("/grad_share")]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-6)
    if topology == "voting":
        voters = [expected[(p, s)] for (p, s) in expected if s[0] == "voter"]
        total = sum(voters)
        coherence = float(total @ total) / sum(float(v @ v) for v in voters)
        assert math.isclose(metrics["role/voter/coherence"], coherence, rel_tol=1e-4)
        if sharing == "ip":
            assert math.isclose(metrics["policy/voter/coherence"], coherence, rel_tol=1e-4)
