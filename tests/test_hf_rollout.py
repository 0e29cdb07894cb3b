"""The "hf" rollout backend's server on its own (in-process, no Ray): the weights verl's sync sends
land in the served model, bad names are refused, and verl's token-in-token-out request answers
like the harness's batched one. (tests/test_verl_engine.py runs it behind verl's replicas.)"""
from types import SimpleNamespace

import pytest
import torch

from harness.engines.adapters import export_initial_adapters
from harness.engines.verl.hf_rollout import HFRolloutServer
from tests.conftest import cell


@pytest.fixture()
def server(tmp_path, warm_model_dir):
    cfg = cell(tmp_path)
    adapter = export_initial_adapters(warm_model_dir, ["shared"], cfg, 0, tmp_path / "adapters")["shared"]
    model_config = SimpleNamespace(local_path=str(warm_model_dir), lora_rank=cfg.model.lora_rank,
                                   lora_alpha=cfg.model.lora_alpha, target_modules=list(cfg.model.lora_targets),
                                   lora_adapter_path=str(adapter))
    return HFRolloutServer(model_config)


def _greedy(server, prompt_ids, eos=-1):
    ids = torch.tensor([prompt_ids])
    tokens, _log_probs = server.sample(ids, torch.ones_like(ids), 1, 8, 1.0, True, eos, -1, seed=0)
    return tokens[0].tolist()


def test_adapter_sync_replaces_the_served_adapter(server):
    before = server.adapter_state()
    sent = {name: torch.randn_like(t) * 0.05 for name, t in before.items()}
    assert server.load_weights(sent, lora=True, global_steps=3) == 1
    after = server.adapter_state()
    assert after.keys() == sent.keys() and all(torch.equal(after[k], sent[k]) for k in sent)
    assert server.global_steps == 3
    with pytest.raises(RuntimeError, match="unknown tensors"):
        server.load_weights({"base_model.model.nowhere.lora_A.weight": torch.zeros(1)}, lora=True, global_steps=4)


def test_base_sync_reaches_the_layers_under_lora(server):
    base = server.model.get_base_model()
    wrapped = next(n for n in base.state_dict() if n.endswith("q_proj.base_layer.weight"))
    hf_name = wrapped.replace(".base_layer", "")  # verl sends HF names
    plain = next(n for n in base.state_dict() if n.endswith("input_layernorm.weight"))
    new = {hf_name: torch.randn_like(base.state_dict()[wrapped]), plain: torch.full_like(base.state_dict()[plain], 0.5)}
    prompt = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = server.model(input_ids=prompt).logits
    server.load_weights(new, lora=False, global_steps=None)
    state = base.state_dict()
    assert torch.equal(state[wrapped], new[hf_name]) and torch.equal(state[plain], new[plain])
    with torch.no_grad():  # the model that answers is the one that was synced
        assert (server.model(input_ids=prompt).logits - before).abs().max() > 1e-3
    with pytest.raises(RuntimeError, match="no tensor model.nowhere.weight"):
        server.load_weights({"model.nowhere.weight": torch.zeros(1)}, lora=False, global_steps=None)


def test_verl_request_answers_like_the_batched_sample(server):
    prompt = [5, 6, 7, 8, 9]
    output = server.generate(prompt, {"temperature": 0.0, "max_tokens": 8}, request_id="r0")
    eos = server.model.generation_config.eos_token_id
    assert output.token_ids == [t for t in _greedy(server, prompt, eos) if t != -1]
    assert output.stop_reason == "completed"
