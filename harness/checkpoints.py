"""Verified checkpoints: a damaged checkpoint is detected and skipped, never trained on.

Every checkpoint directory gets a `manifest.json`, written last, with the size and SHA-256 of
every other file in it (the engine's weights in safetensors, the trainer state, verl's FSDP
shards: whatever the engine wrote). On resume the newest checkpoint whose manifest matches its
files is used; a damaged or missing one is reported (printed and recorded as an alert) and the
previous good one taken instead. Only when checkpoints exist and none is good does the run stop,
with one error and nothing deleted. The last `keep` step checkpoints are kept (and `best/`).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be trusted: resuming would train on damaged state."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> List[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path) -> None:
    """Size and SHA-256 of every file under `directory`, written last (a checkpoint without a
    manifest was interrupted while being written)."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in _files(directory)}
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"files": files}, indent=1))
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, directory / MANIFEST)


def problem_with(directory: Path) -> Optional[str]:
    """None when every file matches the manifest, else what is wrong (one line)."""
    if not directory.is_dir():
        return "missing"
    try:
        listed = json.loads((directory / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return "no manifest (written incompletely)"
    except (ValueError, KeyError, TypeError):
        return "unreadable manifest"
    present = {str(p.relative_to(directory)) for p in _files(directory)}
    for name, expected in sorted(listed.items()):
        path = directory / name
        if name not in present:
            return f"{name} is missing"
        if path.stat().st_size != expected.get("bytes"):
            return f"{name} has {path.stat().st_size} bytes, the manifest says {expected.get('bytes')}"
        if sha256_of(path) != expected.get("sha256"):
            return f"{name} does not match its checksum"
    return None


@dataclass
class ResumePoint:
    checkpoint: Optional[Path]  # None: start from step 0
    skipped: List[str] = field(default_factory=list)  # "<dir>: <problem>" for each damaged newer checkpoint


def step_of(directory: Path) -> int:
    return int(directory.name.split("_", 1)[1])


def find_resume_point(checkpoints: Path, pointer_target: Optional[str]) -> ResumePoint:
    """The newest verified step checkpoint. `pointer_target` is what latest.json names (it may be
    missing). A run that never wrote a checkpoint starts at step 0 (its few logged steps replay
    exactly); one that wrote checkpoints, none of them usable, is an error."""
    candidates = sorted((p for p in checkpoints.glob("step_*") if p.is_dir()), key=step_of, reverse=True)
    skipped: List[str] = []
    if pointer_target and not (checkpoints / pointer_target).is_dir():
        skipped.append(f"{pointer_target}: missing (named by latest.json)")
    for directory in candidates:
        problem = problem_with(directory)
        if problem is None:
            return ResumePoint(directory, skipped)
        skipped.append(f"{directory.name}: {problem}")
    if skipped:
        raise CheckpointError(f"no usable checkpoint in {checkpoints} ({'; '.join(skipped)}); starting over would "
                              f"discard the logged steps. Nothing was deleted: restore a checkpoint, or start the "
                              f"cell under another sweep= or cell_id=")
    return ResumePoint(None, skipped)
