"""The prefix-sharing sampler against HF generate, and the engine's generation contract."""
import torch

from harness.engines.local import LocalEngine
from harness.engines.sampling import group_duplicates, sample_repeated
from harness.models import chat_prompt
from harness.episodes import Sampling, Turn
from tests.conftest import cell


def test_group_duplicates():
    groups = group_duplicates(["a", "b", "a", "c", "b", "a"])
    assert groups == {3: [[0, 2, 5]], 2: [[1, 4]], 1: [[3]]}


def test_greedy_sampler_matches_hf_generate(tmp_path, warm_model_dir):
    cfg = cell(tmp_path, "topology=voting")
    engine = LocalEngine(warm_model_dir, ["voter", "aggregator"], cfg)
    tok = engine.tokenizer
    prompts = ["vote: 12+7+3", "vote: 1+2", "pick: 3+4\n0: 7\n1: 8", "plan: 10+20+30"]
    enc = tok([chat_prompt(tok, p) for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    engine._activate("voter")
    ours, _ = sample_repeated(engine.model, enc["input_ids"], enc["attention_mask"], 2, 8, 1.0, True,
                              tok.eos_token_id, tok.pad_token_id)
    theirs = engine.model.generate(**enc, do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id,
                                   eos_token_id=tok.eos_token_id)[:, enc["input_ids"].shape[1]:]
    for b in range(len(prompts)):
        for k in range(2):
            row = ours[b * 2 + k].tolist()
            want = theirs[b].tolist()[: len(row)]
            assert row == want + [tok.pad_token_id] * (len(row) - len(want)), prompts[b]


def test_sampled_responses_are_what_the_loss_scores(tmp_path, warm_model_dir):
    """Repeated prompts get independent samples, every response ends its turn or is flagged
    truncated, and the training forward gives each sampled token a finite log-prob."""
    cfg = cell(tmp_path, "topology=single")
    engine = LocalEngine(warm_model_dir, ["shared"], cfg)
    torch.manual_seed(0)
    prompts = ["solve: 12+7+3"] * 16 + ["solve: 5+5"] * 3
    out = engine.generate("shared", prompts, Sampling(max_new_tokens=6))
    assert len(out) == len(prompts)
    assert len({tuple(o.response_ids) for o in out[:16]}) > 1
    eos = engine.tokenizer.eos_token_id
    for o in out:
        assert (o.response_ids[-1] == eos) != o.truncated
        assert eos not in o.response_ids[:-1]
    turns = [Turn("solver", 0, "shared", p, o.prompt_ids, o.response_ids, o.text, o.truncated, 0)
             for p, o in zip(prompts, out)]
    scored = engine._log_probs(turns)
    log_prob, mask = scored.log_prob, scored.mask
    assert torch.isfinite(log_prob[mask.bool()]).all() and int(mask.sum()) == sum(len(o.response_ids) for o in out)
