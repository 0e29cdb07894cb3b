"""One short engine=verl run on the tiny model with CUDA, on a GPU node with the full install.

Prints the device, steps/s (median step time after the first step) and the last step's per-role
metrics; exits non-zero when the run fails or a number is not finite. bench/gpu_cluster_check.sh runs it
after the CPU-vs-GPU parity test.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="/tmp/gpu_check")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--topology", default="voting")
    parser.add_argument("--sharing", default="ip")
    parser.add_argument("--device", default="cuda", help="cpu: rehearse the script on a machine without a GPU")
    parser.add_argument("--rollout", default="auto", help="verl rollout replicas: vllm, hf, auto")
    parser.add_argument("--scale", default="tiny-m", help="qwen3-tok: Qwen3's tokenizer and prompts (thinking off)")
    args = parser.parse_args()
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("gpu_check: torch sees no CUDA device", file=sys.stderr)
            return 1
        print(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}")
    cell = [f"root={args.root}", "engine=verl", f"verl.device={args.device}", "verl.attn_implementation=sdpa",
            f"topology={args.topology}", f"sharing={args.sharing}", f"steps={args.steps}", "val_every=5",
            f"verl.rollout={args.rollout}", "progress=false", "report=false", "wandb.enabled=false",
            f"scale={args.scale}", f"sweep=gpu_check-{args.rollout}-{args.scale}"]
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "harness.run", *cell], cwd=REPO, capture_output=True, text=True)
    wall = time.time() - started
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        return 1
    run = next((Path(args.root) / f"gpu_check-{args.rollout}-{args.scale}").iterdir())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step_s = statistics.median(m["time/step_s"] for m in metrics[1:]) if len(metrics) > 1 else metrics[0]["time/step_s"]
    print(f"cell {run.name}, rollout {args.rollout}: {len(metrics)} steps in {wall:.1f} s wall (with Ray start and warm-up); "
          f"median step {step_s:.2f} s = {1 / step_s:.2f} steps/s")
    last = metrics[-1]
    keys = sorted(k for k in last if k.startswith(("role/", "policy/")) or k in ("reward/mean", "loss", "val/accuracy"))
    for key in keys:
        print(f"  {key:45s} {last[key]:.6g}")
    bad = [k for k in keys if not math.isfinite(last[k])]
    if bad:
        print(f"gpu_check: non-finite {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
