"""The `early_warning` study kind (analysis/studies.py): the leading-indicator search and the learned
detector, chosen on the design seeds and scored once on the held-out ones.

collect: every cell of both sweeps as a row of outcomes.csv (its labels, as detector validation
writes them) and its windowed features every few steps into `aligned.csv.gz` beside it (the
per-cell data every figure regenerates from). render: the mixed settings from the design rows; the
indicator table over the design cells; the learned model fitted on them (written to
harness/monitors/learned.json); its alerts replayed on the held-out cells and scored against the
config-only baseline (stratified cluster bootstrap), its AUROC at each lead.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pandas as pd

from analysis.detector_validation import BOOTSTRAP_NOTE, LEARNED, MIN_LEAD, against_baseline, detector_scores, \
    mixed_arms
from analysis.early_warning import (C_GRID, MAX_FEATURES, TARGET_FPR, auroc_by_lead, candidates, describe, examples,
                                    first_alerts, fit)
from analysis.indicators import LEADS, aligned_table, indicator_table, load_cells
from analysis.studies import Study, StudyError, refuse_decision_seeds, register, seed_ranges
from analysis.study_kinds import _split, _table, split_sweeps

ALIGNED = "aligned.csv.gz"
TOP = 15  # indicator rows quoted
REPLICATED = 5  # the design's best signals measured again on the held-out cells


def aligned_file(study: Study) -> Path:
    return study.path / ALIGNED


def collect_early_warning(study: Study, root: Path) -> List[dict]:
    rows, tables = [], []
    for split, sweep, split_rows in split_sweeps(study, root):
        rows += split_rows
        tables.append(aligned_table(load_cells(sweep), split))
    aligned = pd.concat(tables, ignore_index=True)
    aligned.to_csv(aligned_file(study), index=False, float_format="%.6g",
                   compression={"method": "gzip", "mtime": 0})
    return rows


def _hypotheses(study: Study, found: Dict[str, str]) -> str:
    return "\n".join(f"- **{h['id']}** ({h['claim'].strip()}): {found.get(h['id'], 'not testable here')}."
                     for h in study.data.get("hypotheses", [])) or "(no hypotheses)"


def render_early_warning(study: Study, rows: List[dict]) -> Dict[str, str]:
    if not aligned_file(study).is_file():
        raise StudyError(f"study {study.name}: {ALIGNED} is missing; run python -m analysis.studies collect {study.name}")
    design, held = _split(rows, "design"), _split(rows, "held_out")
    refuse_decision_seeds({r.seed for r in held if r.seed is not None} - set(study.seeds("design")))
    mixed = mixed_arms(design)
    aligned = pd.read_csv(aligned_file(study))
    design_table = aligned[(aligned["split"] == "design") & aligned["arm"].isin(mixed)]
    held_table = aligned[(aligned["split"] == "held_out") & aligned["arm"].isin(mixed)]
    blocks: Dict[str, str] = {}

    indicators = indicator_table(design_table, mixed)
    shown = indicators.head(TOP).assign(effect=lambda f: f["effect"].map("{:+.3f}".format),
                                        p=lambda f: f["p"].map("{:.4f}".format), q=lambda f: f["q"].map("{:.3f}".format))
    significant = indicators[(indicators["lead"] == LEADS[0]) & (indicators["q"] < 0.05)]
    blocks["indicators"] = (_table(shown, ["signal", "lead", "failing cells read", "effect", "95% CI", "p", "q"])
                            + f"\n\nDesign seeds {seed_ranges(study.seeds('design'))}, the mixed settings "
                            f"({', '.join(mixed)}); {indicators['signal'].nunique()} features x {len(LEADS)} leads "
                            f"tested. Effect: the failing cells' mean percentile among all cells of their setting at "
                            f"the same step, minus 0.5; p: 20,000 within-setting permutations of which cells failed; "
                            f"q: Benjamini-Hochberg over all {len(indicators)} rows.")
    h2 = (f"shown: {', '.join(significant['signal'])} (q < 0.05)" if len(significant) else
          f"not shown: no signal at lead {LEADS[0]} has q < 0.05 (smallest q = {indicators['q'].min():.2f}, "
          f"{indicators.iloc[0]['signal']})")

    top = list(dict.fromkeys(indicators["signal"]))[:REPLICATED]
    again = indicator_table(held_table, mixed, signals=top)
    ranked = set(zip(indicators["signal"].head(TOP), indicators["lead"].head(TOP)))
    again = again[[(s, l) in ranked for s, l in zip(again["signal"], again["lead"])]]
    blocks["held-out-replication"] = (
        _table(again.assign(effect=again["effect"].map("{:+.3f}".format), p=again["p"].map("{:.4f}".format),
                            q=again["q"].map("{:.3f}".format)), ["signal", "lead", "failing cells read", "effect",
                                                                "95% CI", "p", "q"])
        + f"\n\nThe design's {REPLICATED} best-ranked signals, at the leads where they ranked, measured on the held-out "
        f"cells of the same settings (q: Benjamini-Hochberg over these signals at every lead).")

    rows_design = examples(design_table, mixed)
    model, selection = fit(rows_design, candidates(indicators),
                           f"studies/{study.name}: fitted on design seeds {seed_ranges(study.seeds('design'))}")
    blocks["_learned.json"] = model.to_json()
    blocks["learned-detector"] = (
        f"{describe(model)}.\n\nChosen on the design seeds: "
        + "; ".join(f"+ {s['added']} (C = {s['C']:g}, out-of-fold AUROC {s['out-of-fold AUROC']:.3f})" for s in selection)
        + f" (at most {MAX_FEATURES} features from the indicator table's top candidates, C from "
        f"{', '.join(f'{c:g}' for c in C_GRID)}, 5 folds by seed); threshold: false-positive rate <= {TARGET_FPR:g} "
        f"over the design's surviving cells at the matched steps.")

    fired = first_alerts(model, held_table)
    held_mixed = [replace(r, first_alert={LEARNED.name: fired[r.cell_id]} if r.cell_id in fired else {},
                          watched=r.watched | {LEARNED.name}) for r in held if r.arm in mixed]
    scores = detector_scores(held_mixed, [LEARNED.name])
    blocks["held-out"] = _table(scores, ["detector", "failing cells", "caught in time", "recall", "recall 95% CI",
                                         "median lead (steps)", "fired after the failure (late)", "healthy cells",
                                         "fired on healthy", "false-positive rate", "false-positive 95% CI"]) + \
        f"\n\nHeld-out cells of the mixed settings ({len(held_mixed)}); recall counts an alert at least {MIN_LEAD} " \
        f"steps before the cell's first failure."
    versus = against_baseline(held_mixed, design, [LEARNED.name])
    blocks["against-baseline"] = _table(versus, ["detector", "failing cells", "healthy cells", "J (recall - FPR)",
                                                 "config-only J", "difference", "95% CI (bootstrap)", "verdict"]) + \
        "\n\n" + BOOTSTRAP_NOTE
    by_lead = pd.DataFrame(auroc_by_lead(model, held_table, mixed))
    blocks["auroc"] = (_table(by_lead.assign(AUROC=by_lead["AUROC"].map("{:.3f}".format)),
                              ["lead", "failing reads", "surviving reads", "AUROC"])
                       if len(by_lead) else "(no held-out failure to read)")
    verdict = versus.iloc[0]["verdict"]
    blocks["hypotheses"] = _hypotheses(study, {"H1": verdict, "H2": h2})
    top = indicators.iloc[0]
    blocks["headline"] = (
        f"searched over {indicators['signal'].nunique()} windowed signals on design seeds "
        f"{seed_ranges(study.seeds('design'))}, no single signal separates failing from surviving cells of the same "
        f"setting after the false-discovery correction (best: {top['signal']} at lead {top['lead']}, effect "
        f"{top['effect']:+.2f}, p = {top['p']:.4f}, q = {top['q']:.2f})" if not len(significant) else
        f"on design seeds {seed_ranges(study.seeds('design'))}, {len(significant)} signal(s) led failures by "
        f"{LEADS[0]} steps at q < 0.05 (first: {significant.iloc[0]['signal']})")
    blocks["headline"] += (f"; the learned detector, on held-out seeds {seed_ranges(study.seeds('held_out'))}: "
                           f"{verdict} ([all tables](studies/{study.name}/results.md)).")
    return blocks


register("early_warning", collect_early_warning, render_early_warning)
