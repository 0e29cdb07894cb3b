"""The update's log-probs: the chunked LM head equals a full log-softmax (values, entropy, gradients),
the shared-prompt forward equals the plain forward, and an update through either gives the same
losses, gradients and probe metrics."""
import random

import pytest
import torch

from harness.controller import update_metrics
from harness.engines.logprobs import plain_log_probs, shared_prompt_log_probs, token_log_probs
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe
from tests.test_probe import _setup


@pytest.mark.parametrize("chunk", [7, 320, 1000])
def test_chunked_head_equals_a_full_log_softmax(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(13, 24, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(320, 24, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 320, (13,))
    upstream = torch.randn(13, dtype=torch.float64)

    log_prob, entropy = token_log_probs(hidden, weight, targets, chunk=chunk)
    (log_prob * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    full = torch.log_softmax(hidden @ weight.T, -1)
    want = full.gather(-1, targets[:, None]).squeeze(-1)
    (want * upstream).sum().backward()
    assert torch.allclose(log_prob.double(), want, atol=1e-6)
    assert torch.allclose(entropy.double(), -(full.exp() * full).sum(-1), atol=1e-6)
    assert torch.allclose(grads[0], hidden.grad, atol=1e-6) and torch.allclose(grads[1], weight.grad, atol=1e-6)
    assert not entropy.requires_grad


def _rows(seed=0, problems=6, copies=4):
    """Left-over prompts of different lengths, each repeated (G samples), responses of 1..12 tokens."""
    rng = random.Random(seed)
    prompts, responses = [], []
    for _ in range(problems):
        prompt = [rng.randrange(5, 300) for _ in range(rng.randint(6, 20))]
        for _ in range(copies):
            prompts.append(prompt)
            responses.append([rng.randrange(5, 300) for _ in range(rng.randint(1, 12))])
    return prompts, responses


def test_shared_prompt_forward_equals_the_plain_forward_with_gradients(tmp_path, warm_model_dir):
    _, engine, _ = _setup(tmp_path, warm_model_dir, "topology=single", "model.lora_rank=4")
    model, pad = engine.model, engine.tokenizer.pad_token_id
    with torch.no_grad():  # a non-zero adapter, so its gradients flow through the prompt's KV cache
        for p in engine.params["shared"]:
            p.normal_(0, 0.05)
    prompts, responses = _rows()
    results = {}
    for name, fn in (("plain", plain_log_probs), ("shared", shared_prompt_log_probs)):
        for p in engine.params["shared"]:
            p.grad = None
        out = fn(model, prompts, responses, pad)
        ((out.log_prob * out.mask).sum() / out.mask.sum()).backward()
        results[name] = out, torch.cat([p.grad.reshape(-1) for p in engine.params["shared"]])
    (plain, plain_grad), (shared, shared_grad) = results["plain"], results["shared"]
    assert torch.equal(plain.mask, shared.mask)
    assert (plain.log_prob - shared.log_prob).abs().max() < 1e-5
    assert (plain.entropy - shared.entropy).abs().max() < 1e-5
    assert plain_grad.norm() > 0 and torch.isfinite(shared_grad).all()
    assert (plain_grad - shared_grad).norm() / plain_grad.norm() < 1e-5


@pytest.mark.parametrize("topology,sharing", [("voting", "ip"), ("eval_opt", "sp")])
def test_an_update_through_shared_prompts_equals_the_plain_update(tmp_path, warm_model_dir, topology, sharing):
    """Same turns, same start: per-role losses, every probe metric and the moved weights agree (Adam
    divides by sqrt(v): a coordinate whose gradient is ~0 may move differently by rounding, so the
    weights are compared as a whole, relative to how far they moved)."""
    outcome = {}
    for shared in (True, False):
        _, engine, turns = _setup(tmp_path / str(shared), warm_model_dir, f"topology={topology}",
                                  f"sharing={sharing}", "algo.ppo_mini_batch_size=4",
                                  f"algo.shared_prompt_forward={str(shared).lower()}")
        probe = GradientProbe()
        result = engine.update(turns, probe, step=0)
        weights = {p: torch.cat([(t.detach() - t0).reshape(-1) for t, t0 in zip(engine.params[p], engine.initial[p])])
                   for p in engine.policies}
        outcome[shared] = update_metrics(result), gradient_metrics(probe), result.role_loss, weights
    for part in range(3):
        fast, plain = outcome[True][part], outcome[False][part]
        assert fast.keys() == plain.keys()
        for key in plain:
            assert abs(fast[key] - plain[key]) <= 1e-5 * max(1.0, abs(plain[key])), key
    for policy, plain_moved in outcome[False][3].items():
        gap = float((outcome[True][3][policy] - plain_moved).norm() / plain_moved.norm())
        print(f"{topology}-{sharing} {policy}: |moved(shared) - moved(plain)| / |moved(plain)| = {gap:.1e}")
        assert plain_moved.norm() > 0 and gap < 1e-3
