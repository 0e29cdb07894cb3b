import torch

from harness.algo.grpo import assign_advantages
from harness.algo.loss import BatchNorm, aggregate
from harness.tasks import Grade, Problem
from harness.workflows import Episode, Turn


def _turn(role, instance, reward):
    return Turn(role, instance, "p", "prompt", [1], [2, 3], "x", False, 0, reward=reward)


def test_advantages_are_normalised_per_group_and_role_slot():
    problem = Problem("u", "1+1", "2")
    rewards = [1.0, 0.0, 0.0, 1.0]
    episodes = []
    for k, r in enumerate(rewards):
        turns = [_turn("voter", 0, r), _turn("aggregator", 0, 1.0 - r)]
        if k == 0:
            turns.append(_turn("worker", 1, 5.0))  # a slot present in one episode only
        episodes.append(Episode(problem, turns, "", Grade(bool(r), "2"), group=0))
    other = Episode(problem, [_turn("voter", 0, 0.3)], "", None, group=1)
    assign_advantages(episodes + [other])
    voter = torch.tensor([e.turns[0].advantage for e in episodes])
    expected = (torch.tensor(rewards) - 0.5) / (torch.tensor(rewards).std() + 1e-6)
    assert torch.allclose(voter, expected, atol=1e-5)
    assert torch.allclose(torch.tensor([e.turns[1].advantage for e in episodes]), -expected, atol=1e-5)
    assert episodes[0].turns[2].advantage == 0.0  # no baseline: no signal
    assert other.turns[0].advantage == 0.0


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
