"""`python -m reports.detectors <sweep dir> [--replay] [--steps N]`: the detector-validation report of a sweep.

--replay scores the alerts today's detectors (default settings) raise on the logged metrics
instead of the alerts the runs wrote (for a sweep run before the detectors changed).
--steps N scores only each run's first N steps (labels and alerts), as if the sweep had stopped
there: whether a cell "failed" depends on how long it was watched, so one long sweep gives the
figures at several horizons. The report goes to <sweep>/report/detectors-N.* then.

Per detector: recall (failing cells where it fired at or before the failure), median lead in
steps, false-positive rate on cells that did not fail; per arm: the failure rate with its 95%
interval; per cell: labels and first alerts; the curves of failing cells with the alerts and the
failure step marked. Failures are the objective labels of analysis/labels.py. Written to
<sweep>/report/detectors.html (self-contained) and detectors.md (+ PNGs).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Sequence

from analysis.detector_validation import (BAR, TARGETS, arm_failure_rates, cell_table, detector_scores,
                                          mitigation_effects, outcomes, seeds_of)
from analysis.labels import LabelConfig
from analysis.load import load_alerts, load_metrics
from analysis.plots import failure_curve
from reports.render import esc, image, md_table, page, table, write

MAX_CURVES = 4


def build_detector_report(sweep: Path, cfg: LabelConfig = LabelConfig(), replay: bool = False,
                          until: Optional[int] = None) -> Path:
    sweep = Path(sweep)
    results = outcomes(sweep, cfg, replay, until)
    if not results:
        raise FileNotFoundError(f"{sweep} holds no run directories (with cell.yaml)")
    out = sweep / "report"
    name = "detectors" if until is None else f"detectors-{until}"
    scores, arms, cells = detector_scores(results), arm_failure_rates(results), cell_table(results)
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
    summary = (f"{len(results)} cells, {n_failed} with a failure label, {len(results) - n_failed} without; "
               f"at least {seeds_of(results)} seed(s) per arm. Alerts: "
               + ("replayed on the logged metrics by today's detectors (--replay)." if replay else
                  "as the runs raised them (alerts.jsonl).")
               + (f" Scored on each run's first {until} steps only (--steps)." if until is not None else ""))
    if n_failed == 0:
        summary += (" No cell failed, so recall and lead cannot be measured here: the sweep did not reproduce a "
                    "failure (see the labels' settings below).")
    settings = ", ".join(f"{k}={v}" for k, v in vars(cfg).items())
    body = [f"<h1>Detector validation: {esc(sweep.name)}</h1>", f"<p>{esc(summary)}</p>",
            "<h2>Detectors against the failure labels</h2>", table(scores),
            "<p class=\"muted\">recall: failing cells (with a failure the detector warns of) where its first alert "
            "came at or before the failure step; lead: steps from that alert to the failure; false-positive rate: "
            "cells without any failure label where it fired.</p>", f"<p>{esc(bar)}</p>",
            "<h2>Failure rate per arm (95% Wilson interval)</h2>", table(arms)]
    if len(effects):
        body += ["<h2>Mitigations against the same arm without</h2>", table(effects)]
    body += ["<h2>Cells</h2>", table(cells)]
    if curves:
        body += ["<h2>Failing cells</h2>"] + [image(p, p.stem) for p in curves]
    body += [f"<p class=\"muted\">Failure labels: {esc(settings)} (analysis/labels.py).</p>"]
    write(out / f"{name}.html", page(f"detectors {sweep.name}", body))
    md = [f"# Detector validation: {sweep.name}", "", summary, "", "## Detectors against the failure labels", "",
          md_table(scores), "", bar, "", "## Failure rate per arm (95% Wilson interval)", "", md_table(arms), ""]
    if len(effects):
        md += ["## Mitigations against the same arm without", "", md_table(effects), ""]
    md += ["## Cells", "", md_table(cells), ""]
    md += [f"![{p.stem}]({p.name})" for p in curves] + ["", f"Failure labels: {settings}."]
    write(out / f"{name}.md", "\n".join(md))
    return out / f"{name}.html"


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
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        path = build_detector_report(Path(argv[0]), replay=replay, until=until)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    text = path.with_suffix(".md").read_text()
    print(text.split("## Cells")[0].rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
