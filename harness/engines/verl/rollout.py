"""Rollout of the verl engine: one verl rollout replica per policy, in verl's hybrid mode.

Each policy's replica runs beside that policy's worker group (vLLM on a GPU, the harness's "hf"
backend elsewhere; see hf_rollout.py); after every optimizer step the workers push the new
adapter to it (verl's naive weight sync). The controller's batched requests go to the replica's
server: one `sample` call for HF, one token-in-token-out `generate` per sequence for vLLM
(vLLM batches them itself), each with its own seed so a resumed run samples the same tokens.
"""
from __future__ import annotations

import asyncio
import importlib.util
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Coroutine, List, Optional, Tuple

import torch


def resolve_backend(cfg, device: str) -> str:
    """auto: vLLM where there is a GPU and vLLM is installed, HF generation otherwise."""
    if cfg.verl.rollout != "auto":
        return cfg.verl.rollout
    return "vllm" if device != "cpu" and importlib.util.find_spec("vllm") is not None else "hf"


def run_sync(coroutine: Coroutine):
    """Run a coroutine to completion from sync code, also inside a running event loop (the
    workflow scheduler's), where `asyncio.run` is not allowed."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def rollout_config(cfg, backend: str, n_policies: int, seed: int):
    """verl's RolloutConfig of one policy's replica."""
    from verl.workers.config import RolloutConfig

    v = cfg.verl
    tp = v.rollout_tp if backend == "vllm" else 1
    dp = max(1, v.gpus_per_policy // tp) if backend == "vllm" else 1
    share = v.rollout_gpu_memory_utilization or round(0.5 / (n_policies if v.placement == "colocate" else 1), 3)
    return RolloutConfig(name=backend, mode="async", tensor_model_parallel_size=tp, data_parallel_size=dp,
                         gpu_memory_utilization=share, free_cache_engine=True, load_format="auto",
                         max_model_len=v.rollout_max_model_len, dtype="bfloat16" if v.param_dtype == "bf16" else "float32",
                         enforce_eager=True, seed=seed, enable_sleep_mode=backend == "vllm",
                         prompt_length=v.rollout_max_model_len // 2, response_length=v.rollout_max_model_len // 2)


def launch_replica(backend: str, config, model_config, worker_group, replica_rank: int):
    """verl's replica for `backend`, its server launched beside `worker_group` (hybrid mode).
    Replica ranks number the cell's policies, so the servers' Ray names differ."""
    from verl.workers.rollout.replica import RolloutMode, get_rollout_replica_class

    from harness.engines.verl.hf_rollout import register

    register()  # "hf" in verl's registries of this process

    replica = get_rollout_replica_class(backend)(replica_rank, config, model_config,
                                                 gpus_per_node=max(1, len(worker_group.workers)))
    replica.rollout_mode = RolloutMode.HYBRID
    replica.workers = list(worker_group.workers)  # init_hybrid would slice by replica rank
    run_sync(replica.launch_servers())
    return replica


def sample(backend: str, server, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int,
           max_new_tokens: int, temperature: float, greedy: bool, eos_id: int, pad_id: int,
           seed: int) -> Tuple[List[List[int]], Optional[List[List[float]]]]:
    """New tokens for each of `copies` samples of each left-padded prompt (rows grouped per prompt),
    and each token's log-prob as the server sampled it (vLLM's processed log-probs: after the
    temperature, as verl's `logprobs_mode` default)."""
    import ray

    if backend == "hf":
        tokens, log_probs = ray.get(server.sample.remote(input_ids, attention_mask, copies, max_new_tokens, temperature,
                                                         greedy, eos_id, pad_id, seed))
        return tokens.tolist(), log_probs.tolist()
    prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
    params = dict(temperature=0.0 if greedy else temperature, max_tokens=max_new_tokens, logprobs=True)
    refs = [server.generate.remote(prompt_ids=prompt, sampling_params={**params, "seed": seed + i * copies + k},
                                   request_id=uuid.uuid4().hex)
            for i, prompt in enumerate(prompts) for k in range(copies)]
    outputs = ray.get(refs)
    log_probs = [o.log_probs for o in outputs]
    return [o.token_ids for o in outputs], None if any(lp is None for lp in log_probs) else log_probs
