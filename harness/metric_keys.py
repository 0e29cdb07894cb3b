"""Every per-role and per-policy metric key, built and read in one place.

A step's record (metrics.jsonl) holds flat keys (`accuracy`, `loss`, `val/accuracy`, ...) and keys
with a name inside: `role/<role>/<signal>` (a role's turns), `role/<role>/<instance>/<signal>` (one
instance of a role, e.g. voter 2's gradient norm) and `policy/<policy>/<signal>` (an adapter or the
shared model). Writers build them here, readers find names and signals here, so a key cannot be
written one way and read another (tests/test_module_structure.py keeps f-string keys out of
every other module).
"""
from __future__ import annotations

from typing import Iterable, List, NamedTuple, Optional

ROLE, POLICY = "role", "policy"


def role_key(role: str, signal: str) -> str:
    return f"{ROLE}/{role}/{signal}"


def instance_key(role: str, instance: int, signal: str) -> str:
    return f"{ROLE}/{role}/{instance}/{signal}"


def policy_key(policy: str, signal: str) -> str:
    return f"{POLICY}/{policy}/{signal}"


class Key(NamedTuple):
    kind: str  # role | policy
    name: str  # the role or policy
    signal: str
    instance: Optional[int] = None


def parse(key: str) -> Optional[Key]:
    """role/<r>/<s>, role/<r>/<i>/<s> or policy/<p>/<s> as its parts; None for a flat key."""
    parts = key.split("/")
    if parts[0] not in (ROLE, POLICY) or len(parts) not in (3, 4):
        return None
    if len(parts) == 4:
        return Key(parts[0], parts[1], parts[3], int(parts[2])) if parts[0] == ROLE and parts[2].isdigit() else None
    return Key(parts[0], parts[1], parts[2])


def names_in(record: Iterable[str], kind: str, signal: str) -> List[str]:
    """The roles (kind role) or policies (kind policy) that have `<kind>/<name>/<signal>` in the
    record (instance keys excluded), sorted."""
    found = [parse(k) for k in record]
    return sorted(k.name for k in found if k is not None and k.kind == kind and k.signal == signal and k.instance is None)
