"""Time to load and compare a synthetic sweep of 100 runs x 500 steps (target: under 5 s here).

The runs are written in the real run-directory format with every per-role key a Voting cell
logs (~60 per step), paired baselines included, one torn last line per run, and a few alerts.
Usage: python bench/analysis_load.py [--runs 100] [--steps 500] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import yaml

from analysis.compare import compare
from analysis.load import load_metrics

ROLE_KEYS = ["turns", "turn_share", "token_share", "response_length", "response_length_p90", "response_length_max",
             "truncated", "format_ok", "reward", "accuracy", "grad_norm", "grad_share", "coherence", "amplification",
             "instances_per_policy", "entropy", "kl"]
POLICY_KEYS = ["grad_norm", "grad_norm_probe", "coherence", "instances", "update_norm", "param_norm", "update_ratio"]


def record(step: int, rng: random.Random) -> dict:
    r = {"step": step, "accuracy": rng.random(), "reward/mean": rng.random(), "reward/std": rng.random(),
         "loss": rng.gauss(0, 1), "time/step_s": 0.3}
    for role in ("voter", "aggregator"):
        r.update({f"role/{role}/{k}": rng.random() for k in ROLE_KEYS})
        r.update({f"role/{role}/{i}/grad_norm": rng.random() for i in range(3)})
    for policy in ("voter", "aggregator"):
        r.update({f"policy/{policy}/{k}": rng.random() for k in POLICY_KEYS})
    if step % 10 == 0:
        r["val/accuracy"] = rng.random()
    return r


def synthesize(root: Path, runs: int, steps: int) -> Path:
    sweep = root / "bench"
    rng = random.Random(0)
    seeds = -(-runs // 6)  # enough seeds for `runs` cells, 6 per seed
    made = 0
    for seed in range(seeds):
        for cell in ["single"] + [f"voting-{s}" for s in ("sp", "ip")] + [f"eval_opt-{s}" for s in ("sp", "ip")] + ["orch_workers-ip"]:
            if made == runs:
                break
            made += 1
            topology, _, sharing = cell.partition("-")
            cell_id = f"{cell}-math-tiny-m-s{seed}"
            run = sweep / cell_id
            run.mkdir(parents=True)
            (run / "cell.yaml").write_text(yaml.safe_dump({"cell_id": cell_id, "sweep": "bench", "topology": topology,
                                                          "sharing": sharing or "sp", "task": "arith", "scale": "tiny-m",
                                                          "seed": seed, "steps": steps, "extra": {"task_axis": "math"}}))
            (run / "status.json").write_text(json.dumps({"state": "finished", "step": steps}))
            with open(run / "metrics.jsonl", "w") as f:
                for step in range(steps):
                    f.write(json.dumps(record(step, rng)) + "\n")
                f.write('{"step": 500, "torn')  # a killed writer
            with open(run / "alerts.jsonl", "w") as f:
                f.write(json.dumps({"step": 40, "kind": "amplification", "role": "voter", "policy": "voter",
                                    "value": 2.0, "threshold": 1.5, "message": "m", "action": "alert"}) + "\n")
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--keep", default=None)
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="marl-bench-"))
    sweep = synthesize(root, args.runs, args.steps)
    start = time.perf_counter()
    metrics = load_metrics(sweep)
    loaded = time.perf_counter() - start
    result = compare(sweep)
    total = time.perf_counter() - start
    print(f"{args.runs} runs x {args.steps} steps ({metrics.shape[0]} rows x {metrics.shape[1]} columns): "
          f"load all metrics {loaded:.2f} s, + compare vs baselines {total - loaded:.2f} s, total {total:.2f} s "
          f"(target < 5 s); {len(result['gains'])} multi-agent cells compared")


if __name__ == "__main__":
    main()
