"""`python -m reports.detectors <sweep dir> [--replay] [--steps N] [--thresholds] [--design <sweep dir>]
[--calibrate [file]]`: the detector-validation report of a sweep.

--replay scores the alerts today's detectors (default settings) raise on the logged metrics
instead of the alerts the runs wrote (for a sweep run before the detectors changed).
--steps N scores only each run's first N steps (labels and alerts), as if the sweep had stopped
there. The report goes to <sweep>/report/detectors-N.* then.
--design <sweep dir>: the design seeds' sweep. It alone chooses which settings are mixed and fits
the config-only baseline (fire on every cell of a setting that failed on more than half of its
design seeds) each early warning is compared with, and (with --thresholds) each warning's threshold
setting to be scored here. The scored sweep is then held out: no (setting, seed) of the design
sweep, and no seed any study file used to decide something (analysis/studies.py), may be in it.
--thresholds adds each early warning's operating curve: its figures at a grid of threshold
settings, replayed on the logged metrics (analysis/operating_curve.py).
--calibrate writes what each early warning was shown to predict on this held-out sweep to
harness/monitors/calibration.json (or the file given), which every alert then quotes.

Scoring (analysis/detector_validation.py): early warnings only, by recall at a lead of >= 10 steps
and false positives; an alert counts only for the failure it names, only when it came before it,
from the run's first validation on; label notifications (the labels' own rules said live) are not
scored. Failures are the objective labels of analysis/labels.py. Written to
<sweep>/report/detectors.html (self-contained) and detectors.md (+ PNGs).
"""
from __future__ import annotations

import sys
from pathlib import Path
from statistics import median
from typing import Dict, List, Optional, Sequence, Tuple

from analysis.detector_validation import (BAR, BOOTSTRAP_NOTE, CALIBRATION_WITHIN, CONFIG_ONLY, MIN_LEAD, MIXED, NOTIFICATION_NOTE,
                                          WARNINGS, RunOutcome, against_baseline, arm_failure_rates, calibration_rows,
                                          cell_table, config_baseline, detector_scores, failure_coverage,
                                          mitigation_effects, mixed_arms, notification_delays, outcomes, scored_name,
                                          seeds_of)
from analysis.labels import LabelConfig
from analysis.load import load_alerts, load_metrics
from analysis.studies import seed_ranges
from analysis.operating_curve import GRID, held_out, load_cells, shown, summary_line
from analysis.operating_curve import curve as operating_curve
from analysis.plots import failure_curve
from harness.run_dir import read_jsonl
from harness.monitors.calibration import CALIBRATION_FILE, write_calibration
from reports.render import esc, image, md_table, page, table, write

MAX_CURVES = 4


COVERAGE_NOTE = (f"Per failure kind: the failing cells where some early warning (whatever failure it targets) "
                 f"fired at least {MIN_LEAD} steps before the failure, the median lead of the earliest such warning, "
                 f"and which warning that was. Contract failures (a role's format broke, its length going anywhere) "
                 f"are targeted by no detector: this row says whether any warning came before them.")
SCORING_NOTE = (f"recall: failing cells (with a failure the warning targets) where it fired, naming the failing role "
                f"or a policy of the cell, at least {MIN_LEAD} steps before the failure; lead: steps from that alert "
                f"to the failure; false-positive rate: cells without any failure label that it can fire on where it "
                f"fired (cells where it cannot are counted apart as silent by construction); late: failing cells "
                f"where it fired only after the failure (never a catch). Alerts count from the run's first "
                f"validation after step 0 on.")


class NotHeldOut(Exception):
    """A cell to be scored as held out shares its setting and seed with a design cell, or its seed
    chose something in a study (analysis/studies.py)."""


def held_out_check(results: List[RunOutcome], design: List[RunOutcome]) -> None:
    """By seed value and setting, wherever the runs live: a (setting, seed) the design sweep ran cannot
    be scored as held out (the same seeds in another folder are the same draws)."""
    shared = sorted({(r.arm, r.seed) for r in results} & {(r.arm, r.seed) for r in design}, key=str)
    if shared:
        arm, seed = shared[0]
        raise NotHeldOut(f"the design sweep ran {len(shared)} of the scored (setting, seed) pairs too (e.g. {arm}, "
                         f"seed {seed}): figures chosen on them would not be held out")


def build_detector_report(sweep: Path, cfg: LabelConfig = LabelConfig(), replay: bool = False,
                          until: Optional[int] = None, thresholds: bool = False, design: Optional[Path] = None,
                          grids: Optional[Dict[str, Dict[str, list]]] = None,
                          calibrate: Optional[Path] = None) -> Path:
    """`grids` replaces analysis.operating_curve.GRID per warning (a narrower or a wider search)."""
    sweep = Path(sweep)
    results = outcomes(sweep, cfg, replay, until)
    if not results:
        raise FileNotFoundError(f"{sweep} holds no run directories (with cell.yaml)")
    design_results = outcomes(Path(design), cfg, replay, until) if design is not None else None
    if design is not None and not design_results:
        raise FileNotFoundError(f"the design sweep {design} holds no run directories (with cell.yaml)")
    if design_results:
        held_out_check(results, design_results)
    if design_results is not None or calibrate is not None:  # scored as held out: no seed that chose anything
        from analysis.studies import refuse_decision_seeds

        try:
            refuse_decision_seeds({r.seed for r in results if r.seed is not None and not r.arm.startswith("single")})
        except ValueError as exc:
            raise NotHeldOut(str(exc)) from None
    out = sweep / "report"
    name = "detectors" if until is None else f"detectors-{until}"
    sections: List[Tuple[str, str, object]] = []  # (heading, note, frame or text)
    aim = (f"The aim for an early warning: recall >= {BAR['recall']:g} at a lead of >= {MIN_LEAD} steps with a "
           f"false-positive rate <= {BAR['false-positive rate']:g}, and above the config-only baseline; figures with "
           f"95% Wilson intervals, over >= 5 seeds per setting (here {seeds_of(results)}).")
    mixed: List[str] = []
    if design_results is not None:
        mixed = [arm for arm in mixed_arms(design_results) if any(r.arm == arm for r in results)]
        on_mixed = [r for r in results if r.arm in mixed]
        if mixed:
            note = (f"{len(mixed)} mixed setting(s), chosen on the design seeds ({design}: failure rate over its seeds "
                    f"in [{MIXED[0]:g}, {MIXED[1]:g}]): {'; '.join(mixed)}. {len(on_mixed)} held-out cells. "
                    + SCORING_NOTE)
            sections.append(("Early warnings on the mixed settings", note, detector_scores(on_mixed)))
            baseline, firing = config_baseline(on_mixed, design_results)
            base_note = ("The config-only baseline fires at the monitors' first step (where a detector may first fire) "
                         "on every cell of a setting that failed on more than half of its design seeds; here it fires "
                         f"on: {'; '.join(sorted(firing & set(mixed))) or 'none'}. J = recall at lead >= {MIN_LEAD} "
                         "minus false-positive rate, on the same cells. " + BOOTSTRAP_NOTE)
            sections.append(("Against the config-only baseline (mixed settings)", base_note,
                             against_baseline(on_mixed, design_results)))
            sections.append(("The config-only baseline's own figures (mixed settings)", "",
                             detector_scores(baseline, [CONFIG_ONLY.name])))
        else:
            sections.append(("Early warnings on the mixed settings",
                             f"No setting the design seeds ran is mixed (failure rate over seeds in [{MIXED[0]:g}, "
                             f"{MIXED[1]:g}]) and held out here: the configuration alone tells which cells fail.", None))
    else:
        sections.append(("Early warnings on the mixed settings",
                         "Which settings are mixed, and the config-only baseline, are chosen on design seeds: give "
                         "them with --design <sweep dir>.", None))
    sections.append(("Early warnings on every cell", "Includes the settings whose configuration decides the outcome. "
                     + SCORING_NOTE, detector_scores(results)))
    delays = notification_delays(results)
    said = "; ".join(f"{name}: {len(d)} failing cells, median {median(d):g} steps after the label" if d else
                     f"{name}: none" for name, d in delays.items())
    sections.append(("Label notifications (not scored)", f"{NOTIFICATION_NOTE} When they were said here: {said}.", None))
    sections.append(("Which failures any early warning came before", COVERAGE_NOTE, failure_coverage(results)))
    sections.append(("Failure rate per setting (95% Wilson interval)", "", arm_failure_rates(results)))
    effects = mitigation_effects(results)
    if len(effects):
        sections.append(("Mitigations against the same setting without", "", effects))
    curves = _failure_curves(results, out, until)
    n_failed = sum(bool(r.labels) for r in results)
    late = 0 if replay else sum(a.get("late") is True and scored_name(a) is not None
                                and (until is None or a.get("step", until) < until)
                                for r in results for a in read_jsonl(r.run_dir / "alerts.jsonl"))
    summary = (f"{len(results)} cells, {n_failed} with a failure label, {len(results) - n_failed} without; "
               f"at least {seeds_of(results)} seed(s) per setting; {len(mixed)} mixed setting(s). Alerts: "
               + ("replayed on the logged metrics by today's detectors (--replay)." if replay else
                  "as the runs raised them (alerts.jsonl)"
                  + (f"; {late} judged only after their run ended, when its paired run caught up (marked late)."
                     if late else "."))
               + (f" Scored on each run's first {until} steps only (--steps)." if until is not None else ""))
    if n_failed == 0:
        summary += (" No cell failed, so recall and lead cannot be measured here: the sweep did not reproduce a "
                    "failure (see the labels' settings below).")
    if calibrate is not None:
        rows = calibration_rows(results, CALIBRATION_WITHIN)
        seeds = sorted({r.seed for r in results if r.seed is not None})
        source = f"{sweep.name}, seeds {seed_ranges(seeds)}"
        write_calibration(calibrate, rows, CALIBRATION_WITHIN, source,
                          f"python -m reports.detectors {sweep} {'--replay ' if replay else ''}--calibrate")
        summary += f" Calibration written to {calibrate}."
    settings = ", ".join(f"{k}={v}" for k, v in vars(cfg).items())
    body = [f"<h1>Detector validation: {esc(sweep.name)}</h1>", f"<p>{esc(summary)}</p>", f"<p>{esc(aim)}</p>"]
    md = [f"# Detector validation: {sweep.name}", "", summary, "", aim, ""]
    for heading, note, frame in sections:
        body += [f"<h2>{esc(heading)}</h2>"] + ([f"<p class=\"muted\">{esc(note)}</p>"] if note else [])
        md += [f"## {heading}", ""] + ([note, ""] if note else [])
        if frame is not None:
            body.append(table(frame))
            md += [md_table(frame), ""]
    html_part, md_part = ([], []) if not thresholds else \
        threshold_sections(results, design_results, design, until, grids or {})
    body += html_part + ["<h2>Cells</h2>", table(cell_table(results))]
    md += md_part + ["## Cells", "", md_table(cell_table(results)), ""]
    if curves:
        body += ["<h2>Failing cells</h2>"] + [image(p, p.stem) for p in curves]
        md += [f"![{p.stem}]({p.name})" for p in curves]
    body += [f"<p class=\"muted\">Failure labels: {esc(settings)} (analysis/labels.py).</p>"]
    md += ["", f"Failure labels: {settings}."]
    write(out / f"{name}.html", page(f"detectors {sweep.name}", body))
    write(out / f"{name}.md", "\n".join(md))
    return out / f"{name}.html"


def _failure_curves(results: List[RunOutcome], out: Path, until: Optional[int]) -> List[Path]:
    curves = []
    for r in [r for r in results if r.labels][:MAX_CURVES]:
        metrics = load_metrics(r.run_dir)
        alerts = load_alerts(r.run_dir)
        if len(alerts):
            alerts = alerts[[scored_name(a) in WARNINGS for a in alerts.to_dict("records")]]
        if until is not None:
            metrics = metrics[metrics["step"] < until]
            alerts = alerts[alerts["step"] < until] if len(alerts) else alerts
        curves.append(failure_curve(metrics, alerts, min(label.step for label in r.labels),
                                    out / f"failure{'' if until is None else f'-{until}'}_{r.cell_id}.png",
                                    title=r.cell_id))
    return curves


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
    calibrate = None
    if "--calibrate" in argv:
        at = argv.index("--calibrate")
        following = argv[at + 1] if at + 1 < len(argv) else ""
        if following.endswith(".json"):
            calibrate, argv = Path(following), argv[:at] + argv[at + 2:]
        else:
            calibrate, argv = CALIBRATION_FILE, argv[:at] + argv[at + 1:]
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
        path = build_detector_report(Path(argv[0]), replay=replay, until=until, thresholds=thresholds, design=design,
                                     calibrate=calibrate)
    except (FileNotFoundError, NotHeldOut) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    text = path.with_suffix(".md").read_text()
    print(text.split("## Cells")[0].rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
