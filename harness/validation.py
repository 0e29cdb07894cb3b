"""Is a cell's config runnable? Checked before anything touches the disk, by `harness.run` and
by the grid (launch and dry run) alike, so a bad override never leaves a run directory behind.

`load_config` composes CLI overrides with Hydra, `config_from_dict` takes the grid's nested
overrides; both end in `validate`: first every field against its declared choices and range
(`check_fields`, declared beside each field in config.py), then the rules between sections and
against the registries of models, tasks and workflows: token budgets against the model's positions,
data files, the root and the code jail. Every failure is one ConfigError whose message names the
valid choices.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import is_dataclass
from enum import EnumMeta
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Optional, Sequence, Union, get_args, get_origin, get_type_hints

from omegaconf import OmegaConf

from harness.cli_overrides import close_keys
from harness.config import (GRAPH_TOPOLOGIES, MONITORED, TOPOLOGIES, DEFAULT_PROMPTS, CellConfig, ConfigError,
                            check_fields, default_cell_id, kl_in_loss, register_configs, unknown_choice)
from harness.mitigations import apply_mitigations, mitigation_names
from harness.models import SCALES, RandomQwen3, is_tiny, positions_of, resolve_model_path
from harness.sharing import PolicyMap
from harness.tasks import CODE_TASKS, NEEDS_PATH, WARMUP_TASKS
from harness.tasks.jail import JailUnavailable, find_jail
from harness.tasks.qa_synth import SEARCH_WORKFLOWS
from harness.workflows import build_workflow
from harness.workflows.graph import apply_graph_rewards, is_graph_topology
from harness.workflows.prompts import apply_prompt_set


def load_config(overrides: Sequence[str]) -> CellConfig:
    """Compose the cell config from CLI overrides with Hydra; raise ConfigError on any mistake."""
    from hydra import compose, initialize
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.cli_overrides import OverrideError, check_overrides

    try:
        check_overrides(overrides, CellConfig)
    except OverrideError as exc:
        raise ConfigError(str(exc)) from None
    register_configs()
    try:
        with initialize(version_base=None, config_path=None):
            composed = compose(config_name="cell", overrides=_free_dicts_set_or_added(overrides))
        cfg: CellConfig = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_override_error(exc)) from None
    return _complete(cfg)


def _free_dicts_set_or_added(overrides: Sequence[str]) -> list:
    """A key in or at a free-form dict (`workflow.prompts.<name>=...`, `algo.kl_coef_per_role={voter: 0.1}`)
    is set or added (`++`): Hydra's struct would ask for `+` where the defaults lack the name;
    validate() checks the names (a template against the workflow's, a role against the topology's)."""
    from harness.cli_overrides import in_free_dict

    return [f"++{o}" if not o.startswith("+") and "=" in o and in_free_dict(o.split("=", 1)[0], CellConfig) else o
            for o in overrides]


def config_from_dict(values: dict) -> CellConfig:
    """A cell config from nested overrides (the grid's way in): same schema, types and validation.
    Plain, well-typed values take a direct path (a sweep of 1,000 cells is checked in seconds);
    anything else goes through OmegaConf, which converts it or says what is wrong."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = _build(CellConfig, values)
    except _NotPlain:
        try:
            merged = OmegaConf.merge(OmegaConf.structured(CellConfig), OmegaConf.create(values))
            cfg = OmegaConf.to_object(merged)
        except (OmegaConfBaseException, ValueError) as exc:
            raise ConfigError(f"bad cell config: {str(exc).splitlines()[0]}") from None
    return _complete(cfg)


class _NotPlain(Exception):
    """A value the direct path does not take as it is (OmegaConf decides)."""


def _complete(cfg: CellConfig) -> CellConfig:
    """What both ways in do after reading: the mitigations' knobs, the model family's prompts,
    the default id, validation."""
    apply_mitigations(cfg, _role_contracts(cfg))
    if cfg.monitors.action is not None:  # one switch for every detector, stored per detector
        for name in MONITORED:
            getattr(cfg.monitors, name).action = cfg.monitors.action
    apply_prompt_set(cfg.workflow, cfg.scale, "code" if cfg.task in CODE_TASKS else "math")
    apply_graph_rewards(cfg)
    if cfg.reward.outcome_share_mode == "auto":  # cell.yaml records the mode the cell trains with
        from harness.rewards import resolved_share_mode
        cfg.reward.outcome_share_mode = resolved_share_mode("auto", cfg.algo.adv_estimator, cfg.algo.gae_scope)
    if cfg.reward.outcome_metric == "auto":
        cfg.reward.outcome_metric = "f1" if cfg.task in QA_TASKS else "exact"
    if not cfg.cell_id:
        cfg.cell_id = default_cell_id(cfg)
    validate(cfg)
    return cfg


def _role_contracts(cfg: CellConfig) -> Optional[Dict[str, str]]:
    """role -> contract of the cell's workflow, or None where the workflow cannot be built yet
    (validate() then reports why)."""
    from harness.monitors.roles import contracts_of

    try:
        return contracts_of(build_workflow(cfg))
    except Exception:  # noqa: BLE001 - any problem of the workflow is validate()'s to report
        return None


@lru_cache(maxsize=None)
def _fields(cls) -> Dict[str, Any]:
    return get_type_hints(cls)


def _build(cls, values: Any):
    """`cls`'s defaults merged with `values` as OmegaConf merges them (dicts key by key, lists
    replaced), for values that already have their field's exact type; _NotPlain otherwise."""
    if not isinstance(values, dict):
        raise _NotPlain
    hints = _fields(cls)
    obj = cls()
    for key, value in values.items():
        if key not in hints:
            raise _NotPlain
        setattr(obj, key, _convert(hints[key], value, getattr(obj, key)))
    return obj


def _convert(kind: Any, value: Any, current: Any) -> Any:
    if is_dataclass(kind):
        return _build(kind, value)
    origin, args = get_origin(kind), get_args(kind)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return copy.deepcopy(value)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if isinstance(kind, EnumMeta) and isinstance(value, str):  # a choice: its member; check_fields names the valid ones
        return kind[value] if value in kind.__members__ else value
    if origin is dict and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        merged = dict(current or {})
        for key, item in value.items():
            merged[key] = _convert(args[1], item, merged.get(key))
        return merged
    if origin is list and isinstance(value, list):
        return [_convert(args[0], item, None) for item in value]
    raise _NotPlain


def _override_error(exc: BaseException) -> str:
    """Hydra's message, its cause, and the valid keys of the config node the override missed."""
    text = str(exc).splitlines() or [type(exc).__name__]
    lines = [text[0]]
    cause = str(exc.__cause__ or "")
    if cause:
        lines[0] += f": {cause.splitlines()[0]}"
    kind, key = getattr(exc.__cause__, "object_type", None), getattr(exc.__cause__, "key", None)
    if is_dataclass(kind) and "expected one of" in cause:  # a typed choice: check_fields' own message
        try:
            check_fields(kind(**{key: exc.__cause__.value}), exc.__cause__.full_key[:-len(key)])
        except ConfigError as choice:
            return str(choice)
    match = re.search(r"full_key: (\S+)", cause)
    if match and " not in " in cause:  # an unknown key: the closest dotted keys, and which keys exist there
        from harness.cli_overrides import closest_dotted

        full = match.group(1)
        parent = full.rpartition(".")[0]
        node = OmegaConf.select(OmegaConf.structured(CellConfig), parent) if parent else OmegaConf.structured(CellConfig)
        if node is not None and hasattr(node, "keys") and OmegaConf.get_type(node) is not dict:
            return (f"bad override: unknown key '{full}'{closest_dotted(full, CellConfig)} (valid keys"
                    f"{' of ' + parent if parent else ''}: {', '.join(map(str, node.keys()))}; every key: --help)")
    lines += [f"  {line}" for line in text[1:] if line.startswith("To append")]  # a new key in a dict
    return "bad override: " + "\n".join(lines)


def _check_data(cfg: CellConfig) -> None:
    """The data files exist and are readable; the split and the validation file's loader make sense."""
    for key in ("path", "val_path"):
        value = getattr(cfg.data, key)
        if not value:
            continue
        data = Path(value).expanduser()
        if not data.is_file():
            raise ConfigError(f"data.{key} {value} does not exist")
        if not os.access(data, os.R_OK) or data.stat().st_size == 0:
            raise ConfigError(f"data.{key} {value} is {'empty' if os.access(data, os.R_OK) else 'not readable'}")
    if cfg.data.runtime_results and not Path(cfg.data.runtime_results).is_file():
        raise ConfigError(f"data.runtime_results: no file at {cfg.data.runtime_results}")
    if cfg.data.split == "hf" and not (math.isfinite(cfg.data.test_size) and cfg.data.test_size > 0):
        raise ConfigError(f"data.test_size must be a fraction in (0, 1) or a count >= 1, got {cfg.data.test_size}")
    if cfg.data.val_task is not None:
        if (cfg.data.val_task in CODE_TASKS) != (cfg.task in CODE_TASKS):
            raise ConfigError(f"data.val_task {cfg.data.val_task} is graded differently from task {cfg.task}: "
                              f"give a validation set of the same kind")
        if not cfg.data.val_path:
            raise ConfigError("data.val_task names the loader of data.val_path, which is not set")


def _check_numbers(cfg: CellConfig) -> None:
    """The numbers in lists and free-form dicts (the fields' own ranges are check_fields')."""
    betas = list(cfg.algo.adam_betas)
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"algo.adam_betas must be two numbers in [0, 1), got {betas}")
    for role, beta in cfg.algo.kl_coef_per_role.items():
        if not isinstance(beta, (int, float)) or not (math.isfinite(beta) and beta >= 0):
            raise ConfigError(f"algo.kl_coef_per_role.{role} must be a finite number >= 0, got {beta}")
    for role, weights in cfg.reward.per_role.items():
        for term, value in weights.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"reward.per_role.{role}.{term} must be a finite number, got {value}")


def _check_root(root: str) -> None:
    """The run directory's root must be creatable and writable (checked without creating it)."""
    path = Path(root).expanduser().absolute()
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"root={root} cannot be written ({existing} is not a writable directory)")


def _check_budgets(cfg: CellConfig, model_path: Optional[Path]) -> None:
    """Token budgets must leave room for a prompt within the model's positions."""
    positions = positions_of(cfg.scale)
    if positions is None and model_path is not None and (Path(model_path) / "config.json").is_file():
        positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings")
    budgets = {"workflow.max_new_tokens": cfg.workflow.max_new_tokens,
               **{f"workflow.role_max_new_tokens.{r}": v for r, v in cfg.workflow.role_max_new_tokens.items()}}
    for name, value in budgets.items():
        if value < 1 or (positions and value >= positions):
            raise ConfigError(f"{name}={value} must be >= 1 and below the model's {positions} positions")


def _check_models(cfg: CellConfig) -> None:
    """`models:` (several model instances): each instance's base, training mode and roles."""
    from harness.engines.multi import instance_config

    if cfg.engine == "verl" and any(spec.train == "full" for spec in cfg.models.values()):
        raise ConfigError("engine=verl trains LoRA adapters; a models: instance with train=full needs engine=local")
    if cfg.sharing != "custom" or cfg.sharing_cfg.groups:
        raise ConfigError("models: maps the roles to model instances itself: use sharing=custom without sharing_cfg.groups")
    if cfg.algo.clip_scope == "cell":
        raise ConfigError("algo.clip_scope=cell takes one norm over one engine's policies; with models: use policy")
    for name, spec in cfg.models.items():
        where = f"models.{name}"
        if not spec.roles or any(":" in r for r in spec.roles):
            raise ConfigError(f"{where}.roles must list whole roles (a role is played by one instance), got {spec.roles}")
        if spec.train == "full" and kl_in_loss(cfg.algo):
            raise ConfigError(f"{where}.train=full changes the base the KL term needs: use lora, or algo.kl_coef=0")
        if is_tiny(spec.scale) and cfg.task not in WARMUP_TASKS:
            raise ConfigError(f"{where}: tiny scale {spec.scale} has no warm-up for task {cfg.task}")
        resolve_model_path(instance_config(cfg, name))  # a missing checkpoint: ConfigError


def validate(cfg: CellConfig) -> None:
    """Raise ConfigError for anything that would fail later; touches nothing on disk but model paths."""
    if not is_graph_topology(cfg.topology) and cfg.topology not in TOPOLOGIES + GRAPH_TOPOLOGIES:
        raise unknown_choice("topology", cfg.topology,
                             TOPOLOGIES + GRAPH_TOPOLOGIES + ("graph:<name>", "<path to a workflow graph .yaml>"))
    check_fields(cfg)
    _check_numbers(cfg)
    if cfg.local.device == "cuda" and cfg.engine == "local":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("local.device=cuda but torch sees no GPU here; use local.device=auto or cpu")
    if cfg.local.rollout == "vllm":
        from harness.engines.vllm_rollout import check_config  # its environment, engine=local, LoRA adapters
        check_config(cfg)
    if cfg.verl.rollout == "vllm" and cfg.verl.device == "cpu":
        raise ConfigError("verl.rollout=vllm needs a GPU; on a CPU use verl.rollout=hf (or auto)")
    if cfg.verl.rollout_tp < 1 or cfg.verl.gpus_per_policy % cfg.verl.rollout_tp:
        raise ConfigError(f"verl.rollout_tp={cfg.verl.rollout_tp} must divide verl.gpus_per_policy={cfg.verl.gpus_per_policy}")
    if cfg.engine == "verl" and cfg.sharing_cfg.full_finetune:
        raise ConfigError("engine=verl trains LoRA adapters; sharing_cfg.full_finetune=true needs engine=local")
    if cfg.reward.outcome_metric == "f1" and cfg.task not in QA_TASKS:
        raise ConfigError(f"reward.outcome_metric=f1 is token F1 of a QA answer; task {cfg.task} has none: use "
                          f"exact, or a QA task ({', '.join(sorted(QA_TASKS))})")
    if cfg.algo.adv_estimator == "gae" and cfg.reward.gamma < 1 and cfg.algo.gae_gamma < 1:
        raise ConfigError("reward.gamma and algo.gae_gamma would both discount the workflow's stages: set one of them to 1")
    if cfg.reward.allocator:
        from harness.rewards import load_allocator

        try:
            load_allocator(cfg.reward.allocator)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    mitigation_names(cfg.mitigation)
    for where, mapping in (("monitors.mitigations", cfg.monitors.mitigations),
                           ("monitors.controls", cfg.monitors.controls)):
        for kind, names in mapping.items():
            try:
                mitigation_names(names)
            except ConfigError as exc:
                raise ConfigError(f"{where}.{kind}: {exc}") from None
    mitigating = [n for n in MONITORED if getattr(cfg.monitors, n).action == "mitigate"]
    if mitigating and (cfg.engine != "local" or cfg.models):
        raise ConfigError(f"action=mitigate (monitors.{mitigating[0]}.action) switches a running cell's settings, "
                          f"which only the single-model local engine reads live; use engine=local without models=, "
                          f"or branch the run with python -m harness.intervene")
    branched = [name for name, value in (("sharing_cfg.split_from", cfg.sharing_cfg.split_from),
                                         ("algo.frozen_policies", cfg.algo.frozen_policies)) if value]
    if branched and (cfg.engine != "local" or cfg.models or cfg.algo.adv_estimator != "grpo"):
        raise ConfigError(f"{branched[0]} (a diagnosis arm) needs engine=local without models= and algo.adv_estimator=grpo")
    if cfg.algo.coherence_damping:
        bad = {p: w for p, w in cfg.algo.coherence_damping.items() if not (math.isfinite(float(w)) and 0 <= float(w) <= 1)}
        if bad:
            policy, weight = next(iter(bad.items()))
            raise ConfigError(f"algo.coherence_damping.{policy}={weight}: a weight is in [0, 1] (upstream advises <= 0.3)")
        if cfg.engine != "local" or cfg.models:
            raise ConfigError("algo.coherence_damping (the study's I6) runs on engine=local without models=")
    if cfg.monitors.learned.enabled:
        from harness.monitors.learned import DEFAULT_MODEL

        model = Path(cfg.monitors.learned.model) if cfg.monitors.learned.model else DEFAULT_MODEL
        if not model.is_file():
            raise ConfigError(f"monitors.learned.enabled: no model at {model}; give monitors.learned.model=<its JSON> "
                              f"(python -m analysis.studies render fits harness/monitors/learned.json)")
    from harness.wandb_sink import WANDB_MODES, wandb_settings

    if (mode := wandb_settings(cfg)["mode"]) not in WANDB_MODES:
        raise unknown_choice("wandb mode (wandb.mode, else $WANDB_MODE)", mode, WANDB_MODES)
    if cfg.sharing_cfg.full_finetune and kl_in_loss(cfg.algo):
        raise ConfigError("algo.kl_coef > 0 needs the base model as reference, which full fine-tuning changes; "
                          "use an adapter (sharing_cfg.full_finetune=false)")
    if cfg.sharing_cfg.full_finetune and cfg.sharing != "sp":
        raise ConfigError("sharing_cfg.full_finetune=true needs sharing=sp (one shared policy)")
    if cfg.sharing == "custom" and not cfg.sharing_cfg.groups and not cfg.models:
        raise ConfigError("sharing=custom needs sharing_cfg.groups, e.g. "
                          "'sharing_cfg.groups={a:[voter],b:[aggregator]}'")
    if cfg.task in CODE_TASKS and not cfg.sandbox.unsafe:  # fail closed: no jail, no code task
        try:
            find_jail()
        except JailUnavailable as exc:
            raise ConfigError(str(exc)) from None

    if is_tiny(cfg.scale) and cfg.task not in WARMUP_TASKS:
        raise ConfigError(f"scale {cfg.scale} is a tiny model warmed up on its task; task {cfg.task} has no warm-up: "
                          f"use task {' or '.join(WARMUP_TASKS)}, or a qwen3-* scale")
    _check_workflow_task(cfg)
    _check_data(cfg)
    _check_root(cfg.root)
    if cfg.task in NEEDS_PATH and not cfg.data.path:
        raise ConfigError(f"task {cfg.task} needs data.path=/path/to/problems.jsonl")
    model_path = resolve_model_path(cfg)  # raises ConfigError for a missing checkpoint dir
    if cfg.models:
        _check_models(cfg)
    if isinstance(SCALES[cfg.scale], RandomQwen3):
        from harness import qwen3_tokenizer

        reason = qwen3_tokenizer.problem()
        if reason:
            raise ConfigError(f"scale {cfg.scale}: {reason}")
    _check_budgets(cfg, model_path)
    # the workflow checks its own roles against sharing groups and prompt overrides
    workflow = build_workflow(cfg)
    if cfg.workflow.chat == "auto":  # cell.yaml records how the prompts reach the model (harness/chat.py)
        cfg.workflow.chat = workflow.chat
    policies = PolicyMap.from_config(cfg, workflow.role_instances(), workflow.sharing_maps()).policies
    for where, named in (("sharing_cfg.split_from", list(cfg.sharing_cfg.split_from)),
                         ("algo.frozen_policies", list(cfg.algo.frozen_policies))):
        unknown = sorted(set(named) - set(policies))
        if unknown:
            raise ConfigError(f"{where} names {', '.join(unknown)}, not a policy of this cell; its policies: "
                              f"{', '.join(policies)}")
    if hasattr(workflow, "check_templates"):  # a graph: every node's template must exist
        workflow.check_templates(cfg.workflow.prompts)
    _check_prompt_names(cfg, workflow)
    _check_role_settings(cfg, workflow)
    # per-role settings may name roles of other topologies (one sweep, many topologies), not typos
    known = sorted({r.name for t in TOPOLOGIES for r in build_workflow(SimpleNamespace(topology=t, workflow=cfg.workflow)).roles()}
                   | {r.name for r in workflow.roles()})
    for where, roles in (("workflow.role_max_new_tokens", cfg.workflow.role_max_new_tokens),
                         ("reward.per_role", cfg.reward.per_role)):
        unknown = sorted(set(roles) - set(known))
        if unknown:
            raise ConfigError(f"{where} names unknown role(s) {', '.join(unknown)}; valid roles: {', '.join(known)}")


def _check_prompt_names(cfg: CellConfig, workflow) -> None:
    """Every `workflow.prompts.<name>` names a template: a built-in topology's (one sweep may set them
    for many topologies) or one of the workflow's own; a typo would leave the turn's prompt as it was."""
    own = workflow.template_names()
    unknown = sorted(set(cfg.workflow.prompts) - set(DEFAULT_PROMPTS) - set(own))
    if not unknown:
        return
    name = unknown[0]
    if own:
        raise ConfigError(f"workflow.prompts.{name}: workflow graph {workflow.name} has no prompt template '{name}'; "
                          f"its templates: {', '.join(own)} (the built-in topologies' {', '.join(DEFAULT_PROMPTS)} "
                          f"are taken too){close_keys(name, own)}")
    raise ConfigError(f"workflow.prompts.{name}: topology {cfg.topology} has no prompt template '{name}'; valid keys "
                      f"of workflow.prompts: {', '.join(DEFAULT_PROMPTS)}{close_keys(name, list(DEFAULT_PROMPTS))}")


def _check_role_settings(cfg: CellConfig, workflow) -> None:
    """A monitor or mitigation setting that names roles must name roles of this workflow: a typo
    (or another topology's role) would leave the detector or the mitigation silently doing nothing."""
    roles = sorted(r.name for r in workflow.roles())
    for where, named in (("monitors.capture.pressure_roles", cfg.monitors.capture.pressure_roles),
                         ("monitors.drift.roles", cfg.monitors.drift.roles),
                         ("algo.kl_coef_per_role", list(cfg.algo.kl_coef_per_role))):
        unknown = sorted(set(named) - set(roles))
        if unknown:
            raise ConfigError(f"{where} names {', '.join(unknown)}, which topology {cfg.topology} does not have; "
                              f"its roles: {', '.join(roles)}")


QA_TASKS = ("qa-synth", "nq", "hotpotqa")


def _check_workflow_task(cfg) -> None:
    """UnityMAS-O's workflows need their kind of task: search QA for A-C (with a corpus to search),
    the synthetic code task for D; and the generated QA world warms up only its own roles."""
    if cfg.topology in SEARCH_WORKFLOWS and cfg.task not in QA_TASKS:
        raise ConfigError(f"topology {cfg.topology} searches passages for a question: use task {', '.join(QA_TASKS)}")
    if cfg.topology in SEARCH_WORKFLOWS and cfg.task in ("nq", "hotpotqa"):
        if not cfg.data.corpus:
            raise ConfigError(f"topology {cfg.topology} with task {cfg.task} needs data.corpus=/path/to/passages.jsonl")
        if not Path(cfg.data.corpus).expanduser().is_file():
            raise ConfigError(f"data.corpus {cfg.data.corpus} does not exist")
    if cfg.topology == "reflective_code" and cfg.task not in ("code-synth", "mbpp", "deepcoder"):
        raise ConfigError("topology reflective_code runs the coder's program on the examples the question shows: "
                          "use task code-synth, mbpp or deepcoder")
    if cfg.task == "qa-synth" and cfg.topology in ("eval_opt", "voting", "orch_workers"):
        raise ConfigError(f"task qa-synth's warm-up teaches the search roles, not {cfg.topology}'s: use topology single, "
                          f"{', '.join(SEARCH_WORKFLOWS)}")
