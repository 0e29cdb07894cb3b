"""GPU-hours a sweep's updates cost, from a measurement rather than a reservation.

`bench/gpu_check.sh` times the local engine's update at Qwen3-0.6B/1.7B/4B shapes on a real GPU and
writes `gpu_check.json`; the repository keeps the one quoted in docs/benchmarks.md as
`bench/gpu_check_results.json` ($MARL_GPU_MEASUREMENT names another). The dry run turns its response
tokens per second into update GPU-hours per cell: steps x problems x rollouts x the most model calls
an episode makes x the tokens per call, over the measured rate; per 1,000 tokens of mean response
length (a run's own `role/<role>/response_length` says what to multiply by) and at every call's longest
response (an upper bound). Linear in tokens, at the measured GPU; rollouts (vLLM) are not in it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional

REPO = Path(__file__).resolve().parents[1]
MEASUREMENT = REPO / "bench" / "gpu_check_results.json"
ENV = "MARL_GPU_MEASUREMENT"


@dataclass(frozen=True)
class Measured:
    device: str
    tokens_per_s: Dict[str, float]  # scale name -> update response tokens per second
    source: Path


def load_measurement(path: Optional[Path] = None) -> Optional[Measured]:
    """The kept measurement, or None when there is none (no GPU check has been run yet)."""
    path = Path(path or os.environ.get(ENV) or MEASUREMENT)
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    rates = {name: figures["shared_prompt"]["update_response_tokens_per_s"]
             for name, figures in report.get("shapes", {}).items()
             if "update_response_tokens_per_s" in figures.get("shared_prompt", {})}
    return Measured(report["device"], rates, path)


def max_calls(cfg) -> Optional[int]:
    """The most model calls one episode makes, for the four study topologies (None for graphs)."""
    wf = cfg.workflow
    return {"single": 1, "voting": wf.n_votes + 1, "eval_opt": 2 * wf.max_iterations,
            "orch_workers": wf.max_subtasks + 2}.get(cfg.topology)


def update_gpu_hours(cfg, measured: Measured, response_tokens: Optional[int] = None) -> Optional[float]:
    """One cell's update GPU-hours at the measured rate, every call writing `response_tokens` (default:
    its longest response, workflow.max_new_tokens); None when its scale or topology is not measured."""
    rate, calls = measured.tokens_per_s.get(cfg.scale), max_calls(cfg)
    if not rate or calls is None:
        return None
    per_call = cfg.workflow.max_new_tokens if response_tokens is None else response_tokens
    return cfg.steps * cfg.algo.problems_per_step * cfg.algo.group_size * calls * per_call / rate / 3600


def estimate_line(configs: Iterable, measured: Optional[Measured]) -> Optional[str]:
    """The dry run's line: the estimate over the cells it covers, or why there is none."""
    configs = list(configs)
    if measured is None:
        if any(c.scale in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b") for c in configs):
            return (f"no measured GPU-hours estimate: {MEASUREMENT.relative_to(REPO)} is absent "
                    "(bench/gpu_check.sh on a GPU machine writes it)")
        return None
    covered = [c for c in configs if update_gpu_hours(c, measured) is not None]
    if not covered:
        return None
    longest = sum(update_gpu_hours(c, measured) for c in covered)
    per_1k = sum(update_gpu_hours(c, measured, 1000) for c in covered)
    return (f"estimate: {per_1k:,.1f} GPU-hours of update compute per 1,000 tokens of mean response length, "
            f"{longest:,.1f} if every call wrote its longest response; {len(covered)} of {len(configs)} cells "
            f"(measured on {measured.device} with the local engine, bf16; rollouts not included; "
            f"{measured.source.name})")
