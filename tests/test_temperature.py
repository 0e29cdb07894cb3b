"""Log-probs at the sampling temperature: the trainer's log-probs and entropies are those of
softmax(logits / T), T the rollout's temperature (as verl's actor), and every run logs verl's
rollout-vs-trainer check, so a sampler and a trainer that disagree show in the metrics."""
import pytest
import torch

from harness.engines.base import ProbsDiff
from harness.engines.logprobs import plain_log_probs, shared_prompt_log_probs
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell
from tests.test_logprobs import _rows
from tests.test_probe import _setup


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_log_probs_and_entropy_are_those_of_the_tempered_distribution(tmp_path, warm_model_dir, temperature):
    _, engine, _ = _setup(tmp_path, warm_model_dir, "topology=single")
    lm, pad = engine.model.get_base_model(), engine.tokenizer.pad_token_id
    prompts, responses = _rows(problems=3, copies=2)
    want_lp, want_ent = [], []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            logits = lm(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1] / temperature
            full = torch.log_softmax(logits.double(), -1)
            want_lp.append(full.gather(-1, torch.tensor(response)[:, None]).squeeze(-1))
            want_ent.append(-(full.exp() * full).sum(-1))
    for fn in (plain_log_probs, shared_prompt_log_probs):
        out = fn(engine.model, prompts, responses, pad, temperature=temperature)
        for row, (lp, ent) in enumerate(zip(want_lp, want_ent)):
            n = len(responses[row])
            assert torch.allclose(out.log_prob[row, :n].double(), lp, atol=1e-5), fn.__name__
            assert torch.allclose(out.entropy[row, :n].double(), ent, atol=1e-5), fn.__name__
        at_one = fn(engine.model, prompts, responses, pad)  # the old behaviour: temperature 1
        assert (at_one.log_prob - out.log_prob).abs().max() > 1e-2


def test_probs_diff_is_verls_rollout_check():
    diff = ProbsDiff()
    assert diff.summary() is None
    diff.add([0.0, -1.0], torch.tensor([0.0, -2.0]))  # p: 1 vs 1, e^-1 vs e^-2
    diff.add(None, torch.tensor([-3.0]))  # a turn without the sampler's log-probs is not counted
    mean, largest = diff.summary()
    gap = abs(torch.tensor(-1.0).exp() - torch.tensor(-2.0).exp()).item()
    assert largest == pytest.approx(gap) and mean == pytest.approx(gap / 2)


def test_a_tempered_run_logs_sampler_and_trainer_in_agreement(tmp_path, warm_model_dir):
    """A voting/IP cell sampled at T=0.7: every policy's rollout_probs_diff_max is below 1e-3 on every
    step; the same turns scored at T=1 (what the trainer computed before) are far apart."""
    cfg = cell(tmp_path, "topology=voting", "sharing=ip", "steps=2", "val_every=100", "samples_every=0",
               "ckpt_every=100", "algo.temperature=0.7")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    metrics = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    for m in metrics:
        for policy in ("voter", "aggregator"):
            assert m[f"policy/{policy}/rollout_probs_diff_max"] < 1e-3, (m["step"], policy)
            assert 0.0 <= m[f"policy/{policy}/rollout_probs_diff_mean"] <= m[f"policy/{policy}/rollout_probs_diff_max"]

    _, engine, turns = _setup(tmp_path / "gap", warm_model_dir, "topology=voting", "algo.temperature=0.7")
    diff = ProbsDiff()
    for policy in engine.policies:
        engine._activate(policy)
        mine = [t for t in turns if t.policy == policy]
        with torch.no_grad():
            out = plain_log_probs(engine.model, [t.prompt_ids for t in mine], [t.response_ids for t in mine],
                                  engine.tokenizer.pad_token_id)  # temperature 1
        for row, turn in enumerate(mine):
            diff.add(turn.rollout_log_probs, out.log_prob[row][out.mask[row].bool()])
    assert diff.summary()[1] > 0.05
