"""Which policy each role instance trains: SP, IP per role type, IP per instance, or custom groups.

Placement is the engine's business (one LoRA adapter per policy on a shared base model for the
local engine). Policy ids are readable: "shared", the role name, "voter_1", or a group name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from harness.config import GRAPH_SHARING_MODES, ConfigError

RoleInstance = Tuple[str, int]


@dataclass(frozen=True)
class PolicyMap:
    mode: str
    assignment: Dict[RoleInstance, str]

    def policy_of(self, role: str, instance: int) -> str:
        return self.assignment[(role, instance)]

    @property
    def policies(self) -> List[str]:
        return sorted(set(self.assignment.values()))

    def members(self, policy: str) -> List[RoleInstance]:
        return [ri for ri, p in self.assignment.items() if p == policy]

    @classmethod
    def from_config(cls, cfg, role_instances: Sequence[RoleInstance],
                    maps: Optional[Dict[str, Dict[str, List[str]]]] = None) -> "PolicyMap":
        """`maps` are the workflow's own groupings by mode: `partial` (UnityMAS-O's partial sharing,
        e.g. M-ASK's search-behaviour agents on one model and its knowledge agents on another) and
        `paper` (the agents-to-models mapping UnityMAS-O's paper trains each workflow with)."""
        mode = cfg.sharing
        if getattr(cfg, "models", None):  # UnityMAS-O's phi: each model instance is one policy
            return cls("models", _custom({name: list(m.roles) for name, m in cfg.models.items()}, role_instances))
        if cfg.topology == "single":
            mode = "sp"  # one role: every mode is the same single policy
        if mode == "sp":
            return cls(mode, {ri: "shared" for ri in role_instances})
        if mode == "ip":
            return cls(mode, {(r, i): r for r, i in role_instances})
        if mode == "ip_instance":
            counts: Dict[str, int] = {}
            for r, _ in role_instances:
                counts[r] = counts.get(r, 0) + 1
            return cls(mode, {(r, i): (r if counts[r] == 1 else f"{r}_{i}") for r, i in role_instances})
        if mode == "custom":
            return cls(mode, _custom(cfg.sharing_cfg.groups, role_instances))
        if mode in GRAPH_SHARING_MODES:
            groups = (maps or {}).get(mode)
            if not groups:
                raise ConfigError(f"sharing={mode} needs a workflow graph that declares its {mode}: groups; "
                                  f"topology {cfg.topology} declares none (use sp, ip, ip_instance or custom)")
            return cls(mode, _custom(groups, role_instances, f"sharing={mode}"))
        raise ConfigError(f"unknown sharing mode '{mode}'")


def _custom(groups: Dict[str, List[str]], role_instances: Sequence[RoleInstance],
            where: str = "sharing=custom") -> Dict[RoleInstance, str]:
    """Members are 'role' (all its instances) or 'role:instance'; each instance in exactly one group.
    `where` names the groups' source in the message (custom's or a graph's own)."""
    assignment: Dict[RoleInstance, str] = {}
    known = {f"{r}:{i}" for r, i in role_instances} | {r for r, _ in role_instances}
    for policy, members in groups.items():
        for member in members:
            if member not in known:
                raise ConfigError(f"sharing group '{policy}' names '{member}', not a role of this topology; "
                                  f"valid: {', '.join(sorted(known))}")
            for r, i in role_instances:
                if member in (r, f"{r}:{i}"):
                    if (r, i) in assignment and assignment[(r, i)] != policy:
                        raise ConfigError(f"{r}:{i} is in two sharing groups: {assignment[(r, i)]}, {policy}")
                    assignment[(r, i)] = policy
    missing = [f"{r}:{i}" for r, i in role_instances if (r, i) not in assignment]
    if missing:
        raise ConfigError(f"{where} leaves {', '.join(missing)} without a policy; add them to a group")
    return assignment
