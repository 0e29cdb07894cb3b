"""verl rollout backend "hf": HF generation behind verl's rollout-replica interface.

verl 0.9.1 ships rollout replicas for vLLM, SGLang and TensorRT-LLM only, none of which runs
beside verl on a CPU. This backend has the same three pieces as verl's vLLM backend, so the verl
engine's rollout takes one path on a laptop, in CI and on a GPU cluster:

- `HFRolloutServer` (like `vLLMHttpServer`): a Ray actor next to a policy's workers that holds the
  rollout model (base + LoRA adapter) and serves verl's token-in-token-out `generate`, plus a
  batched `sample` the harness uses (each distinct prompt prefilled once).
- `HFServerAdapter` (like vLLM's `ServerAdapter`): the `BaseRollout` inside each training worker;
  `update_weights` pushes the trainer's weights to the server (through Ray's object store).
- `HFReplica` (like `vLLMReplica`): launches the server on the node of the replica's workers.

`register()` puts them in verl's registries (`_ROLLOUT_REGISTRY[("hf", "async")]`,
`RolloutReplicaRegistry["hf"]`); verl itself is not patched.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Generator, List, Optional, Tuple

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from harness.engines.sampling import sample_repeated

NAME = "hf"


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server; the adapter finds its server by it."""
    return f"{NAME}_server_{replica_rank}"


class HFRolloutServer:
    """The rollout model of one replica: the base checkpoint from disk with the policy's LoRA
    adapter on top, overwritten by every weight sync. Runs on the device it is given."""

    def __init__(self, model_config, visible_devices: Optional[str] = None):
        from transformers import AutoModelForCausalLM

        if visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
        self.device = torch.device("cuda:0" if visible_devices is not None and torch.cuda.is_available() else "cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_config.local_path, dtype=dtype,
                                                     attn_implementation="sdpa")
        if model_config.lora_rank > 0:
            from peft import LoraConfig, PeftModel, get_peft_model

            if model_config.lora_adapter_path:  # the policy's initial adapter, as the trainer loads it
                model = PeftModel.from_pretrained(model, model_config.lora_adapter_path)
            else:
                target = model_config.target_modules
                model = get_peft_model(model, LoraConfig(
                    r=model_config.lora_rank, lora_alpha=model_config.lora_alpha, lora_dropout=0.0,
                    target_modules=target if isinstance(target, str) else list(target)))
        self.model = model.to(self.device).eval()
        self.global_steps: Optional[int] = None
        self.syncs = 0

    def ready(self) -> bool:
        return True

    # ------------------------------------------------------------------ weights
    def load_weights(self, named: Dict[str, torch.Tensor], lora: bool, global_steps: Optional[int]) -> int:
        """Adapter tensors (names of `get_peft_model_state_dict`) or full base weights (HF names)."""
        if lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, named)
            unexpected = [k for k in result.unexpected_keys if "lora_" in k]
            if unexpected:
                raise RuntimeError(f"rollout adapter sync: {len(unexpected)} unknown tensors, e.g. {unexpected[0]}")
        else:  # HF names; under LoRA the wrapped layers keep theirs in `.base_layer`
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            own = base.state_dict()
            renamed = {}
            for name, tensor in named.items():
                stem, _, leaf = name.rpartition(".")
                target = name if name in own else f"{stem}.base_layer.{leaf}"
                if target not in own:
                    raise RuntimeError(f"rollout weight sync: the rollout model has no tensor {name}")
                renamed[target] = tensor
            base.load_state_dict(renamed, strict=False)
        self.global_steps = global_steps
        self.syncs += 1
        return self.syncs

    def adapter_state(self) -> Dict[str, torch.Tensor]:
        """The served adapter (tests compare it with the trainer's)."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().float().cpu() for k, v in get_peft_model_state_dict(self.model).items()}

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def sample(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int, max_new_tokens: int,
               temperature: float, greedy: bool, eos_id: int, pad_id: int,
               seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B*repeats, T) new tokens for B left-padded prompts (the harness's batched request), and
        their log-probs at the sampling temperature."""
        torch.manual_seed(seed)
        tokens, log_probs = sample_repeated(self.model, input_ids.to(self.device), attention_mask.to(self.device),
                                            repeats, max_new_tokens, temperature, greedy, eos_id, pad_id)
        return tokens.cpu(), log_probs.float().cpu()

    def generate(self, prompt_ids: List[int], sampling_params: Dict[str, Any], request_id: str,
                 **_multimodal) -> TokenOutput:
        """verl's token-in-token-out request (what its agent loop sends to a vLLM server)."""
        temperature = float(sampling_params.get("temperature", 1.0))
        max_tokens = int(sampling_params.get("max_tokens", sampling_params.get("max_new_tokens", 256)))
        if "seed" in sampling_params:
            torch.manual_seed(int(sampling_params["seed"]))
        config = getattr(self.model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        eos = -1 if eos is None else eos
        ids = torch.tensor([prompt_ids])
        tokens, log_probs = sample_repeated(self.model, ids.to(self.device), torch.ones_like(ids).to(self.device), 1,
                                            max_tokens, max(temperature, 1e-6), temperature == 0, eos, -1)
        kept = [(t, float(lp)) for t, lp in zip(tokens[0].tolist(), log_probs[0].tolist()) if t != -1]
        return TokenOutput(token_ids=[t for t, _ in kept],
                           log_probs=[lp for _, lp in kept] if sampling_params.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    # ------------------------------------------------------------------ verl's server control calls
    async def wake_up(self, tags: Optional[List[str]] = None) -> None:
        return None  # HF keeps its weights resident; nothing to restore

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None  # no cache survives a request

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps


class HFServerAdapter(BaseRollout):
    """The rollout inside a training worker: sends the trainer's weights to its replica's server.
    Every rank gathers (the gather is collective), rank 0 of the replica sends."""

    def __init__(self, config, model_config, device_mesh=None, replica_rank: int = 0):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = replica_rank
        self._has_server = int(os.environ.get("RANK", 0)) == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: List[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(self, weights: Generator[Tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", peft_config=None, base_sync_done: bool = True,
                             global_steps: Optional[int] = None, **_kwargs):
        """Adapter tensors (`peft_config` set, `base_sync_done`), else the full base weights."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes named tensors, not {wire_format!r}")
        named = {name: t.detach().float().cpu() for name, t in weights}  # verl yields full tensors
        if self._has_server:
            await self._server_handle().load_weights.remote(named, peft_config is not None and base_sync_done,
                                                            global_steps)


class HFReplica(RolloutReplica):
    """One HF rollout server per replica, placed on the node of the replica's first worker."""

    async def launch_servers(self):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from verl.utils.device import get_device_name

        node_id, accelerators = await self.workers[0].__ray_call__.remote(
            lambda self: (ray.get_runtime_context().get_node_id(), ray.get_runtime_context().get_accelerator_ids()))
        gpu_ids = accelerators.get("GPU") or []
        visible = str(gpu_ids[0]) if get_device_name() != "cpu" and gpu_ids else None
        server = ray.remote(HFRolloutServer).options(
            name=server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
        ).remote(self.model_config, visible)
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server


def register() -> None:
    """Make "hf" a rollout backend of verl in this process (driver and every worker)."""
    _ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
