"""Engines hold the policies: `local` (in-process, peft) or `verl` (Ray worker groups, FSDP2)."""
from __future__ import annotations

from pathlib import Path
from typing import List


def build_engine(cfg, model_dir: Path, policies: List[str], work_dir: Path, task=None):
    """The cell's engine; with `models:` one local engine per model instance, each on its own base."""
    if cfg.models:
        from harness.engines.multi import MultiModelEngine, instance_config
        from harness.warmup import prepare_model

        dirs = {name: prepare_model(instance_config(cfg, name), task) for name in cfg.models}
        if cfg.engine == "verl":  # one worker group per instance, each on its own base
            from harness.engines.verl.engine import VerlEngine

            return VerlEngine(dirs, sorted(dirs), cfg, seed=cfg.seed, work_dir=work_dir)
        return MultiModelEngine(cfg, dirs, seed=cfg.seed)
    if cfg.engine == "verl":
        from harness.engines.verl.engine import VerlEngine

        return VerlEngine(model_dir, policies, cfg, seed=cfg.seed, work_dir=work_dir)
    from harness.engines.local import LocalEngine

    return LocalEngine(model_dir, policies, cfg, seed=cfg.seed)
