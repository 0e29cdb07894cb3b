"""The harness's single-agent GRPO step against Hugging Face TRL's GRPOTrainer, side by side.

Same warm tiny-m model, same arithmetic problems and prompt, LoRA rank 8 / alpha 16 on all linear
layers, G samples per problem at temperature 1 with the same token budget, no KL, no gradient
checkpointing, one optimizer step per generation batch (the harness: one PPO mini-batch per step),
one CPU thread each. The two run in alternating rounds (harness, TRL, TRL, harness, ...), each a
fresh process training `--steps` steps; a round's time is the median step after the first
`--skip`, and the table prints each round's ratio and the median over rounds. TRL needs a newer
transformers than verl allows, so it runs in its own venv (.venv-trl, built here on first use).

The multi-agent point: a voting step (3 voters + aggregator on IP) over a single-agent step, per
token computed (distinct prompts + responses), from the harness alone.

Usage: .venv/bin/python bench/trl_compare.py [--rounds 5] [--steps 30] [--shapes 16x4x16 8x4x12]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRL_VENV = REPO / ".venv-trl"
TRL_PINS = ["trl==1.16.0", "peft==0.21.2"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def ensure_trl_venv(venv: Path) -> Path:
    """TRL's own environment: CPU torch first (the wheel on disk), then TRL and peft."""
    python = venv / "bin" / "python"
    if python.is_file() and subprocess.run([str(python), "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    print(f"building {venv} (TRL {TRL_PINS[0]}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0"], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *TRL_PINS], check=True)
    return python


def harness_overrides(shape: dict, topology: str = "single") -> list:
    return [f"topology={topology}", "sharing=ip", "task=arith", "scale=tiny-m", f"steps={shape['steps']}",
            f"algo.problems_per_step={shape['problems']}", f"algo.group_size={shape['group']}",
            f"algo.ppo_mini_batch_size={shape['problems']}", f"workflow.max_new_tokens={shape['tokens']}",
            "algo.lr=1e-3", "algo.kl_coef=0", "algo.temperature=1.0", "model.lora_rank=8", "model.lora_alpha=16",
            "progress=false", "wandb.enabled=false", "report=false"]


def harness_worker(spec_path: str) -> None:
    """One harness run: `steps` controller steps (rollout + instrumented update), their wall times and
    the tokens each step computed."""
    import torch
    from probe_overhead import tokens_computed  # bench/, this script's directory

    from harness.controller import Controller
    from harness.engines.local import LocalEngine
    from harness.sharing import PolicyMap
    from harness.tasks import build_task
    from harness.validation import load_config
    from harness.warmup import prepare_model
    from harness.workflows import build_workflow

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    cfg = load_config(spec["overrides"])
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    engine = LocalEngine(prepare_model(cfg, task, log=lambda *_: None), policy_map.policies, cfg, seed=0)
    controller = Controller(cfg, task, workflow, policy_map, engine)
    times, tokens = [], []
    for step in range(cfg.steps):
        started = time.perf_counter()
        result = controller.train_step(step)
        times.append(time.perf_counter() - started)
        tokens.append(tokens_computed(result.episodes))
    print(json.dumps({"step_s": times, "tokens": tokens}))


def run_worker(command: list, spec: dict, env: dict) -> dict:
    """One fresh process given `spec` as a JSON file; its last stdout line is its JSON result."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
    proc = subprocess.run([*command, handle.name], cwd=REPO, capture_output=True, text=True, env=env)
    os.unlink(handle.name)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trl_spec(shape: dict, model_dir: Path, seed: int) -> dict:
    """The same problems and prompt text the harness's single agent sees (its chat template applied by TRL)."""
    from harness.config import CellConfig
    from harness.tasks import build_task
    from harness.workflows.prompts import resolve_prompts

    cfg = CellConfig()
    template = resolve_prompts({})["solver"]
    problems = [{"prompt": template.format(question=p.question), "answer": p.answer}
                for p in build_task(cfg).problems("train")]
    return {"model_dir": str(model_dir), "problems": problems, "steps": shape["steps"], "seed": seed,
            "problems_per_step": shape["problems"], "group_size": shape["group"], "max_new_tokens": shape["tokens"],
            "lr": 1e-3, "lora_rank": 8, "lora_alpha": 16, "lora_targets": LORA_TARGETS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["harness"])
    parser.add_argument("spec", nargs="?")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of each round's median")
    parser.add_argument("--shapes", nargs="+", default=["16x4x16", "8x4x12"], help="problems x G x tokens")
    parser.add_argument("--venv", type=Path, default=TRL_VENV)
    args = parser.parse_args()
    if args.worker:
        return harness_worker(args.spec)

    from harness.config import CellConfig
    from harness.tasks import build_task
    from harness.warmup import prepare_model

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    trl_python = str(ensure_trl_venv(args.venv))
    cfg = CellConfig()
    model_dir = prepare_model(cfg, build_task(cfg))
    harness_side = [sys.executable, str(Path(__file__).resolve()), "--worker", "harness"]
    trl_side = [trl_python, str(Path(__file__).resolve().parent / "trl_worker.py")]
    median = lambda xs: statistics.median(xs[args.skip:] or xs)  # noqa: E731
    print(f"harness vs TRL {TRL_PINS[0]}: median step time (generation + update) over steps "
          f"{args.skip}-{args.steps - 1}, alternating rounds, one thread each")
    print(f"{'shape (P x G x T)':<18} {'round':>5} {'harness s':>10} {'TRL s':>8} {'ratio':>6}")
    for text in args.shapes:
        problems, group, tokens = (int(v) for v in text.split("x"))
        shape = {"problems": problems, "group": group, "tokens": tokens, "steps": args.steps}
        ratios = []
        for round_ in range(args.rounds):
            order = ["harness", "trl"] if round_ % 2 == 0 else ["trl", "harness"]
            seconds = {}
            for side in order:
                if side == "harness":
                    out = run_worker(harness_side, {"overrides": harness_overrides(shape)}, env)
                else:
                    out = run_worker(trl_side, trl_spec(shape, model_dir, seed=round_), env)
                seconds[side] = median(out["step_s"])
            ratios.append(seconds["harness"] / seconds["trl"])
            print(f"{text:<18} {round_:>5} {seconds['harness']:>10.3f} {seconds['trl']:>8.3f} {ratios[-1]:>6.3f}",
                  flush=True)
        print(f"{text:<18} {'all':>5} {'':>10} {'':>8} {statistics.median(ratios):>6.3f}  "
              f"(median; range {min(ratios):.2f}-{max(ratios):.2f}; target <= 0.50)", flush=True)

    shape = {"problems": 16, "group": 4, "tokens": 16, "steps": min(args.steps, 15)}
    per_token = {}
    for topology in ("single", "voting"):
        out = run_worker(harness_side, {"overrides": harness_overrides(shape, topology)}, env)
        per_token[topology] = median([s / t for s, t in zip(out["step_s"], out["tokens"])])
        print(f"harness {topology:<7} 16x4x16: {median(out['step_s']):.3f} s per step, "
              f"{median(out['tokens']):.0f} tokens computed, "
              f"{per_token[topology] * 1e6:.1f} us per token")
    print(f"voting (3 voters + aggregator, IP) over single, per token computed: "
          f"{per_token['voting'] / per_token['single']:.2f}")


if __name__ == "__main__":
    main()
