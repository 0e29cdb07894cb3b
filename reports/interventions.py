"""The intervention report: did switching on the alert's matched mitigation save the cells its
detector said were failing, more often than doing nothing or an unrelated mitigation?

    python -m reports.interventions runs/repro_intervene     # -> runs/repro_intervene-interventions/report/

Reads a sweep and the arms `harness.intervene` branched from its runs (`<sweep>-interventions`). Per
branched cell: the arms' validation curves from the branch point, each arm's failure label
(analysis/labels.py: a failure after the branch) and final accuracy. Per alert kind: the failure
rate after branching with `none` (the run itself after the branch, which its `none` arm repeats key
for key where one was run), with the matched mitigation and with the control one, with 95% Wilson
intervals, over every branched cell and over those that failed without intervention. Where the
sweep has an `action` axis (sweep=repro_intervene: alert, stop, mitigate), the failure rate and
final accuracy of each action on the same settings.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from analysis.compare import mean_ci
from analysis.detector_validation import interval, wilson
from analysis.labels import label_records
from harness.intervene import interventions_sweep
from harness.logging import read_jsonl
from reports.render import esc, image, md_table, page, table, write

ARM_ORDER = ("none", "matched", "control")


@dataclass
class Outcome:
    """One arm of one branched cell (or the run itself standing for `none`)."""

    label: str
    mitigation: str
    run: Path
    records: List[dict]
    failed_at: Optional[int]  # the first failure label at or after the branch point
    final_accuracy: Optional[float]


@dataclass
class Branched:
    parent: Path
    start: int
    kind: Optional[str]
    alert_step: Optional[int]
    arms: Dict[str, Outcome] = field(default_factory=dict)
    none_repeats_run: Optional[bool] = None  # a none arm was run: does it repeat the run's records?
    failed_before: Optional[int] = None  # the run had already failed here, before the branch: no test


def outcome(label: str, mitigation: str, run: Path, start: int) -> Outcome:
    records = read_jsonl(run / "metrics.jsonl")
    failures = [f.step for f in label_records(records) if f.step >= start]
    accuracies = [r["val/accuracy"] for r in records if isinstance(r.get("val/accuracy"), (int, float))]
    return Outcome(label, mitigation, run, records, min(failures) if failures else None,
                   accuracies[-1] if accuracies else None)


def _same(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if not k.startswith("time/"))


def branched_cells(sweep: Path) -> List[Branched]:
    """Every run of `sweep` with arms, its arms' outcomes, and `none` from the run where no arm was run."""
    arms_root = sweep.parent / interventions_sweep(sweep.name)
    cells: Dict[tuple, Branched] = {}  # one per (run, branch point): a run may be branched more than once
    for arm in sorted(p for p in arms_root.glob("*") if (p / "branch.json").is_file()):
        branch = json.loads((arm / "branch.json").read_text())
        if not (arm / "status.json").is_file() or json.loads((arm / "status.json").read_text()).get("state") not in (
                "finished", "stopped_early"):
            continue  # an arm still running, or failed: not an outcome yet
        parent = Path(branch["parent"])
        alert = branch.get("alert") or {}
        cell = cells.setdefault((parent, branch["start"]),
                                Branched(parent, branch["start"], alert.get("kind"), alert.get("step")))
        cell.arms[branch["arm"]] = outcome(branch["arm"], branch["mitigation"], arm, branch["start"])
    for cell in cells.values():
        itself = outcome("none", "none", cell.parent, cell.start)
        earlier = [f.step for f in label_records(itself.records) if f.step < cell.start]
        cell.failed_before = min(earlier) if earlier else None
        if "none" in cell.arms:
            ran = cell.arms["none"].records
            cell.none_repeats_run = len(ran) == len(itself.records) and all(map(_same, ran, itself.records))
        else:
            cell.arms["none"] = itself
    return sorted(cells.values(), key=lambda c: (c.parent.name, c.start))


def arm_labels(cells: List[Branched]) -> List[str]:
    """none, matched, control, then any mitigation named as an arm, in that order."""
    named = sorted({label for c in cells for label in c.arms} - set(ARM_ORDER))
    return [label for label in ARM_ORDER if any(label in c.arms for c in cells)] + named


def rate(failed: int, n: int) -> str:
    low, high = wilson(failed, n)
    return f"{failed}/{n} {interval(low, high)}" if n else "–"


def testable(cells: List[Branched]) -> List[Branched]:
    """The branched cells that had not failed before their branch point: an arm can only prevent a
    failure still to come."""
    return [c for c in cells if c.failed_before is None]


def kind_table(cells: List[Branched]) -> pd.DataFrame:
    """Per alert kind: each arm's failure rate after the branch, over the testable branched cells and
    over those of them that failed without intervention."""
    rows = []
    cells = testable(cells)
    for kind in sorted({c.kind or "(a step)" for c in cells}):
        group = [c for c in cells if (c.kind or "(a step)") == kind]
        failing = [c for c in group if c.arms["none"].failed_at is not None]
        for label in arm_labels(group):
            have = [c for c in group if label in c.arms]
            have_failing = [c for c in failing if label in c.arms]
            mitigations = sorted({c.arms[label].mitigation for c in have})
            rows.append({"alert kind": kind, "arm": label, "mitigation": ", ".join(mitigations) or "–",
                         "failed after the branch [95% CI]": rate(sum(c.arms[label].failed_at is not None for c in have),
                                                                 len(have)),
                         "of the cells that failed without it [95% CI]": rate(
                             sum(c.arms[label].failed_at is not None for c in have_failing), len(have_failing)),
                         "final accuracy": _mean_text([c.arms[label].final_accuracy for c in have])})
    return pd.DataFrame(rows)


def accuracy_table(cells: List[Branched]) -> pd.DataFrame:
    """Per alert kind: each arm's final validation accuracy less the `none` arm's on the same cell (the
    arms share their random numbers, so the difference is the intervention's), over every branched
    cell, those that had failed before the branch included: for them the question is recovery."""
    rows = []
    for kind in sorted({c.kind or "(a step)" for c in cells}):
        group = [c for c in cells if (c.kind or "(a step)") == kind]
        for label in [a for a in arm_labels(group) if a != "none"]:
            pairs = [(c.arms[label].final_accuracy, c.arms["none"].final_accuracy) for c in group
                     if label in c.arms and c.arms[label].final_accuracy is not None
                     and c.arms["none"].final_accuracy is not None]
            better = sum(arm > none for arm, none in pairs)
            rows.append({"alert kind": kind, "arm": label,
                         "mitigation": ", ".join(sorted({c.arms[label].mitigation for c in group if label in c.arms})),
                         "cells": len(pairs), "final accuracy less none's [95% CI]":
                             _mean_text([arm - none for arm, none in pairs]),
                         "cells where it is higher": f"{better}/{len(pairs)}"})
    return pd.DataFrame(rows)


def _mean_text(values: Sequence[Optional[float]]) -> str:
    mean, low, high, n = mean_ci([v for v in values if v is not None])
    return "–" if n == 0 else f"{mean:.3f} {interval(low, high)}"


def action_table(sweep: Path) -> Optional[pd.DataFrame]:
    """The sweep's `action` axis: per sharing mode and action, failure rate and final accuracy."""
    from harness.config import stored_cell_config

    groups: Dict[tuple, List[Outcome]] = defaultdict(list)
    for run in sorted(p for p in sweep.glob("*") if (p / "cell.yaml").is_file()):
        cfg = stored_cell_config(run)
        action = (cfg.extra or {}).get("action")
        if action is None or cfg.topology == "single":
            continue
        groups[(cfg.sharing, str(action))].append(outcome(str(action), cfg.mitigation, run, 0))
    if not groups:
        return None
    return pd.DataFrame([{"sharing": sharing, "action": action,
                          "failed [95% CI]": rate(sum(o.failed_at is not None for o in runs), len(runs)),
                          "final accuracy [95% CI]": _mean_text([o.final_accuracy for o in runs])}
                         for (sharing, action), runs in sorted(groups.items())])


def cell_table(cells: List[Branched]) -> pd.DataFrame:
    rows = []
    for cell in cells:
        row = {"cell": cell.parent.name, "alert": f"{cell.kind} at {cell.alert_step}" if cell.kind else "–",
               "branched at": cell.start,
               "before the branch": "held" if cell.failed_before is None else f"failed at {cell.failed_before}"}
        for label in arm_labels(cells):
            arm = cell.arms.get(label)
            row[label] = "–" if arm is None else (
                (f"failed at {arm.failed_at}" if arm.failed_at is not None else "held")
                + (f", {arm.final_accuracy:.3f}" if arm.final_accuracy is not None else ""))
        rows.append(row)
    return pd.DataFrame(rows)


def curves(cell: Branched, out: Path) -> Path:
    """The arms' validation accuracy over the run's, from the branch point (dashed) on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    for i, label in enumerate(arm_labels([cell])):
        arm = cell.arms.get(label)
        if arm is None:
            continue
        points = [(r["step"], r["val/accuracy"]) for r in arm.records if isinstance(r.get("val/accuracy"), (int, float))]
        after = [p for p in points if p[0] >= cell.start - 1]
        ax.plot([p[0] for p in after], [p[1] for p in after], "o-", color=f"C{i}", markersize=3,
                label=f"{label} ({arm.mitigation})" + (f", failed at {arm.failed_at}" if arm.failed_at is not None else ""))
        if label == "none":
            before = [p for p in points if p[0] <= cell.start]
            ax.plot([p[0] for p in before], [p[1] for p in before], "o-", color="gray", markersize=3)
    ax.axvline(cell.start, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"{cell.parent.name}: branched at step {cell.start}" + (f" ({cell.kind})" if cell.kind else ""),
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def build_intervention_report(sweep: Path) -> Path:
    sweep = Path(sweep)
    cells = branched_cells(sweep)
    out = sweep.parent / interventions_sweep(sweep.name) / "report"
    kinds, actions, per_cell = kind_table(cells), action_table(sweep), cell_table(cells)
    checked = [c for c in cells if c.none_repeats_run is not None]
    repeat_note = (f"`none` is the run itself after the branch; on the {len(checked)} cells where a `none` arm was "
                   f"also run, it repeated the run's records key for key on "
                   f"{sum(bool(c.none_repeats_run) for c in checked)}.")
    late = len(cells) - len(testable(cells))
    repeat_note += (f" {late} of the {len(cells)} had failed before their branch point (an alert that confirms a "
                    f"failure comes after it): they are listed, not counted in the rates.") if late else ""
    paired = accuracy_table(cells)
    md = [f"# Interventions: {sweep.name}", "", f"{len(cells)} branched cells. {repeat_note}", "",
          "## Failure rate after branching, per alert kind", "", md_table(kinds) if len(kinds) else "(no arms yet)",
          "", "## Final accuracy against doing nothing, per alert kind", "",
          md_table(paired) if len(paired) else "(no arms yet)"]
    html = [f"<h1>Interventions: {esc(sweep.name)}</h1>", f"<p>{len(cells)} branched cells. {esc(repeat_note)}</p>",
            "<h2>Failure rate after branching, per alert kind</h2>", table(kinds) if len(kinds) else "<p>no arms yet</p>",
            "<h2>Final accuracy against doing nothing, per alert kind</h2>",
            table(paired) if len(paired) else "<p>no arms yet</p>"]
    if actions is not None:
        note = ("A cell under `stop` ends at its first alert: its failures are those before the stop, its final "
                "accuracy the last validation before it. `mitigate` switches the alert kind's matched mitigation on "
                "in the running cell; `alert` only reports.")
        md += ["", "## The sweep's actions on the same settings", "", md_table(actions), "", note]
        html += ["<h2>The sweep's actions on the same settings</h2>", table(actions), f"<p>{esc(note)}</p>"]
    md += ["", "## Branched cells", "", md_table(per_cell) if len(per_cell) else "(none)"]
    html += ["<h2>Branched cells</h2>", table(per_cell) if len(per_cell) else "<p>none</p>"]
    for cell in cells:
        figure = curves(cell, out / f"{cell.parent.name}@{cell.start}.png")
        html.append(image(figure, f"arms of {cell.parent.name}"))
        md.append(f"\n![arms of {cell.parent.name}]({figure.name})")
    write(out / "report.md", "\n".join(md) + "\n")
    return write(out / "index.html", page(f"Interventions: {sweep.name}", html))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("error: give one sweep folder: python -m reports.interventions <root>/<sweep>", file=sys.stderr)
        return 2
    index = build_intervention_report(Path(args[0]))
    print((index.parent / "report.md").read_text())
    print(f"report: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
