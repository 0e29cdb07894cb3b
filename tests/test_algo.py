import torch

from harness.algo.grpo import assign_advantages
from harness.algo.loss import BatchNorm, aggregate
from harness.tasks import Grade, Problem
from harness.workflows import Episode, Turn


def _turn(role, instance, reward, prompt="prompt"):
    return Turn(role, instance, "p", prompt, [1], [2, 3], "x", False, 0, reward=reward)


def test_a_role_counts_once_per_episode_in_its_group():
    """Eval-Opt, outcomes [1, 0, 0, 0], the wrong episodes revised twice: every generator turn of an
    episode gets that episode's advantage, +1.5 / -0.5 (slot-by-turn grouping gave +2.27 / -0.38)."""
    problem = Problem("u", "1+1", "2")
    episodes = []
    for k, outcome in enumerate([1.0, 0.0, 0.0, 0.0]):
        drafts = 1 if outcome else 3
        turns = []
        for d in range(drafts):
            turns += [_turn("generator", 0, outcome), _turn("evaluator", 0, outcome)]
        episodes.append(Episode(problem, turns, "", Grade(bool(outcome), "2"), group=0))
    assign_advantages(episodes)
    for e, want in zip(episodes, [1.5, -0.5, -0.5, -0.5]):
        assert all(abs(t.advantage - want) < 1e-4 for t in e.turns), [t.advantage for t in e.turns]


def test_episode_scores_are_the_mean_of_a_roles_turn_rewards_and_lone_roles_get_no_signal():
    problem = Problem("u", "1+1", "2")
    rewards = [1.0, 0.0, 0.0, 1.0]
    episodes = []
    for k, r in enumerate(rewards):
        turns = [_turn("voter", i, r) for i in range(3)] + [_turn("aggregator", 0, 1.0 - r)]
        if k == 0:
            turns.append(_turn("worker", 1, 5.0))  # a role present in one episode only
        episodes.append(Episode(problem, turns, "", Grade(bool(r), "2"), group=0))
    other = Episode(problem, [_turn("voter", 0, 0.3)], "", None, group=1)
    assign_advantages(episodes + [other])
    expected = (torch.tensor(rewards) - 0.5) / (torch.tensor(rewards).std() + 1e-6)
    for i in range(3):
        assert torch.allclose(torch.tensor([e.turns[i].advantage for e in episodes]), expected, atol=1e-5)
    assert torch.allclose(torch.tensor([e.turns[3].advantage for e in episodes]), -expected, atol=1e-5)
    assert episodes[0].turns[4].advantage == 0.0  # no baseline: no signal
    assert other.turns[0].advantage == 0.0


def test_turn_grouping_compares_turns_that_saw_the_same_input_not_the_same_position():
    """Workers: worker 0 got subtask A in two episodes and B in two; A and B are never pooled."""
    problem = Problem("u", "1+1", "2")
    layout = [("A", 1.0), ("B", 0.0), ("A", 0.0), ("B", 1.0)]
    episodes = [Episode(problem, [_turn("worker", 0, r, prompt=f"solve {s}")], "", None, group=0) for s, r in layout]
    assign_advantages(episodes, grouping="turn")
    got = [e.turns[0].advantage for e in episodes]
    want = 0.5 / ((0.5 ** 0.5) + 1e-6)  # two members with rewards {1, 0}: +-0.5 over their std 0.707
    assert abs(got[0] - want) < 1e-4 and abs(got[2] + want) < 1e-4
    assert abs(got[3] - want) < 1e-4 and abs(got[1] + want) < 1e-4


def test_micro_batch_losses_add_up_to_the_full_batch_loss():
    torch.manual_seed(0)
    loss = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    roles = ["a", "a", "a", "b", "b", "b"]
    norm = BatchNorm(int(mask.sum()), 6, {"a": int(mask[:3].sum()), "b": int(mask[3:].sum())})
    for mode, full in [("token-mean", (loss * mask).sum() / mask.sum()),
                       ("seq-mean-token-mean", ((loss * mask).sum(1) / mask.sum(1)).mean()),
                       ("role-balanced", 0.5 * ((loss[:3] * mask[:3]).sum() / mask[:3].sum()
                                                + (loss[3:] * mask[3:]).sum() / mask[3:].sum()))]:
        parts = sum(aggregate(loss[i:i + 1], mask[i:i + 1], mode, norm, roles[i]) for i in range(6))
        assert torch.allclose(parts, full, atol=1e-6), mode


def test_ppo_loss_matches_verls_vanilla_policy_loss_with_asymmetric_and_dual_clip():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    from harness.algo.loss import ClipConfig, ppo_clip_loss

    torch.manual_seed(0)
    log_prob, old = torch.randn(6, 5) * 0.3, torch.randn(6, 5) * 0.3
    old[0] = log_prob[0] + 2.0  # ratio e^-2 with a negative advantage below: dual clip region
    advantages = torch.tensor([[-1.0], [1.0], [-0.5], [2.0], [-2.0], [0.3]])
    mask = (torch.rand(6, 5) > 0.2).float()
    clip = ClipConfig(0.2, 0.28, 3.0)
    ours = ppo_clip_loss(log_prob, old, advantages, clip)
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                               "global_batch_info": {}})
    want, metrics = compute_policy_loss_vanilla(old, log_prob, advantages.expand(-1, 5), mask, "token-mean", config)
    got = (ours.loss_mat * mask).sum() / mask.sum()
    assert torch.allclose(got, want, atol=1e-6)
    assert abs(float((ours.clipped * mask).sum() / mask.sum()) - metrics["actor/pg_clipfrac"]) < 1e-6
    # changing the upper clip changes the loss where ratios exceed 1.2 with positive advantages
    wider = ppo_clip_loss(log_prob, old, advantages, ClipConfig(0.2, 0.5, 3.0))
    assert not torch.allclose(wider.loss_mat, ours.loss_mat)


def test_lr_schedule_is_verls_cosine_with_warmup():
    from types import SimpleNamespace

    from harness.engines.base import lr_multiplier

    algo = SimpleNamespace(lr_schedule="cosine", lr_warmup_steps=15)
    values = [lr_multiplier(algo, 500, step) for step in (0, 5, 15, 257, 499)]
    assert values[0] == 0.0 and abs(values[1] - 5 / 15) < 1e-9 and values[2] == 1.0
    assert abs(values[3] - 0.5) < 0.01 and values[4] < 1e-3
    assert lr_multiplier(SimpleNamespace(lr_schedule="constant", lr_warmup_steps=0), 500, 3) == 1.0
