"""`package.module:name` references in configs (reward allocators, graph tools, Python workflows)."""
from __future__ import annotations

import importlib
from typing import Any

from harness.config import ConfigError


def import_object(path: str, setting: str = "") -> Any:
    """The object `path` names. A bad path raises one ConfigError that starts with `setting` (the
    config key or graph node that gave the path), so the user sees where it came from and why."""
    where = f"{setting} " if setting else ""
    module_name, _, name = str(path).partition(":")
    if not module_name or not name:
        raise ConfigError(f"{where}must read 'package.module:function', got '{path}'")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{where}'{path}' cannot be loaded: {exc}") from None
