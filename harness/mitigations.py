"""Mitigations of the two failure modes, chosen per cell as `mitigation=<name>[+<name>...]` and so
usable as a grid axis (`sweep.extra_axes: {mitigation: [none, role_count_scaling]}`).

Each name sets the knobs that implement it (they can also be set directly):

| mitigation | against | knobs | what the update does |
| --- | --- | --- | --- |
| `role_count_scaling` | amplification (IP) | `algo.role_count_scaling=true` | a policy trained by n same-type instances (3 voters) cuts its rows into mini-batches of n x `ppo_mini_batch_size` problems, so it takes the optimizer steps one instance would (each on all n instances' rows). A loss weight of 1/n would not do it: Adam divides the scale out, so the step count is what moves the adapter |
| `coherence_reg` | amplification (IP) | `algo.coherence_reg=1.0` (λ, if 0) | each optimizer step's lr is divided by the design effect d = max(1, 1 + λ(c − 1)) of the step's same-type instances, c = ‖Σg_i‖²/Σ‖g_i‖² (1 orthogonal, n aligned): the coherent part of n instances' push counts once (harness/algo/coherence.py) |
| `kl_anchor` | amplification, capture | `algo.kl_coef=0.05` (if 0), per role `algo.kl_coef_per_role.<role>` | loss += β_role · KL(π_θ ‖ π_base) per token (verl's low-variance estimator), the base being the adapter switched off |
| `lr_half` | nothing in particular (a control) | `algo.lr_factor=0.5` (if 1) | every optimizer step half as long: the update's size changes, aimed at no cause |
| `role_balanced` | capture (SP) | `algo.loss_agg=role-balanced` | L = (1/|R|) Σ_r token-mean over role r's tokens, so a role's weight no longer grows with its tokens |
| `agent_norm` | capture (SP) | `algo.adv_norm=agent` | A = (s − mean of the group's scores of that role) / std of the role's scores over the whole batch (Dr. MAS), instead of the group's own std |
| `length_penalty` | capture (SP) | `reward.per_role.<role>.length=-0.05` for the judging roles (their contract a verdict, an index, a plan or a search action: the evaluator, aggregator, orchestrator, verifier, decomposer, ...) unless set | r_turn −= 0.05 per response token of a judging role |
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional

from harness.config import CellConfig, ConfigError
from harness.monitors.roles import judging_roles

KL_ANCHOR_BETA = 0.05
COHERENCE_REG = 1.0
LENGTH_PENALTY = -0.05
LR_HALF = 0.5


def _role_count_scaling(cfg: CellConfig) -> None:
    cfg.algo.role_count_scaling = True


def _coherence_reg(cfg: CellConfig) -> None:
    if cfg.algo.coherence_reg == 0:  # unset; a bad value is left for validation to reject
        cfg.algo.coherence_reg = COHERENCE_REG


def _kl_anchor(cfg: CellConfig) -> None:
    if cfg.algo.kl_coef == 0:  # unset; a bad value is left for validation to reject
        cfg.algo.kl_coef = KL_ANCHOR_BETA


def _lr_half(cfg: CellConfig) -> None:
    if cfg.algo.lr_factor == 1.0:  # unset; a value set by hand stays
        cfg.algo.lr_factor = LR_HALF


def _role_balanced(cfg: CellConfig) -> None:
    cfg.algo.loss_agg = "role-balanced"


def _agent_norm(cfg: CellConfig) -> None:
    cfg.algo.adv_norm = "agent"


def _length_penalty(cfg: CellConfig, role_contracts: Optional[Mapping[str, str]] = None) -> None:
    for role in judging_roles(role_contracts):
        weights = dict(cfg.reward.per_role.get(role, {}))
        weights.setdefault("length", LENGTH_PENALTY)
        cfg.reward.per_role[role] = weights


MITIGATIONS: Dict[str, Callable[[CellConfig], None]] = {
    "none": lambda cfg: None,
    "role_count_scaling": _role_count_scaling,
    "coherence_reg": _coherence_reg,
    "kl_anchor": _kl_anchor,
    "lr_half": _lr_half,
    "role_balanced": _role_balanced,
    "agent_norm": _agent_norm,
    "length_penalty": _length_penalty,
}


def mitigation_names(value: str) -> List[str]:
    names = [n.strip() for n in str(value).split("+") if n.strip()] or ["none"]
    unknown = [n for n in names if n not in MITIGATIONS]
    if unknown:
        raise ConfigError(f"unknown mitigation '{unknown[0]}'; valid choices: {', '.join(MITIGATIONS)} "
                          f"(several joined by '+')")
    return names


def apply_mitigations(cfg: CellConfig, role_contracts: Optional[Mapping[str, str]] = None) -> None:
    """Set the knobs of every mitigation named in cfg.mitigation (idempotent). `role_contracts`
    (role -> contract, from the cell's workflow) tells length_penalty which roles judge."""
    switch_on(cfg, cfg.mitigation, role_contracts)


def switch_on(cfg: CellConfig, names: str, role_contracts: Optional[Mapping[str, str]] = None) -> List[str]:
    """Set the knobs of the mitigations `names` ('a+b') names, in place: at build time for the cell's
    own, or mid-run for a running cell's `action=mitigate` (the engine and controller read these knobs
    at every step). Returns the names."""
    chosen = mitigation_names(names)
    for name in chosen:
        if name == "length_penalty":
            _length_penalty(cfg, role_contracts)
        else:
            MITIGATIONS[name](cfg)
    return chosen
