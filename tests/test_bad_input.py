"""Bad input: one readable error naming the valid choices, non-zero exit, no run directory."""
import subprocess

import pytest

from harness.run import EXIT_BAD_INPUT, main
from tests.conftest import REPO, python_cmd

CASES = [
    (["topology=star"], "unknown topology 'star'; valid choices: single, eval_opt, voting, orch_workers"),
    (["sharing=half"], "unknown sharing mode 'half'; valid choices: sp, ip, ip_instance, custom"),
    (["task=chess"], "unknown task 'chess'; valid choices: aime, arith, code-synth, dapo-math, deepcoder, gsm8k, hotpotqa, humaneval"),
    (["task=gsm8k"], "task gsm8k has no warm-up: use task arith or code-synth or qa-synth, or a qwen3-* scale"),
    (["task=math", "scale=qwen3-0.6b"], "task math needs data.path"),
    (["task=gsm8k", "scale=qwen3-0.6b", "data.path=/nonexistent/gsm8k.jsonl"], "data.path /nonexistent/gsm8k.jsonl does not exist"),
    (["scale=huge"], "unknown scale 'huge'; valid choices: tiny-s, tiny-m, tiny-l, qwen3-tok, qwen3-0.6b"),
    (["steps=many"], "bad override"),
    (["stepz=3"], "unknown key 'stepz'; did you mean steps? (valid keys: topology, sharing, task"),
    (["lr=abc"], "unknown key 'lr'; did you mean algo.lr?"),
    (["algo.lrr=3"], "valid keys of algo: problems_per_step"),
    (["topology"], "bad override: Error parsing override 'topology'"),
    (["algo.loss_agg=sum"], "valid choices: token-mean, seq-mean-token-mean, role-balanced"),
    (["algo.group_size=1"], "group_size must be >= 2"),
    (["scale=qwen3-0.6b", "model.path=/nonexistent/Qwen3-0.6B"], "/nonexistent/Qwen3-0.6B"),
    (["scale=qwen3-4b"], "needs a local checkpoint"),
    (["sharing=ip", "sharing_cfg.full_finetune=true"], "needs sharing=sp"),
    (["+reward.per_role.agregator.length=1"], "unknown role(s) agregator; valid roles: aggregator"),
    (["monitors.drift.action=panic"], "valid choices: log, alert, stop"),
    (["algo.adv_estimator=gae", "reward.gamma=0.9", "algo.gae_gamma=0.9"], "would both discount the workflow's stages: set one of them to 1"),
    (["monitors.collapse.trend_window=-1"], "monitors.collapse.trend_window must be >= 0"),
    (["monitors.collapse.trend_patience=0"], "monitors.collapse.trend_patience must be >= 1, got 0"),
    (["workflow.role_max_new_tokens.agregator=24"], "unknown role(s) agregator; valid roles: aggregator"),
    (["workflow.prompts.judge=x"], "has no prompt template 'judge'; its templates: aggregator, voter"),
    (["engine=megatron"], "unknown engine 'megatron'; valid choices: local, verl"),
    (["engine=verl", "verl.placement=spread"], "valid choices: colocate, split"),
    (["local.device=tpu"], "(local.device) 'tpu'; valid choices: auto, cpu, cuda"),
    (["local.dtype=fp16"], "(local.dtype) 'fp16'; valid choices: fp32, bf16"),
    (["engine=verl", "verl.rollout=sglang"], "(verl.rollout) 'sglang'; valid choices: auto, hf, vllm"),
    (["engine=verl", "verl.device=cpu", "verl.rollout=vllm"], "verl.rollout=vllm needs a GPU"),
    (["engine=verl", "verl.gpus_per_policy=2", "verl.rollout_tp=4"], "verl.rollout_tp=4 must divide"),
    (["engine=verl", "sharing=sp", "sharing_cfg.full_finetune=true"], "engine=verl trains LoRA adapters"),
    (["algo.lr=nan"], "algo.lr must be a finite number > 0, got nan"),
    (["algo.lr=inf"], "algo.lr must be a finite number > 0, got inf"),
    (["algo.kl_coef=-0.1"], "algo.kl_coef must be a finite number >= 0"),
    (["algo.temperature=0"], "algo.temperature must be a finite number > 0"),
    (["algo.lr_spike_factor=0"], "algo.lr_spike_factor must be a finite number > 0, got 0"),
    (["algo.lr_spike_steps=-5"], "algo.lr_spike_steps must be >= 0, got -5"),
    (["algo.clip_ratio_high=nan"], "algo.clip_ratio_high must be a finite number > 0, got nan"),
    (["algo.lr_schedule=linear"], "(algo.lr_schedule) 'linear'; valid choices: constant, cosine"),
    (["algo.clip_scope=global"], "valid choices: policy, cell"),
    (["algo.adv_grouping=slot"], "valid choices: trajectory, episode, turn"),
    (["algo.ppo_mini_batch_size=0"], "algo.ppo_mini_batch_size must be >= 1"),
    (["workflow.max_new_tokens=100000"], "workflow.max_new_tokens=100000 must be >= 1 and below the model's 512 positions"),
    (["+workflow.role_max_new_tokens={aggregator:4096}"], "workflow.role_max_new_tokens.aggregator=4096"),
    (["+reward.per_role.aggregator.length=nan"], "reward.per_role.aggregator.length must be a finite number"),
    (["data.question_format=lcb"], "(data.question_format) 'lcb'; valid choices: livecodebench, plain"),
    (["data.runtime_results=/nonexistent/runtime.json"], "data.runtime_results: no file at /nonexistent/runtime.json"),
]


@pytest.mark.parametrize("overrides,message", CASES)
def test_bad_input_in_process(tmp_path, capsys, monkeypatch, overrides, message):
    monkeypatch.delenv("MARL_MODEL_ROOT", raising=False)
    root = tmp_path / "runs"
    assert main([f"root={root}", *overrides]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not root.exists()


def test_bad_input_from_the_command_line(tmp_path):
    root = tmp_path / "runs"
    proc = subprocess.run(python_cmd() + [f"root={root}", "topology=star"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.strip().splitlines()[-1].startswith("error: unknown topology 'star'")
    assert "Traceback" not in proc.stderr and not root.exists()


def test_unusable_data_and_root_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MARL_MODEL_ROOT", raising=False)
    model = tmp_path / "Qwen3-0.6B"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 40960}')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    root = tmp_path / "runs"
    for overrides, message in [
        (["task=gsm8k", "scale=qwen3-0.6b", f"model.path={model}", f"data.path={empty}"], "is empty"),
        ([f"root={empty}/runs"], "cannot be written"),
    ]:
        assert main([f"root={root}", *overrides]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
        assert not root.exists()
