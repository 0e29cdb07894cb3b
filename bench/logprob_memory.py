"""Peak memory of one update forward + backward at Qwen3's vocabulary (151,936 tokens), by response
length: the harness's response-only, vocabulary-chunked log-probs against the full-logits way
(logits and log-softmax over the whole sequence and vocabulary, as the update used to do).

A random tiny Qwen3 (hidden 64, 2 layers, LoRA 8) keeps the model itself small, so the numbers are
the log-prob head's. Each point runs in a fresh process (peak RSS never goes down); printed: the
peak RSS above the process's RSS before the forward, and its growth per doubling of the length
(2.0 is linear, 4.0 quadratic).
Usage: python bench/logprob_memory.py [--lengths 256 512 1024] [--rows 2]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

VOCAB = 151_936


def rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(way: str, length: int, rows: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.eval()
    def step(length: int) -> None:
        prompts = [[int(t) for t in torch.randint(0, VOCAB, (32,))] for _ in range(rows)]
        responses = [[int(t) for t in torch.randint(0, VOCAB, (length,))] for _ in range(rows)]
        loss = log_prob_sum(way, model, prompts, responses)
        loss.backward()
        model.zero_grad(set_to_none=True)

    step(4)  # one-time allocations (kernels, allocator pools) out of the measurement
    before = rss_mb()
    step(length)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mb": peak - before}


def log_prob_sum(way: str, model, prompts, responses):
    import torch

    from harness.engines.logprobs import response_log_probs

    if way == "chunked":
        out = response_log_probs(model, prompts, responses, pad_id=0)
        loss = (out.log_prob * out.mask).sum()
    else:
        ids = torch.tensor([p + r for p, r in zip(prompts, responses)])
        logits = model(input_ids=ids).logits[:, :-1].float()
        log_softmax = torch.log_softmax(logits, -1)
        picked = log_softmax.gather(-1, ids[:, 1:, None]).squeeze(-1)[:, len(prompts[0]) - 1:]
        with torch.no_grad():
            (-(log_softmax.exp() * log_softmax).sum(-1)).mean()
        loss = picked.sum()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", nargs=3, metavar=("WAY", "LENGTH", "ROWS"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--rows", type=int, default=2)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), int(args.one[2]))))
        return
    repo = Path(__file__).resolve().parents[1]
    print(f"peak RSS above the model (MB), {args.rows} rows x (32 prompt + L response tokens), vocabulary {VOCAB:,}")
    print(f"{'L':>6} {'chunked':>9} {'growth':>7} {'full logits':>12} {'growth':>7}")
    last = {}
    for length in args.lengths:
        row = [f"{length:>6}"]
        for way, width in (("chunked", 9), ("full", 12)):
            proc = subprocess.run([sys.executable, __file__, "--one", way, str(length), str(args.rows)], cwd=repo,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]
            growth = f"{peak / last[way]:.2f}" if way in last else "-"
            last[way] = peak
            row += [f"{peak:>{width}.0f}", f"{growth:>7}"]
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
