"""Test a diagnosis by intervening: branch a run at an alert into arms that differ only by a mitigation.

    python -m harness.intervene runs/repro_mixed/voting-ip-arith-tiny-m-s200-setting=mb2 \\
        --at first-alert [--kind amplification] --arms none,matched,control [--steps N] [--prepare-only]

Each arm is an ordinary cell, `<cell>@<K>+<arm>`, in the folder `<sweep>-interventions` beside the
run's sweep folder (so the sweep's own tables count each seed once): it starts from
the run's newest verified checkpoint at or before the branch step (K steps done; a run keeps the
checkpoint at each of its alerts), switches its arm's mitigation on from there and trains to the
run's horizon (or `--steps`). Steps are seeded from (seed, step) alone, so every arm draws the same
problems and sampling seeds step for step (common random numbers): arms differ by the intervention
only, and the `none` arm repeats the run's own steps key for key. `matched` is the mitigation of the
first alert's kind (monitors.mitigations), `control` one aimed at the other failure mode
(monitors.controls); any mitigation name is an arm too. An arm folder holds the run's records before
K, its checkpoint and `branch.json` (where it came from); it resumes, reports and can be submitted
like any cell.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from harness.config import CellConfig, ConfigError

EXIT_BAD_INPUT = 2
ARM_WORDS = ("none", "matched", "control")
DETECTOR_KINDS = ("amplification", "capture", "length_drift", "collapse", "non_finite")


@dataclass(frozen=True)
class Branch:
    """Where a run is branched: the step the arms first differ at (`step`), the checkpoint they start
    from (`checkpoint`, K = `start` steps done, K <= step) and the alert that chose it, if any."""

    run: Path
    step: int
    checkpoint: Path
    start: int
    alert: Optional[dict]


@dataclass(frozen=True)
class Arm:
    label: str  # as asked: none, matched, control or a mitigation name
    mitigation: str  # what it switches on
    cfg: CellConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.root) / self.cfg.sweep / self.cfg.cell_id


def first_alert(run: Path, kind: Optional[str] = None) -> Optional[dict]:
    """The run's first detector alert that was more than logged (alerts.jsonl), of `kind` if given;
    of several at one step, the first written."""
    from harness.run_dir import read_jsonl

    alerts = [a for a in read_jsonl(run / "alerts.jsonl") if a.get("kind") in DETECTOR_KINDS
              and a.get("action") != "log" and (kind is None or a["kind"] == kind)]
    return min(alerts, key=lambda a: a["step"]) if alerts else None


def find_branch(run: Path, at: str, horizon: int, kind: Optional[str] = None) -> Branch:
    """`at` is `first-alert` (the arms differ from the step after it, as action=mitigate would) or a step."""
    from harness.checkpoints import problem_with, step_of

    alert = None
    if kind is not None and kind not in DETECTOR_KINDS:
        raise ConfigError(f"unknown alert kind '{kind}'; valid: {', '.join(DETECTOR_KINDS)}")
    if at == "first-alert":
        alert = first_alert(run, kind)
        if alert is None:
            raise ConfigError(f"{run} has no {kind + ' ' if kind else ''}alert to branch at (alerts.jsonl); "
                              f"give a step: --at <step>")
        step = int(alert["step"]) + 1
    else:
        try:
            step = int(at)
        except ValueError:
            raise ConfigError(f"--at must be first-alert or a step number, got '{at}'") from None
    if not 0 < step < horizon:
        raise ConfigError(f"branch step {step} is outside the run's training steps 1..{horizon - 1}")
    candidates = sorted((p for p in (run / "checkpoints").glob("step_*") if p.is_dir() and step_of(p) <= step),
                        key=step_of, reverse=True)
    for checkpoint in candidates:
        if problem_with(checkpoint) is None:
            return Branch(run, step, checkpoint, step_of(checkpoint), alert)
    raise ConfigError(f"{run} has no verified checkpoint at or before step {step}"
                      + (f" (checked: {', '.join(p.name for p in candidates)})" if candidates else ""))


def resolve_arms(words: Sequence[str], parent: CellConfig, alert: Optional[dict]) -> List[tuple]:
    """(label, mitigation) per arm; `matched` and `control` read the alert's kind."""
    from harness.mitigations import mitigation_names

    arms = []
    for word in words:
        if word in ("matched", "control"):
            if alert is None:
                raise ConfigError(f"arm '{word}' needs an alert to match: use --at first-alert, or name mitigations")
            mapping = parent.monitors.mitigations if word == "matched" else parent.monitors.controls
            arms.append((word, mapping.get(alert["kind"], "none")))
        else:
            try:
                mitigation_names(word)
            except ConfigError as exc:
                raise ConfigError(f"unknown arm '{word}'; valid: {', '.join(ARM_WORDS)} or a mitigation "
                                  f"({str(exc).split('valid choices: ', 1)[-1]}") from None
            arms.append((word, word))
    if len({label for label, _ in arms}) != len(arms):
        raise ConfigError(f"an arm is named twice: {', '.join(label for label, _ in arms)}")
    return arms


def interventions_sweep(sweep: str) -> str:
    """Arms live in a sweep folder of their own beside the run's, so the run's sweep tables count
    each seed once; the intervention report reads both."""
    return f"{sweep}-interventions"


def arm_config(parent: CellConfig, run: Path, branch: Branch, label: str, mitigation: str,
               steps: Optional[int], sweep: Optional[str] = None, edit=None) -> CellConfig:
    """The parent's config with the arm's mitigation added (and `edit(values)`'s changes), its own id,
    in the arms' sweep folder (`<sweep>-interventions` unless `sweep`); validated as any cell is."""
    from omegaconf import OmegaConf

    from harness.mitigations import mitigation_names
    from harness.validation import config_from_dict

    values = OmegaConf.to_container(OmegaConf.structured(parent), enum_to_str=True)
    own = [n for n in mitigation_names(parent.mitigation) if n != "none"]
    added = [n for n in mitigation_names(mitigation) if n != "none" and n not in own]
    values.update(cell_id=f"{parent.cell_id}@{branch.start}+{label}", mitigation="+".join(own + added) or "none",
                  root=str(run.parent.parent), sweep=sweep or interventions_sweep(run.parent.name),
                  steps=steps or parent.steps)
    if values["steps"] <= branch.start:
        raise ConfigError(f"--steps {values['steps']} ends before the branch point (step {branch.start})")
    if edit is not None:
        edit(values)
    return config_from_dict(values)


def seed_arm(arm: Arm, branch: Branch, extra: Optional[dict] = None) -> None:
    """The arm's folder: the parent's records before K, its checkpoint K, and branch.json. Built aside
    and renamed, so an arm folder is either complete or absent."""
    from harness.run_dir import LOG_FILES, iter_jsonl, write_atomic

    target = arm.run_dir
    staging = target.with_name(f".{target.name}.seeding")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "checkpoints").mkdir(parents=True)
    shutil.copytree(branch.checkpoint, staging / "checkpoints" / branch.checkpoint.name)
    write_atomic(staging / "checkpoints" / "latest.json", json.dumps({"dir": branch.checkpoint.name,
                                                                      "step": branch.start}))
    for name in LOG_FILES:
        source = branch.run / name
        kept = [r for r in iter_jsonl(source) if int(r.get("step", -1)) < branch.start] if source.exists() else []
        (staging / name).write_text("".join(json.dumps(r) + "\n" for r in kept))
    (staging / "branch.json").write_text(json.dumps({
        "parent": str(branch.run), "parent_cell": branch.run.name, "branch_step": branch.step,
        "checkpoint": branch.checkpoint.name, "start": branch.start, "arm": arm.label, "mitigation": arm.mitigation,
        "alert": branch.alert, **(extra or {})}, indent=2) + "\n")
    staging.rename(target)


def prepare(run: Path, at: str, words: Sequence[str], steps: Optional[int] = None,
            kind: Optional[str] = None) -> List[Arm]:
    """Check everything, then seed every arm's folder (an arm folder that already exists is kept: its
    cell resumes). Bad input raises ConfigError before anything is written."""
    from harness.run_dir import stored_cell_config

    run = Path(run).resolve()
    if not (run / "cell.yaml").is_file():
        raise ConfigError(f"{run} is not a run directory (no cell.yaml)")
    parent = stored_cell_config(run)
    branch = find_branch(run, at, steps or parent.steps, kind)
    arms = [Arm(label, mitigation, arm_config(parent, run, branch, label, mitigation, steps))
            for label, mitigation in resolve_arms(words, parent, branch.alert)]
    for arm in arms:
        if not arm.run_dir.exists():
            seed_arm(arm, branch)
    return arms


def prepare_sham(run: Path, step: int, kind: Optional[str] = None, steps: Optional[int] = None) -> List[Arm]:
    """The `sham` arm: the matched mitigation of the run's first alert (of `kind`), switched on at
    `step`, a step chosen without any alert of this run (the grid draws another branched cell's
    alert step): does the mitigation save the cell whenever it comes, or only at the alert?"""
    from harness.run_dir import stored_cell_config

    run = Path(run).resolve()
    parent = stored_cell_config(run)
    alert = first_alert(run, kind)
    if alert is None:
        raise ConfigError(f"{run} has no {kind + ' ' if kind else ''}alert whose matched mitigation a sham arm takes")
    branch = find_branch(run, str(step), steps or parent.steps)
    mitigation = parent.monitors.mitigations.get(alert["kind"], "none")
    arm = Arm("sham", mitigation, arm_config(parent, run, branch, "sham", mitigation, steps))
    if not arm.run_dir.exists():
        seed_arm(arm, Branch(run, branch.step, branch.checkpoint, branch.start, None), {"sham_of": alert})
    return [arm]


def sham_steps(first_steps: Dict[str, int]) -> Dict[str, int]:
    """Cell -> a sham branch step: the alert step of the next cell in id order (a cyclic shift), so
    the sham steps are the alert steps themselves, each given to a cell it did not come from."""
    cells = sorted(first_steps)
    return {cell: first_steps[cells[(i + 1) % len(cells)]] + 1 for i, cell in enumerate(cells)} if len(cells) > 1 else {}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.intervene", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory (<root>/<sweep>/<cell>)")
    parser.add_argument("--at", default="first-alert", help="first-alert (default) or a step")
    parser.add_argument("--kind", default=None, help=f"first-alert of this kind only ({', '.join(DETECTOR_KINDS)})")
    parser.add_argument("--arms", default="none,matched,control",
                        help="comma-separated: none, matched, control, or mitigation names ('a+b' for several)")
    parser.add_argument("--steps", type=int, default=None, help="train each arm to this step (default: the run's)")
    parser.add_argument("--prepare-only", action="store_true", help="seed the arms' folders, train nothing")
    parser.add_argument("--sham-at", type=int, default=None,
                        help="instead: one `sham` arm, the first alert's matched mitigation switched on at this step")
    args = parser.parse_args(argv)
    try:
        if args.sham_at is not None:
            arms = prepare_sham(args.run, args.sham_at, args.kind, args.steps)
        else:
            arms = prepare(args.run, args.at, [w.strip() for w in args.arms.split(",") if w.strip()], args.steps,
                           args.kind)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for arm in arms:
        print(f"arm {arm.label}: {arm.mitigation} -> {arm.run_dir}")
    if args.prepare_only:
        return 0
    from harness.run import CellFailed, run_cell

    failed = 0
    for arm in arms:
        try:
            run_cell(arm.cfg)
        except CellFailed as exc:
            print(f"error: arm {arm.label} failed: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
