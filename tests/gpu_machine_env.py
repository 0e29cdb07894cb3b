"""A Python environment holding only what the bare GPU machine's Python holds.

That machine (../shared/notes/gpu-device.md) has torch, transformers, peft and a few more, and no
Ray, verl, vLLM, Hydra, OmegaConf or wandb. Its stand-in here is a fresh venv whose site-packages
links, from the running environment, exactly the distributions bench/gpu_bundle.py says the machine
has and what they require; anything else the GPU check imports must come from the bundle. Built
once per set of distributions and reused.
"""
from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Set

from tests.dependency_env import base_site_packages, cache_root, cached_venv

BUILD = "gpu machine 1"  # a change here rebuilds the cached environments


def top_level_entries(name: str) -> Set[str]:
    """The site-packages entries a distribution installed (packages, modules, .libs, its dist-info)."""
    dist = metadata.distribution(name)
    entries = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first not in ("..", "bin") and not first.endswith(".pth"):
            entries.add(first)
    return entries


def gpu_machine_env() -> Path:
    from bench.gpu_bundle import GPU_MACHINE, closure

    names = sorted(n for n in closure(GPU_MACHINE) if _installed(n))
    pins = [f"{n}=={metadata.version(n)}" for n in names]
    key = hashlib.sha1("\n".join([BUILD, sys.version, base_site_packages(), *pins]).encode()).hexdigest()[:12]

    def fill(python: Path, own: Path) -> str:
        for name in names:
            source = Path(metadata.distribution(name).locate_file("")).resolve()
            for entry in top_level_entries(name):
                if (source / entry).exists() and not (own / entry).exists():
                    (own / entry).symlink_to(source / entry)
        return "\n".join(pins) + "\n"

    return cached_venv(cache_root() / f"gpu-machine-{key}", fill)


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False
