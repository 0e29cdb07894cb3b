"""The GPU check for a bare GPU machine: its bundle, the check itself in an environment that holds
only what such a machine holds plus the bundle, the local engine's device settings, and the dry
run's GPU-hours estimate from the check's figures."""
import json
import os
import subprocess
import sys

import pytest
import torch

from bench.gpu_bundle import LIMIT_MIB, missing_distributions
from grid.gpu_estimate import load_measurement, max_calls, update_gpu_hours
from harness.config import CellConfig, ConfigError
from harness.engines.local import DTYPES
from tests.conftest import REPO
from tests.gpu_machine_env import gpu_machine_env

ABSENT_THERE = ("ray", "verl", "vllm", "hydra", "omegaconf", "submitit", "wandb")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "gpu_bundle"
    proc = subprocess.run([sys.executable, "bench/gpu_bundle.py", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_bundle_holds_the_tokenizer_and_stays_under_its_limit(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["size_mib"] <= LIMIT_MIB
    assert {"qwen3-tokenizer/tokenizer.json", "qwen3-tokenizer/tokenizer_config.json"} <= set(manifest["files"])
    # the check's own imports, read from the modules it loaded: the engine's stack, none of the absent ones
    assert {"torch", "transformers", "peft", "harness"} <= set(manifest["imports"])
    assert not set(manifest["imports"]) & set(ABSENT_THERE)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file()) / 2 ** 20
    assert size <= LIMIT_MIB


def test_a_distribution_the_machine_lacks_is_bundled_and_its_own_are_not():
    from importlib.metadata import version

    assert missing_distributions(["omegaconf", "torch", "numpy", "harness", "jinja2"]) == {
        "omegaconf": version("omegaconf")}


def test_an_oversized_bundle_fails_and_leaves_nothing(tmp_path):
    out = tmp_path / "gpu_bundle"
    proc = subprocess.run([sys.executable, "bench/gpu_bundle.py", "--out", str(out), "--limit-mib", "1"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: the bundle is ") and "over the 1 MiB limit" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_the_check_runs_in_a_gpu_machine_environment_from_the_bundle_alone(bundle, tmp_path):
    env_dir = gpu_machine_env()
    python = str(env_dir / "bin" / "python")
    for module in ABSENT_THERE:  # the stand-in really lacks what the machine lacks
        assert subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode != 0, module
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=python, OUT=str(out), GPU_BUNDLE=str(bundle), GPU_CHECK_TINY="1",
               MARL_CACHE=str(tmp_path / "empty-cache"), HOME=str(tmp_path))  # the tokenizer from the bundle only
    proc = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["mode"] == "tiny" and report["parity"]["passed"]
    figures = report["shapes"]["tiny"]
    for variant in ("shared_prompt", "plain"):
        assert figures[variant]["update_s"] > 0 and figures[variant]["update_response_tokens_per_s"] > 0
        assert figures[variant]["response_tokens"] == 8 * 16  # 2 problems x 4 rollouts x 16 tokens
    assert figures["lora_parameters"] > 0 and figures["plain_over_shared_time"] > 0
    limits = report["limits"]  # measured by the check itself: a matrix product and a device copy
    assert limits["matmul_flops_per_s"] > 1e9 and limits["copy_bytes_per_s"] > 1e8
    for variant in ("shared_prompt", "plain"):  # 4 x parameters x tokens computed, over the limit
        computed = 4 * figures["parameters"] * (2 if variant == "shared_prompt" else 8) * 24 + 4 * figures[
            "parameters"] * 8 * 16
        assert figures[variant]["update_flops_per_s"] == pytest.approx(computed / figures[variant]["update_s"])
        assert 0 < figures[variant]["matmul_share"] == pytest.approx(
            figures[variant]["update_flops_per_s"] / limits["matmul_flops_per_s"])
    rollout = figures["rollout"]  # 2 prompts x 4 samples, every row to the 16-token budget
    assert (rollout["rows"], rollout["new_tokens"]) == (8, 16) and rollout["decode_tokens_per_s"] > 0
    assert 0 < rollout["bandwidth_bound_s"] < rollout["rollout_s"] and rollout["bandwidth_share"] < 1
    assert "engine=verl (FSDP2 worker groups)" in report["not_checked"]
    log = (out / "gpu_check.log").read_text()
    assert "parity (cpu vs cpu, fp32)" in log and "not checked here: vLLM rollouts" in log
    assert "of the matmul limit" in log and "of the bandwidth bound" in log and "limits on this device" in log


def test_the_check_refuses_bad_input(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path / "o"), *args], cwd=REPO,
                              capture_output=True, text=True)

    unknown = run("--tiny", "--shapes", "qwen3-70b")
    assert unknown.returncode == 2 and unknown.stderr.strip() == "error: unknown shape(s) qwen3-70b; valid: tiny"
    if not torch.cuda.is_available():
        no_gpu = run()
        assert no_gpu.returncode == 2 and "torch sees no CUDA device" in no_gpu.stderr
    assert not (tmp_path / "o").exists()
    missing = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "GPU_BUNDLE": str(tmp_path / "none"), "OUT": str(tmp_path / "o")})
    assert missing.returncode == 2 and missing.stderr.startswith("error: no bundle at")


def test_local_device_cuda_is_refused_without_a_gpu():
    from harness.validation import config_from_dict

    if torch.cuda.is_available():
        assert config_from_dict({"local": {"device": "cuda"}}).local.device == "cuda"
    else:
        with pytest.raises(ConfigError, match="local.device=cuda but torch sees no GPU here"):
            config_from_dict({"local": {"device": "cuda"}})


def test_a_bf16_base_trains_fp32_adapters_on_the_local_engine():
    """local.dtype=bf16 keeps the adapters (and Adam's state) in fp32 and matches fp32's gradient norm
    closely on the same rows."""
    sys.path.insert(0, str(REPO / "bench"))
    import copy

    import gpu_check
    from harness import qwen3_tokenizer

    tokenizer = qwen3_tokenizer.load()
    turns = gpu_check.make_turns(tokenizer, gpu_check.TINY_WORKLOAD, seed=1)
    norms = {}
    for dtype in ("fp32", "bf16"):
        base = gpu_check.build_model(gpu_check.TINY_SHAPES["tiny"], tokenizer, "cpu", torch.float32, seed=0)
        cfg = gpu_check.study_config(gpu_check.TINY_WORKLOAD, "cpu", dtype, True, lr=1e-3)
        engine = gpu_check.LocalEngine.from_model(base, tokenizer, ["voter"], cfg, seed=0)
        assert next(engine.model.get_base_model().model.parameters()).dtype == DTYPES[dtype]
        assert all(p.dtype == torch.float32 for p in engine.params["voter"])
        norms[dtype] = engine.update(copy.deepcopy(turns), step=0).policy_grad_norm["voter"]
    assert norms["fp32"] > 0 and norms["bf16"] == pytest.approx(norms["fp32"], rel=2e-2)


def test_the_dry_run_estimates_gpu_hours_from_the_checks_figures(tmp_path):
    measured = {"device": "NVIDIA H200", "shapes": {
        "qwen3-0.6b": {"shared_prompt": {"update_response_tokens_per_s": 20000.0}},
        "qwen3-4b": {"shared_prompt": {"error": "out of memory"}}}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(measured))
    loaded = load_measurement(path)
    assert loaded.tokens_per_s == {"qwen3-0.6b": 20000.0}  # a shape that failed gives no rate
    cfg = CellConfig(topology="voting", scale="qwen3-0.6b", steps=500)
    cfg.algo.problems_per_step, cfg.algo.group_size, cfg.workflow.max_new_tokens = 64, 8, 5120
    assert max_calls(cfg) == cfg.workflow.n_votes + 1 == 4
    assert update_gpu_hours(cfg, loaded) == pytest.approx(500 * 64 * 8 * 4 * 5120 / 20000 / 3600)
    assert update_gpu_hours(cfg, loaded, 1000) == pytest.approx(500 * 64 * 8 * 4 * 1000 / 20000 / 3600)
    cfg.scale = "qwen3-4b"
    assert update_gpu_hours(cfg, loaded) is None
    proc = subprocess.run([sys.executable, "grid/launch.py", "sweep=full_matrix", "dry_run=true"], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "MARL_GPU_MEASUREMENT": str(path)})
    line = [l for l in proc.stdout.splitlines() if l.startswith("estimate:")]
    assert line and "GPU-hours of update compute per 1,000 tokens of mean response length" in line[0]
    assert "; 14 of 42 cells (measured on NVIDIA H200 with the local engine" in line[0]
    assert not [l for l in proc.stdout.splitlines() if "no measured GPU-hours estimate" in l]
