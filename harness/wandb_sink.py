"""A mirror of the run directory in wandb (offline unless configured): one wandb run per cell, each
role and policy a panel section. The JSONL run directory (harness/run_dir.py) stays the source of truth."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from harness.run_dir import RunDir, write_atomic


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
                              config=OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
                              mode=settings["mode"],
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
