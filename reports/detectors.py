"""`python -m reports.detectors <sweep dir> [--replay] [--steps N] [--thresholds] [--design <sweep dir>]`:
the detector-validation report of a sweep.

--replay scores the alerts today's detectors (default settings) raise on the logged metrics
instead of the alerts the runs wrote (for a sweep run before the detectors changed).
--steps N scores only each run's first N steps (labels and alerts), as if the sweep had stopped
there: whether a cell "failed" depends on how long it was watched, so one long sweep gives the
figures at several horizons. The report goes to <sweep>/report/detectors-N.* then.
--thresholds adds each detector's operating curve: its figures at a grid of threshold settings,
replayed on the logged metrics (analysis/operating_curve.py). The best of them is tuned on the
cells it is scored on, so --design <sweep dir> also chooses each detector's setting on another
(design) sweep and scores that choice on this one: the held-out figures.

Per detector: recall (failing cells where it fired at or before the failure), median lead in
steps, false-positive rate on cells that did not fail and that it can fire on; per arm: the failure rate with its 95%
interval; per failure kind (contract included, which no detector targets): the failing cells any
alert came before, with its lead; per cell: labels and first alerts; the curves of failing cells with the alerts and the
failure step marked. Failures are the objective labels of analysis/labels.py. Written to
<sweep>/report/detectors.html (self-contained) and detectors.md (+ PNGs).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from analysis.detector_validation import (BAR, TARGETS, RunOutcome, arm_failure_rates, cell_table, detector_scores,
                                          failure_coverage, mitigation_effects, outcomes, seeds_of)
from analysis.labels import LabelConfig
from analysis.load import load_alerts, load_metrics
from analysis.operating_curve import GRID, held_out, load_cells, shown, summary_line
from analysis.operating_curve import curve as operating_curve
from analysis.plots import failure_curve
from harness.logging import read_jsonl
from reports.render import esc, image, md_table, page, table, write

MAX_CURVES = 4
COVERAGE_NOTE = ("Per failure kind: the failing cells where some detector (amplification, capture, length_drift "
                 "or collapse, not only those that target the kind) fired at or before the failure step, the median lead of the earliest such "
                 "alert, and which detector that was. Contract failures (a role's format broke, its length "
                 "going anywhere) are targeted by no detector: this row says whether any alert came before them.")


class NotHeldOut(Exception):
    """The design sweep shares runs with the sweep it is to be scored on."""


def build_detector_report(sweep: Path, cfg: LabelConfig = LabelConfig(), replay: bool = False,
                          until: Optional[int] = None, thresholds: bool = False, design: Optional[Path] = None,
                          grids: Optional[Dict[str, Dict[str, list]]] = None) -> Path:
    """`grids` replaces analysis.operating_curve.GRID per detector (a narrower or a wider search)."""
    sweep = Path(sweep)
    results = outcomes(sweep, cfg, replay, until)
    if not results:
        raise FileNotFoundError(f"{sweep} holds no run directories (with cell.yaml)")
    design_results = outcomes(Path(design), cfg, until=until) if design is not None else None
    if design is not None and not design_results:
        raise FileNotFoundError(f"the design sweep {design} holds no run directories (with cell.yaml)")
    if design_results:
        shared = {r.run_dir.resolve() for r in results} & {r.run_dir.resolve() for r in design_results}
        if shared:
            raise NotHeldOut(f"the design sweep {design} shares {len(shared)} run(s) with {sweep} (e.g. "
                             f"{sorted(shared)[0].name}): figures chosen on them would not be held out")
    out = sweep / "report"
    name = "detectors" if until is None else f"detectors-{until}"
    scores, arms, cells = detector_scores(results), arm_failure_rates(results), cell_table(results)
    coverage = failure_coverage(results)
    effects = mitigation_effects(results)
    bar = (f"The bar (the detector issue's): recall >= {BAR['recall']:g}, median lead >= "
           f"{BAR['median lead (steps)']:g} steps, false-positive rate <= {BAR['false-positive rate']:g}, "
           f"over >= 5 seeds per arm (here {seeds_of(results)}).")
    failing = [r for r in results if r.labels][:MAX_CURVES]
    curves: List[Path] = []
    for r in failing:
        metrics = load_metrics(r.run_dir)
        alerts = load_alerts(r.run_dir)
        alerts = alerts[alerts["kind"].isin(list(TARGETS))] if len(alerts) else alerts
        if until is not None:
            metrics = metrics[metrics["step"] < until]
            alerts = alerts[alerts["step"] < until] if len(alerts) else alerts
        curves.append(failure_curve(metrics, alerts, min(label.step for label in r.labels),
                                    out / f"failure{'' if until is None else f'-{until}'}_{r.cell_id}.png",
                                    title=r.cell_id))
    n_failed = sum(bool(r.labels) for r in results)
    late = 0 if replay else sum(a.get("late") is True and a.get("kind") in TARGETS
                                and (until is None or a.get("step", until) < until)
                                for r in results for a in read_jsonl(r.run_dir / "alerts.jsonl"))
    summary = (f"{len(results)} cells, {n_failed} with a failure label, {len(results) - n_failed} without; "
               f"at least {seeds_of(results)} seed(s) per arm. Alerts: "
               + ("replayed on the logged metrics by today's detectors (--replay)." if replay else
                  "as the runs raised them (alerts.jsonl)"
                  + (f"; {late} judged only after their run ended, when its paired run caught up (marked late)."
                     if late else "."))
               + (f" Scored on each run's first {until} steps only (--steps)." if until is not None else ""))
    if n_failed == 0:
        summary += (" No cell failed, so recall and lead cannot be measured here: the sweep did not reproduce a "
                    "failure (see the labels' settings below).")
    settings = ", ".join(f"{k}={v}" for k, v in vars(cfg).items())
    body = [f"<h1>Detector validation: {esc(sweep.name)}</h1>", f"<p>{esc(summary)}</p>",
            "<h2>Detectors against the failure labels</h2>", table(scores),
            "<p class=\"muted\">recall: failing cells (with a failure the detector warns of) where its first alert "
            "came at or before the failure step; lead: steps from that alert to the failure; false-positive rate: "
            "cells without any failure label that it can fire on where it fired (cells where it cannot: "
            "amplification without a policy trained by two role instances, capture with one role, length drift "
            "without a short-contract role, are counted apart as silent by construction).</p>", f"<p>{esc(bar)}</p>",
            "<h2>Which failures any alert warned of</h2>", f"<p>{esc(COVERAGE_NOTE)}</p>", table(coverage),
            "<h2>Failure rate per arm (95% Wilson interval)</h2>", table(arms)]
    if len(effects):
        body += ["<h2>Mitigations against the same arm without</h2>", table(effects)]
    html_part, md_part = ([], []) if not (thresholds or design is not None) else \
        threshold_sections(results, design_results, design, until, grids or {})
    body += html_part + ["<h2>Cells</h2>", table(cells)]
    if curves:
        body += ["<h2>Failing cells</h2>"] + [image(p, p.stem) for p in curves]
    body += [f"<p class=\"muted\">Failure labels: {esc(settings)} (analysis/labels.py).</p>"]
    write(out / f"{name}.html", page(f"detectors {sweep.name}", body))
    md = [f"# Detector validation: {sweep.name}", "", summary, "", "## Detectors against the failure labels", "",
          md_table(scores), "", bar, "", "## Which failures any alert warned of", "", COVERAGE_NOTE, "",
          md_table(coverage), "", "## Failure rate per arm (95% Wilson interval)", "", md_table(arms), ""]
    if len(effects):
        md += ["## Mitigations against the same arm without", "", md_table(effects), ""]
    md += md_part
    md += ["## Cells", "", md_table(cells), ""]
    md += [f"![{p.stem}]({p.name})" for p in curves] + ["", f"Failure labels: {settings}."]
    write(out / f"{name}.md", "\n".join(md))
    return out / f"{name}.html"


def threshold_sections(results: List[RunOutcome], design_results: Optional[List[RunOutcome]],
                       design: Optional[Path], until: Optional[int], grids: Dict[str, Dict[str, list]]
                       ) -> Tuple[List[str], List[str]]:
    """The operating curves on this sweep and, with a design sweep, the held-out choice (HTML, Markdown)."""
    cells = load_cells(results, until)
    intro = ("Each detector replayed on the logged metrics at every setting of a grid (the frontier: the "
             "settings no other beats on recall, lead and false positives at once, and the default). The best "
             "row is tuned on the cells it is scored on, an optimistic bound: if no setting meets the bar here, "
             "no threshold of this detector will on these failures.")
    html, md = ["<h2>Operating curves (replayed)</h2>", f"<p>{esc(intro)}</p>"], ["## Operating curves (replayed)", "",
                                                                                  intro, ""]
    for kind in GRID:
        frame = operating_curve(kind, cells, grids.get(kind))
        line = summary_line(kind, frame)
        html += [f"<h3>{esc(kind)}</h3>", f"<p>{esc(line)}</p>", table(shown(frame))]
        md += [f"### {kind}", "", line, "", md_table(shown(frame)), ""]
    if design_results is not None:
        chosen = held_out(list(GRID), load_cells(design_results, until), cells, grids)
        text = (f"Each detector's setting chosen on the design sweep {design} (the one closest to the bar there: "
                "the most of its criteria met, then recall, lead, false positives), scored on this sweep's cells, "
                "which did not choose it. Figures: recall / median lead / false-positive rate.")
        html += ["<h2>Held out: settings chosen on a design sweep</h2>", f"<p>{esc(text)}</p>", table(chosen)]
        md += ["## Held out: settings chosen on a design sweep", "", text, "", md_table(chosen), ""]
    return html, md


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    replay = "--replay" in argv
    argv = [a for a in argv if a != "--replay"]
    until = None
    if "--steps" in argv:
        at = argv.index("--steps")
        value = argv[at + 1] if at + 1 < len(argv) else ""
        if not value.isdigit() or int(value) < 1:
            print(f"error: --steps needs a whole number of steps >= 1, got {value!r}", file=sys.stderr)
            return 2
        until, argv = int(value), argv[:at] + argv[at + 2:]
    thresholds = "--thresholds" in argv
    argv = [a for a in argv if a != "--thresholds"]
    design = None
    argv = [part for a in argv for part in (a.split("=", 1) if a.startswith("--design=") else [a])]
    if "--design" in argv:
        at = argv.index("--design")
        if at + 1 >= len(argv):
            print("error: --design needs the design sweep's directory", file=sys.stderr)
            return 2
        design, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        path = build_detector_report(Path(argv[0]), replay=replay, until=until, thresholds=thresholds, design=design)
    except (FileNotFoundError, NotHeldOut) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    text = path.with_suffix(".md").read_text()
    print(text.split("## Cells")[0].rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
