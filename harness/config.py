"""Dataclass schemas for one cell, registered in Hydra's ConfigStore.

Every knob is a field here, so every knob is overridable from the command line
(`python -m harness.run algo.lr=5e-4 workflow.n_votes=5`). Plain data: this module imports
nothing else of the harness, and Hydra and OmegaConf only where a config is registered or loaded
(the local engine imports it on machines without them), so every module may import it. Each field
declares its choices (a fixed set as the field's StrEnum type) or range beside it (`choice`, `ranged`;
`check_fields` checks them all); the rules between sections are `harness/validation.py`'s.
"""
from __future__ import annotations

import math
from importlib import import_module
from dataclasses import dataclass, field, fields, is_dataclass
from enum import EnumMeta, StrEnum
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

TOPOLOGIES = ("single", "eval_opt", "voting", "orch_workers")
# UnityMAS-O's workflows A-D, shipped as graphs (harness/workflows/graphs/<name>.yaml)
GRAPH_TOPOLOGIES = ("qd_retrieve_answer", "qd_retrieve_evidence_answer", "mask_search", "reflective_code")
# A choice field's type: a StrEnum whose names are its values (OmegaConf converts a given string by
# name), so a value compares, hashes, formats and serialises as its string
SharingMode = StrEnum("SharingMode", "sp ip ip_instance custom partial paper")
# modes whose groups a workflow graph declares under a key of the mode's name: partial (the graph's own
# partial sharing) and paper (UnityMAS-O's paper's mapping of the workflow's agents onto models)
GRAPH_SHARING_MODES = ("partial", "paper")
Engine = StrEnum("Engine", "local verl")
VerlPlacement, VerlDevice = StrEnum("VerlPlacement", "colocate split per_node"), StrEnum("VerlDevice", "auto cpu cuda")
LocalDevice, LocalDtype = StrEnum("LocalDevice", "auto cpu cuda"), StrEnum("LocalDtype", "fp32 bf16")
LocalRollout, VerlRayUp = StrEnum("LocalRollout", "hf vllm"), StrEnum("VerlRayUp", "auto always never")
VerlRollout, Chat = StrEnum("VerlRollout", "auto hf vllm"), StrEnum("Chat", "auto template study")
LossAgg = StrEnum("LossAgg", "token-mean seq-mean-token-mean role-balanced")
LrSchedule, ClipScope = StrEnum("LrSchedule", "constant cosine"), StrEnum("ClipScope", "policy cell")
AdvGrouping, AdvNorm = StrEnum("AdvGrouping", "trajectory episode turn"), StrEnum("AdvNorm", "group agent")
OutcomeShareMode = StrEnum("OutcomeShareMode", "auto full last split")
OutcomeMetric, AdvEstimator = StrEnum("OutcomeMetric", "auto exact f1"), StrEnum("AdvEstimator", "grpo gae")
AdvWhitening, GaeScope = StrEnum("AdvWhitening", "policy cell"), StrEnum("GaeScope", "graph turn")
ModelTraining, DataSplit = StrEnum("ModelTraining", "lora full"), StrEnum("DataSplit", "harness hf")


def _registry(module: str, name: str, order: Callable = list) -> Callable[[], List[str]]:
    """The names another module registers, read when a config is checked (this module imports none)."""
    return lambda: order(getattr(import_module(module), name))


class ConfigError(ValueError):
    """A user-facing configuration mistake; its message names the valid choices."""


# A field's valid numbers, declared beside it (ranged) and checked by check_fields: name -> (test, wording)
RANGES: Dict[str, tuple] = {
    ">0": (lambda v: v > 0, "> 0"), ">=0": (lambda v: v >= 0, ">= 0"),
    ">=1": (lambda v: v >= 1, ">= 1"), ">=2": (lambda v: v >= 2, ">= 2"), ">1": (lambda v: v > 1, "> 1 or null"),
    "[0,1]": (lambda v: 0 <= v <= 1, "in [0, 1]"), "(0,1]": (lambda v: 0 < v <= 1, "in (0, 1]"),
}


def choice(default: Optional[str], options: Union[EnumMeta, Callable[[], Sequence[str]]], what: str) -> Any:
    """A field that takes one of `options`: its StrEnum type (the default stored as its member), or a
    callable where another module's registry lists them, read when checked; check_fields rejects
    anything else in one message that names them."""
    stored = options[default] if isinstance(options, EnumMeta) and default is not None else default
    return field(default=stored, metadata={"choices": options, "what": what})


def ranged(default: Any, rule: str) -> Any:
    """A number field with its valid range, one of RANGES; None passes where the field is optional."""
    return field(default=default, metadata={"range": rule})


def unknown_choice(what: str, value: Any, options: Sequence[str]) -> ConfigError:
    """The one message for a value outside its choices, naming them."""
    return ConfigError(f"unknown {what} '{value}'; valid choices: {', '.join(options)}")


def check_fields(section: Any, where: str = "") -> None:
    """Every choice and range declared on a config's fields, recursively through its sections (and
    `models:`'s instances): the first field outside its choices or range is one ConfigError."""
    for spec in fields(section):
        key, value = f"{where}{spec.name}", getattr(section, spec.name)
        if is_dataclass(value):
            check_fields(value, f"{key}.")
        elif isinstance(value, dict) and value and all(is_dataclass(v) for v in value.values()):
            for name, item in value.items():
                check_fields(item, f"{key}.{name}.")
        if value is None:
            continue
        options = spec.metadata.get("choices")
        if options is not None:
            options = list(options if isinstance(options, EnumMeta) else options())
            if value not in options:
                raise unknown_choice(spec.metadata["what"] + (f" ({key})" if "." in key else ""), value, options)
        rule = spec.metadata.get("range")
        if rule is not None:
            test, wording = RANGES[rule]
            wording = f"a finite number {wording}" if isinstance(value, float) and wording[0] == ">" else wording
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and test(value)):
                raise ConfigError(f"{key} must be {wording}, got {value}")


# Default prompt templates, one per role action; `workflow.prompts.<name>=...` overrides any.
# Plain and short on purpose: the tiny CPU model has a small context and learns these formats in
# its warm-up. Real checkpoints get the same structure with their own wording through overrides.
DEFAULT_PROMPTS: Dict[str, str] = {
    "solver": "solve: {question}",
    "generator": "solve: {question}",
    "generator_revise": "solve: {question}\nlast: {draft}\nnote: {feedback}",
    "evaluator": "check: {question} = {draft}",
    "voter": "vote: {question}",
    "aggregator": "pick: {question}\n{candidates}",
    "orchestrator": "plan: {question}",
    "worker": "work: {subtask}",
    "synthesizer": "join: {question}\nparts: {results}",
}


@dataclass
class WorkflowConfig:
    n_votes: int = ranged(3, ">=1")  # voting: voter instances
    max_iterations: int = ranged(2, ">=1")  # eval_opt: generator drafts at most
    max_subtasks: int = ranged(2, ">=1")  # orch_workers: worker instances at most
    max_new_tokens: int = ranged(12, ">=1")  # per turn, unless a role overrides it
    role_max_new_tokens: Dict[str, int] = field(default_factory=dict)
    prompts: Dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PROMPTS))  # by template name
    # auto: tiny scales keep the templates above, Qwen3 scales get the study's (harness/workflows/prompts.py)
    prompt_set: str = "auto"
    # how the real-model (qwen3) contracts read an evaluator's verdict and an aggregator's selection: study
    # (the study's code: the first boxed verdict or index, else the first digit 1-9) or tolerant (the last
    # well-formed statement anywhere, for models that restate their choice; harness/workflows/contracts.py)
    parse: str = choice("study", _registry("harness.workflows.contracts", "PARSES"), "contract parse")
    chat: Chat = choice("auto", Chat, "chat")  # auto: the set's or graph's (harness/chat.py)


@dataclass
class SharingConfig:
    # custom mode: policy id -> members, each "role" or "role:instance"
    groups: Dict[str, List[str]] = field(default_factory=dict)
    full_finetune: bool = False  # sp only: train all base parameters instead of one adapter
    # a run branched into more policies than its parent had (harness.diagnose's un-sharing arms): new policy ->
    # the parent's policy whose adapter, starting point and optimizer state it copies at the branch
    split_from: Dict[str, str] = field(default_factory=dict)


@dataclass
class ModelConfig:
    path: Optional[str] = None  # local checkpoint dir for qwen3-* scales
    # the checkpoint's folder under $MARL_MODEL_ROOT when model.path is not given; None: the scale's own
    # (Qwen3-4B, ...). The study starts 4B code cells from its own warm-started weights (grid/conf/task/code.yaml)
    dirname: Optional[str] = None
    lora_rank: int = ranged(8, ">=1")
    lora_alpha: int = ranged(16, ">0")
    lora_targets: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"])
    cache_dir: Optional[str] = None  # warm tiny checkpoints; default ~/.cache/marl-harness
    warmup_steps: Optional[int] = None  # None: the scale's default


@dataclass
class ModelInstanceConfig:
    """One model instance of UnityMAS-O's agent-to-model map phi: its own base model, training
    mode and optimizer, and the roles it plays (`models.<name>.roles`; the policy id is <name>)."""

    scale: str = choice("tiny-m", _registry("harness.models", "SCALES"), "scale")
    path: Optional[str] = None  # a checkpoint dir for qwen3-* scales
    train: ModelTraining = choice("lora", ModelTraining, "training mode")  # lora: an adapter on the base | full: every base parameter
    lr: Optional[float] = ranged(None, ">0")  # its AdamW's learning rate; default: algo.lr
    weight_decay: Optional[float] = ranged(None, ">=0")  # its AdamW's weight decay; default: algo.weight_decay
    roles: List[str] = field(default_factory=list)


@dataclass
class AlgoConfig:
    """GRPO with verl's PPO update: each policy's rows are cut into mini-batches of
    `ppo_mini_batch_size` problems' worth (x group_size rows), one optimizer step each, over
    `ppo_epochs`; old log-probs come from the behaviour weights before the first step."""

    problems_per_step: int = ranged(8, ">=1")
    group_size: int = ranged(4, ">=2")  # G episodes per problem (GRPO normalises within a group)
    ppo_mini_batch_size: int = ranged(8, ">=1")  # problems per mini-batch (verl's count): rows = this x group_size
    ppo_epochs: int = ranged(1, ">=1")
    shuffle: bool = False  # shuffle a policy's rows before cutting mini-batches, seeded from (seed, step, epoch)
    # verl's trainer.balance_batch (on by default there and in the study): the step's rows sorted by length
    # and zig-zagged before mini-batching (engines/base.py balanced_order); balance_dp: the DP ranks it balances
    balance_batch: bool = True
    balance_dp: int = 1
    lr: float = ranged(1e-3, ">0")
    lr_factor: float = ranged(1.0, ">0")  # every step's lr times this (the lr_half mitigation sets 0.5: a smaller update, any direction)
    lr_schedule: LrSchedule = choice("constant", LrSchedule, "learning-rate schedule")  # (verl's schedulers), stepped once per training step
    lr_warmup_steps: int = ranged(0, ">=0")  # linear warm-up from 0 over this many training steps
    weight_decay: float = ranged(0.0, ">=0")  # AdamW's (decoupled); verl's actor default and the study's: 0.01
    adam_betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # verl's default
    adam_eps: float = ranged(1e-8, ">0")  # torch's AdamW default, which verl keeps
    max_grad_norm: float = ranged(1.0, ">0")
    clip_scope: ClipScope = choice("policy", ClipScope, "gradient clipping scope")  # policy: each policy clips its own norm (verl); cell: one norm over all policies
    clip_ratio: float = ranged(0.2, ">0")
    clip_ratio_low: Optional[float] = ranged(None, ">0")  # default: clip_ratio
    clip_ratio_high: Optional[float] = ranged(None, ">0")  # default: clip_ratio (the study: 0.28)
    clip_ratio_c: Optional[float] = ranged(3.0, ">1")  # dual clip for negative advantages (verl's default); null: off
    loss_agg: LossAgg = choice("token-mean", LossAgg, "loss aggregation")
    # trajectory (the study's): a group is (problem, role or voter instance), each call scored alone;
    # episode: a role's turns share its episode's advantage; turn: per input (algo/grpo.py)
    adv_grouping: AdvGrouping = choice("trajectory", AdvGrouping, "advantage grouping")
    norm_adv_by_std: bool = True
    adv_norm: AdvNorm = choice("group", AdvNorm, "advantage normalisation")  # group: GRPO's std over the group; agent: the role's std over the batch (Dr. MAS)
    role_count_scaling: bool = False  # n same-type instances on a policy: mini-batches n x as large
    coherence_reg: float = ranged(0.0, ">=0")  # λ > 0: each step's lr / (1 + λ(coherence - 1)) of same-type instances (algo/coherence.py)
    # the study's I6 (algo/coherence_damping.py): policy -> λ; its gradient x (1 - λ clamp(cos(g, EMA g), 0, 1)) at each
    # mini-batch, before clipping (upstream trainer.coherence_reg.per_role_weights, ema_window 128; engine=local)
    coherence_damping: Dict[str, float] = field(default_factory=dict)
    coherence_damping_window: int = ranged(128, ">=1")
    # an induced failure for validating detectors (sweep=repro_lr_spike): lr x lr_spike_factor on the
    # lr_spike_steps training steps from lr_spike_start (0 steps: off)
    lr_spike_factor: float = ranged(1.0, ">0")
    lr_spike_start: int = ranged(0, ">=0")
    lr_spike_steps: int = ranged(0, ">=0")
    frozen_policies: List[str] = field(default_factory=list)  # policies that sample but never step (harness.diagnose)
    kl_coef: float = ranged(0.0, ">=0")  # > 0: KL to the base model (adapter disabled)
    kl_coef_per_role: Dict[str, float] = field(default_factory=dict)  # a role's own beta (else kl_coef)
    adv_estimator: AdvEstimator = choice("grpo", AdvEstimator, "advantage estimator")  # grpo (group-relative) | gae (PPO with a critic per policy: harness/algo/critic.py)
    gae_gamma: float = ranged(1.0, "[0,1]")  # GAE's discount over an episode's turns (verl's default 1.0)
    gae_lambda: float = ranged(1.0, "[0,1]")  # GAE's lambda (verl's default 1.0)
    # gae: over the graph's stages, a successor the next stage's value (`graph`), or every turn a one-step
    # episode of its policy, as UnityMAS-O's trainer (`turn`); advantages whitened over the cell's turns
    # (`cell`: one verl batch) or within each policy's (`policy`: UnityMAS-O's worker groups; docs/unitymas.md)
    gae_scope: GaeScope = choice("graph", GaeScope, "GAE scope")
    adv_whiten: AdvWhitening = choice("cell", AdvWhitening, "advantage whitening")
    critic_lr: float = ranged(1e-3, ">0")  # the value heads' Adam (engine=local: a linear head on the policy's features)
    verl_critic_lr: float = ranged(1e-4, ">0")  # engine=verl: verl's critic, the whole base model with a value head
    critic_steps: int = ranged(4, ">=1")  # value-loss steps per training step
    value_clip: float = ranged(0.5, ">0")  # verl's cliprange_value
    micro_batch_size: int = ranged(64, ">=1")
    temperature: float = ranged(1.0, ">0")
    shared_prompt_forward: bool = True  # local engine: each distinct prompt runs once in the update (exact)


REWARD_TERMS = ("node", "turn", "traj", "length", "length_hold", "length_target")  # RewardConfig's weights, by name


@dataclass
class RewardConfig:
    """r = node*r_node + turn*r_turn + traj*r_traj per turn; per_role overrides by role name."""

    node: float = ranged(0.0, ">=0")  # role-level correctness (voter correct, aggregator picked correct, ...)
    turn: float = ranged(0.0, ">=0")  # the turn's output honours its role's contract
    traj: float = ranged(1.0, ">=0")  # final outcome, copied to every turn
    length: float = ranged(0.0, ">=0")  # per response token (used to provoke length drift on purpose)
    # r -= length_hold x |tokens - length_target|: a role held to a length (harness.diagnose's hold_length arm sets
    # both per role, the target at the role's own early mean length)
    length_hold: float = 0.0
    length_target: float = 0.0
    per_role: Dict[str, Dict[str, float]] = field(default_factory=dict)
    gamma: float = ranged(1.0, "(0,1]")  # UnityMAS-O's discount: the turn at workflow step t (its graph stage, 1-based) counts gamma^(t-1)
    # full: the outcome on every turn; last: on the last stage's turns; split: divided among the roles, then
    # their turns; auto (resolved when the config is read): last under GAE (no reward for longer loops), full under GRPO
    outcome_share_mode: OutcomeShareMode = choice("auto", OutcomeShareMode, "outcome share mode")
    # the outcome r_traj: exact (1 when the task grades the answer correct: EM, all tests passed) or f1 (QA's
    # token F1, partial credit, UnityMAS-O's metric); auto (resolved when the config is read): f1 on QA tasks, else exact
    outcome_metric: OutcomeMetric = choice("auto", OutcomeMetric, "outcome metric")
    allocator: Optional[str] = None  # "module:function(episode, cfg) -> per-turn rewards", in place of the terms


@dataclass
class ArithConfig:
    min_terms: int = 2
    max_terms: int = 3
    max_value: int = 30
    n_train: int = 4000
    n_val: int = 200


Action = StrEnum("Action", "log alert stop mitigate")
MONITORED = ("amplification", "capture", "drift", "collapse", "nonfinite", "learned")  # MonitorConfig's detectors


# Alert kind -> the mitigation that removes the cause its detector names (harness/mitigations.py):
# amplification: n instances give their adapter n times the optimizer steps, and role_count_scaling
# gives it one instance's; capture: a role's tokens weigh its share of a shared loss, and
# role_balanced weighs roles equally; length drift: a judging role is paid to lengthen, and
# length_penalty charges its tokens; collapse names no cause, and kl_anchor holds every role near
# the base; a non-finite step is skipped already.
MATCHED_MITIGATIONS = {"amplification": "role_count_scaling", "capture": "role_balanced",
                       "length_drift": "length_penalty", "collapse": "kl_anchor", "non_finite": "none"}
# Alert kind -> an intervention's control arm: halving the learning rate changes the size of every
# update, aimed at no cause (the intervention report measures how much each arm changed the update
# against `none`). If it saves a cell as often as the matched one, the save says "a smaller step
# helps", not "the diagnosis was right".
CONTROL_MITIGATIONS = {**{kind: "lr_half" for kind in MATCHED_MITIGATIONS}, "non_finite": "none"}


@dataclass
class AmplificationConfig:
    """A policy trained by several role instances moves faster than one instance moves a policy."""

    action: Action = choice("alert", Action, "action")
    min_ratio: float = 1.3  # its drift ‖θ_t − θ_0‖ over the reference's at the same step (EWMA)
    min_coherence: float = 0.5  # EWMA of its instances' ‖Σg_i‖²/Σ‖g_i‖²; below this they cancel out
    # and pulling away: that ratio risen this share above its own early band (the ratio over its first
    # `baseline_steps` judged steps). n instances make a policy faster by a fixed factor, which says how
    # the cell is built; a ratio still rising says the policy is running away. All ratios: scale-free
    min_rise: float = 0.25
    baseline_steps: int = 10
    ewma_alpha: float = 0.2
    min_step: int = 3  # drift over the first steps is too small to compare
    patience: int = 5  # consecutive steps


@dataclass
class CaptureConfig:
    """A role leaves its contract toward another role's behaviour (SP's role capture)."""

    action: Action = choice("alert", Action, "action")
    baseline_steps: int = 10  # early band of every signal
    ewma_alpha: float = 0.2
    length_approach: float = 0.3  # the victim's own length closed this share of its early gap to the other's
    contract_drop: float = 0.15  # and its format compliance or role accuracy fell by this share (relative)
    min_share_rise: Optional[float] = None  # also ask the other role's gradient share to rise by this (off)
    pressure_z: Optional[float] = 4.0  # |Σ cov(advantage, length)| / its SE over the window, toward the other; None: off
    pressure_window: int = 10  # steps
    pressure_roles: List[str] = field(default_factory=list)  # [] (default): the judging roles, found by contract
    patience: int = 5


@dataclass
class DriftConfig:
    """A judging role (a verdict, an index, a plan, a search action) changes its length: capture's early warning."""

    action: Action = choice("alert", Action, "action")
    roles: List[str] = field(default_factory=list)  # [] (default): the judging roles, found by contract
    baseline_steps: int = 10
    ewma_alpha: float = 0.2
    z_threshold: float = 5.0
    min_std_tokens: float = 0.5  # floor on the baseline spread: lengths of 3 tokens barely vary
    min_std_fraction: float = 0.1  # and 10% of the baseline mean
    # pressure_z 6 and patience 1: chosen on the design cells of sweep=repro_eval_opt (seeds 0-1) by
    # reports.detectors --design (z 4 and patience 3 fired on 4 of 11 healthy held-out cells)
    pressure_z: Optional[float] = 6.0  # |Σ cov(advantage, length)| / its SE over the window; None: off
    pressure_window: int = 10  # steps
    pressure_net: bool = True  # a role judged at its own job: the length's pressure within right and within wrong turns
    patience: int = 1


@dataclass
class CollapseConfig:
    """Validation accuracy below a fraction of its running best, beyond the estimate's noise
    (confirmation); and, as the early warning, training accuracy below that fraction of the paired
    single agent's on the same problems, beyond the noise of the paired differences."""

    action: Action = choice("alert", Action, "action")
    fraction: float = 0.7  # of the running best (validation); of the paired run's accuracy (training)
    se: float = 2.0  # standard errors of the difference (val/accuracy_se; the paired differences' spread)
    patience: int = 2  # consecutive validations
    trend_window: int = ranged(10, ">=0")  # training steps in the paired comparison; 0: no early warning
    trend_patience: int = ranged(1, ">=1")  # consecutive steps


@dataclass
class NonFiniteConfig:
    action: Action = choice("alert", Action, "action")  # the step of a non-finite policy is always skipped


@dataclass
class LearnedConfig:
    """The learned early warning (harness/monitors/learned.py): off unless it beat the config-only
    baseline on held-out seeds (studies/early-warning says whether it did)."""

    enabled: bool = False
    model: Optional[str] = None  # its JSON; None: harness/monitors/learned.json (fitted by studies/early-warning)
    action: Action = choice("alert", Action, "action")


@dataclass
class MonitorConfig:
    # every detector's action at once when set (log, alert, stop, mitigate); else each its own `action`
    action: Optional[Action] = choice(None, Action, "action")
    # mitigate: the running cell switches on its alert's mitigation from the next step (local engine)
    mitigations: Dict[str, str] = field(default_factory=lambda: dict(MATCHED_MITIGATIONS))
    controls: Dict[str, str] = field(default_factory=lambda: dict(CONTROL_MITIGATIONS))  # harness.intervene's control
    debounce: int = 25  # steps before the same alert (kind, role, policy, signal) may fire again
    # no alert before this step (detectors still read every record): an alert before the run has
    # learned anything can only say which setting the cell was trained in. None: the cell's first
    # validation after step 0 (val_every)
    start_step: Optional[int] = None
    # the paired single-agent run's dir (the grid sets it): amplification's drift reference (else the
    # cell's own one-instance policies) and collapse's early warning (else validation alone)
    reference_run: Optional[str] = None
    amplification: AmplificationConfig = field(default_factory=AmplificationConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    nonfinite: NonFiniteConfig = field(default_factory=NonFiniteConfig)
    learned: LearnedConfig = field(default_factory=LearnedConfig)


@dataclass
class WandbConfig:
    enabled: bool = True
    # unset (None): the WANDB_MODE / WANDB_PROJECT / WANDB_ENTITY environment variables, else the
    # defaults below (harness.wandb_sink.wandb_settings); a value set here wins over the environment
    mode: Optional[str] = None  # offline (default) | online | disabled; online needs the user's own login/server
    project: Optional[str] = None  # default marl-harness
    entity: Optional[str] = None
    dir: Optional[str] = None  # default: the run directory


@dataclass
class LocalConfig:
    """engine=local: where its one process computes and in what precision."""

    device: LocalDevice = choice("auto", LocalDevice, "local engine device")  # auto: cuda when torch sees a GPU, else cpu
    dtype: LocalDtype = choice("fp32", LocalDtype, "local engine precision")  # the base model's weights; bf16 on a GPU (LoRA adapters stay fp32, peft's default)
    rollout: LocalRollout = choice("hf", LocalRollout, "local engine rollout")  # hf: generate in-process; vllm: a vLLM server process (make vllm)


@dataclass
class VerlConfig:
    """engine=verl: one verl worker group (Ray, FSDP2) per policy; see harness/engines/verl/."""

    device: VerlDevice = choice("auto", VerlDevice, "verl device")  # auto: cuda when torch sees a GPU, else cpu (the CPU platform plugin)
    gpus_per_policy: int = ranged(1, ">=1")  # FSDP ranks of each policy's worker group
    # colocate: all policies share the cell's GPUs; split: each its own; per_node: each its own, pinned round-robin
    # to the Ray cluster's nodes (one policy per node on a multi-node cell); the run records where (placement.json)
    placement: VerlPlacement = choice("colocate", VerlPlacement, "verl placement")
    use_dynamic_bsz: bool = True  # micro-batches by token budget (verl's default) instead of by count
    max_token_len_per_gpu: int = 4096
    gradient_checkpointing: bool = False
    param_dtype: str = "bf16"  # FSDP mixed precision on GPU; a CPU always computes in fp32
    attn_implementation: str = "flash_attention_2"  # on GPU; sdpa on a CPU
    ray_address: Optional[str] = None  # default: $RAY_ADDRESS (slurm/ray-up.sh), else a private local Ray
    ray_num_cpus: Optional[int] = None  # logical CPUs of a private local Ray
    ray_up: VerlRayUp = choice("auto", VerlRayUp, "verl Ray bring-up")  # grid on SLURM: auto = slurm/ray-up.sh when a cell spans nodes; always; never
    rollout: VerlRollout = choice("auto", VerlRollout, "verl rollout backend")  # verl rollout replica per policy: auto = vllm on a GPU when installed, else hf
    rollout_tp: int = 1  # vLLM tensor parallel size (the policy's other GPUs serve as data parallel)
    rollout_gpu_memory_utilization: Optional[float] = None  # vLLM's share of a GPU; default 0.5 / colocated policies
    rollout_max_model_len: int = 8192  # vLLM's longest prompt + response


@dataclass
class InstrumentConfig:
    kl_to_base: bool = True  # measure per-role KL to the base model (adapter disabled) as a metric
    kl_every: int = ranged(10, ">=0")  # ... every this many steps (a forward with the adapter off); every step if algo.kl_coef > 0


@dataclass
class DataConfig:
    """Real datasets: a local jsonl or parquet (`path`), else `datasets`' local cache on clusters.
    The grid names the study's files relative to a site data root (`root`, or $MARL_DATA_ROOT)."""

    path: Optional[str] = None
    root: Optional[str] = None  # the site's data root: the grid resolves the study's file names against it
    # validation problems from their own file (the study validates DAPO-Math training on AIME 2025),
    # read by `val_task`'s loader (default: the cell's task); else held out from `path` as `split` says
    val_path: Optional[str] = None
    val_task: Optional[str] = choice(None, _registry("harness.tasks", "TASKS", sorted), "validation task")
    # harness: `val_size` problems held out, seeded by `seed` (at most a quarter); hf: Hugging Face
    # datasets' train_test_split(test_size, seed=split_seed), the study's (DAPO-Math: 0.1, 42;
    # DeepCoder: shuffle(42) then the first 1000 as its test set, the same permutation)
    split: DataSplit = choice("harness", DataSplit, "data split")
    test_size: float = 0.1  # hf: a fraction (< 1) or a number of problems (>= 1) in the test part
    split_seed: int = 42
    val_size: int = 200  # harness: held out from the same file, seeded (at most a quarter)
    max_prompt_length: Optional[int] = ranged(None, ">=1")  # a longer prompt ends its episode (upstream's; null: none)
    seed: int = 1234
    rg_size: int = 2000  # items generated by a reasoning-gym task (task=rg-<generator>)
    corpus: Optional[str] = None  # nq / hotpotqa: the JSONL passage corpus the search workflows retrieve from
    # deepcoder: the question as the study words it (livecodebench: LiveCodeBench's wrapper) or the bare problem
    question_format: str = choice("livecodebench", _registry("harness.tasks.code", "QUESTION_FORMATS"), "question format")
    # deepcoder: the study's runtime_results.json (not published with its repository): tests that did not pass
    # there are dropped, and problems left without one, before the split (the held-out 1000 depend on it)
    runtime_results: Optional[str] = None


@dataclass
class QASynthConfig:
    """The generated multi-hop QA world (harness/tasks/qa_synth.py); the world itself is fixed."""

    n_people: int = 80
    n_train: int = 3000
    n_val: int = 120
    kinds: List[str] = field(default_factory=lambda: ["lookup", "compare", "bridge"])


@dataclass
class CodeSynthConfig:
    n_train: int = 4000
    n_val: int = 200
    max_const: int = 4  # rules x+c, x-c, x*c for c in 1..max_const (9: harder, RL at tiny-m stalls)


@dataclass
class SandboxConfig:
    wall_s: float = ranged(10.0, ">0")
    cpu_s: int = 8
    memory_mb: int = 1024
    unsafe: bool = False  # true: run model-written code without a jail (rlimits only); never for untrusted models


@dataclass
class CellConfig:
    topology: str = "voting"
    sharing: SharingMode = choice("ip", SharingMode, "sharing mode")
    task: str = choice("arith", _registry("harness.tasks", "TASKS", sorted), "task")
    scale: str = choice("tiny-m", _registry("harness.models", "SCALES"), "scale")
    engine: Engine = choice("local", Engine, "engine")
    seed: int = ranged(0, ">=0")
    # the rollout random stream: 0 is the run's own; j > 0 draws the same problems with other samples
    # (harness.diagnose's resampled arms: how often the same state fails by chance)
    resample: int = ranged(0, ">=0")
    steps: int = ranged(100, ">=1")
    root: str = "runs"
    sweep: str = "default"
    cell_id: Optional[str] = None  # default: derived from the axis values
    mitigation: str = "none"  # harness/mitigations.py: a name, or several joined by "+"
    val_every: int = ranged(10, ">=1")
    val_problems: int = 32
    val_samples: int = ranged(4, ">=1")  # sampled episodes per validation problem (at algo.temperature); accuracy +- its SE
    val_greedy: bool = False  # true: one greedy episode per problem instead
    ckpt_every: int = ranged(10, ">=1")
    ckpt_keep: int = ranged(2, ">=1")  # step checkpoints kept (a damaged newest one falls back to the one before), plus best/
    samples_every: int = 20
    progress: bool = True
    report: bool = True  # write <run>/report/ (HTML + Markdown) when the run ends
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    sharing_cfg: SharingConfig = field(default_factory=SharingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    arith: ArithConfig = field(default_factory=ArithConfig)
    data: DataConfig = field(default_factory=DataConfig)
    code_synth: CodeSynthConfig = field(default_factory=CodeSynthConfig)
    qa_synth: QASynthConfig = field(default_factory=QASynthConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    monitors: MonitorConfig = field(default_factory=MonitorConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    extra: Dict[str, Any] = field(default_factory=dict)  # free-form tags carried to cell.yaml
    # several model instances (different bases, LoRA or full), roles mapped to them; with sharing=custom
    models: Dict[str, ModelInstanceConfig] = field(default_factory=dict)


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="cell", node=CellConfig)


def default_cell_id(cfg: CellConfig) -> str:
    """Readable and stable: the same axis values give the same id on every machine. A graph
    topology reads as its file's name (`my_flow.yaml` -> `my_flow`, `graph:voting` -> `graph-voting`)."""
    tail = "" if cfg.mitigation == "none" else f"-mitigation={cfg.mitigation}"
    if cfg.topology == "single":
        return f"single-{cfg.task}-{cfg.scale}-s{cfg.seed}{tail}"
    return f"{topology_label(cfg.topology)}-{cfg.sharing}-{cfg.task}-{cfg.scale}-s{cfg.seed}{tail}"


GRAPH_FILE_SUFFIXES = (".yaml", ".yml")


def topology_label(topology: str) -> str:
    """A topology as cell ids and tables show it: a name as it is, a graph file by its stem
    (`runs/my_flow.yaml` -> `my_flow`), `graph:voting` as `graph-voting`, an import path by its NAME."""
    label = str(topology).replace("graph:", "graph-")
    if ":" in label:  # an import path package.module:NAME
        return label.rsplit(":", 1)[1]
    if label.endswith(GRAPH_FILE_SUFFIXES):
        return label.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return label


def monitor_start(cfg: "CellConfig") -> int:
    """The first step the monitors may alert at: monitors.start_step, else the first validation after
    step 0 (the run has learned something; an earlier alert can only reflect the cell's setting)."""
    return int(cfg.monitors.start_step if cfg.monitors.start_step is not None else cfg.val_every)


def kl_beta(algo: AlgoConfig, role: str) -> float:
    """A role's weight of the KL-to-base term in its loss: its own beta, else algo.kl_coef."""
    return float(algo.kl_coef_per_role.get(role, algo.kl_coef))


def kl_in_loss(algo: AlgoConfig) -> bool:
    """Some role's loss has a KL-to-base term (so the reference forward runs every step)."""
    return algo.kl_coef > 0 or any(beta > 0 for beta in algo.kl_coef_per_role.values())
