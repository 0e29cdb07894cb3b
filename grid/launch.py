"""Launch a sweep: `python grid/launch.py sweep=full_matrix [launcher=slurm] [cluster=<profile>] [dry_run=true]`.

    action=launch   expand the sweep, validate every cell, submit what is not done (idempotent)
    action=status   print each cell's state, step, failure reason and log path
    action=intervene  branch every ended multi-agent cell at its first alert into arms (harness.intervene;
                    intervene.arms=[none,matched,control], intervene.at=first-alert|<step>, intervene.kind=<kind>,
                    intervene.sham=true: also the matched mitigation at another cell's alert step),
                    run them as cells of <sweep>-interventions, then write the intervention report
    action=diagnose  branch every failed multi-agent cell before its failure into one arm per mechanism
                    removed, each on diagnose.resamples rollout streams beside resampled none arms
                    (harness.diagnose; diagnose.at=[label-15], diagnose.mechanisms, diagnose.limit), run them
                    as cells of <sweep>-diagnosis, then write each run's diagnosis.json; with dry_run=true the
                    plan and its cost in cell-steps
    action=evaluate  score every ended cell's checkpoints as the study does (analysis.evaluate, resumable) as
                    jobs of the launcher; evaluate.split=validation|held_out, evaluate.mode, evaluate.k,
                    evaluate.samples, evaluate.problems; with dry_run=true what each cell would score
    dry_run=true    print the cells with their resources, GPU-hours reserved and checks; submit nothing

Every axis can be overridden: `sweep.axes.seed=[0,1,2]`, `sweep.axes.topology=[voting,flows/my_flow.yaml]`
(a workflow graph file: its cells are named by the file's stem),
`sweep.cell.steps=50`, `'+sweep.extra_axes.mitigation={none:{},balanced:{algo:{loss_agg:role-balanced}}}'`.
Bad input (an unknown sweep, axis value or cluster profile, a shape the cluster cannot run, a missing
model path) prints one error naming the valid choices, exits 2 and submits nothing.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

if __package__ in (None, ""):  # `python grid/launch.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grid.evaluation import EvaluateOptions, evaluate  # noqa: E402
from grid.expand import CONF_DIR, GridError, check_cells, choices, expand, table  # noqa: E402
from grid.gpu_estimate import estimate_line, load_measurement  # noqa: E402
from grid.plan_settings import settings_lines  # noqa: E402
from harness.report_hooks import build_report  # noqa: E402

EXIT_BAD_INPUT = 2
ACTIONS = ("launch", "status", "intervene", "diagnose", "evaluate")
GROUPS = ("sweep", "launcher", "cluster")  # config groups: sweep=<name> picks grid/conf/sweep/<name>.yaml
LAUNCH_RECORD = "launch.json"  # the overrides a sweep was launched with, beside its cells


@dataclass
class InterveneOptions:
    """action=intervene: where each cell is branched and into which arms (harness.intervene)."""

    at: str = "first-alert"
    arms: List[str] = field(default_factory=lambda: ["none", "matched", "control"])
    kind: Optional[str] = None  # first-alert of this kind only
    # also a `sham` arm per branched cell: its matched mitigation at another branched cell's alert step
    sham: bool = False


@dataclass
class DiagnoseOptions:
    """action=diagnose: where each failed cell is branched and which mechanisms its arms remove."""

    at: List[str] = field(default_factory=lambda: ["label-15"])
    mechanisms: Any = None  # every registered one that applies; a list; or sharing -> list
    resamples: int = 6
    margin: int = 20
    limit: Optional[int] = None  # failed cells per setting (every axis but the seed), in seed order
    rule: str = "failures"  # the verdict's rule: failures | failures-or-accuracy (analysis/diagnosis.py)


@dataclass
class LaunchOptions:
    """The launcher's own options, typed like a cell's config (grid/conf/launch.yaml sets them)."""

    action: str = "launch"  # launch | status | intervene | diagnose | evaluate
    dry_run: bool = False
    root: str = "runs"
    wait: bool = False
    intervene: InterveneOptions = field(default_factory=InterveneOptions)
    diagnose: DiagnoseOptions = field(default_factory=DiagnoseOptions)
    evaluate: EvaluateOptions = field(default_factory=EvaluateOptions)


def check_launch_overrides(overrides: Sequence[str]) -> None:
    """Hydra habits that do not apply here, and unknown launch options, as one line each."""
    from harness.cli_overrides import LIST_HINT, OverrideError, close_keys, parse_habits

    try:
        parsed = parse_habits(overrides, LIST_HINT)
    except OverrideError as exc:
        raise GridError(str(exc)) from None
    from harness.cli_overrides import closest_dotted, is_schema_key
    from harness.config import CellConfig

    known = [f.name for f in fields(LaunchOptions)] + list(GROUPS)
    for override in parsed:
        top = override.key_or_group.split(".")[0].split("@")[0]
        if top not in known and top != "hydra" and is_schema_key(override.key_or_group, CellConfig):
            raise GridError(f"'{override.key_or_group}' is a cell setting: write sweep.cell.{override.input_line.lstrip('+~')} "
                            f"(every cell of the sweep) or put it on an axis")
        cell_key = override.key_or_group[len("sweep.cell."):] if override.key_or_group.startswith("sweep.cell.") else None
        if cell_key and not is_schema_key(cell_key, CellConfig):
            raise GridError(f"unknown cell key '{cell_key}' in sweep.cell.{cell_key}{closest_dotted(cell_key, CellConfig)} "
                            f"(every key: python -m harness.run --help)")
        if top not in known and top != "hydra":
            raise GridError(f"unknown launch option '{top}'{close_keys(top, known)} (valid: "
                            f"{', '.join(f.name for f in fields(LaunchOptions))}; {', '.join(g + '=<name>' for g in GROUPS)}; "
                            f"sweep.<key>=... for the sweep's settings)")


def typed_options(cfg: DictConfig) -> LaunchOptions:
    """The composed launch options checked against LaunchOptions: `dry_run=ture` is an error, not true."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    values = {f.name: cfg.get(f.name) for f in fields(LaunchOptions)}
    try:
        options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(LaunchOptions), values))
    except (OmegaConfBaseException, ValueError) as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "an option"
        hint = " (dry_run and wait take true or false)" if key in ("dry_run", "wait") else ""
        raise GridError(f"{key}: {str(exc).splitlines()[0]}{hint}") from None
    if options.action not in ACTIONS:
        raise GridError(f"unknown action '{options.action}'; valid choices: {', '.join(ACTIONS)}")
    return options


def compose(overrides: Sequence[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    check_launch_overrides(overrides)
    # any key of a cell is a setting of sweep.cell, whether or not the sweep's file sets it: no `+` needed
    overrides = [f"++{o}" if o.startswith("sweep.cell.") else o for o in overrides]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name="launch", overrides=list(overrides))
    except yaml.YAMLError as exc:  # a config file of grid/conf that does not parse
        from harness.yaml_errors import describe_yaml_error

        raise GridError(f"a config file is not valid YAML: {describe_yaml_error(exc)}") from None
    except MissingConfigException as exc:
        group = next((g for g in GROUPS if f"'{g}/" in str(exc)), None)
        valid = f"; valid choices: {', '.join(choices(group))}" if group else ""
        raise GridError(f"{str(exc).splitlines()[0]}{valid}") from None
    except (HydraException, OmegaConfBaseException) as exc:
        lines = str(exc).splitlines()
        cause = str(exc.__cause__ or "").splitlines()
        raise GridError(f"bad override: {lines[0] if lines else exc}" + (f": {cause[0]}" if cause else "")) from None
    replace_axes(cfg, overrides)
    typed_options(cfg)
    return cfg


def replace_axes(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """An axis given a dict of values (`'sweep.extra_axes.action={alert:{}}'`) is that axis, not the
    sweep file's merged with it: Hydra merges a dict into a dict, which would keep the file's other
    values (the action axis would still hold `mitigate`) and run cells nobody asked for."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    parser = OverridesParser.create()
    for text in overrides:
        key = _key(text)
        parts = key.split(".")
        if text.startswith("~") or len(parts) != 3 or parts[:2] not in (["sweep", "axes"], ["sweep", "extra_axes"]):
            continue
        value = parser.parse_override(text.lstrip("+")).value()
        if isinstance(value, dict):
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, merge=False)


SESSION_KEYS = ("action", "dry_run", "wait")  # how this command runs, not what the sweep is


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def record_launch(sweep_dir: Path, argv: Sequence[str]) -> None:
    """Keeps the overrides the sweep was launched with beside its cells (launch.json: every launch,
    newest last), so `action=status` shows the sweep that ran, not the sweep file's defaults."""
    from harness.run_dir import write_atomic

    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / LAUNCH_RECORD
    launches = json.loads(path.read_text()).get("launches", []) if path.is_file() else []
    launches.append({"overrides": [a for a in argv if _key(a) not in SESSION_KEYS],
                     "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    write_atomic(path, json.dumps({"launches": launches}, indent=1) + "\n")


def compose_as_launched(cfg: DictConfig, argv: Sequence[str]) -> DictConfig:
    """The status config: the last launch's overrides, under any the user gives now."""
    path = Path(cfg.root) / cfg.sweep.name / LAUNCH_RECORD
    if not path.is_file():
        return cfg
    last = json.loads(path.read_text())["launches"][-1]
    given = {_key(a) for a in argv}
    stored = [a for a in last["overrides"] if _key(a) not in given]
    print(f"status of the sweep as launched at {last['at']}: {' '.join(last['overrides']) or '(no overrides)'}")
    return compose(stored + list(argv))


def print_status(cells, cfg: DictConfig, out=print) -> List:
    from grid.submit import Ledger, cell_state

    ledger = Ledger(Path(cfg.root) / cfg.sweep.name).read()
    states = [cell_state(c, cfg.root, cfg.sweep.name, ledger) for c in cells]
    rows = [("cell", "state", "step", "reason", "log")]
    rows += [(s.cell.cell_id, s.state, f"{s.step}/{s.steps}", s.reason[:60], s.log) for s in states]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        out("  ".join(v.ljust(w) for v, w in zip(r[:4], widths)) + "  " + r[4])
    counts = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    out("summary: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return states


def launch(cells, cfg: DictConfig, argv: Sequence[str] = (), out=print) -> int:
    from grid.submit import Ledger, cell_state, needs_submission, run_local, submit_slurm

    sweep_dir = Path(cfg.root) / cfg.sweep.name
    ledger = Ledger(sweep_dir)
    known = ledger.read()
    states = [cell_state(c, cfg.root, cfg.sweep.name, known) for c in cells]
    todo = [s.cell for s in states if needs_submission(s)]
    for s in states:
        if not needs_submission(s):
            out(f"skip {s.cell.cell_id}: {s.state}")
    if not todo:
        out(f"nothing to submit: all {len(cells)} cells are finished, stopped early or in flight")
        report = sweep_dir / "report" / "index.html"
        if report.is_file():
            out(f"sweep report: {report}")
        elif all(s.state in ("finished", "stopped_early") for s in states):
            sweep_report(sweep_dir, out)
        return 0
    if cfg.launcher.name == "slurm":
        entries = submit_slurm(todo, cfg.cluster, cfg.launcher, ledger)  # refuses a shape before submitting any
        record_launch(sweep_dir, argv)
        out(f"submitted {len(entries)} cells to SLURM ({len({e['job_id'].split('_')[0] for e in entries.values()})} "
            f"job arrays); follow with: python grid/launch.py sweep={cfg.sweep.name} action=status")
        if cfg.get("wait"):
            wait_for_slurm(cells, cfg, out)
    else:
        record_launch(sweep_dir, argv)
        run_local(todo, cfg.launcher, ledger, log=out)
    if cfg.launcher.name != "slurm" or cfg.get("wait"):
        states = print_status(cells, cfg, out)
        settle_alerts(sweep_dir, out)
        sweep_report(sweep_dir, out)
        return 0 if all(s.state in ("finished", "stopped_early") for s in states) else 1
    return 0


def settle_alerts(sweep_dir: Path, out) -> None:
    """Once no cell is in flight, judge the steps that waited for a paired run still behind when
    their cell ended (harness/monitors/settle.py), and redraw those runs' reports."""
    try:
        from harness.run_dir import stored_cell_config
        from harness.monitors.settle import settle_sweep

        written = settle_sweep(sweep_dir, warn=out)
    except Exception as exc:  # noqa: BLE001 - the sweep itself is over; a relaunch or action=status retries
        out(f"warning: could not judge the runs' late steps ({type(exc).__name__}: {exc})")
        return
    for run_id, alerts in written.items():
        out(f"late alerts in {run_id} (judged after it ended, when its paired run had caught up): "
            + "; ".join(f"step {a.step} {a.kind}" for a in alerts))
        try:
            if stored_cell_config(sweep_dir / run_id).report:
                build_report("run", sweep_dir / run_id)
        except Exception as exc:  # noqa: BLE001 - the alerts are written; `python -m reports` can redraw
            out(f"warning: could not redraw the report of {run_id} ({type(exc).__name__}: {exc})")


def arm_cell(parent, arm_cfg):
    """A branched arm as a cell of the grid: its own config, its parent cell's axes and resources."""
    from omegaconf import OmegaConf

    from grid.expand import Cell

    overrides = OmegaConf.to_container(OmegaConf.structured(arm_cfg), enum_to_str=True)
    return Cell(arm_cfg.cell_id, dict(parent.axes), overrides, parent.resources)


def intervene(cells, cfg: DictConfig, argv: Sequence[str] = (), out=print) -> int:
    """Branch every ended multi-agent cell of the sweep (harness.intervene) and launch the arms as the
    cells of `<sweep>-interventions` with their parents' resources; then the intervention report."""
    from omegaconf import OmegaConf

    from grid.submit import read_status
    from harness.config import ConfigError
    from harness.intervene import ARM_WORDS, first_alert, interventions_sweep, prepare, prepare_sham, sham_steps
    from harness.mitigations import mitigation_names

    words = [str(w) for w in cfg.intervene.arms]
    for word in words:  # bad arms are bad input, before any folder is seeded
        if word not in ARM_WORDS:
            try:
                mitigation_names(word)
            except ConfigError:
                raise GridError(f"unknown arm '{word}' in intervene.arms; valid: {', '.join(ARM_WORDS)} or a "
                                f"mitigation name") from None
    sweep_dir = Path(cfg.root) / cfg.sweep.name
    arms, alerted = [], {}
    for cell in cells:
        if cell.is_baseline:
            continue
        run = sweep_dir / cell.cell_id
        state = (read_status(run) or {}).get("state")
        if state not in ("finished", "stopped_early"):
            out(f"skip {cell.cell_id}: {state or 'not run'}, not ended")
            continue
        try:
            branched = prepare(run, str(cfg.intervene.at), words, None, cfg.intervene.kind)
        except ConfigError as exc:
            out(f"skip {cell.cell_id}: {exc}")
            continue
        arms += [arm_cell(cell, arm.cfg) for arm in branched]
        alert = first_alert(run, cfg.intervene.kind)
        if alert is not None:
            alerted[cell.cell_id] = (cell, int(alert["step"]))
    if cfg.intervene.sham:  # each alerted cell's matched mitigation at another alerted cell's alert step
        for cell_id, step in sham_steps({c: s for c, (_, s) in alerted.items()}).items():
            cell = alerted[cell_id][0]
            try:
                branched = prepare_sham(sweep_dir / cell_id, step, cfg.intervene.kind)
            except ConfigError as exc:
                out(f"skip the sham arm of {cell_id}: {exc}")
                continue
            arms += [arm_cell(cell, arm.cfg) for arm in branched]
    if not arms:
        out(f"nothing to branch in {sweep_dir}: no ended cell with an alert")
        return 0
    arms_cfg = OmegaConf.merge(cfg, {"sweep": {"name": interventions_sweep(cfg.sweep.name)}})
    code = launch(arms, arms_cfg, argv, out)
    if arms_cfg.launcher.name != "slurm" or cfg.get("wait"):
        out(f"intervention report: {build_report('interventions', sweep_dir)}")
    return code


def diagnosis_mechanisms(cfg: DictConfig, sharing: str) -> Optional[List[str]]:
    """diagnose.mechanisms: null (every registered one that applies), a list, or sharing -> list."""
    from omegaconf import OmegaConf

    chosen = cfg.diagnose.mechanisms
    if chosen is None:
        return None
    if OmegaConf.is_dict(chosen):
        return [str(m) for m in chosen.get(sharing, [])] if sharing in chosen else None
    return [str(m) for m in chosen]


def setting_of(cell) -> tuple:
    """A cell's setting: every axis value but the seed (diagnose.limit counts failed cells per setting,
    so each planted cause, not only each sharing mode, gets its share of a budget)."""
    return tuple(sorted((axis, str(value)) for axis, value in cell.axes.items() if axis != "seed"))


def diagnose(cells, cfg: DictConfig, argv: Sequence[str] = (), out=print) -> int:
    """Branch every failed multi-agent cell of the sweep before its failure (harness.diagnose) and
    launch the arms as the cells of `<sweep>-diagnosis`; then each run's verdict (diagnosis.json).
    diagnose.limit: at most that many failed cells per setting (every axis but the seed: a sharing mode,
    a planted cause), in seed order (a study's budget).
    With dry_run=true: the plan and its cost, nothing written."""
    from omegaconf import OmegaConf

    from grid.submit import read_status
    from harness.config import ConfigError
    from harness.diagnose import describe, diagnosis_sweep, plan, power, seed, write_verdict
    from harness.mechanisms import mechanism_named

    for sharing in {c.axes.get("sharing") for c in cells if not c.is_baseline}:
        for name in diagnosis_mechanisms(cfg, str(sharing)) or []:
            try:
                mechanism_named(name)
            except ConfigError as exc:
                raise GridError(f"diagnose.mechanisms: {exc}") from None
    if int(cfg.diagnose.resamples) < 1:
        raise GridError(f"diagnose.resamples must be >= 1, got {cfg.diagnose.resamples}")
    from analysis.diagnosis import check_rule

    try:
        check_rule(str(cfg.diagnose.rule), "diagnose.rule")
    except ConfigError as exc:
        raise GridError(str(exc)) from None
    sweep_dir = Path(cfg.root) / cfg.sweep.name
    taken: dict = {}
    planned = []
    for cell in sorted((c for c in cells if not c.is_baseline), key=lambda c: (c.axes.get("seed", 0), c.cell_id)):
        run = sweep_dir / cell.cell_id
        state = (read_status(run) or {}).get("state")
        if state not in ("finished", "stopped_early"):
            out(f"skip {cell.cell_id}: {state or 'not run'}, not ended")
            continue
        sharing = str(cell.axes.get("sharing"))
        setting = setting_of(cell)
        if cfg.diagnose.limit is not None and taken.get(setting, 0) >= int(cfg.diagnose.limit):
            continue
        try:
            arms = plan(run, [str(p) for p in cfg.diagnose.at], diagnosis_mechanisms(cfg, sharing),
                        int(cfg.diagnose.resamples), int(cfg.diagnose.margin), strict=False)
        except ConfigError as exc:
            out(f"skip {cell.cell_id}: {exc}")
            continue
        if arms[0].failure is None:  # an alert but no failure: nothing a diagnosis can explain
            out(f"skip {cell.cell_id}: no failure label")
            continue
        taken[setting] = taken.get(setting, 0) + 1
        planned.append((cell, run, arms))
        out(f"{cell.cell_id}: {describe(arms)}".replace("\n", "\n  "))
    if not planned:
        out(f"nothing to diagnose in {sweep_dir}: no ended cell with a failure label")
        return 0
    total = sum(a.cost for _, _, arms in planned for a in arms)
    out(f"{len(planned)} failed cells, {sum(len(arms) for _, _, arms in planned)} arms, {total} cell-steps")
    out(power(int(cfg.diagnose.resamples)))
    if cfg.dry_run:
        out("dry run: nothing written")
        return 0
    for _, _, arms in planned:
        seed(arms)
    cells_out = [arm_cell(cell, arm.cfg) for cell, _, arms in planned for arm in arms]
    arms_cfg = OmegaConf.merge(cfg, {"sweep": {"name": diagnosis_sweep(cfg.sweep.name)}})
    code = launch(cells_out, arms_cfg, argv, out)
    if arms_cfg.launcher.name != "slurm" or cfg.get("wait"):
        for _, run, _ in planned:
            verdict = json.loads(write_verdict(run, rule=str(cfg.diagnose.rule)).read_text())
            for line in verdict["lines"]:
                out(f"{run.name}: {line}")
        print_confusion(sweep_dir, out)
        sweep_report(sweep_dir, out)
    return code


def print_confusion(sweep_dir: Path, out) -> None:
    """Where the sweep plants causes (a `planted` axis): planted x diagnosed, and how it meets its aim."""
    from analysis.diagnosis import confusion, confusion_summary, sweep_diagnoses
    from analysis.tables import to_markdown

    rows = sweep_diagnoses(sweep_dir)
    table = confusion(rows)
    if len(table):
        out("planted cause x diagnosis:\n" + to_markdown(table))
        out(confusion_summary(rows))


def sweep_report(sweep_dir: Path, out) -> None:
    try:
        out(f"sweep report: {build_report('sweep', sweep_dir)}")
    except Exception as exc:  # noqa: BLE001 - the sweep itself succeeded; `python -m reports` can retry
        out(f"warning: could not write the sweep report ({type(exc).__name__}: {exc})")


def wait_for_slurm(cells, cfg: DictConfig, out) -> None:
    from grid.submit import Ledger, cell_state

    while True:
        ledger = Ledger(Path(cfg.root) / cfg.sweep.name).read()
        states = [cell_state(c, cfg.root, cfg.sweep.name, ledger) for c in cells]
        if not any(s.state in ("queued", "running") for s in states):
            return
        time.sleep(2)


def sized_configs(cells) -> List:
    """The cells' configs as read, unvalidated: an estimate needs their sizes, not runnable cells (a
    dry run lists a cell's problems, such as data not yet downloaded, beside it)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from harness.config import CellConfig

    configs = []
    for cell in cells:
        try:
            configs.append(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CellConfig),
                                                               OmegaConf.create(cell.overrides))))
        except OmegaConfBaseException:
            continue
    return configs


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    from harness.cli_overrides import print_config_request

    printed = print_config_request(argv)
    try:
        if printed is not None:  # --cfg job: the resolved sweep, launcher and cluster; nothing expanded or run
            cfg = compose(printed)
            print(OmegaConf.to_yaml({k: cfg[k] for k in ("sweep", "launcher", "cluster", "action", "root")}), end="")
            return 0
        cfg = compose(argv)
        if cfg.action == "status":
            cfg = compose_as_launched(cfg, argv)
        cells = expand(cfg.sweep, cfg.cluster, cfg.root)
        if cfg.action == "diagnose":  # its dry run is the arms' plan, not the sweep's
            return diagnose(cells, cfg, argv)
        if cfg.action == "evaluate":  # its dry run is the checkpoints each cell would score
            return evaluate(cells, cfg)
        if cfg.dry_run:
            invalid = check_cells(cells, strict=False)
            print(table(cells))
            configs = sized_configs(cells)
            for line in settings_lines(configs):
                print(line)
            estimate = estimate_line(configs, load_measurement())
            if estimate:  # before the summary, which stays the last line
                print(estimate)
            n_base = sum(c.is_baseline for c in cells)
            gpu_hours = sum(c.resources.gpu_hours for c in cells)
            print(f"{len(cells)} cells: {len(cells) - n_base} multi-agent + {n_base} single-agent baselines "
                  f"(sweep {cfg.sweep.name}, launcher {cfg.launcher.name}, cluster {cfg.cluster.name}); "
                  f"{gpu_hours:g} GPU-hours reserved (GPUs x time limit, an upper bound); dry run: nothing submitted")
            if invalid:
                print(f"error: {invalid} of {len(cells)} cells are invalid (their check column says why)", file=sys.stderr)
                return EXIT_BAD_INPUT
            return 0
        check_cells(cells, strict=True)  # every problem surfaces before the first submission
        if cfg.action == "status":
            states = print_status(cells, cfg)
            if not any(s.state in ("queued", "running") for s in states):
                settle_alerts(Path(cfg.root) / cfg.sweep.name, print)
            return 0
        if cfg.action == "intervene":
            return intervene(cells, cfg, argv)
        return launch(cells, cfg, argv)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
