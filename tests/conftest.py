"""Shared fixtures: one warm tiny model per session (cached on disk across sessions), and a
helper that builds cell configs through the same Hydra path as the command line."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def cell(tmp_path: Path, *overrides: str):
    from harness.validation import load_config

    return load_config([f"root={tmp_path}", "progress=false", "wandb.enabled=false", "report=false", *overrides])


@pytest.fixture(scope="session")
def warm_model_dir():
    """The default tiny-m warm checkpoint (built once, then reused from the cache)."""
    import torch

    from harness.config import CellConfig
    from harness.warmup import prepare_model
    from harness.tasks import build_task

    torch.set_num_threads(1)
    cfg = CellConfig()
    return prepare_model(cfg, build_task(cfg))


def python_cmd() -> list[str]:
    return [sys.executable, "-m", "harness.run"]
