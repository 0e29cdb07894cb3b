"""The failure mechanisms a diagnosis can remove, one arm each (harness.diagnose).

Each mechanism builds the config of an arm that, from the branch point on, removes only that
mechanism from a run: un-sharing a policy several instances of one role push (amplification),
un-sharing a policy several roles share (capture), holding a judging role to its early length or
freezing it (a judging role paid for length), or slowing every update down (the non-specific
control: a mechanism is only named when its arm does more than slowing down does). A mechanism
that does not apply to a run (nothing to un-share in a single agent) says why.

The registry is open: `register(Mechanism(...))` from your own module, and name it on the command
line as `package.module:OBJECT` (harness.imports) or by its name once registered.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness.config import CellConfig, ConfigError
from harness.monitors.roles import judging_roles
from harness.metric_keys import role_key

HOLD_COEF = 0.05  # reward per token of a judging role's distance from its early mean length
EARLY_STEPS = 20  # the early band a held length is taken from: the run's first steps


@dataclass(frozen=True)
class ArmContext:
    """What an arm builder reads of the run it branches: its config, policy -> (role, instance) members,
    role -> contract, and its metrics records before the branch."""

    parent: CellConfig
    members: Dict[str, List[Tuple[str, int]]]
    contracts: Dict[str, str]
    records: Sequence[dict]


@dataclass(frozen=True)
class Mechanism:
    name: str
    names: str  # the failure mechanism its arm removes: amplification | capture | length drift | generic
    removes: str  # what the arm changes, in words
    applies: Callable[[ArmContext], Optional[str]]  # None where it applies, else why not
    build: Callable[[dict, ArmContext], None]  # edits the arm's config values (a nested dict) in place

    @property
    def specific(self) -> bool:
        return self.names != "generic"


def _one_role_pools(ctx: ArmContext) -> Dict[str, List[Tuple[str, int]]]:
    """Policies pushed by several instances of one role and nothing else (IP Voting's voter adapter)."""
    return {p: m for p, m in ctx.members.items() if len(m) > 1 and len({r for r, _ in m}) == 1}


def _shared_by_roles(ctx: ArmContext) -> Dict[str, List[Tuple[str, int]]]:
    return {p: m for p, m in ctx.members.items() if len({r for r, _ in m}) > 1}


def _split(values: dict, ctx: ArmContext, groups: Dict[str, List[str]], sources: Dict[str, str]) -> None:
    """The arm's policies as custom groups (members `role:instance`), each new one copying its source."""
    kept = {p: [f"{r}:{i}" for r, i in m] for p, m in ctx.members.items() if p not in set(sources.values())}
    values["sharing"] = "custom"
    values.setdefault("sharing_cfg", {})
    values["sharing_cfg"]["groups"] = {**kept, **groups}
    values["sharing_cfg"]["split_from"] = dict(sources)


def _unshare_instances(values: dict, ctx: ArmContext) -> None:
    groups, sources = {}, {}
    for policy, members in _one_role_pools(ctx).items():
        for role, instance in members:
            groups[f"{policy}_{instance}"] = [f"{role}:{instance}"]
            sources[f"{policy}_{instance}"] = policy
    _split(values, ctx, groups, sources)


def _unshare_roles(values: dict, ctx: ArmContext) -> None:
    groups, sources = {}, {}
    taken = set(ctx.members)
    for policy, members in _shared_by_roles(ctx).items():
        for role in sorted({r for r, _ in members}):
            name = role if role not in taken else f"{policy}_{role}"
            groups[name] = [f"{r}:{i}" for r, i in members if r == role]
            sources[name] = policy
    _split(values, ctx, groups, sources)


def _mitigation(values: dict, name: str) -> None:
    own = [n for n in str(values.get("mitigation") or "none").split("+") if n != "none"]
    values["mitigation"] = "+".join(own + [n for n in name.split("+") if n not in own])


def _judges(ctx: ArmContext) -> List[str]:
    return [r for r in judging_roles(ctx.contracts) if r in {role for m in ctx.members.values() for role, _ in m}]


def early_length(records: Sequence[dict], role: str, steps: int = EARLY_STEPS) -> Optional[float]:
    lengths = [r[role_key(role, "response_length")] for r in records[:steps]
               if isinstance(r.get(role_key(role, "response_length")), (int, float))]
    return fmean(lengths) if lengths else None


def _hold_length(values: dict, ctx: ArmContext) -> None:
    per_role = values.setdefault("reward", {}).setdefault("per_role", {})
    for role in _judges(ctx):
        target = early_length(ctx.records, role)
        if target is not None:
            per_role[role] = {**per_role.get(role, {}), "length_hold": HOLD_COEF, "length_target": round(target, 4)}


def _own_judge_policies(ctx: ArmContext) -> List[str]:
    judges = set(_judges(ctx))
    return sorted(p for p, m in ctx.members.items() if {r for r, _ in m} <= judges)


def _freeze_judge(values: dict, ctx: ArmContext) -> None:
    values.setdefault("algo", {})["frozen_policies"] = _own_judge_policies(ctx)


MECHANISMS: Dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    MECHANISMS[mechanism.name] = mechanism
    return mechanism


register(Mechanism(
    "unshare_instances", "amplification",
    "every instance of a role that pushed one adapter gets its own copy of it (and of its optimizer state)",
    lambda ctx: None if _one_role_pools(ctx) else "no policy is pushed by several instances of one role",
    _unshare_instances))
register(Mechanism(
    "role_count_scaling", "amplification",
    "a policy pushed by n instances takes the optimizer steps one instance would (mitigation role_count_scaling)",
    lambda ctx: None if any(len(m) > 1 for m in ctx.members.values()) else "no policy has several instances",
    lambda values, ctx: _mitigation(values, "role_count_scaling")))
register(Mechanism(
    "unshare_roles", "capture",
    "a policy several roles share is copied into one policy per role",
    lambda ctx: None if _shared_by_roles(ctx) else "no policy is shared by several roles",
    _unshare_roles))
register(Mechanism(
    "hold_length", "length drift",
    f"each judging role is paid {HOLD_COEF} per token of distance from its own early mean length (first {EARLY_STEPS} steps)",
    lambda ctx: None if _judges(ctx) else "no judging role (a verdict, an index, a plan or a search action)",
    _hold_length))
register(Mechanism(
    "freeze_judge", "length drift",
    "the policies of the judging roles alone stop training (they keep sampling)",
    lambda ctx: None if _own_judge_policies(ctx) else "no policy trains judging roles alone",
    _freeze_judge))
register(Mechanism(
    "slow_down", "generic",
    "every update slowed: a KL anchor to the base and half the learning rate (the non-specific control)",
    lambda ctx: None, lambda values, ctx: _mitigation(values, "kl_anchor+lr_half")))

GENERIC = "slow_down"


def mechanism_named(name: str) -> Mechanism:
    """A registered mechanism, or `package.module:OBJECT` (a Mechanism, registered on import)."""
    if name in MECHANISMS:
        return MECHANISMS[name]
    if ":" in name:
        from harness.imports import import_object

        found = import_object(name, "a diagnosis mechanism")
        if not isinstance(found, Mechanism):
            raise ConfigError(f"mechanism '{name}' is not a harness.mechanisms.Mechanism")
        return register(found)
    raise ConfigError(f"unknown mechanism '{name}'; valid: {', '.join(MECHANISMS)} or package.module:OBJECT")
