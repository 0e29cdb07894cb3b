"""User reward allocators for tests/test_rewards.py (`reward.allocator=tests.reward_allocators:<name>`)."""


def last_turn_pays(episode, cfg):
    """The outcome on the episode's last turn only, 0 elsewhere."""
    outcome = 1.0 if episode.grade is not None and episode.grade.correct else 0.0
    return [0.0] * (len(episode.turns) - 1) + [outcome]


def one_too_few(episode, cfg):
    return [0.0] * (len(episode.turns) - 1)


NOT_A_FUNCTION = 3
