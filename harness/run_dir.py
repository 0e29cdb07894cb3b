"""The run directory: the contract between training, analysis and reports.

    <root>/<sweep>/<cell_id>/
      cell.yaml  metrics.jsonl  alerts.jsonl  samples.jsonl  status.json  checkpoints/  report/

Writers append one JSON object per line and flush per step; readers tolerate a torn last line.
On resume, records past the last checkpoint are dropped, so a killed run re-logs those steps
once: no step is lost and none is duplicated.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

if TYPE_CHECKING:
    from harness.config import CellConfig

LOG_FILES = ("metrics.jsonl", "alerts.jsonl", "samples.jsonl")
STATES = ("running", "finished", "stopped_early", "failed", "diverged")
FINAL_STATES = ("finished", "stopped_early", "diverged")  # nothing writes the run again (a failed one may resume)
STATUS_BYTES = 4096  # status.json is padded to this: a failure's status can be written in place on a full disk
STATUS_ESSENTIAL = ("state", "step", "cell_id", "reason", "failure_log", "updated")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings a reader can turn back into floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def iter_jsonl(path: Path) -> Iterator[dict]:
    """Every complete record; a torn or garbled line (a killed writer) is skipped."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n"):
                    break  # torn last line
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record
    except FileNotFoundError:
        return


def read_jsonl(path: Path) -> List[dict]:
    return list(iter_jsonl(path))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"

    def file(self, name: str) -> Path:
        return self.path / name

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        for name in LOG_FILES:
            self.file(name).touch()

    # ------------------------------------------------------------------ records
    def append(self, name: str, record: Dict[str, Any]) -> None:
        with open(self.file(name), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(_clean(record), sort_keys=False) + "\n")
            handle.flush()

    def records(self, name: str) -> List[dict]:
        return read_jsonl(self.file(name))

    def truncate_from(self, step: int) -> None:
        """Keep only records of steps before `step` (and drop torn lines) in every log."""
        for name in LOG_FILES:
            path = self.file(name)
            if not path.exists():
                continue
            kept = [r for r in iter_jsonl(path) if int(r.get("step", -1)) < step]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))

    # ------------------------------------------------------------------ status
    def read_status(self) -> Optional[dict]:
        try:
            return json.loads(self.file("status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def write_status(self, state: str, **fields: Any) -> None:
        """Atomically (a new file renamed over the old); on a full disk, in place over the old
        file's blocks, which every status write pads to STATUS_BYTES so that a failure's status
        fits where the last one was."""
        assert state in STATES, state
        status = self.read_status() or {}
        status.update(fields, state=state, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
        text = json.dumps(_clean(status), indent=2)
        text += " " * max(0, STATUS_BYTES - len(text.encode()) - 1) + "\n"
        try:
            write_atomic(self.file("status.json"), text)
        except OSError:
            _rewrite_in_place(self.file("status.json"), json.dumps(_clean({k: status.get(k) for k in STATUS_ESSENTIAL})))

    # ------------------------------------------------------------------ checkpoints
    def latest_checkpoint(self) -> Optional[Path]:
        """The directory latest.json names, if it exists (unverified: resuming goes through
        `resume_point`)."""
        target = self.pointer_target()
        return self.checkpoints / target if target and (self.checkpoints / target).is_dir() else None

    def pointer_target(self) -> Optional[str]:
        try:
            return str(json.loads((self.checkpoints / "latest.json").read_text())["dir"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return "latest.json (unreadable)"

    def resume_point(self):
        """The newest checkpoint whose files match its manifest (harness/checkpoints.py)."""
        from harness.checkpoints import find_resume_point

        return find_resume_point(self.checkpoints, self.pointer_target())

    def save_checkpoint(self, step: int, write, keep: int = 2, pin: bool = False) -> Path:
        """`write(dir)` fills a fresh directory, a checksum manifest seals it, and only then does the
        pointer flip; the newest `keep` step checkpoints stay, and every pinned one (the state at an
        alert, where harness.intervene branches)."""
        from harness.checkpoints import step_of, write_manifest

        name = f"step_{step:07d}"
        tmp = self.checkpoints / f".tmp_{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        write_manifest(tmp)
        final = self.checkpoints / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_atomic(self.checkpoints / "latest.json", json.dumps({"dir": name, "step": step}))
        pinned = self.pinned_checkpoints() | ({name} if pin else set())
        if pin:
            write_atomic(self.checkpoints / "pinned.json", json.dumps(sorted(pinned)))
        steps = sorted((p for p in self.checkpoints.glob("step_*") if p.is_dir()), key=step_of, reverse=True)
        for old in steps[max(keep, 1):]:
            if old.name not in pinned:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def pinned_checkpoints(self) -> set:
        try:
            return set(json.loads((self.checkpoints / "pinned.json").read_text()))
        except (FileNotFoundError, ValueError):
            return set()

    def save_best(self, source: Path) -> None:
        tmp = self.checkpoints / ".tmp_best"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp)
        shutil.rmtree(self.checkpoints / "best", ignore_errors=True)
        os.replace(tmp, self.checkpoints / "best")


def _rewrite_in_place(path: Path, text: str) -> None:
    """Overwrite an existing file within its current size (no new blocks: works on a full disk)."""
    data = text.encode()
    size = path.stat().st_size
    if len(data) + 1 > size:
        raise OSError(f"{path}: {len(data)} bytes do not fit in place ({size})")
    with open(path, "r+b") as handle:
        handle.write(data + b" " * (size - len(data) - 1) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


# detector settings of earlier versions (an absolute gate on the update size, retired for a relative one)
RETIRED_MONITOR_KEYS = {"amplification": ("min_update_ratio",)}


def stored_cell_config(run: Path) -> "CellConfig":
    """A run's resolved config from its cell.yaml, as it trained (no re-validation of its root)."""
    from omegaconf import OmegaConf

    from harness.config import CellConfig

    stored = upgrade_stored(OmegaConf.to_container(OmegaConf.load(Path(run) / "cell.yaml")))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CellConfig), stored))


def upgrade_stored(cell: dict) -> dict:
    """A cell.yaml as today's CellConfig reads it: runs logged before the paired run became one
    monitors setting kept it under each detector (`monitors.amplification.reference_run`); runs
    logged before `workflow.chat` rendered every prompt as one message in the tokenizer's template,
    and a resumed or evaluated one goes on so."""
    workflow = cell.get("workflow")
    if isinstance(workflow, dict) and "chat" not in workflow:
        workflow["chat"] = "template"
    monitors = cell.get("monitors") or {}
    for detector, removed in RETIRED_MONITOR_KEYS.items():  # settings later detectors no longer have
        for key in removed:
            (monitors.get(detector) or {}).pop(key, None)
    for detector in ("amplification", "collapse"):
        recorded = (monitors.get(detector) or {}).pop("reference_run", None)
        if recorded and not monitors.get("reference_run"):
            monitors["reference_run"] = recorded
    return cell
