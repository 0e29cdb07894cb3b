"""The initial LoRA adapters of a cell, built the same way by every engine.

The local engine keeps them in memory; the verl engine's workers load them from disk
(`lora_adapter_path`), so both engines start a run from bit-identical adapters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import torch


def lora_config(cfg):
    from peft import LoraConfig

    return LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha, lora_dropout=0.0,
                      target_modules=list(cfg.model.lora_targets), task_type="CAUSAL_LM")


def attach_adapters(base, policies: List[str], cfg, seed: int):
    """One adapter per policy on `base`, initialised from `seed` in policy order."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    config = lora_config(cfg)
    model = get_peft_model(base, config, adapter_name=policies[0])
    for policy in policies[1:]:
        model.add_adapter(policy, config)
    return model


def export_initial_adapters(model_dir: Path, policies: List[str], cfg, seed: int, out_dir: Path) -> Dict[str, Path]:
    """Write each policy's initial adapter as a peft directory; returns {policy: dir}."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = attach_adapters(base, policies, cfg, seed)
    model.save_pretrained(str(out_dir), selected_adapters=list(policies))
    return {p: Path(out_dir) / p for p in policies}  # peft writes named adapters to sub-directories
