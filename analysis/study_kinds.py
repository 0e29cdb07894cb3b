"""How each kind of study is collected into `outcomes.csv` and scored from it (analysis/studies.py).

`detector_validation`: one row per cell of the design and the held-out sweeps (its labels, the first
step of each scored alert, what it can fire on); scored as analysis/detector_validation.py scores a
sweep: mixed settings and the config-only baseline from the design rows, every figure from the
held-out rows, and the calibration every alert quotes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

from analysis.detector_validation import (BOOTSTRAP_NOTE, CALIBRATION_WITHIN, MIN_LEAD, MIXED, SCORED, WARNINGS, RunOutcome,
                                          against_baseline, arm_failure_rates, calibration_rows, detector_scores,
                                          mixed_arms, outcomes)
from analysis.labels import FailureLabel
from analysis.studies import Study, StudyError, refuse_decision_seeds, register, seed_ranges
from analysis.tables import to_markdown

# ------------------------------------------------------------------ outcome rows <-> RunOutcome
def _labels_text(labels: List[FailureLabel]) -> str:
    return ";".join(f"{l.kind}{':' + l.role if l.role else ''}@{l.step}" for l in labels)


def _parse_labels(text: str) -> List[FailureLabel]:
    labels = []
    for part in filter(None, (text or "").split(";")):
        head, step = part.rsplit("@", 1)
        kind, _, role = head.partition(":")
        labels.append(FailureLabel(kind, int(step), role or None, ""))
    return labels


def cell_row(r: RunOutcome, split: str, final_accuracy: Optional[float], sharing: str) -> dict:
    return {"split": split, "cell": r.cell_id, "arm": r.arm, "sharing": sharing, "seed": r.seed, "start": r.start,
            "val_every": r.val_every, "labels": _labels_text(r.labels),
            "first_alerts": ";".join(f"{name}@{step}" for name, step in sorted(r.first_alert.items())),
            "watched": ";".join(sorted(r.watched)),
            "final_val_accuracy": "" if final_accuracy is None else f"{final_accuracy:.4f}"}


def outcome_of(row: dict) -> RunOutcome:
    first = {}
    for part in filter(None, (row.get("first_alerts") or "").split(";")):
        name, step = part.rsplit("@", 1)
        first[name] = int(step)
    return RunOutcome(Path(row["cell"]), row["cell"], row["arm"], _parse_labels(row.get("labels", "")), first,
                      watched=set(filter(None, (row.get("watched") or "").split(";"))), start=int(row["start"]),
                      val_every=int(row["val_every"]), seed=int(row["seed"]) if row.get("seed") not in ("", None) else None)


def _final_accuracy(run: Path) -> Optional[float]:
    from harness.run_dir import read_jsonl

    values = [r["val/accuracy"] for r in read_jsonl(run / "metrics.jsonl") if isinstance(r.get("val/accuracy"), (int, float))]
    return float(values[-1]) if values else None


def _sharing(run: Path) -> str:
    import yaml

    cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
    return "single" if cell.get("topology") == "single" else str(cell.get("sharing", ""))


# ------------------------------------------------------------------ detector validation
def split_sweeps(study: Study, root: Path) -> List[tuple]:
    """(split, sweep dir, cell rows) for the design and the held-out sweeps, each split's seeds
    checked against the study's."""
    found_splits = []
    runs = study.data.get("runs") or {}
    for split in ("design", "held_out"):
        if split not in runs:
            raise StudyError(f"study {study.name}: runs.{split} (the sweep folder under the runs root) is not set")
        sweep = root / runs[split]
        results = outcomes(sweep)
        if not results:
            raise StudyError(f"study {study.name}: {sweep} holds no run directories")
        stray = {r.seed for r in results} - set(study.seeds(split))
        if stray:
            raise StudyError(f"study {study.name}: {sweep} holds seeds {sorted(stray)[:5]} that its "
                             f"{split} seeds do not list")
        found_splits.append((split, sweep, [cell_row(r, split, _final_accuracy(r.run_dir), _sharing(r.run_dir))
                                            for r in results]))
    return found_splits


def collect_detector_validation(study: Study, root: Path) -> List[dict]:
    """Both sweeps' cells, as the runs raised their alerts; each split's seeds must be the study's."""
    return [row for _, _, rows in split_sweeps(study, root) for row in rows]


def _split(rows: List[dict], split: str) -> List[RunOutcome]:
    return [outcome_of(r) for r in rows if r["split"] == split]


def _table(frame: pd.DataFrame, columns: List[str]) -> str:
    return to_markdown(frame[[c for c in columns if c in frame.columns]])


def render_detector_validation(study: Study, rows: List[dict]) -> Dict[str, str]:
    design, held = _split(rows, "design"), _split(rows, "held_out")
    refuse_decision_seeds({r.seed for r in held if r.seed is not None} - set(study.seeds("design")))
    mixed = mixed_arms(design)
    on_mixed = [r for r in held if r.arm in mixed]
    blocks: Dict[str, str] = {}
    rates = arm_failure_rates(held).drop(columns=["mixed"]).rename(columns={"cells": "held-out cells",
                                                                              "failed": "held-out failed",
                                                                              "failure rate": "held-out rate"})
    design_rates = arm_failure_rates(design).set_index("arm")
    rates.insert(1, "design failed", [f"{design_rates.loc[a, 'failed']}/{design_rates.loc[a, 'cells']}"
                                      if a in design_rates.index else "–" for a in rates["arm"]])
    rates["mixed (design)"] = ["yes" if a in mixed else "" for a in rates["arm"]]
    blocks["failure-rates"] = (_table(rates, ["arm", "design failed", "held-out failed", "held-out cells", "95% CI",
                                              "failure kinds", "mixed (design)"])
                               + f"\n\nDesign seeds {seed_ranges([r.seed for r in design if r.seed is not None])}, held-out seeds {seed_ranges([r.seed for r in held if r.seed is not None])}. Mixed: the "
                               f"failure rate over the design seeds lies in [{MIXED[0]:g}, {MIXED[1]:g}].")
    scores = detector_scores(on_mixed)
    blocks["warnings"] = _table(scores, ["detector", "failing cells", "caught in time", "recall", "recall 95% CI",
                                         "median lead (steps)", "fired after the failure (late)", "healthy cells",
                                         "fired on healthy", "false-positive rate", "false-positive 95% CI"]) + \
        f"\n\nHeld-out cells of the mixed settings ({len(on_mixed)}); recall counts a warning at least {MIN_LEAD} " \
        f"steps before the failure it names."
    versus = against_baseline(on_mixed, design)
    blocks["against-baseline"] = _table(versus, ["detector", "failing cells", "healthy cells", "J (recall - FPR)",
                                                 "config-only J", "difference", "95% CI (bootstrap)", "verdict"]) + \
        "\n\n" + BOOTSTRAP_NOTE
    verdicts = versus.set_index("detector")["verdict"].to_dict()
    blocks["headline"] = (
        f"on held-out seeds {seed_ranges(sorted({r.seed for r in on_mixed if r.seed is not None}))} "
        f"({len(on_mixed)} cells of the mixed settings {', '.join(sorted(mixed)) or '(none)'}), "
        + "; ".join(f"{name}: {verdict}" for name, verdict in verdicts.items())
        + f" ([all tables](studies/{study.name}/results.md)).")
    lines = []
    for hypothesis in study.data.get("hypotheses", []):
        warning = hypothesis.get("warning")
        result = verdicts.get(warning, "not testable here")
        lines.append(f"- **{hypothesis['id']}** ({hypothesis['claim'].strip()}): {result}.")
    blocks["hypotheses"] = "\n".join(lines) or "(no hypotheses)"
    calibration = calibration_rows(held, CALIBRATION_WITHIN)
    source = f"{study.name}, seeds {seed_ranges([r.seed for r in held if r.seed is not None])}"
    blocks["calibration"] = "\n".join(
        f"- {row['name']}: of {row['warned']} held-out cells warned this way, {row['in_time']} failed "
        f"({row['failure']}) {MIN_LEAD}-{CALIBRATION_WITHIN} steps later, {row['soon']} sooner; {row['late']} further "
        f"alert(s) came after the failure" for row in calibration) or "(no warning fired)"
    if study.data.get("calibrates"):
        blocks["_calibration.json"] = json.dumps(
            {"source": source, "within": CALIBRATION_WITHIN,
             "written_by": "python -m analysis.studies render (from studies/" + study.name + "/outcomes.csv)",
             "warnings": calibration}, indent=1) + "\n"
    return blocks


register("detector_validation", collect_detector_validation, render_detector_validation)


# ------------------------------------------------------------------ interventions and diagnoses (branched arms)
ARM_COLUMNS = ("parent", "start", "arm", "mitigation", "mechanism", "resample", "point", "alert_kind", "alert_step",
               "sham", "failure_kind", "failure_step", "failed_at", "failed_before", "final_accuracy", "state", "update_sizes", "sharing", "seed",
               "setting")


def _arm_rows(study: Study, root: Path) -> List[dict]:
    from analysis.arms import collect_arms

    runs = study.data.get("runs") or {}
    if "arms" not in runs:
        raise StudyError(f"study {study.name}: runs.arms (the arms' sweep folder under the runs root) is not set")
    arms = collect_arms(root / runs["arms"])
    _held_out_only(study, arms, root / runs["arms"], "arms")
    return [{"split": "arm", **{k: row.get(k, "") for k in ARM_COLUMNS}} for row in arms]


def _held_out_only(study: Study, rows: List[dict], where: Path, what: str) -> None:
    """A study scores only the seeds it lists: a launcher cut short can leave runs of dropped seeds beside its own."""
    stray = sorted({int(r["seed"]) for r in rows if r.get("seed") is not None} - set(study.seeds("held_out")))
    if stray:
        raise StudyError(f"study {study.name}: {where} holds {what} of seeds {stray[:5]} its seeds do not list")


def _typed_arms(rows: List[dict]) -> List[dict]:
    """Rows read back from outcomes.csv with the types analysis/arms.py reads."""
    from analysis.arms import truthy

    out = []
    for row in rows:
        if row.get("split") != "arm":
            continue
        typed = dict(row)
        typed["start"], typed["resample"] = int(row["start"]), int(row.get("resample") or 0)
        typed["sham"] = truthy(row.get("sham"))
        out.append(typed)
    return out


def collect_interventions(study: Study, root: Path) -> List[dict]:
    """The arms branched from the base sweep, and the base sweep's cells by action (alert, mitigate)."""
    from reports.interventions import base_rows

    runs = study.data.get("runs") or {}
    rows = _arm_rows(study, root)
    if "base" in runs:
        base = base_rows(root / runs["base"])
        _held_out_only(study, base, root / runs["base"], "cells")
        rows += [{"split": "base", **row} for row in base]
    if not rows:
        raise StudyError(f"study {study.name}: no ended arms or cells under {root}")
    return rows


def _hypothesis_lines(study: Study, verdicts: Dict[tuple, str]) -> str:
    lines = []
    for h in study.data.get("hypotheses", []):
        key = (tuple(h.get("compare", [])), h.get("measure", "failures"))
        lines.append(f"- **{h['id']}** ({h['claim'].strip()}): {verdicts.get(key, 'not testable here (no pairs)')}.")
    return "\n".join(lines) or "(no hypotheses)"


def render_interventions(study: Study, rows: List[dict]) -> Dict[str, str]:
    from analysis.arms import action_comparisons, comparisons

    arms = _typed_arms(rows)
    found = comparisons(arms)
    actions = action_comparisons([r for r in rows if r.get("split") == "base"])
    verdicts: Dict[tuple, str] = {}
    for row in found:  # the first alert kind listed that has the pair
        verdicts.setdefault(((row["arm"], row["against"]), "failures"), f"{row['failures']}; {row['failed after the branch (paired, not failed before it)']}")
        verdicts.setdefault(((row["arm"], row["against"]), "accuracy"), f"{row['accuracy']}; {row['final accuracy, arm - reference']}")
    for row in actions:  # the pooled row (last) is the preregistered test; the per-sharing rows are beside it
        verdicts[((row["action"], "alert"), "failures")] = f"{row['sharing']}: {row['failures']}; {row['failed (paired)']}"
    blocks = {
        "comparisons": to_markdown(pd.DataFrame(found)) if found else "(no branched arms)",
        "actions": to_markdown(pd.DataFrame(actions)) if actions else "(no action axis)",
        "hypotheses": _hypothesis_lines(study, verdicts),
    }
    parents = {r["parent"] for r in arms}  # a cell's sham arm branches at another step: still one cell
    blocks["headline"] = (
        f"on held-out seeds {seed_ranges(study.seeds('held_out'))} ({len(parents)} alert cells branched, "
        f"{len(arms)} arms run), " + "; ".join(
            f"{h['id']} ({' vs '.join(h.get('compare', []))}, {h.get('measure', 'failures')}): "
            + _verdict_word(verdicts.get((tuple(h.get("compare", [])), h.get("measure", "failures"))))
            for h in study.data.get("hypotheses", []))
        + f" ([all tables](studies/{study.name}/results.md)).")
    return blocks


def _verdict_word(verdict: Optional[str]) -> str:
    """The worded result of a hypothesis's test ('shown (p = 0.012)'), from its comparison row's text."""
    import re

    if verdict is None:
        return "not testable (no pairs)"
    found = re.search(r"(the opposite shown|not shown|shown|not testable)[^(]*(\(p = [0-9.]+\))?", verdict)
    return f"{found.group(1)} {found.group(2) or ''}".strip() if found else verdict


def collect_diagnosis(study: Study, root: Path) -> List[dict]:
    """The diagnosis arms (resampled none and mechanism arms), each with the failure it branched before;
    with `runs.base`, also each multi-agent cell of the base sweep (its planted cause where the sweep
    plants one, and its first failure), so cells that never failed are counted too."""
    rows = _arm_rows(study, root)
    if not rows:
        raise StudyError(f"study {study.name}: no ended arms under {root / study.data['runs']['arms']}")
    base = (study.data.get("runs") or {}).get("base")
    return rows + ([{"split": "base", **row} for row in _base_cells(study, root / base)] if base else [])


def _base_cells(study: Study, sweep: Path) -> List[dict]:
    from analysis.labels import label_run
    from harness.run_dir import stored_cell_config

    rows = []
    for run in sorted(p for p in sweep.glob("*") if (p / "cell.yaml").is_file()):
        cfg = stored_cell_config(run)
        if cfg.topology == "single":
            continue
        labels = label_run(run)
        rows.append({"cell": run.name, "sharing": cfg.sharing, "seed": cfg.seed,
                     "planted": (cfg.extra or {}).get("planted", ""),
                     "failed_at": min(label.step for label in labels) if labels else ""})
    _held_out_only(study, rows, sweep, "cells")
    return rows


def render_diagnosis(study: Study, rows: List[dict]) -> Dict[str, str]:
    from analysis.diagnosis import mechanism_tests, point_verdict, pooled_failures

    arms = _typed_arms(rows)
    rule = study.data.get("rule", "failures")
    lines, found_by_sharing = [], {}
    for (parent, start) in sorted({(r["parent"], r["start"]) for r in arms}):
        mine = [r for r in arms if (r["parent"], r["start"]) == (parent, start)]
        failure = {"kind": mine[0].get("failure_kind") or "failure", "step": mine[0].get("failure_step") or "?"}
        verdict = point_verdict(mine, failure, rule)
        lines.append(f"- `{parent}` ({mine[0].get('sharing')}): {verdict['line']}")
        found_by_sharing.setdefault(str(mine[0].get("sharing")), []).append(verdict["verdict"])
    tests = []
    listed = study.data.get("mechanisms") or {}
    for sharing, mechanisms in listed.items():
        for mechanism in mechanisms:
            if mechanism == "slow_down":
                continue
            found = mechanism_tests(arms, sharing, mechanism)
            tests.append({"sharing": sharing, "mechanism": mechanism, "runs": found["vs_none"]["runs"],
                          "saved more / less than none": f"{found['vs_none']['saved_more']} / {found['vs_none']['saved_less']}",
                          "p vs none": f"{found['vs_none']['p']:.3f}",
                          "saved more / less than slow_down": f"{found['vs_slow_down']['saved_more']} / {found['vs_slow_down']['saved_less']}",
                          "p vs slow_down": f"{found['vs_slow_down']['p']:.3f}",
                          "pooled pairs": pooled_failures(arms, sharing, mechanism), "verdict": found["words"]})
    verdicts = {(t["sharing"], t["mechanism"]): t["verdict"] for t in tests}
    hypotheses = [f"- **{h['id']}** ({h['claim'].strip()}): "
                  f"{verdicts.get((h.get('sharing'), h.get('mechanism')), 'not testable here (no failed cell diagnosed)')}."
                  for h in study.data.get("hypotheses", [])]
    blocks = {"verdicts": "\n".join(lines) or "(no diagnosed run)",
              "mechanisms": to_markdown(pd.DataFrame(tests)) if tests else "(no mechanism tested)",
              "hypotheses": "\n".join(hypotheses) or "(no hypotheses)",
              "headline": _diagnosis_headline(study, arms, found_by_sharing, verdicts)}
    planted = _planted_rows(rows, arms, rule)
    if planted:  # a check on planted causes: its finding is planted x diagnosed, not the study's account
        from analysis.diagnosis import confusion, confusion_summary

        blocks["confusion"] = to_markdown(confusion(planted)) + "\n\n" + confusion_summary(planted) + "."
        blocks["headline"] = (f"on held-out seeds {seed_ranges(study.seeds('held_out'))} "
                              f"({sum(1 for r in planted if r['verdict'])} planted failures diagnosed, {len(arms)} arms "
                              f"run): {confusion_summary(planted)} ([all tables](studies/{study.name}/results.md)).")
    return blocks


def _planted_rows(rows: List[dict], arms: List[dict], rule: str = "failures") -> List[dict]:
    """Per base cell of a planted sweep: its planted cause, whether it failed, and the verdict of its
    first branch point (None where it failed but was not diagnosed), as analysis.diagnosis.confusion reads them."""
    from analysis.diagnosis import point_verdict

    out = []
    for row in (r for r in rows if r.get("split") == "base" and r.get("planted")):
        mine = [a for a in arms if a["parent"] == row["cell"]]
        first = [a for a in mine if a["start"] == min((b["start"] for b in mine), default=None)]
        out.append({"cell": row["cell"], "planted": row["planted"], "failed": str(row.get("failed_at", "")) != "",
                    "verdict": point_verdict(first, rule=rule)["verdict"] if first else None})
    return out


STUDY_ACCOUNT = {"ip": "amplification", "sp": "capture"}  # what the SP/IP study says makes each mode fail


def _diagnosis_headline(study: Study, arms: List[dict], found: Dict[str, List[str]], verdicts: Dict[tuple, str]) -> str:
    """The README's line: per sharing mode, what the counterfactuals named against the study's account,
    then each hypothesis's worded result."""
    from collections import Counter

    cells = sum(len(v) for v in found.values())
    per_mode = [f"{sharing.upper()}: " + ", ".join(f"{name} {count}" for name, count in Counter(named).most_common())
                + f" (the study's account, {STUDY_ACCOUNT.get(sharing, '-')}: {named.count(STUDY_ACCOUNT.get(sharing))} of {len(named)})"
                for sharing, named in sorted(found.items())]
    tests = [f"{h['id']} ({h.get('sharing')}, {h.get('mechanism')}): "
             + _verdict_word(verdicts.get((h.get("sharing"), h.get("mechanism")))) for h in study.data.get("hypotheses", [])]
    return (f"on held-out seeds {seed_ranges(study.seeds('held_out'))} ({cells} failed cells diagnosed, {len(arms)} arms "
            f"run), each cell's diagnosis: " + "; ".join(per_mode) + (". Across cells: " + "; ".join(tests) if tests else "")
            + f" ([all tables](studies/{study.name}/results.md)).")


register("interventions", collect_interventions, render_interventions)
register("diagnosis", collect_diagnosis, render_diagnosis)
