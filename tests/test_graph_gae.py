"""GAE over the workflow graph (UnityMAS-O): a turn's successor is the next stage of its episode's
path, parallel siblings share it, a join is read once; the reward discount counts graph stages; and
with GAE a longer loop is not paid more than a shorter one for the same correct answer."""
import copy
import random

import pytest

from harness.algo.critic import one_step_gae, stage_gae, turn_gae, verl_gae, whiten
from harness.rewards import assign_rewards
from harness.tasks.base import Grade, Problem
from harness.episodes import Episode, Turn
from tests.conftest import cell
from tests.test_rewards import _episodes

G, L = 0.9, 0.8


def test_on_a_chain_the_stages_are_the_turns_and_the_numbers_verls():
    """Every stage one turn (eval_opt, workflow D's loop): stage GAE is verl's GAE over turns
    (`turn_gae`, itself tested against verl's compute_gae_advantage_return)."""
    rng = random.Random(1)
    for n in (1, 2, 5, 7):
        r, v = [rng.uniform(-1, 1) for _ in range(n)], [rng.uniform(-1, 1) for _ in range(n)]
        for gamma, lam in ((1.0, 1.0), (G, L), (0.5, 0.0)):
            for ours, verls in zip(stage_gae(r, v, list(range(n)), gamma, lam), turn_gae(r, v, gamma, lam)):
                assert ours == pytest.approx(verls, abs=1e-12)


def test_voters_share_the_aggregator_as_their_successor():
    """Three voters at stage 0, the aggregator at 1: each voter's delta reads V(aggregator), not the
    value of the voter that happened to finish after it."""
    r, v = [0.1, 0.2, 0.3, 1.0], [0.5, 0.0, 0.2, 0.6]
    adv, ret = stage_gae(r, v, [0, 0, 0, 1], G, L)
    a_agg = 1.0 - 0.6
    by_hand = [r[i] + G * 0.6 - v[i] + G * L * a_agg for i in range(3)] + [a_agg]
    assert adv == pytest.approx(by_hand, abs=1e-12)
    assert ret == pytest.approx([a + b for a, b in zip(by_hand, v)])
    chained = turn_gae(r, v, G, L)[0]  # completion order: voter 0's successor would be voter 1
    assert abs(chained[0] - by_hand[0]) > 0.05


def test_a_fan_out_is_read_once_as_its_mean():
    """Orchestrator (stage 0) -> two workers (stage 1) -> synthesis (stage 2): the orchestrator's
    successor value and advantage are the workers' means; each worker's successor is the synthesis."""
    r, v = [0.0, 0.2, 0.0, 1.0], [0.3, 0.5, 0.1, 0.7]
    adv, _ = stage_gae(r, v, [0, 1, 1, 2], G, L)
    a3 = 1.0 - 0.7
    a1, a2 = 0.2 + G * 0.7 - 0.5 + G * L * a3, 0.0 + G * 0.7 - 0.1 + G * L * a3
    a0 = 0.0 + G * (0.5 + 0.1) / 2 - 0.3 + G * L * (a1 + a2) / 2
    assert adv == pytest.approx([a0, a1, a2, a3], abs=1e-12)


@pytest.mark.parametrize("topology,task,first_stage", [
    ("voting", "arith", ["voter", "voter", "voter"]),
    ("orch_workers", "arith", ["orchestrator"]),
    ("reflective_code", "code-synth", ["planner"]),
])
def test_real_episodes_record_their_graph_stage_and_discount_by_it(tmp_path, warm_model_dir, topology, task, first_stage):
    """Rollouts of the tiny model: turns filed together share a stage whatever order they finish in,
    each later stage follows the one before, and reward.gamma counts stages (voters gamma^0, the
    aggregator gamma^1)."""
    cfg, episodes = _episodes(tmp_path, warm_model_dir, f"topology={topology}", f"task={task}", "reward.turn=0.5")
    discounted = copy.deepcopy(cfg.reward)
    discounted.gamma = 0.5
    for episode in episodes:
        depths = [t.depth for t in episode.turns]
        assert sorted(t.role for t in episode.turns if t.depth == 0) == first_stage
        assert set(depths) == set(range(max(depths) + 1))  # no stage skipped
        assert all(a.depth <= b.depth for a, b in zip(episode.turns, episode.turns[1:]))
        assign_rewards(episode, cfg.reward)
        plain = [t.reward for t in episode.turns]
        assign_rewards(episode, discounted)
        assert [t.reward for t in episode.turns] == pytest.approx([r * 0.5 ** d for r, d in zip(plain, depths)])
    if topology == "voting":
        assert all([t.depth for t in e.turns] == [0, 0, 0, 1] for e in episodes)
    if topology == "reflective_code":  # D's loop is a chain: plan, code, (reflect, plan, code)* while the run fails
        assert all([t.depth for t in e.turns] == list(range(len(e.turns))) for e in episodes)
        assert {len(e.turns) for e in episodes} - {2, 5, 8} == set()


def _d_episode(rounds: int, correct: bool) -> Episode:
    """Workflow D's turns for a loop of `rounds` rounds: plan, code, (reflect, plan, code)*."""
    roles = ["planner", "coder"] + ["reflector", "planner", "coder"] * (rounds - 1)
    turns = [Turn(role, 0, role, f"{role} prompt", [1], [2, 3], "x", False, index=i, depth=i) for i, role in enumerate(roles)]
    for turn in turns:
        turn.role_correct = correct
    return Episode(Problem("p", "q", "a"), turns, "x", Grade(correct, "a"))


def _first_turn_advantage(cfg, episode: Episode, first_value: float = 0.3) -> float:
    assign_rewards(episode, cfg.reward, cfg.algo.adv_estimator)
    values = [first_value] + [0.5] * (len(episode.turns) - 1)  # the same first state: the same value
    adv, _ = stage_gae([t.reward for t in episode.turns], values, [t.depth for t in episode.turns],
                       cfg.algo.gae_gamma, cfg.algo.gae_lambda)
    return adv[0]


@pytest.mark.parametrize("gae_gamma", ["1.0", "0.9"])
def test_with_gae_a_correct_one_round_episode_is_worth_at_least_a_correct_three_round_one(tmp_path, gae_gamma):
    """The default (outcome_share_mode=auto -> last under GAE) pays a correct episode once, at its
    last stage: the planner's first-turn advantage does not grow with the loop's rounds.
    Copying the outcome to every turn (full) would pay the three-round loop about 2.3x."""
    cfg = cell(tmp_path, "topology=reflective_code", "task=code-synth", "algo.adv_estimator=gae",
               f"algo.gae_gamma={gae_gamma}")
    assert cfg.reward.outcome_share_mode == "last"  # resolved into cell.yaml's config
    one, three = _first_turn_advantage(cfg, _d_episode(1, True)), _first_turn_advantage(cfg, _d_episode(3, True))
    assert one >= three - 1e-12
    assert one > _first_turn_advantage(cfg, _d_episode(1, False))  # and a correct episode still beats a wrong one
    full = copy.deepcopy(cfg)
    full.reward.outcome_share_mode = "full"
    assert _first_turn_advantage(full, _d_episode(3, True)) > _first_turn_advantage(full, _d_episode(1, True)) + 0.5


def test_gae_with_every_turn_alone_is_verls_gae_on_one_step_episodes_and_pays_each_turn_its_own_outcome(tmp_path):
    """algo.gae_scope=turn, UnityMAS-O's trainer: each turn a one-step episode of its own policy, so
    its advantage is its reward less its value whatever follows it; the outcome lands on every turn
    (auto -> full: no return sums rewards), and a three-round loop's planner is paid as a one-round one's."""
    rewards, values = [0.0, 1.0, 0.5, 1.0], [0.2, 0.4, 0.1, 0.9]
    adv, ret = one_step_gae(rewards, values)
    assert adv == pytest.approx([-0.2, 0.6, 0.4, 0.1]) and ret == rewards
    verl_adv, verl_ret = verl_gae([([r], [v]) for r, v in zip(rewards, values)], 1.0, 1.0)  # one token a row
    assert [r for row in verl_ret for r in row] == pytest.approx(rewards)
    assert [a for row in verl_adv for a in row] == pytest.approx(whiten(adv), abs=1e-6)  # verl whitens the batch
    cfg = cell(tmp_path, "topology=reflective_code", "task=code-synth", "algo.adv_estimator=gae", "algo.gae_scope=turn")
    assert cfg.reward.outcome_share_mode == "full"
    first = []
    for rounds in (1, 3):
        episode = _d_episode(rounds, True)
        assign_rewards(episode, cfg.reward, cfg.algo.adv_estimator)
        first.append(one_step_gae([t.reward for t in episode.turns], [0.3] * len(episode.turns))[0][0])
    assert first[0] == pytest.approx(first[1]) and first[0] > 0


def test_grpo_keeps_the_studys_outcome_on_every_turn(tmp_path):
    assert cell(tmp_path, "topology=voting").reward.outcome_share_mode == "full"
    assert cell(tmp_path, "topology=voting", "algo.adv_estimator=gae", "reward.outcome_share_mode=split"
                ).reward.outcome_share_mode == "split"
