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
from typing import Any, Dict, Iterator, List, Optional

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


# ---------------------------------------------------------------------- wandb
def wandb_key(key: str) -> str:
    """'role/voter/grad_norm' -> 'role:voter/grad_norm' (and 'val/role/voter/x' -> 'val:role:voter/x'):
    wandb groups panels by the text before the first '/', so each role and policy gets a section."""
    parts = key.split("/")
    prefix = ["val"] if parts[0] == "val" else []
    rest = parts[len(prefix):]
    if len(rest) >= 3 and rest[0] in ("role", "policy"):
        return ":".join(prefix + rest[:2]) + "/" + "/".join(rest[2:])
    return key


WANDB_DEFAULTS = {"mode": "offline", "project": "marl-harness", "entity": None}
WANDB_MODES = ("offline", "online", "disabled")


def wandb_settings(cfg) -> Dict[str, Optional[str]]:
    """mode, project and entity as a researcher expects them: a value set in the config, else the
    WANDB_<NAME> environment variable, else the harness's default (offline, project marl-harness).
    wandb's `dryrun` is its old name for offline."""
    resolved = {}
    for name, default in WANDB_DEFAULTS.items():
        value = getattr(cfg.wandb, name, None)
        resolved[name] = value if value not in (None, "") else (os.environ.get(f"WANDB_{name.upper()}") or default)
    if resolved["mode"] == "dryrun":
        resolved["mode"] = "offline"
    return resolved


class WandbSink:
    """One wandb run per cell (group = sweep, tags = axis values); offline unless configured.
    The JSONL run directory stays the source of truth: this is a mirror for the wandb UI."""

    def __init__(self, cfg, run_dir: RunDir):
        import wandb

        self._wandb = wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        tags = [f"topology:{cfg.topology}", f"scale:{cfg.scale}", f"task:{cfg.task}", f"sharing:{cfg.sharing}",
                f"seed:{cfg.seed}"]
        from omegaconf import OmegaConf

        settings = wandb_settings(cfg)
        self.run = wandb.init(project=settings["project"], entity=settings["entity"], group=cfg.sweep,
                              name=cfg.cell_id, id=wandb_run_id(run_dir.path), resume="allow", tags=tags,
                              config=OmegaConf.to_container(OmegaConf.structured(cfg)), mode=settings["mode"],
                              dir=str(cfg.wandb.dir or run_dir.path), reinit="finish_previous",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))

    def log(self, record: Dict[str, Any]) -> None:
        values = {wandb_key(k): v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        self.run.log(values, step=int(record["step"]))

    def alert(self, alert) -> None:
        level = self._wandb.AlertLevel.ERROR if alert.action == "stop" else self._wandb.AlertLevel.WARN
        self.run.alert(title=f"{alert.kind} (step {alert.step})", text=alert.message, level=level, wait_duration=0)
        self.run.summary[f"alerts/{alert.kind}"] = self.run.summary.get(f"alerts/{alert.kind}", 0) + 1

    def finish(self, state: str) -> None:
        self.run.summary["state"] = state
        self.run.finish(exit_code=0 if state in ("finished", "stopped_early") else 1)


WANDB_ID_FILE = "wandb-run-id"


def wandb_run_id(run_path: Path) -> str:
    """The run directory's own wandb id: drawn at random on its first run and kept in the directory,
    so a resume continues the same wandb run and two run directories (other roots, other machines,
    the same cell id) never share one; a moved directory keeps its id."""
    import secrets

    path = Path(run_path) / WANDB_ID_FILE
    kept = path.read_text().strip() if path.is_file() else ""
    if kept:
        return kept
    run_id = secrets.token_hex(8)
    write_atomic(path, run_id + "\n")
    return run_id


def read_wandb_offline(path: Path) -> Iterator[Any]:
    """The records of an offline `run-*.wandb` file (LevelDB log format, protobuf records):
    lets tests and tools check what a cell sent to wandb without a server."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block = 32768
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb transaction log")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = block - (pos % block)
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        else:  # first or middle piece
            pending = pending + chunk if kind == 3 else chunk
