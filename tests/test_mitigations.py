"""Each mitigation sets the knobs it names and changes the update the way its formula says;
`mitigation=` composes, rejects unknown names and becomes a grid axis."""
import statistics
import subprocess
from collections import defaultdict

import pytest
import torch

from harness.algo.coherence import design_effect
from harness.algo.grpo import assign_advantages
from harness.config import CellConfig, ConfigError, kl_beta
from harness.engines.base import step_lr, update_plan
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe
from harness.run_dir import read_jsonl
from harness.mitigations import MITIGATIONS, apply_mitigations
from harness.rewards import assign_rewards
from harness.run import run_cell, run_dir_of
from harness.tasks import Grade, Problem
from harness.validation import config_from_dict
from harness.episodes import Episode, Turn
from tests.conftest import REPO, cell, python_cmd
from tests.test_probe import _setup, spread_advantages


def _turn(role, instance, reward=0.0, n_tokens=2):
    return Turn(role, instance, "p", "prompt", [1], list(range(n_tokens)), "x", False, 0, reward=reward)


def test_role_count_scaling_gives_three_voters_the_steps_of_one():
    """IP voting, 8 problems x 4 rollouts, mini-batches of 2 problems: the voter adapter's 96 rows make
    12 optimizer steps, the aggregator's 32 make 4; scaled, the voters' rows go 24 to a step: 4 steps."""
    turns = [_turn(role, i) for _ in range(32) for role, i in (("voter", 0), ("voter", 1), ("voter", 2),
                                                                ("aggregator", 0))]
    for t in turns:
        t.policy = t.role
    cfg = CellConfig()
    cfg.algo.ppo_mini_batch_size = 2
    plain = update_plan(turns, cfg.algo, 0, 0)
    assert len(plain["voter"]) == 12 and len(plain["aggregator"]) == 4
    apply_mitigations(_named(cfg, "role_count_scaling"))
    scaled = update_plan(turns, cfg.algo, 0, 0)
    assert len(scaled["voter"]) == 4 and len(scaled["aggregator"]) == 4
    assert [len(b.turns) for b in scaled["voter"]] == [24] * 4
    assert sorted(id(t) for b in scaled["voter"] for t in b.turns) == sorted(id(t) for t in turns if t.role == "voter")


def _gram(*vectors):
    matrix = torch.tensor(vectors, dtype=torch.float64)
    return matrix @ matrix.T


def test_design_effect_counts_aligned_instances_once_and_leaves_orthogonal_ones_alone():
    voters = [("voter", 0), ("voter", 1), ("voter", 2)]
    aligned, orthogonal = _gram([1, 2], [2, 4], [0.5, 1]), _gram([1, 0, 0], [0, 3, 0], [0, 0, 2])
    assert design_effect(voters, aligned, 1.0) == pytest.approx(3.5 ** 2 / (1 + 4 + 0.25) * 1.0, rel=1e-12)
    assert design_effect(voters, _gram([1, 1], [1, 1], [1, 1]), 1.0) == pytest.approx(3.0)  # n aligned: n
    assert design_effect(voters, _gram([1, 1], [1, 1], [1, 1]), 0.5) == pytest.approx(2.0)  # 1 + λ(n - 1)
    assert design_effect(voters, orthogonal, 1.0) == pytest.approx(1.0)
    assert design_effect(voters, _gram([1, 0], [-1, 0], [0, 1]), 1.0) == 1.0  # cancelling: never sped up
    assert design_effect(voters, aligned, 0.0) == 1.0  # off
    # a zero gradient (all-zero advantages) adds nothing; one instance per role is never penalised
    assert design_effect(voters, _gram([1, 1], [1, 1], [0, 0]), 1.0) == pytest.approx(2.0)
    assert design_effect([("voter", 0), ("aggregator", 0)], _gram([1, 1], [1, 1]), 1.0) == 1.0
    # a shared policy: the most redundant role sets the step (voters aligned, generator alone)
    slots = voters + [("aggregator", 0)]
    assert design_effect(slots, _gram([1, 0], [1, 0], [1, 0], [1, 0]), 1.0) == pytest.approx(3.0)


def _voters_agree(turns) -> None:
    """Every voter of a question gives voter 0's reply with its advantage: 3 equal gradients, coherence 3 by
    construction (sampled replies give a coherence that depends on the warm model's build, above or below 1)."""
    first = {}
    for turn in turns:
        if turn.role == "voter":
            reply = first.setdefault(turn.prompt, turn)
            turn.response_ids, turn.text, turn.truncated = list(reply.response_ids), reply.text, reply.truncated
            turn.rollout_log_probs = None if reply.rollout_log_probs is None else list(reply.rollout_log_probs)
            turn.advantage = reply.advantage


def test_coherence_reg_divides_each_step_of_the_voter_adapter_by_its_instances_coherence(tmp_path, warm_model_dir):
    """The same batch from the same weights, with and without `coherence_reg`: every optimizer step
    of the voter adapter is the plain step times 1/coherence of its voters' gradients in that step
    (Adam's first step is a function of the gradient's direction, so only the lr scales it); the
    aggregator, one instance, is untouched. (Both with role_count_scaling, so that each adapter takes one
    step on all its rows and the two compose.)"""
    overrides = ("topology=voting", "sharing=ip", "algo.ppo_mini_batch_size=8")
    results = {}
    for name in ("role_count_scaling", "role_count_scaling+coherence_reg"):
        cfg, engine, turns = _setup(tmp_path / name, warm_model_dir, *overrides, f"mitigation={name}")
        spread_advantages(turns)
        _voters_agree(turns)
        probe = GradientProbe()
        results[name] = (engine.update(turns, probe, step=0), gradient_metrics(probe))
    (plain, plain_grads), (reg, reg_grads) = results["role_count_scaling"], results["role_count_scaling+coherence_reg"]
    assert plain.optimizer_steps == reg.optimizer_steps == {"voter": 1, "aggregator": 1}
    coherence = reg_grads["role/voter/coherence"]
    assert coherence == pytest.approx(plain_grads["role/voter/coherence"]) and coherence == pytest.approx(3.0, rel=1e-4)
    assert reg.minibatches["voter"][0]["lr_scale"] == pytest.approx(1.0 / coherence, rel=1e-9)
    assert reg.minibatches["aggregator"][0]["lr_scale"] == 1.0 and "lr_scale" not in plain.minibatches["voter"][0]
    assert reg.policy_update_norm["voter"] == pytest.approx(plain.policy_update_norm["voter"] / coherence, rel=1e-5)
    assert reg.policy_update_norm["aggregator"] == pytest.approx(plain.policy_update_norm["aggregator"], rel=1e-6)


def _named(cfg, name):
    cfg.mitigation = name
    return cfg


def test_agent_norm_divides_by_the_roles_std_over_the_batch():
    """Two problems, a voter per episode: group means 0.75 and 0.25; the voter's 8 scores have sample
    std 0.5345; agent_norm gives (s - group mean) / 0.5345, GRPO's own gives (s - mean) / group std."""
    rewards = [[1, 1, 1, 0], [0, 0, 0, 1]]
    episodes = [Episode(Problem("u", "q", "a"), [_turn("voter", 0, r)], "", Grade(bool(r), "a"), group=g)
                for g, group in enumerate(rewards) for r in group]
    assign_advantages(episodes, norm="agent")
    scores = [r for group in rewards for r in group]
    std = statistics.stdev(scores)
    means = [0.75] * 4 + [0.25] * 4
    got = [e.turns[0].advantage for e in episodes]
    assert all(abs(a - (s - m) / std) < 1e-5 for a, s, m in zip(got, scores, means)), got
    assign_advantages(episodes)  # GRPO: each group's own std (0.5): +-1.5 and -+0.5
    assert abs(episodes[0].turns[0].advantage - 0.5) < 1e-4 and abs(episodes[3].turns[0].advantage + 1.5) < 1e-4
    with pytest.raises(ValueError, match="valid: group, agent"):
        assign_advantages(episodes, norm="batch")


def test_length_penalty_charges_the_short_contract_roles_per_token():
    cfg = apply_and_validate({"topology": "voting", "mitigation": "length_penalty",
                              "reward": {"per_role": {"evaluator": {"length": -0.2}}}})
    assert cfg.reward.per_role["aggregator"]["length"] == -0.05
    assert cfg.reward.per_role["evaluator"]["length"] == -0.2  # an explicit setting wins
    assert "voter" not in cfg.reward.per_role
    episode = Episode(Problem("u", "q", "a"), [_turn("aggregator", 0, n_tokens=2), _turn("aggregator", 0, n_tokens=10),
                                                _turn("voter", 0, n_tokens=10)], "", Grade(True, "a"))
    assign_rewards(episode, cfg.reward)
    assert [round(t.reward, 6) for t in episode.turns] == [0.9, 0.5, 1.0]


def apply_and_validate(values):
    return config_from_dict(values)


def test_role_balanced_and_kl_anchor_set_their_knobs_and_names_compose():
    cfg = apply_and_validate({"topology": "voting", "sharing": "sp", "mitigation": "role_balanced+kl_anchor",
                              "algo": {"kl_coef_per_role": {"voter": 0.2}}})
    assert cfg.algo.loss_agg == "role-balanced" and cfg.algo.kl_coef == 0.05
    assert kl_beta(cfg.algo, "voter") == 0.2 and kl_beta(cfg.algo, "aggregator") == 0.05
    assert cfg.cell_id == "voting-sp-arith-tiny-m-s0-mitigation=role_balanced+kl_anchor"
    assert set(MITIGATIONS) == {"none", "role_count_scaling", "coherence_reg", "kl_anchor", "lr_half", "role_balanced",
                                "agent_norm", "length_penalty"}
    with pytest.raises(ConfigError, match="unknown mitigation 'coherence'; valid choices: none, role_count_scaling"):
        apply_and_validate({"mitigation": "kl_anchor+coherence"})
    with pytest.raises(ConfigError, match="kl_coef_per_role.voter must be a finite number >= 0"):
        apply_and_validate({"algo": {"kl_coef_per_role": {"voter": -1.0}}})
    halved = apply_and_validate({"mitigation": "lr_half", "algo": {"lr": 0.002}})
    assert halved.algo.lr_factor == 0.5 and step_lr(halved.algo, 10, 3) == 0.001 and halved.algo.lr == 0.002
    for knob, name in (("coherence_reg", "coherence_reg"), ("kl_coef", "kl_anchor")):  # not replaced by the default
        with pytest.raises(ConfigError, match=f"algo.{knob} must be a finite number >= 0, got -1.0"):
            apply_and_validate({"mitigation": name, "algo": {knob: -1.0}})


def test_unknown_mitigation_on_the_command_line_exits_2_and_writes_nothing(tmp_path):
    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", "mitigation=balanced"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown mitigation 'balanced'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_kl_anchor_puts_each_roles_beta_into_its_loss(tmp_path, warm_model_dir):
    """The same micro-batch's loss with a role's beta is the plain loss plus beta x its token-mean KL
    to the base (the adapter moved first, so the KL is not 0); another role's beta does not touch it."""
    cfg, engine, turns = _setup(tmp_path, warm_model_dir, "topology=voting", "sharing=ip")
    with torch.no_grad():
        for p in engine.params["voter"]:
            p.add_(0.05 * torch.randn_like(p))
    engine._activate("voter")
    batch = [t for t in turns if t.policy == "voter"][:8]
    plan = update_plan(batch, cfg.algo, 0, 0)
    norm = plan["voter"][0].norm

    def loss(per_role):
        cfg.algo.kl_coef_per_role = per_role
        stats = {k: defaultdict(float) for k in ("entropy", "kl", "tokens", "clipped", "ratio")}
        value = engine.micro_batch_loss(batch, norm, "voter", stats, with_kl=True)
        return float(value.detach()), stats["kl"]["voter"] / stats["tokens"]["voter"]

    plain, kl = loss({})
    anchored, _ = loss({"voter": 0.5})
    other, _ = loss({"aggregator": 0.5})
    assert kl > 1e-4 and abs(other - plain) < 1e-7
    assert abs(anchored - plain - 0.5 * kl) < 1e-5 * max(1.0, abs(anchored))


def test_role_count_scaling_in_a_real_run_slows_the_voter_adapter_to_one_instances_pace(tmp_path, warm_model_dir):
    common = ("topology=voting", "sharing=ip", "steps=6", "val_every=100", "samples_every=0",
              "algo.ppo_mini_batch_size=2", "algo.balance_batch=false", "wandb.enabled=false", "report=false")
    plain = _metrics(tmp_path, *common)
    scaled = _metrics(tmp_path, *common, "mitigation=role_count_scaling")
    assert all(m["policy/voter/optimizer_steps"] == 12 for m in plain)
    assert all(m["policy/voter/optimizer_steps"] == 4 == m["policy/aggregator/optimizer_steps"] for m in scaled)
    # step 0: both runs roll out the same episodes from the same weights, so the adapters' first
    # moves compare like for like (later steps see different voters' outputs, hence other data)
    first_plain = plain[0]["policy/voter/drift"] / plain[0]["policy/aggregator/drift"]
    first_scaled = scaled[0]["policy/voter/drift"] / scaled[0]["policy/aggregator/drift"]
    slowed = scaled[-1]["policy/voter/drift"] / plain[-1]["policy/voter/drift"]
    print(f"voter/aggregator drift after step 0: {first_plain:.2f} plain, {first_scaled:.2f} scaled; "
          f"voter drift after 6 steps, scaled/plain: {slowed:.2f}")
    assert first_plain > 1.3 and 0.8 < first_scaled < 1.25
    assert slowed < 0.8


def _metrics(tmp_path, *overrides):
    cfg = cell(tmp_path, *overrides)
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    return read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
