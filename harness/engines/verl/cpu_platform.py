"""A CPU platform for verl 0.9.1, loaded through `VERL_USE_EXTERNAL_MODULES`.

Stock verl knows nvidia/huawei/amd and falls back to "cuda" when none is found, so it cannot
train on a CPU. This module registers a "cpu" platform (device cpu, backend gloo) and makes
verl's FSDP engines (actor and critic) available for it; `VERL_PLATFORM=cpu` selects it.
verl itself is not patched but in one place: its critic loader hard-codes flash-attention
(a GPU kernel), so on this platform it loads the critic with SDPA instead.
"""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _zero(*_args, **_kwargs) -> int:
    return 0


def _none(*_args, **_kwargs) -> None:
    return None


# What verl calls on `get_torch_device()`: torch.cpu has no memory statistics or RNG state.
CPU_DEVICE_MODULE = SimpleNamespace(
    is_available=lambda: True, current_device=lambda: 0, device_count=lambda: 1, set_device=_none,
    synchronize=_none, empty_cache=_none, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
    max_memory_allocated=_zero, max_memory_reserved=_zero, memory_allocated=_zero, memory_reserved=_zero,
    reset_peak_memory_stats=_none, mem_get_info=lambda *_: (0, 0), get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state, Stream=None, current_stream=_none, stream=None,
    memory=SimpleNamespace(_set_allocator_settings=_none),
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """Device "cpu", collective backend "gloo" (torch rejects "cpu:gloo,cpu:gloo")."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return not torch.cuda.is_available()

    def current_device(self):
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's resource pools ask for GPUs; a CPU Ray cluster declares logical ones

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# verl registers its FSDP engine for cuda and npu only; the same class trains fp32 on a CPU.
# Imported after the platform exists: the engine module asks for the device at import time.
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402

EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)

# The critic (algo.adv_estimator=gae): verl's value-head engine, registered for cuda and npu only,
# is the same FSDP engine with the value head's output; it too trains fp32 on a CPU.
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead  # noqa: E402

EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithValueHead)


def _load_valuehead_model_sdpa(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's load_valuehead_model asks for flash_attention_2, which has no CPU kernel: the same
    one-label token classifier with PyTorch's SDPA attention."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
        attn_implementation="sdpa", trust_remote_code=trust_remote_code)


import verl.utils.model as _verl_model  # noqa: E402

_verl_model.load_valuehead_model = _load_valuehead_model_sdpa  # read at call time by the engine's model builder
