"""The local engine on a GPU at the study's model shapes: what one update costs, for planning GPU-hours.

Runs on a bare GPU machine (torch, transformers, peft; no Ray, verl, vLLM, Hydra or wandb) from the
repository and the bundle `bench/gpu_bundle.py` makes (Qwen3's tokenizer, and wheels of anything
imported here that such a machine lacks). For each of Qwen3-0.6B/1.7B/4B's shapes (random weights
built on the GPU from the architecture: no checkpoint) it times the engine's real update (`update`:
PPO clip loss, the study's seq-mean-token-mean, LoRA 64 on all seven projections, fused AdamW) on a
voter adapter's rows, in bf16, with and without the shared-prompt forward, and records step time,
response tokens per second and peak memory; then the engine's rollout (`sample_repeated`, the adapter
active: 32 sequences, 512-token prompts, 1,024 new tokens). Each is set against the device's limits,
measured by the same script: the update's FLOP rate (4 x parameters x tokens computed: forward plus
activation gradients) as a share of a large bf16 matrix product's, and the rollout's decode time as a
share of the memory-bandwidth bound (the weights and the KV cache read once per decoding step, at the
measured device copy bandwidth). Before that, the parity test: one update of a tiny model on the CPU
and on the GPU in fp32 from the same weights must agree within 1e-4.

Lengths: the study trains math voting with responses up to 5,120 tokens and code up to 2,048; the
check uses 1,024-token responses and 512-token prompts (4 problems x 8 rollouts = 32 rows, micro
batches of 8) so that three shapes fit in a few minutes. Update cost is close to linear in tokens
at these lengths, so the GPU-hours estimate scales the measured rate (grid/gpu_estimate.py).

    python bench/gpu_check.py --out DIR             # on the GPU machine (bench/gpu_check.sh)
    python bench/gpu_check.py --tiny --out DIR      # the same code path on a CPU, tiny shapes

Writes DIR/gpu_check.json (the figures, the device, what was not checked and why) and prints a table.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from harness.config import CellConfig  # noqa: E402
from harness.engines.local import DTYPES, LocalEngine  # noqa: E402
from harness.engines.sampling import sample_repeated  # noqa: E402
from harness.episodes import Turn  # noqa: E402
from harness.models import chat_prompt  # noqa: E402

PARITY_TOL = 1e-4
ADAPTER_TOL = 1e-2  # the adapters' CPU-vs-CUDA gap after the update, as a share of the update (L2)
QWEN3_VOCAB = 151936  # embedding rows; token ids from 151643 on are special
FIRST_SPECIAL = 151643
NOT_CHECKED = {
    "engine=verl (FSDP2 worker groups)": "needs Ray and verl, which do not fit the 64 MiB a bare GPU machine takes in",
    "vLLM rollouts": "vLLM is hundreds of MB; the check times the local engine's own sampler",
    "SLURM and the grid launcher": "a single machine without a cluster; the grid is tested on CPU machines",
}


@dataclass(frozen=True)
class Shape:
    """A Qwen3 architecture: the released configs' sizes (all three tie their embeddings)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int = QWEN3_VOCAB


STUDY_SHAPES: Dict[str, Shape] = {
    "qwen3-0.6b": Shape(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072),
    "qwen3-1.7b": Shape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144),
    "qwen3-4b": Shape(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728),
}
TINY_SHAPES: Dict[str, Shape] = {"tiny": Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=256)}


@dataclass(frozen=True)
class Workload:
    """One update's rows: `problems` prompts, `group` rollouts each, fixed token lengths."""

    problems: int
    group: int
    prompt_tokens: int
    response_tokens: int
    micro_batch: int

    @property
    def rows(self) -> int:
        return self.problems * self.group


STUDY_WORKLOAD = Workload(problems=4, group=8, prompt_tokens=512, response_tokens=1024, micro_batch=8)
TINY_WORKLOAD = Workload(problems=2, group=4, prompt_tokens=24, response_tokens=16, micro_batch=4)
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? ")


def study_config(workload: Workload, device: str, dtype: str, shared_prompt: bool, lr: float = 2e-5) -> CellConfig:
    """The study's update settings (docs/study-settings.md) for one policy; one mini-batch per update."""
    cfg = CellConfig()
    cfg.local.device, cfg.local.dtype = device, dtype
    cfg.model.lora_rank, cfg.model.lora_alpha = 64, 32
    cfg.model.lora_targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    algo = cfg.algo
    algo.lr, algo.weight_decay, algo.max_grad_norm, algo.temperature = lr, 0.01, 1.0, 0.7
    algo.loss_agg, algo.kl_coef = "seq-mean-token-mean", 0.0
    algo.clip_ratio_low, algo.clip_ratio_high, algo.clip_ratio_c = 0.2, 0.28, 3.0
    algo.ppo_mini_batch_size, algo.group_size, algo.ppo_epochs = workload.problems, workload.group, 1
    algo.micro_batch_size, algo.shared_prompt_forward = workload.micro_batch, shared_prompt
    algo.lr_schedule, algo.lr_warmup_steps = "constant", 0
    cfg.instrument.kl_to_base = False  # a metric on a cadence, off in the study's loss: not part of an update
    return cfg


def build_model(shape: Shape, tokenizer, device: str, dtype: torch.dtype, seed: int):
    """A random Qwen3 of `shape`, built directly on `device` in `dtype` (no fp32 copy on the host)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, max_position_embeddings=40960,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def make_turns(tokenizer, workload: Workload, seed: int) -> List[Turn]:
    """`rows` voter turns: each problem's real chat prompt (padded with its own text to the length)
    and random non-special response tokens, advantages of both signs, three voter instances."""
    rng = random.Random(seed)
    turns: List[Turn] = []
    for problem in range(workload.problems):
        text = chat_prompt(tokenizer, f"Problem {problem}. " + QUESTION * 64)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][: workload.prompt_tokens]
        for rollout in range(workload.group):
            response = [rng.randrange(FIRST_SPECIAL) for _ in range(workload.response_tokens)]
            turns.append(Turn(role="voter", instance=rollout % 3, policy="voter", prompt=text, prompt_ids=list(ids),
                              response_ids=response, text="", truncated=True, index=0,
                              advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5)))
    return turns


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_updates(engine: LocalEngine, turns: List[Turn], repeats: int, device: str) -> dict:
    """One untimed update (kernels, allocator), then `repeats` timed ones on fresh copies of the rows."""
    engine.update(copy.deepcopy(turns), step=0)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for step in range(1, repeats + 1):
        batch = copy.deepcopy(turns)
        _synchronize(device)
        started = time.perf_counter()
        result = engine.update(batch, step=step)
        _synchronize(device)
        seconds.append(time.perf_counter() - started)
        if not math.isfinite(result.loss):
            raise FloatingPointError(f"non-finite loss {result.loss}")
    step_s = sorted(seconds)[len(seconds) // 2]
    response_tokens = sum(len(t.response_ids) for t in turns)
    figures = {"update_s": step_s, "update_s_all": seconds, "response_tokens": response_tokens,
               "update_response_tokens_per_s": response_tokens / step_s}
    if device.startswith("cuda"):
        figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return figures


def matmul_limit(device: str, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of a large square matrix product in `dtype`: what the update's share is judged against."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b  # kernels chosen, clocks up
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _synchronize(device)
    return 2 * size ** 3 * repeats / (time.perf_counter() - started)


def bandwidth_limit(device: str, megabytes: int, repeats: int = 10) -> float:
    """Bytes/s of a device copy (each byte read once and written once): what decoding is bound by."""
    source = torch.empty(megabytes * 2 ** 20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    _synchronize(device)
    return 2 * source.numel() * repeats / (time.perf_counter() - started)


def tokens_computed(workload: Workload, shared_prompt: bool) -> int:
    """Tokens an update's forward runs: each distinct prompt once (shared) or once per row, and every response."""
    prompts = workload.problems if shared_prompt else workload.rows
    return prompts * workload.prompt_tokens + workload.rows * workload.response_tokens


def update_share(figures: dict, parameters: int, tokens: int, limit: float) -> None:
    """The update's FLOP rate, counted as 4 x parameters x tokens, and its share of the matmul limit."""
    if "update_s" in figures:
        figures["update_flops_per_s"] = 4 * parameters * tokens / figures["update_s"]
        figures["matmul_share"] = figures["update_flops_per_s"] / limit


def time_rollout(engine: LocalEngine, shape: Shape, workload: Workload, device: str, dtype: torch.dtype,
                 bandwidth: float) -> dict:
    """The engine's sampler with the policy's adapter: `problems` prompts x `group` samples, up to
    `response_tokens` new tokens, at T = 0.7; decode tokens/s and the share of the bandwidth bound,
    the weights (base and adapter) and the KV cache at each step's length read once a step."""
    engine._activate("voter")
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(0, FIRST_SPECIAL, (workload.problems, workload.prompt_tokens), generator=generator).to(device)
    mask = torch.ones_like(ids)
    eos = pad = FIRST_SPECIAL  # a token the random model all but never samples: every row runs to the budget
    sample_repeated(engine.model, ids[:1, :8], mask[:1, :8], 2, 4, 0.7, False, eos, pad)  # kernels warm
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _synchronize(device)
    started = time.perf_counter()
    tokens, _ = sample_repeated(engine.model, ids, mask, workload.group, workload.response_tokens, 0.7, False, eos,
                                pad)
    _synchronize(device)
    seconds = time.perf_counter() - started
    steps, rows = tokens.shape[1], tokens.shape[0]
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * torch.finfo(dtype).bits // 8
    kv_read = sum(rows * (workload.prompt_tokens + t) * kv_per_token for t in range(steps))
    bound_s = (steps * weight_bytes + kv_read) / bandwidth
    figures = {"rollout_s": seconds, "rows": rows, "new_tokens": steps, "decode_tokens_per_s": rows * steps / seconds,
               "bandwidth_bound_s": bound_s, "bandwidth_share": bound_s / seconds}
    if device.startswith("cuda"):
        figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return figures


def measure_shape(name: str, shape: Shape, tokenizer, workload: Workload, device: str, dtype: str,
                  repeats: int, limits: Optional[dict] = None) -> dict:
    """The shape's update with the shared-prompt forward and with the plain one, on one model."""
    torch_dtype = DTYPES[dtype]
    started = time.perf_counter()
    base = build_model(shape, tokenizer, device, torch_dtype, seed=0)
    parameters = sum(p.numel() for p in base.parameters())
    engine = LocalEngine.from_model(base, tokenizer, ["voter"], study_config(workload, device, dtype, True), seed=0)
    built_s = time.perf_counter() - started
    turns = make_turns(tokenizer, workload, seed=1)
    out: dict = {"shape": asdict(shape), "parameters": parameters, "build_s": built_s,
                 "lora_parameters": sum(p.numel() for p in engine.params["voter"])}
    for variant, shared in (("shared_prompt", True), ("plain", False)):
        engine.cfg.algo.shared_prompt_forward = shared
        try:
            out[variant] = time_updates(engine, turns, repeats, device)
        except torch.OutOfMemoryError as exc:  # a figure in itself: record it and go on
            out[variant] = {"error": f"out of memory: {str(exc).splitlines()[0]}"}
            torch.cuda.empty_cache()
        if limits:
            update_share(out[variant], parameters, tokens_computed(workload, shared), limits["matmul_flops_per_s"])
    if limits:
        try:
            out["rollout"] = time_rollout(engine, shape, workload, device, torch_dtype, limits["copy_bytes_per_s"])
        except torch.OutOfMemoryError as exc:
            out["rollout"] = {"error": f"out of memory: {str(exc).splitlines()[0]}"}
            torch.cuda.empty_cache()
    if "update_s" in out["shared_prompt"] and "update_s" in out["plain"]:
        out["plain_over_shared_time"] = out["plain"]["update_s"] / out["shared_prompt"]["update_s"]
    del engine, base
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def parity(tokenizer, device: str, lr: float = 1e-3) -> dict:
    """One update of a tiny model on the CPU and on `device` (fp32, same weights, same rows, two
    mini-batches so the second uses behaviour log-probs): losses, grad norms, update norms and
    entropies agree within PARITY_TOL (relative, absolute near zero), and the adapters after the
    update differ by at most ADAPTER_TOL of the update itself (L2). Not element by element: Adam's
    first steps are about lr * sign(grad), so a weight whose gradient is near zero moves by a
    visible part of a step on one device and not on the other (seen on an H200: 6.8e-5 at lr 1e-3
    with the metrics 1.6e-6 apart)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    workload = Workload(problems=2, group=4, prompt_tokens=24, response_tokens=12, micro_batch=2)
    turns = make_turns(tokenizer, workload, seed=2)
    results, adapters = {}, {}
    for where in ("cpu", device):
        cfg = study_config(workload, where, "fp32", True, lr=lr)
        cfg.algo.ppo_mini_batch_size = 1  # two optimizer steps
        base = build_model(TINY_SHAPES["tiny"], tokenizer, "cpu", torch.float32, seed=3)
        engine = LocalEngine.from_model(base, tokenizer, ["voter"], cfg, seed=3)
        result = engine.update(copy.deepcopy(turns), step=0)
        results[where] = {"loss": result.loss, **{f"role_loss/{k}": v for k, v in result.role_loss.items()},
                          **{f"grad_norm/{k}": v for k, v in result.policy_grad_norm.items()},
                          **{f"update_norm/{k}": v for k, v in result.policy_update_norm.items()},
                          **{f"entropy/{k}": v for k, v in result.entropy.items()}}
        adapters[where] = torch.cat([p.detach().float().cpu().flatten() for p in engine.params["voter"]])
        initial = torch.cat([p.float().cpu().flatten() for p in engine.initial["voter"]])
    worst = 0.0
    for key, value in results["cpu"].items():
        other = results[device][key]
        worst = max(worst, abs(value - other) / max(abs(value), 1.0))
    adapter_gap = float((adapters["cpu"] - adapters[device]).abs().max())
    moved = float((adapters["cpu"] - initial).norm())
    adapter_relative = float((adapters["cpu"] - adapters[device]).norm()) / max(moved, 1e-30)
    return {"compared": f"cpu vs {device}", "metrics": results, "max_relative_gap": worst,
            "adapter_max_abs_gap": adapter_gap, "adapter_relative_gap": adapter_relative, "update_l2": moved,
            "tolerance": PARITY_TOL, "adapter_tolerance": ADAPTER_TOL,
            "passed": worst <= PARITY_TOL and adapter_relative <= ADAPTER_TOL}


def shape_line(name: str, figures: dict) -> str:
    """One printed line per shape: the shared-prompt update, its peak memory, the plain one beside it."""
    shared, plain = figures["shared_prompt"], figures["plain"]

    def timing(variant: dict) -> str:
        if "update_s" not in variant:
            return variant.get("error", "no figure")
        peak = f", peak {variant['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in variant else ""
        return f"{variant['update_s']:.2f} s, {variant['update_response_tokens_per_s']:,.0f} response tok/s{peak}"

    ratio = figures.get("plain_over_shared_time")
    line = (f"{name}: {figures['parameters'] / 1e9:.2f} B params; update {timing(shared)}; plain forward "
            f"{timing(plain)}" + (f" (time {ratio:.2f}x the shared-prompt update)" if ratio else ""))
    if "matmul_share" in shared:
        line += f"; update at {shared['matmul_share']:.0%} of the matmul limit"
    rollout = figures.get("rollout", {})
    if "decode_tokens_per_s" in rollout:
        line += (f"; rollout {rollout['decode_tokens_per_s']:,.0f} decode tok/s, {rollout['bandwidth_share']:.0%} "
                 f"of the bandwidth bound")
    elif rollout:
        line += f"; rollout {rollout.get('error', 'no figure')}"
    return line


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()})"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on whatever device there is (rehearsal)")
    parser.add_argument("--tokenizer-cache", type=Path, default=None,
                        help="folder holding qwen3-tokenizer/ (the bundle); default: the harness's cache")
    parser.add_argument("--shapes", default=None, help="comma-separated names (default: all of the mode's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip shapes not started by then")
    args = parser.parse_args(argv)
    from harness import qwen3_tokenizer

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.tiny and device != "cuda":
        print("error: torch sees no CUDA device; --tiny rehearses the check on a CPU", file=sys.stderr)
        return 2
    shapes, workload = (TINY_SHAPES, TINY_WORKLOAD) if args.tiny else (STUDY_SHAPES, STUDY_WORKLOAD)
    chosen = list(shapes) if args.shapes is None else args.shapes.split(",")
    unknown = [s for s in chosen if s not in shapes]
    if unknown:
        print(f"error: unknown shape(s) {', '.join(unknown)}; valid: {', '.join(shapes)}", file=sys.stderr)
        return 2
    tokenizer = qwen3_tokenizer.load(args.tokenizer_cache)
    dtype = "bf16" if device == "cuda" else "fp32"
    report: dict = {"device": device_name(device), "torch": torch.__version__, "dtype": dtype,
                    "mode": "tiny" if args.tiny else "study", "workload": asdict(workload),
                    "not_checked": NOT_CHECKED, "shapes": {}, "skipped": {}}
    report["parity"] = parity(tokenizer, device)
    check = report["parity"]
    print(f"parity ({check['compared']}, fp32): metrics' max relative gap {check['max_relative_gap']:.2e} "
          f"(tolerance {PARITY_TOL:g}); adapters' gap {check['adapter_relative_gap']:.2e} of the update "
          f"(tolerance {ADAPTER_TOL:g}; largest weight gap {check['adapter_max_abs_gap']:.2e}) -> "
          f"{'ok' if check['passed'] else 'FAILED'}")
    big = not args.tiny  # the limits: a large bf16 product and a large copy on a GPU, small ones in a rehearsal
    report["limits"] = limits = {
        "matmul_flops_per_s": matmul_limit(device, DTYPES[dtype], 8192 if big else 256),
        "copy_bytes_per_s": bandwidth_limit(device, 2048 if big else 16)}
    print(f"limits on this device: matmul {limits['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s ({dtype}), "
          f"copy {limits['copy_bytes_per_s'] / 1e9:.0f} GB/s")
    for name in chosen:
        if time.perf_counter() - started > args.budget_s:
            report["skipped"][name] = f"time budget of {args.budget_s:g} s spent"
            continue
        report["shapes"][name] = figures = measure_shape(name, shapes[name], tokenizer, workload, device, dtype,
                                                         args.repeats, limits)
        print(shape_line(name, figures))
    report["wall_s"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    for what, why in NOT_CHECKED.items():
        print(f"not checked here: {what}: {why}")
    ok = report["parity"]["passed"] and all("update_s" in f["shared_prompt"] for f in report["shapes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
