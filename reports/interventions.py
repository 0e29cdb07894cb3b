"""The intervention report: did switching on the alert's matched mitigation save the cells its
detector said were failing, more often than doing nothing, than a control that changes the update's
size, and than the same mitigation at a step chosen without any alert?

    python -m reports.interventions runs/repro_intervene     # -> runs/repro_intervene-interventions/report/

Reads a sweep and the arms `harness.intervene` branched from its runs (`<sweep>-interventions`).
Every comparison is paired (analysis/arms.py): an arm against the `none` arm run from the same
checkpoint with the same random numbers (never the parent assumed in its place), failures after the
branch by McNemar's exact test on the cells that had not failed before it, final accuracy by the
sign test and Wilcoxon's; each claim is worded by its p. A `sham` arm (the matched mitigation at
another cell's alert step, `intervene.sham=true`) is compared with the matched arm from the alert's
step on. Where the sweep has an `action` axis, `mitigate` against `alert` on the same seeds.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from analysis.arms import action_comparisons, collect_arms, comparisons
from analysis.labels import label_records
from analysis.paired import compare_failures, compare_values, worded
from harness.intervene import interventions_sweep
from harness.run_dir import read_jsonl
from reports.render import esc, image, md_table, page, table, write

ARM_ORDER = ("none", "matched", "control", "sham")


@dataclass
class Outcome:
    """One arm of one branched cell."""

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
    none_repeats_run: Optional[bool] = None  # the none arm repeats the run's records (None: no none arm run)
    failed_before: Optional[int] = None  # the run had already failed here, before the branch


def outcome(label: str, mitigation: str, run: Path, start: int) -> Outcome:
    records = read_jsonl(run / "metrics.jsonl")
    failures = [f.step for f in label_records(records) if f.step >= start]
    accuracies = [r["val/accuracy"] for r in records if isinstance(r.get("val/accuracy"), (int, float))]
    return Outcome(label, mitigation, run, records, min(failures) if failures else None,
                   accuracies[-1] if accuracies else None)


def _same(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if not k.startswith("time/"))


def branched_cells(sweep: Path) -> List[Branched]:
    """Every run of `sweep` with arms, per branch point, with its arms' outcomes (only arms that ran)."""
    arms_root = sweep.parent / interventions_sweep(sweep.name)
    cells: Dict[tuple, Branched] = {}  # one per (run, branch point): a run may be branched more than once
    for arm in sorted(p for p in arms_root.glob("*") if (p / "branch.json").is_file()):
        branch = json.loads((arm / "branch.json").read_text())
        if not (arm / "status.json").is_file() or json.loads((arm / "status.json").read_text()).get("state") not in (
                "finished", "stopped_early"):
            continue  # an arm still running, or failed: not an outcome yet
        parent = Path(branch["parent"])
        alert = branch.get("alert") or branch.get("sham_of") or {}
        cell = cells.setdefault((parent, branch["start"]),
                                Branched(parent, branch["start"], alert.get("kind"), alert.get("step")))
        cell.arms[branch["arm"]] = outcome(branch["arm"], branch["mitigation"], arm, branch["start"])
    for cell in cells.values():
        itself = read_jsonl(cell.parent / "metrics.jsonl")
        earlier = [f.step for f in label_records(itself) if f.step < cell.start]
        cell.failed_before = min(earlier) if earlier else None
        if "none" in cell.arms:
            ran = cell.arms["none"].records
            cell.none_repeats_run = len(ran) == len(itself) and all(map(_same, ran, itself))
    return sorted(cells.values(), key=lambda c: (c.parent.name, c.start))


def arm_labels(cells: List[Branched]) -> List[str]:
    """none, matched, control, sham, then any mitigation named as an arm, in that order."""
    named = sorted({label for c in cells for label in c.arms} - set(ARM_ORDER))
    return [label for label in ARM_ORDER if any(label in c.arms for c in cells)] + named


def comparison_table(rows: List[dict]) -> pd.DataFrame:
    """Per alert kind, every arm against `none`, the matched against the control, the sham against the
    matched (analysis/arms.py comparisons), worded by their p."""
    return pd.DataFrame(comparisons(rows))


def base_rows(sweep: Path) -> List[dict]:
    """One row per multi-agent cell of a sweep with an `action` axis: its first failure and final accuracy."""
    from harness.run_dir import stored_cell_config

    rows = []
    for run in sorted(p for p in sweep.glob("*") if (p / "cell.yaml").is_file()):
        cfg = stored_cell_config(run)
        action = (cfg.extra or {}).get("action")
        if action is None or cfg.topology == "single":
            continue
        found = outcome(str(action), cfg.mitigation, run, 0)
        rows.append({"cell": run.name, "sharing": cfg.sharing, "seed": cfg.seed, "action": str(action),
                     "failed_at": "" if found.failed_at is None else found.failed_at,
                     "final_accuracy": "" if found.final_accuracy is None else f"{found.final_accuracy:.4f}"})
    return rows


def action_table(sweep: Path) -> Optional[pd.DataFrame]:
    """The sweep's `action` axis: per sharing mode, `mitigate` (and `stop`) against `alert` on the same
    seeds: failures over the whole run (McNemar) and final accuracy (sign test)."""
    rows = action_comparisons(base_rows(sweep))
    return pd.DataFrame(rows) if rows else None


def cell_table(cells: List[Branched]) -> pd.DataFrame:
    rows = []
    for cell in cells:
        row = {"cell": cell.parent.name, "alert": f"{cell.kind} at {cell.alert_step}" if cell.kind else "–",
               "branched at": cell.start,
               "before the branch": "held" if cell.failed_before is None else f"failed at {cell.failed_before}",
               "none repeats the run": {True: "yes", False: "NO", None: "none not run"}[cell.none_repeats_run]}
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
    arms_root = sweep.parent / interventions_sweep(sweep.name)
    out = arms_root / "report"
    rows = collect_arms(arms_root)
    comparisons, actions, per_cell = comparison_table(rows), action_table(sweep), cell_table(cells)
    run_none = [c for c in cells if c.none_repeats_run is not None]
    repeat_note = (f"{len(cells)} branch points; a `none` arm ran at {len(run_none)} of them and repeated its run's "
                   f"records key for key at {sum(bool(c.none_repeats_run) for c in run_none)}. Branch points without a "
                   f"`none` arm are listed, not compared (an arm is only ever compared with arms that ran).")
    late = sum(c.failed_before is not None for c in cells)
    if late:
        repeat_note += (f" {late} had failed before their branch point (an alert that confirms a failure comes after "
                        f"it): their failures are not compared, their final accuracy is (recovery).")
    note = ("Paired tests (analysis/paired.py): failures after the branch by McNemar's exact test on the pairs whose "
            "run had not failed before it, with the difference of failure rates and Newcombe's paired 95% interval; "
            "final accuracy by the sign test (the words) and Wilcoxon's signed-rank test, with the mean difference "
            "and its 95% t interval. 'change of the update vs none': the mean over the 10 steps after the branch of "
            "|the arm's summed update norm / none's - 1|, how much the arm changed the update (a control meant to "
            "change it about as much as the matched mitigation should be near it). A sham arm switches the matched "
            "mitigation on at another branched cell's alert step (no alert there), compared with the matched arm "
            "on failures from this cell's alert step on.")
    md = [f"# Interventions: {sweep.name}", "", repeat_note, "", "## Paired comparisons", "", note, "",
          md_table(comparisons) if len(comparisons) else "(no arms yet)"]
    html = [f"<h1>Interventions: {esc(sweep.name)}</h1>", f"<p>{esc(repeat_note)}</p>",
            "<h2>Paired comparisons</h2>", f"<p class=\"muted\">{esc(note)}</p>",
            table(comparisons) if len(comparisons) else "<p>no arms yet</p>"]
    if actions is not None and len(actions):
        text = ("A cell under `stop` ends at its first alert: its failures are those before the stop. `mitigate` "
                "switches the alert kind's matched mitigation on in the running cell; `alert` only reports. Paired "
                "by seed.")
        md += ["", "## The sweep's actions on the same seeds", "", md_table(actions), "", text]
        html += ["<h2>The sweep's actions on the same seeds</h2>", table(actions), f"<p>{esc(text)}</p>"]
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
