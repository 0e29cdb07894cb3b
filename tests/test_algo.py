import torch

from harness.algo.grpo import assign_advantages
from harness.algo.loss import BatchNorm, aggregate
from harness.tasks import Grade, Problem
from harness.episodes import Episode, Turn


def _turn(role, instance, reward, prompt="prompt"):
    return Turn(role, instance, "p", prompt, [1], [2, 3], "x", False, 0, reward=reward)


def test_episode_grouping_counts_a_role_once_per_episode_in_its_group():
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
    assign_advantages(episodes, grouping="episode")
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
    assign_advantages(episodes + [other], grouping="episode")
    expected = (torch.tensor(rewards) - 0.5) / (torch.tensor(rewards).std() + 1e-6)
    for i in range(3):
        assert torch.allclose(torch.tensor([e.turns[i].advantage for e in episodes]), expected, atol=1e-5)
    assert torch.allclose(torch.tensor([e.turns[3].advantage for e in episodes]), -expected, atol=1e-5)
    assert episodes[0].turns[4].advantage == 0.0  # no baseline: no signal
    assert other.turns[0].advantage == 0.0


def _grpo_by_hand(score, members):
    """verl's GRPO advantage of `score` in a group with these member scores (std unbiased, eps 1e-6)."""
    import statistics

    return (score - statistics.fmean(members)) / (statistics.stdev(members) + 1e-6)


def _eval_opt_group():
    """One problem, three episodes: E0 answers right at once, E1 revises and ends right (two drafts,
    two verdicts), E2 answers wrong at once; the outcome is copied to every turn."""
    problem, episodes = Problem("u", "1+1", "2"), []
    for outcome, drafts in ((1.0, 1), (1.0, 2), (0.0, 1)):
        turns = []
        for _ in range(drafts):
            turns += [_turn("generator", 0, outcome), _turn("evaluator", 0, outcome)]
        episodes.append(Episode(problem, turns, "", Grade(bool(outcome), "2"), group=0))
    return episodes


def test_trajectory_grouping_is_the_studys_every_call_a_member_of_its_roles_group():
    """Eval-Opt: the generator group holds E0's draft, E1's two drafts and E2's draft, scores [1, 1, 1, 0]
    (a revising episode counts twice), likewise the evaluator's; episode grouping scores [1, 1, 0]."""
    episodes = _eval_opt_group()
    assign_advantages(episodes)  # the default: trajectory grouping
    members = [1.0, 1.0, 1.0, 0.0]
    for e, outcome in zip(episodes, (1.0, 1.0, 0.0)):
        assert all(abs(t.advantage - _grpo_by_hand(outcome, members)) < 1e-5 for t in e.turns)
    assert abs(episodes[0].turns[0].advantage - 0.5) < 1e-5 and abs(episodes[2].turns[0].advantage + 1.5) < 1e-5
    episodes = _eval_opt_group()
    assign_advantages(episodes, grouping="episode")
    for e, outcome in zip(episodes, (1.0, 1.0, 0.0)):
        assert all(abs(t.advantage - _grpo_by_hand(outcome, [1.0, 1.0, 0.0])) < 1e-5 for t in e.turns)
    assert abs(episodes[0].turns[0].advantage - 0.57735) < 1e-4


def test_trajectory_grouping_gives_each_voter_index_its_own_group():
    """Voting with each voter paid for its own answer: E0's voters [1, 0, 1] and aggregator 1, E1's
    [0, 0, 1] and 0. By voter index (the study's generator0..2): voter 0's group is [1, 0], voter 1's
    [0, 0] (no signal), voter 2's [1, 1] (no signal); by episode every voter of E0 gets the episode's
    +0.71, the wrong voter 1 included."""
    problem = Problem("u", "1+1", "2")
    layout = [([1.0, 0.0, 1.0], 1.0), ([0.0, 0.0, 1.0], 0.0)]

    def episodes():
        return [Episode(problem, [_turn("voter", i, r) for i, r in enumerate(voters)] + [_turn("aggregator", 0, agg)],
                        "", None, group=0) for voters, agg in layout]

    by_trajectory = episodes()
    assign_advantages(by_trajectory, per_instance={"voter"})
    got = [[round(t.advantage, 4) for t in e.turns] for e in by_trajectory]
    half = round(_grpo_by_hand(1.0, [1.0, 0.0]), 4)
    assert got == [[half, 0.0, 0.0, half], [-half, 0.0, 0.0, -half]]
    by_episode = episodes()
    assign_advantages(by_episode, grouping="episode")
    e0 = round(_grpo_by_hand(2 / 3, [2 / 3, 1 / 3]), 4)
    assert [round(t.advantage, 4) for t in by_episode[0].turns[:3]] == [e0] * 3
    pooled = episodes()  # without per-instance voters the six votes of the problem are one group
    assign_advantages(pooled)
    assert abs(pooled[0].turns[1].advantage - _grpo_by_hand(0.0, [1, 0, 1, 0, 0, 1])) < 1e-5


def test_the_workflows_declare_which_roles_are_trajectories_per_instance(tmp_path):
    from harness.workflows import build_workflow
    from harness.tasks import build_task
    from tests.conftest import cell

    for topology, want in (("voting", {"voter"}), ("graph:voting", {"voter"}), ("orch_workers", set()),
                           ("graph:orch_workers", set()), ("eval_opt", set())):
        cfg = cell(tmp_path, f"topology={topology}")
        roles = build_workflow(cfg, build_task(cfg)).roles()
        assert {r.name for r in roles if r.trajectory == "instance"} == want, topology


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


def test_the_studys_i6_damping_by_hand():
    """scale = 1 - λ clamp(cos(g, EMA), 0, 1); the EMA starts at the first gradient (cos 1) and moves
    toward the scaled gradient with τ = 1 - 1/window (upstream's i6-coherence-regularizer.md)."""
    import torch

    from harness.algo.coherence_damping import CoherenceDamping

    damping = CoherenceDamping({"voter": 0.3}, window=4)
    g1 = [torch.tensor([3.0, 0.0]), None, torch.tensor([4.0])]
    cos, scale = damping.apply("voter", g1)
    assert abs(cos - 1.0) < 1e-6 and abs(scale - 0.7) < 1e-6
    assert torch.allclose(g1[0], torch.tensor([2.1, 0.0])) and torch.allclose(g1[2], torch.tensor([2.8]))
    ema = [torch.tensor([3.0 * 0.75 + 2.1 * 0.25, 0.0]), torch.tensor([4.0 * 0.75 + 2.8 * 0.25])]
    assert all(torch.allclose(a, b) for a, b in zip(damping.ema["voter"], ema))
    g2 = [torch.tensor([0.0, 5.0]), None, torch.tensor([0.0])]  # orthogonal to the history: untouched
    cos, scale = damping.apply("voter", g2)
    assert abs(cos) < 1e-6 and scale == 1.0 and torch.allclose(g2[0], torch.tensor([0.0, 5.0]))
    g3 = [torch.tensor([-3.0, 0.0]), None, torch.tensor([-4.0])]  # opposed: not damped (one-sided clamp)
    assert damping.apply("voter", g3)[1] == 1.0
    assert damping.apply("aggregator", [torch.tensor([1.0])]) is None  # no weight: no EMA, no change
    restored = CoherenceDamping({"voter": 0.3}, window=4)
    restored.load(damping.tensors())
    assert all(torch.equal(a, b) for a, b in zip(restored.ema["voter"], damping.ema["voter"]))
