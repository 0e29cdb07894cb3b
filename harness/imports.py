"""`package.module:name` references in configs (reward allocators, graph tools, Python workflows)."""
from __future__ import annotations

import importlib
from typing import Any


def import_object(path: str) -> Any:
    """The object `path` names; ValueError saying what is wrong (the caller names the setting)."""
    module_name, _, name = str(path).partition(":")
    if not module_name or not name:
        raise ValueError(f"must read 'package.module:function', got '{path}'")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"'{path}' cannot be loaded: {exc}") from None
