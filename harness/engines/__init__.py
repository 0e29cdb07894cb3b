"""Engines hold the policies: `local` (in-process, peft) or `verl` (Ray worker groups, FSDP2)."""
from __future__ import annotations

from pathlib import Path
from typing import List


def build_engine(cfg, model_dir: Path, policies: List[str], work_dir: Path):
    if cfg.engine == "verl":
        from harness.engines.verl.engine import VerlEngine

        return VerlEngine(model_dir, policies, cfg, seed=cfg.seed, work_dir=work_dir)
    from harness.engines.local import LocalEngine

    return LocalEngine(model_dir, policies, cfg, seed=cfg.seed)
