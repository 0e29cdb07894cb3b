"""Why did this run fail? Branch it before the failure into arms that each remove one mechanism,
resample to know chance, and name the mechanism whose removal saves the run.

    python -m harness.diagnose runs/repro_branch/voting-ip-arith-tiny-m-s603-action=alert-setting=mb2 \\
        [--at label-15] [--mechanisms unshare_instances,slow_down] [--resamples 6] [--margin 20] [--dry-run]

From the run's newest verified checkpoint at or before each branch point (`label-N`: N steps before
its first failure label; `first-alert`; `last-healthy`: its last validation before the failure; or a
step), each arm trains to the failure's step plus `--margin`:
- `none` on rollout streams 0..R-1 (`resample`: the same state and problems, other samples; stream 0
  repeats the run key for key): how often this state fails by chance;
- every mechanism that applies (harness/mechanisms.py) on the same streams, arm j paired with none j.

Arms are cells `<cell>@<K>+<mechanism>~r<j>` of `<sweep>-diagnosis` beside the run's sweep, seeded
like intervention arms (branch.json says where they came from); `grid/launch.py ... action=diagnose`
runs them for every failed cell of a sweep, locally or on SLURM. When they have run, the verdict
(analysis/diagnosis.py) goes to `<run>/diagnosis.json`: per branch point, each mechanism's failures
against none's and against slowing down (McNemar exact), and one line naming the mechanism whose
arm beat both, or "generic", or "undetermined". --dry-run prints the plan and its cost in cell-steps,
and writes nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from harness.config import CellConfig, ConfigError
from harness.intervene import Branch, arm_config, find_branch, first_alert, seed_arm

EXIT_BAD_INPUT = 2
POINTS = ("label-<N>", "first-alert", "last-healthy", "<step>")


def diagnosis_sweep(sweep: str) -> str:
    return f"{sweep}-diagnosis"


@dataclass(frozen=True)
class DiagnosisArm:
    label: str  # none or the mechanism's name
    resample: int
    point: str  # the branch point as asked (label-15, first-alert, ...)
    branch: Branch
    cfg: CellConfig
    failure: Optional[dict] = None  # the failure diagnosed (its label's record)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.root) / self.cfg.sweep / self.cfg.cell_id

    @property
    def cost(self) -> int:
        """Cell-steps it trains."""
        return self.cfg.steps - self.branch.start


def failure_of(run: Path):
    """The run's first failure label (analysis/labels.py), or None."""
    from analysis.labels import label_run

    labels = label_run(run)
    return min(labels, key=lambda l: l.step) if labels else None


def branch_step(run: Path, point: str, failure, alert: Optional[dict]) -> int:
    from harness.run_dir import read_jsonl

    if point == "first-alert":
        if alert is None:
            raise ConfigError(f"{run} has no alert to branch at (alerts.jsonl); valid points: {', '.join(POINTS)}")
        return int(alert["step"]) + 1
    if point.startswith("label-"):
        if failure is None:
            raise ConfigError(f"{run} has no failure label to branch before; valid points: first-alert or a step")
        try:
            return failure.step - int(point.split("-", 1)[1])
        except ValueError:
            raise ConfigError(f"branch point '{point}': label-<N> needs a whole number of steps") from None
    if point == "last-healthy":
        if failure is None:
            raise ConfigError(f"{run} has no failure label: it never stopped being healthy")
        steps = [int(r["step"]) for r in read_jsonl(run / "metrics.jsonl")
                 if isinstance(r.get("val/accuracy"), (int, float)) and r["step"] < failure.step]
        if not steps:
            raise ConfigError(f"{run} has no validation before its failure at step {failure.step}")
        return max(steps)
    try:
        return int(point)
    except ValueError:
        raise ConfigError(f"unknown branch point '{point}'; valid: {', '.join(POINTS)}") from None


def context_of(run: Path, parent: CellConfig, before: int):
    from harness.run_dir import read_jsonl
    from harness.mechanisms import ArmContext
    from harness.monitors.settle import role_contracts_of

    status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
    members = {p: [(m.rsplit(":", 1)[0], int(m.rsplit(":", 1)[1])) for m in found]
               for p, found in (status.get("policies") or {}).items()}
    records = [r for r in read_jsonl(run / "metrics.jsonl") if isinstance(r.get("step"), int) and r["step"] < before]
    return ArmContext(parent, members, role_contracts_of(status) or {}, records)


def given_failure(step: int, steps: int):
    """A failure the user labelled (--failure-step): their own definition, at a step the run reached."""
    from analysis.labels import FailureLabel

    if not 0 < step < steps:
        raise ConfigError(f"--failure-step {step} is outside the run's steps 1..{steps - 1}")
    return FailureLabel("given", step, None, f"a failure at step {step}, given on the command line")


def plan(run: Path, points: Sequence[str] = ("label-15",), mechanisms: Optional[Sequence[str]] = None,
         resamples: int = 6, margin: int = 20, failure_step: Optional[int] = None,
         strict: bool = True) -> List[DiagnosisArm]:
    """Every arm, checked and configured; nothing written. Bad input raises ConfigError; a named
    mechanism that does not apply to this run is bad input too unless `strict` is off (a sweep's list
    names mechanisms for every cell: each cell takes those that apply)."""
    from harness.run_dir import stored_cell_config
    from harness.mechanisms import MECHANISMS, mechanism_named

    run = Path(run).resolve()
    if not (run / "cell.yaml").is_file():
        raise ConfigError(f"{run} is not a run directory (no cell.yaml)")
    if resamples < 1:
        raise ConfigError(f"--resamples must be >= 1, got {resamples}")
    parent = stored_cell_config(run)
    failure = failure_of(run) if failure_step is None else given_failure(failure_step, parent.steps)
    alert = first_alert(run)
    if failure is None and alert is None:
        raise ConfigError(f"{run} did not fail (no failure label) and raised no alert: nothing to diagnose")
    horizon = min(parent.steps, failure.step + margin) if failure is not None else parent.steps
    chosen = [mechanism_named(m) for m in (mechanisms if mechanisms is not None else list(MECHANISMS))]
    arms: List[DiagnosisArm] = []
    for point in points:
        step = branch_step(run, point, failure, alert)
        if not 0 < step < horizon:
            raise ConfigError(f"branch point {point} is step {step}, outside the arms' steps 1..{horizon - 1}")
        branch = find_branch(run, str(step), horizon)
        context = context_of(run, parent, branch.start)
        usable = [m for m in chosen if m.applies(context) is None]
        if strict and mechanisms is not None and len(usable) < len(chosen):
            skipped = next(m for m in chosen if m not in usable)
            raise ConfigError(f"mechanism {skipped.name} does not apply to {run.name}: {skipped.applies(context)}")
        for resample in range(resamples):
            for mechanism in [None] + usable:
                label = "none" if mechanism is None else mechanism.name

                def edit(values, mechanism=mechanism, resample=resample):
                    values["resample"] = resample
                    values["cell_id"] = f"{values['cell_id']}~r{resample}"
                    if mechanism is not None:
                        mechanism.build(values, context)

                cfg = arm_config(parent, run, branch, label, "none", horizon, diagnosis_sweep(run.parent.name), edit)
                arms.append(DiagnosisArm(label, resample, point, branch, cfg,
                                         failure.record() if failure is not None else None))
    return arms


def seed(arms: Sequence[DiagnosisArm]) -> None:
    """Each arm's folder (the run's records before its branch, its checkpoint, branch.json)."""
    from harness.intervene import Arm

    for arm in arms:
        if not arm.run_dir.exists():
            seed_arm(Arm(arm.label, arm.cfg.mitigation, arm.cfg), arm.branch,
                     {"mechanism": arm.label, "resample": arm.resample, "point": arm.point, "failure": arm.failure})


def describe(arms: Sequence[DiagnosisArm]) -> str:
    lines = []
    for point in dict.fromkeys(a.point for a in arms):
        mine = [a for a in arms if a.point == point]
        first = mine[0]
        labels = list(dict.fromkeys(a.label for a in mine))
        lines.append(f"{point}: from checkpoint step {first.branch.start} (branch step {first.branch.step}) to step "
                     f"{first.cfg.steps}; arms {', '.join(labels)} x resamples 0-{max(a.resample for a in mine)}")
    total = sum(a.cost for a in arms)
    lines.append(f"{len(arms)} arms, {total} cell-steps (each arm {arms[0].cost} steps)" if len({a.cost for a in arms}) == 1
                 else f"{len(arms)} arms, {total} cell-steps")
    return "\n".join(lines)


def power(resamples: int) -> str:
    """What the plan can show before it runs: an arm is told apart from `none` (or from slowing down)
    only when enough paired resamples differ, all its way; a plan with fewer resamples cannot name a
    mechanism whatever its arms do."""
    from analysis.paired import ALPHA, least_discordant

    needed, test = least_discordant(), f"exact sign test, p < {ALPHA}"
    if resamples < needed:
        return (f"power: with {resamples} resamples no arm can be told apart from none or from slowing down: the exact "
                f"sign test needs {needed} paired resamples that differ, all one way, for p < {ALPHA} "
                f"(--resamples {needed} or more)")
    if resamples == needed:
        return (f"power: an arm is told apart from none or from slowing down only when all {needed} paired resamples "
                f"differ its way ({test}): a mechanism is named only where none and slowing down fail on every "
                "stream and its arm on none")
    return (f"power: an arm is told apart from none or from slowing down only when at least {needed} of its "
            f"{resamples} paired resamples differ, all its way ({test})")


def write_verdict(run: Path, failure: Optional[dict] = None, rule: str = "failures") -> Path:
    """diagnosis.json in the run directory from the arms that ran (analysis/diagnosis.py); `failure`:
    the one diagnosed, where it is not the run's first label (--failure-step); `rule`: the verdict's."""
    from analysis.diagnosis import diagnose_run

    run = Path(run).resolve()
    verdict = diagnose_run(run, run.parent.parent / diagnosis_sweep(run.parent.name), failure=failure, rule=rule)
    target = run / "diagnosis.json"
    from harness.run_dir import write_atomic

    write_atomic(target, json.dumps(verdict, indent=2) + "\n")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.diagnose", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory (<root>/<sweep>/<cell>)")
    parser.add_argument("--at", default="label-15", help="branch points, comma-separated: label-<N>, first-alert, "
                                                          "last-healthy or a step (default label-15)")
    parser.add_argument("--mechanisms", default=None, help="comma-separated (default: every registered one that applies)")
    parser.add_argument("--resamples", type=int, default=6, help="rollout streams per arm (default 6)")
    parser.add_argument("--margin", type=int, default=20, help="steps past the failure the arms run (default 20)")
    parser.add_argument("--failure-step", type=int, default=None,
                        help="the step the run failed at by a definition of your own (default: its first failure label)")
    parser.add_argument("--rule", default="failures", help="the verdict's rule: failures (default) or "
                        "failures-or-accuracy (docs/diagnosis.md)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its cost; write nothing")
    parser.add_argument("--prepare-only", action="store_true", help="seed the arms' folders, train nothing")
    args = parser.parse_args(argv)
    try:
        from analysis.diagnosis import check_rule

        check_rule(args.rule)
        arms = plan(args.run, [p.strip() for p in args.at.split(",") if p.strip()],
                    None if args.mechanisms is None else [m.strip() for m in args.mechanisms.split(",") if m.strip()],
                    args.resamples, args.margin, args.failure_step)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(describe(arms))
    print(power(args.resamples))
    if args.dry_run:
        return 0
    seed(arms)
    if args.prepare_only:
        return 0
    from harness.run import CellFailed, run_cell

    failed = 0
    for arm in arms:
        try:
            run_cell(arm.cfg, log=lambda *_: None)
        except CellFailed as exc:
            print(f"error: arm {arm.cfg.cell_id} failed: {exc}", file=sys.stderr)
            failed += 1
    target = write_verdict(args.run, arms[0].failure if args.failure_step is not None else None, args.rule)
    for line in json.loads(target.read_text())["lines"]:
        print(line)
    print(f"diagnosis: {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
