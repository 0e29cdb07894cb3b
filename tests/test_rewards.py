"""Rewards over the trajectory (UnityMAS-O): the discount per workflow step, the outcome shared in
full or split among roles, and a user reward allocator; on real episodes of the tiny model."""
import copy

import pytest

from harness.config import ConfigError
from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.rewards import assign_rewards
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.workflows import build_workflow
from tests.conftest import cell


def _episodes(tmp_path, warm_model_dir, *overrides):
    cfg = cell(tmp_path, *overrides)
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    controller = Controller(cfg, task, workflow, policy_map, LocalEngine(warm_model_dir, policy_map.policies, cfg))
    import torch

    torch.manual_seed(5)
    episodes, _ = controller.rollout(controller.problems_for(0)[:4], 4, greedy=False)
    return cfg, episodes


def test_gamma_discounts_each_turn_by_its_workflow_step(tmp_path, warm_model_dir):
    cfg, episodes = _episodes(tmp_path, warm_model_dir, "topology=eval_opt", "reward.turn=0.5")
    discounted = copy.deepcopy(cfg.reward)
    discounted.gamma = 0.5
    assert any(len(e.turns) >= 3 for e in episodes)  # a draft, a verdict and a revision: several steps
    for episode in episodes:
        assign_rewards(episode, cfg.reward)
        plain = [t.reward for t in episode.turns]
        assign_rewards(episode, discounted)
        assert [t.reward for t in episode.turns] == pytest.approx([r * 0.5 ** i for i, r in enumerate(plain)])
        assert [t.index for t in episode.turns] == [t.depth for t in episode.turns] == list(range(len(episode.turns)))


def test_split_pays_the_outcome_once_per_episode(tmp_path, warm_model_dir):
    cfg, episodes = _episodes(tmp_path, warm_model_dir, "topology=voting", "reward.outcome_share_mode=split")
    for episode in episodes:
        assign_rewards(episode, cfg.reward)
        outcome = float(episode.grade.correct)
        voters = [t.reward for t in episode.turns if t.role == "voter"]
        (aggregator,) = [t.reward for t in episode.turns if t.role == "aggregator"]
        assert voters == pytest.approx([outcome / 6] * 3) and aggregator == pytest.approx(outcome / 2)
        assert sum(t.reward for t in episode.turns) == pytest.approx(outcome)
    assert any(e.grade.correct for e in episodes)


def test_a_user_allocator_writes_the_turn_rewards(tmp_path, warm_model_dir):
    cfg, episodes = _episodes(tmp_path, warm_model_dir, "topology=voting",
                              "reward.allocator=tests.reward_allocators:last_turn_pays", "reward.gamma=0.9")
    for episode in episodes:
        assign_rewards(episode, cfg.reward)
        *early, last = [t.reward for t in episode.turns]
        assert early == [0.0] * 3 and last == pytest.approx(float(episode.grade.correct) * 0.9)  # stage 2 of 2
    cfg.reward.allocator = "tests.reward_allocators:one_too_few"
    with pytest.raises(ValueError, match="returned 3 rewards for 4 turns"):
        assign_rewards(episodes[0], cfg.reward)


def test_a_held_role_is_paid_less_the_further_its_length_strays_from_its_target(tmp_path, warm_model_dir):
    """harness.diagnose's hold_length arm: r -= length_hold x |tokens - length_target| on that role alone."""
    cfg, episodes = _episodes(tmp_path, warm_model_dir, "topology=voting")
    held = copy.deepcopy(cfg.reward)
    held.per_role = {"aggregator": {"length_hold": 0.05, "length_target": 3.0}}
    for episode in episodes:
        assign_rewards(episode, cfg.reward)
        plain = [t.reward for t in episode.turns]
        assign_rewards(episode, held)
        for turn, before in zip(episode.turns, plain):
            cost = 0.05 * abs(len(turn.response_ids) - 3.0) if turn.role == "aggregator" else 0.0
            assert turn.reward == pytest.approx(before - cost)
    assert any(len(t.response_ids) != 3 for e in episodes for t in e.turns if t.role == "aggregator")


def test_on_qa_the_outcome_is_the_answers_f1_and_exact_match_is_an_option(tmp_path, warm_model_dir):
    """qa-synth resolves outcome_metric=auto to f1 (UnityMAS-O's metric): a wrong but close answer
    is paid its token F1; under exact it is paid 0 (outcome-only weights, GRPO: every turn pays it)."""
    cfg, episodes = _episodes(tmp_path, warm_model_dir, "topology=qd_retrieve_answer", "task=qa-synth",
                              "reward.node=0", "reward.turn=0", "reward.traj=1")
    assert (cfg.reward.outcome_metric, cfg.reward.outcome_share_mode) == ("f1", "full")
    exact = copy.deepcopy(cfg.reward)
    exact.outcome_metric = "exact"
    for episode in episodes:
        assign_rewards(episode, cfg.reward)
        assert [t.reward for t in episode.turns] == pytest.approx([episode.grade.score] * len(episode.turns))
        assign_rewards(episode, exact)
        assert [t.reward for t in episode.turns] == [float(episode.grade.correct)] * len(episode.turns)
    assert all(0.0 <= e.grade.score <= 1.0 and (e.grade.score == 1.0) == e.grade.correct for e in episodes)
    episode = episodes[0]  # a near answer: the gold's first word and one wrong word
    gold = episode.problem.meta["answers"][0]
    episode.grade = build_task(cfg).grade(episode.problem, f"Answer: {gold.split()[0]} nobody")
    assign_rewards(episode, cfg.reward)
    assert not episode.grade.correct and 0.0 < episode.grade.score < 1.0
    assert [t.reward for t in episode.turns] == pytest.approx([episode.grade.score] * len(episode.turns))
    assert cell(tmp_path / "arith").reward.outcome_metric == "exact"


@pytest.mark.parametrize("override,message", [
    ("reward.gamma=0", "reward.gamma must be in (0, 1]"),
    ("reward.gamma=1.5", "reward.gamma must be in (0, 1]"),
    ("reward.outcome_share_mode=half", "valid choices: auto, full, last, split"),
    ("reward.outcome_metric=bleu", "valid choices: auto, exact, f1"),
    ("reward.outcome_metric=f1", "task arith has none: use exact, or a QA task (hotpotqa, nq, qa-synth)"),
    ("reward.allocator=tests.reward_allocators", "reward.allocator must read 'package.module:function'"),
    ("reward.allocator=tests.reward_allocators:missing", "reward.allocator 'tests.reward_allocators:missing' cannot be loaded"),
    ("reward.allocator=tests.reward_allocators:NOT_A_FUNCTION", "is not callable"),
])
def test_bad_reward_settings_are_one_error(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        cell(tmp_path, override)
