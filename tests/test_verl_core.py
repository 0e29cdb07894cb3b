"""The local engine's torch-only copies of verl's estimators (harness/algo/verl_core.py) compute
what verl's own functions compute, on random inputs, in every mode the harness uses."""
import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage, kl_penalty
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from harness.algo import verl_core


def _batch(seed: int, nan_outside_mask: bool = False):
    generator = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, 9, generator=generator)
    mask = (torch.rand(6, 9, generator=generator) > 0.3).float()
    mask[2] = 0.0  # a fully masked row: verl leaves it out of the sequence mean
    if nan_outside_mask:  # token-mean's masked sum keeps it out (verl's seq-mean multiplies: NaN there too)
        loss[4, mask[4] == 0] = float("nan")
    return loss, mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("normaliser", [None, 37])
def test_agg_loss_matches_verl(mode, normaliser):
    loss, mask = _batch(1, nan_outside_mask=mode == "token-mean")
    kwargs = {"batch_num_tokens": normaliser} if mode == "token-mean" else {"global_batch_size": normaliser}
    ours = verl_core.agg_loss(loss, mask, mode, **kwargs)
    theirs = agg_loss(loss, mask, mode, **kwargs)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_agg_loss_refuses_a_mode_it_does_not_implement():
    loss, mask = _batch(2)
    with pytest.raises(ValueError, match="valid: token-mean, seq-mean-token-mean"):
        verl_core.agg_loss(loss, mask, "token-sum")


def test_low_var_kl_matches_verl_including_its_clamps():
    generator = torch.Generator().manual_seed(3)
    log_prob = torch.randn(5, 7, generator=generator) * 8  # differences beyond verl's +-20 and its 10 cap
    ref = torch.randn(5, 7, generator=generator) * 8
    torch.testing.assert_close(verl_core.low_var_kl(log_prob, ref), kl_penalty(log_prob, ref, "low_var_kl"),
                               rtol=0, atol=0)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantage_matches_verl(norm_by_std):
    generator = torch.Generator().manual_seed(4)
    scores = torch.randint(0, 2, (11,), generator=generator).float() + torch.rand(11, generator=generator)
    keys = ["a", "b", "a", "c", "b", "a", "d", "b", "c", "a", "b"]  # "d" has one member
    ours = verl_core.grpo_outcome_advantage(scores, keys, 1e-6, norm_by_std)
    tensor = scores[:, None].clone()
    theirs, _ = compute_grpo_outcome_advantage(tensor, torch.ones_like(tensor), np.array(keys, dtype=object), 1e-6,
                                               norm_by_std)
    torch.testing.assert_close(ours, theirs[:, 0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("warmup,total", [(0, 20), (5, 20), (15, 500), (3, 3)])
def test_lr_schedules_match_verl(warmup, total):
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    cosine = get_cosine_schedule_with_warmup(optimizer, warmup, total).lr_lambdas[0]
    constant = get_constant_schedule_with_warmup(optimizer, warmup).lr_lambdas[0]
    for step in range(total + 3):
        assert verl_core.lr_lambda("cosine", warmup, total, step) == pytest.approx(cosine(step), abs=1e-12)
        assert verl_core.lr_lambda("constant", warmup, total, step) == pytest.approx(constant(step), abs=1e-12)
