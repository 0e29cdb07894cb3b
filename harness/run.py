"""Train one cell: `python -m harness.run topology=voting sharing=ip task=arith scale=tiny-m steps=100 seed=0`.

Lifecycle: validate the config (nothing touches the disk before that), prepare the base model,
take the cell's lock, resume from the last checkpoint if there is one, train with a progress
bar, checkpoint every `ckpt_every` steps, and mark the run finished. A finished cell is left
alone; a failed one records why in status.json.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional, Sequence

from omegaconf import OmegaConf

from harness.config import CellConfig, ConfigError, monitor_start
from harness.run_dir import RunDir, stored_cell_config, write_atomic
from harness.wandb_sink import wandb_settings
from harness.validation import load_config
from harness.metric_keys import role_key

EXIT_BAD_INPUT = 2
EXIT_LOCKED = 3
# keys that may differ between the stored and the requested config of the same run dir
RESUMABLE_KEYS = ("steps", "progress", "root", "ckpt_keep")


def run_dir_of(cfg: CellConfig) -> RunDir:
    return RunDir(Path(cfg.root) / cfg.sweep / cfg.cell_id)


def _config_mismatch(stored: dict, requested: dict) -> List[str]:
    keys = (set(stored) | set(requested)) - set(RESUMABLE_KEYS)
    return sorted(k for k in keys if stored.get(k) != requested.get(k))


class NodeLost(RuntimeError):
    """A node of a multi-node cell went away mid-run (engine=verl over several Ray nodes)."""


class CellFailed(RuntimeError):
    """The cell failed after its config was accepted; status.json says so, with this one-line reason."""


def run_cell(cfg: CellConfig, log=print) -> str:
    """Train (or resume) the cell; returns its final state. Every failure after the config was
    accepted (task loading, the run directory, checkpoints, training, reports) takes one path:
    status.json says `failed` with a one-line reason, the traceback goes to <run>/failure.log,
    and CellFailed carries the reason (ConfigError stays a user mistake: nothing is written)."""
    run_dir = run_dir_of(cfg)
    try:
        return _run_cell(cfg, run_dir, log)
    except ConfigError:
        raise
    except Exception as exc:
        reason = failure_reason(exc)
        where = run_dir.file("failure.log")
        try:
            where.write_text(traceback.format_exc())
        except OSError:
            where = None  # a full disk: the reason in status.json still gets through (written in place)
        if run_dir.path.is_dir():
            run_dir.write_status("failed", reason=reason, failure_log=str(where) if where else None)
        raise CellFailed(reason + (f" (traceback: {where})" if where else "")) from exc


def failure_reason(exc: BaseException) -> str:
    """One line, the cause first: an OS error's message (and file), the first error of a tree copy."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        _, target, why = exc.args[0][0]
        text = f"OSError: {why} (writing {target})"
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}" + (f" ({exc.filename})" if exc.filename else "")
    else:
        text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return text[:300]


def _run_cell(cfg: CellConfig, run_dir: RunDir, log) -> str:
    import torch

    from harness.controller import Controller, sample_records
    from harness.engines import build_engine
    from harness.wandb_sink import WandbSink
    from harness.live_alerts import LiveAlerts
    from harness.monitors import Monitor, stop_reason
    from harness.paired_run import paired_run
    from harness.recipe import CellRecipe
    from harness.warmup import warm_info

    ended = _already_ended(cfg, run_dir, log)
    if ended:
        return ended
    resume = _resume_point(run_dir, log)  # before anything is built or written: damaged state is never trained on
    recipe = CellRecipe.build(cfg)
    task, workflow, policy_map = recipe.task, recipe.workflow, recipe.policy_map
    model_dir = recipe.model_dir(log=log)
    lock = _claim(cfg, run_dir)

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    engine = build_engine(cfg, model_dir, policy_map.policies, run_dir.path / "engine", task=task)
    if getattr(engine, "placement", None):  # engine=verl: which Ray node(s) each policy's workers were given
        write_atomic(run_dir.file("placement.json"), json.dumps({"placement": cfg.verl.placement,
                                                                 "policies": engine.placement}, indent=2))
    controller = Controller.from_recipe(recipe, engine)
    start, best, waiting = _restore(cfg, resume.checkpoint, engine, controller, log)
    if hasattr(engine, "apply_split"):  # a branch that un-shares policies: split now if the load did not
        engine.apply_split()
    run_dir.truncate_from(start)
    for skipped in resume.skipped:  # after the truncation, so the record survives it
        run_dir.append("alerts.jsonl", {"step": start, "kind": "checkpoint", "role": None, "policy": None,
                                        "value": None, "threshold": None, "action": "log",
                                        "message": f"damaged checkpoint skipped ({skipped}); resumed from step {start}"})
    role_contracts = recipe.role_contracts
    monitor = Monitor(cfg.monitors, recipe.role_policies, role_contracts, monitor_start(cfg), reference=paired_run(cfg.monitors))
    sink = WandbSink(cfg, run_dir) if cfg.wandb.enabled and wandb_settings(cfg)["mode"] != "disabled" else None
    desk = LiveAlerts(cfg, run_dir, role_contracts, sink, log)
    # steps before `waiting` (all before `start` when none waited) were judged live: alerts.jsonl holds them
    replayed = monitor.replay(run_dir.records("metrics.jsonl"), desk.written, start if waiting is None else waiting)
    run_dir.write_status("running", step=start, cell_id=cfg.cell_id, pid=os.getpid(), host=os.uname().nodename,
                         policies={p: [f"{r}:{i}" for r, i in policy_map.members(p)] for p in policy_map.policies},
                         contracts=role_contracts,
                         model_dir=str(model_dir), warmup=warm_info(model_dir), reason=None, alerts=desk.counts)
    late = desk.resume(replayed, start, waiting)

    def save(step: int, best_val: float, pin: bool = False) -> Path:
        trainer = {"step": step, "best_val": best_val, "waiting_for_paired_run": monitor.waiting_since()}
        return _save(run_dir, engine, controller, trainer, keep=cfg.ckpt_keep, pin=pin)

    bar = _progress(cfg, start)
    state, reason, step = "finished", stop_reason(late), start - 1
    try:
        for step in range(start, cfg.steps):
            if reason:  # a late alert asked to stop before this step
                state = "stopped_early"
                break
            validated = {}
            if step % cfg.val_every == 0:  # before the step's update: step 0 scores the untrained policy
                validated = _validation(controller, step, updates=step)
                if validated["val/accuracy"] > best:  # the state just scored is the best: keep it
                    best = validated["val/accuracy"]
                    run_dir.save_best(save(step, best))
            result = controller.train_step(step)
            metrics = {"step": step, **result.metrics, **validated}
            final = step == cfg.steps - 1
            if final:  # the trained policy, after the last update (the step's record carries it)
                metrics.update(_validation(controller, step + 1, updates=step + 1))
            run_dir.append("metrics.jsonl", metrics)
            if cfg.samples_every and (step % cfg.samples_every == 0 or step == cfg.steps - 1):
                for record in sample_records(step, result.episodes, n=2):
                    run_dir.append("samples.jsonl", record)
            if sink is not None:
                sink.log(metrics)
            alerts = monitor.observe(metrics)
            desk.observe(alerts, start, step)
            reason = stop_reason(alerts)
            alerted = any(alert.action != "log" for alert in alerts)  # kept: a branch point (harness.intervene)
            improved = final and metrics["val/accuracy"] > best
            best = max(best, metrics["val/accuracy"]) if final else best
            if (step + 1) % cfg.ckpt_every == 0 or final or reason or alerted:
                latest = save(step + 1, best, pin=alerted)
                if improved:
                    run_dir.save_best(latest)
                run_dir.write_status("running", step=step + 1)
            _advance(bar, metrics, workflow)
            if reason:
                state = "stopped_early"
                break
    except Exception as exc:
        if sink is not None:
            sink.finish("failed")
        lost = engine.lost_nodes(exc) if hasattr(engine, "lost_nodes") else None
        if lost:  # a multi-node cell: the reason names the node that went, not the actor call that noticed
            raise NodeLost(f"{lost}: {failure_reason(exc)}") from exc
        raise  # recorded by run_cell's one failure path
    except BaseException:  # interrupted (SLURM requeue/timeout exit, Ctrl-C): not a failure, resumable
        run_dir.write_status("running", reason="interrupted; resumes from the last checkpoint")
        raise
    finally:
        if bar is not None:
            bar.close()
        if hasattr(engine, "shutdown"):
            engine.shutdown()
        lock.close()
    run_dir.write_status(state, step=step + 1 if state == "stopped_early" else cfg.steps, best_val=best,
                         reason=reason, mitigations=desk.mitigations, finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
                         waiting_for_paired_run=monitor.waiting_since())  # judged later: monitors/settle.py
    if sink is not None:
        sink.finish(state)
    if cfg.report:
        _write_report(run_dir, log)
    log(f"cell {cfg.cell_id} {state}{' (' + reason + ')' if reason else ''}: {run_dir.path}")
    return state


def _already_ended(cfg: CellConfig, run_dir: RunDir, log) -> Optional[str]:
    """The state of a run directory that holds this cell already ended (nothing to do), else None; a run
    directory that holds another config is refused."""
    status = run_dir.read_status()
    if run_dir.file("cell.yaml").is_file():
        try:  # in today's form: settings added since take their defaults, retired ones are upgraded
            stored = OmegaConf.to_container(OmegaConf.structured(stored_cell_config(run_dir.path)), enum_to_str=True)
        except Exception:  # noqa: BLE001 - a config today's harness cannot read: compared as written
            stored = OmegaConf.to_container(OmegaConf.load(run_dir.file("cell.yaml")))
        differing = _config_mismatch(stored, OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True))
        if differing:
            raise ConfigError(f"{run_dir.path} holds a run with a different config ({', '.join(differing)}); "
                              f"choose another sweep= or cell_id=")
    if status and (status.get("state") == "stopped_early"
                   or (status.get("state") == "finished" and status.get("step", 0) >= cfg.steps)):
        log(f"cell {cfg.cell_id} already {status['state']} at step {status['step']} ({run_dir.path}); nothing to do")
        return status["state"]
    return None


def _resume_point(run_dir: RunDir, log):
    """The newest intact checkpoint (or step 0); a damaged one is skipped with a warning, never trained on."""
    from harness.checkpoints import CheckpointError

    try:
        resume = run_dir.resume_point()
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    for skipped in resume.skipped:
        log(f"warning: checkpoint {skipped}; falling back to "
            f"{resume.checkpoint.name if resume.checkpoint else 'step 0'}")
    return resume


def _claim(cfg: CellConfig, run_dir: RunDir):
    """The run directory, created and locked for this process (the lock is held while it trains), with the
    cell's config written in it; a second process on the same cell is refused."""
    run_dir.path.mkdir(parents=True, exist_ok=True)
    lock = open(run_dir.file(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"cell {cfg.cell_id} is already running ({run_dir.path}.lock held)") from None
    run_dir.create()
    write_atomic(run_dir.file("cell.yaml"), OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return lock


def _restore(cfg: CellConfig, checkpoint: Optional[Path], engine, controller, log):
    """(first step, best validation so far, the step the paired run was awaited from) after loading
    `checkpoint` into the engine and controller; (0, -1, None) without one."""
    if checkpoint is None:
        return 0, -1.0, None
    engine.load(checkpoint)
    controller.load(checkpoint)
    state = OmegaConf.to_container(OmegaConf.load(checkpoint / "trainer.yaml"))
    start, best, waiting = int(state["step"]), float(state["best_val"]), None
    if "waiting_for_paired_run" in state:
        waiting = state["waiting_for_paired_run"]
    else:
        log(f"checkpoint {checkpoint.name} predates the record of steps left waiting for the paired run: "
            f"steps before {start} that waited for it may stay unjudged (alerts.jsonl keeps what was judged live)")
    log(f"resuming {cfg.cell_id} from step {start}")
    return start, best, waiting


def _save(run_dir: RunDir, engine, controller, trainer: dict, keep: int, pin: bool = False) -> Path:
    """A checkpoint at `trainer['step']`: the engine's weights, the controller's state, the trainer's."""
    def write(directory: Path) -> None:
        engine.save(directory)
        controller.save(directory)
        (directory / "trainer.yaml").write_text(OmegaConf.to_yaml(trainer))
    return run_dir.save_checkpoint(trainer["step"], write, keep=keep, pin=pin)


def _validation(controller, seed_step: int, updates: int) -> dict:
    """Validation of the policy after `updates` updates, seeded by `seed_step`; `val/updates` says which
    policy it scored (a scheduled validation runs before its step's update)."""
    return {**controller.validate(seed_step), "val/updates": float(updates)}


def _write_report(run_dir: RunDir, log) -> None:
    """The run's diagnostic report; a report that cannot be drawn never fails a finished run."""
    try:
        from harness.report_hooks import build_report

        log(f"report: {build_report('run', run_dir.path)}")
    except Exception as exc:  # noqa: BLE001 - reported, and `python -m reports <run>` can retry
        log(f"warning: could not write the report ({type(exc).__name__}: {exc}); retry with python -m reports {run_dir.path}")


def _progress(cfg: CellConfig, start: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, desc=cfg.cell_id, dynamic_ncols=True, file=sys.stderr)


def _advance(bar, metrics: dict, workflow) -> None:
    if bar is None:
        return
    postfix = {"reward": f"{metrics.get('reward/mean', 0):.2f}"}
    if "val/accuracy" in metrics:
        postfix["val"] = f"{metrics['val/accuracy']:.2f}"
    for role in workflow.roles():
        length = metrics.get(role_key(role.name, "response_length"))
        if length is not None:
            postfix[f"len_{role.name}"] = f"{length:.1f}"
    bar.set_postfix(postfix, refresh=False)
    bar.update(1)


def cell_help(section: Optional[str] = None) -> str:
    """--help: what a cell is and its sections, one line each; --help <section>: that section's keys
    and defaults (--help all: every key)."""
    from dataclasses import fields, is_dataclass

    schema = OmegaConf.structured(CellConfig)
    sections = [f.name for f in fields(CellConfig) if is_dataclass(f.default_factory)]  # a field built from a dataclass
    if section == "all":
        return OmegaConf.to_yaml(schema)
    if section is not None:
        if section not in sections:
            return (f"error: no section '{section}'; valid: {', '.join(sections)} (or all)")
        return f"{section}:\n" + "\n".join("  " + line for line in OmegaConf.to_yaml(schema[section]).splitlines())
    top = [f"  {f.name}={getattr(CellConfig, f.name, None)}" for f in fields(CellConfig) if f.name not in sections]
    lines = [__doc__.strip(), "", "Settings (key=value; every key with its default: --help all):", *top, "",
             "Sections (--help <section> lists its keys and defaults):"]
    for name in sections:
        lines.append(f"  {name:<12} {SECTION_HELP.get(name, '')}".rstrip())
    return "\n".join(lines)


SECTION_HELP = {
    "workflow": "the roles' protocol sizes (votes, drafts, subtasks), token budgets, prompts, how contracts are read",
    "sharing_cfg": "custom policy groups (sharing=custom); un-sharing at a branch (harness.diagnose)",
    "model": "base checkpoint, LoRA rank, alpha and target layers, the tiny models' cache",
    "algo": "the GRPO / PPO update: batch, mini-batches, lr, clipping, loss, advantages, KL, I6",
    "reward": "per-turn reward terms (node, turn, outcome, length) and per-role weights",
    "arith": "the tiny model's synthetic arithmetic task",
    "data": "real datasets: files, splits, the validation set, DeepCoder's wording and runtime filter",
    "code_synth": "the tiny model's synthetic code task",
    "qa_synth": "the generated multi-hop QA world",
    "sandbox": "the jail model-written code runs in",
    "monitors": "the detectors, their thresholds and actions (alert, stop, mitigate)",
    "wandb": "wandb's mode, project and entity (offline by default)",
    "instrument": "the per-role gradient probe",
    "verl": "engine=verl: Ray worker groups, FSDP, vLLM rollouts",
    "local": "engine=local: device and precision",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # a cell process owns its wandb service: an inherited one (a parent that used wandb) would keep
    # a killed attempt's run open and refuse the resumed attempt ("run ID is in use")
    os.environ.pop("WANDB_SERVICE", None)
    if argv and argv[0] in ("-h", "--help"):
        text = cell_help(argv[1] if len(argv) > 1 else None)
        print(text, file=sys.stdout if not text.startswith("error:") else sys.stderr)
        return 0 if not text.startswith("error:") else EXIT_BAD_INPUT
    from harness.cli_overrides import print_config_request

    printed = print_config_request(argv)
    try:
        cfg = load_config(argv if printed is None else printed)
        if printed is not None:  # --cfg job: the resolved cell config, nothing run
            print(OmegaConf.to_yaml(OmegaConf.structured(cfg)), end="")
            return 0
        run_cell(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CellFailed as exc:
        print(f"error: cell failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
