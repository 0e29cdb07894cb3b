"""The verdict of a diagnosis (harness.diagnose): which mechanism's removal saved the run, beyond
chance and beyond slowing down.

Per branch point of a failed run: the `none` arms on streams 0..R-1 say how often that state fails by
chance; each mechanism's arm j is paired with none j. A mechanism is named when its arms failed less
often than none's (McNemar exact, p < ALPHA) and less often than the non-specific control's
(`slow_down`, same test): the first such in registry order if several. Where only slowing down beat
none the verdict is "generic"; where nothing did, "undetermined".

That is rule `failures`, the default and the one the committed studies wrote down. Where slowing down
saves every stream no arm can fail less often than it, so rule `failures-or-accuracy` also names a
mechanism whose arms beat none on failures and beat slowing down on the final accuracy they reach
(paired by stream, exact sign test, p < ALPHA): the removal kept the run learning, slowing down did not.

Across failed runs (a study, a sweep), `mechanism_tests` asks per sharing mode whether a mechanism
saves more resamples than none and than slowing down, by the sign test across runs on the per-run
difference of failure counts (a run is one unit: its resamples share a state).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from analysis.arms import _float, _int, collect_arms, failed_after
from analysis.paired import ALPHA, binomial_two_sided, compare_failures, compare_values, worded

GENERIC = "slow_down"
NONE = "none"
RULES = ("failures", "failures-or-accuracy")


def check_rule(rule: str, what: str = "verdict rule") -> str:
    if rule not in RULES:
        from harness.config import ConfigError

        raise ConfigError(f"unknown {what} '{rule}'; valid choices: {', '.join(RULES)}")
    return rule


def _by(rows: Sequence[dict], *keys) -> Dict[tuple, List[dict]]:
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row)
    return groups


def _mechanism_order() -> List[str]:
    from harness.mechanisms import MECHANISMS

    return list(MECHANISMS)


def _names(mechanism: str) -> str:
    from harness.mechanisms import MECHANISMS

    return MECHANISMS[mechanism].names if mechanism in MECHANISMS else mechanism


def point_verdict(rows: Sequence[dict], failure: Optional[dict] = None, rule: str = "failures") -> dict:
    """The verdict at one branch point from its arms' rows (one per arm and resample), by `rule` (RULES)."""
    check_rule(rule)
    by_arm = {arm: {int(r["resample"]): r for r in group} for (arm,), group in _by(rows, "arm").items()}
    none = by_arm.get(NONE, {})
    start = int(rows[0]["start"])
    failed = {arm: {j: failed_after(r) for j, r in runs.items()} for arm, runs in by_arm.items()}

    def finals(arm: str, streams: Sequence[int]) -> List[Optional[float]]:
        return [_float(by_arm[arm][j].get("final_accuracy")) for j in streams]

    results = {}
    order = [m for m in _mechanism_order() if m in by_arm] + sorted(set(by_arm) - set(_mechanism_order()) - {NONE})
    for arm in order:
        streams = sorted(set(failed[arm]) & set(none))
        vs_none = compare_failures([failed[arm][j] for j in streams], [failed[NONE][j] for j in streams])
        slow = sorted(set(failed[arm]) & set(failed.get(GENERIC, {})))
        vs_slow = compare_failures([failed[arm][j] for j in slow], [failed[GENERIC][j] for j in slow]) \
            if arm != GENERIC and slow else None
        accuracy = compare_values(finals(arm, streams), finals(NONE, streams))
        kept = compare_values(finals(arm, slow), finals(GENERIC, slow)) if arm != GENERIC and slow else None
        results[arm] = {"names": _names(arm), "resamples": len(streams), "failed": vs_none.arm_failed,
                        "none_failed": vs_none.reference_failed, "p_vs_none": vs_none.p,
                        "slow_down_failed": None if vs_slow is None else vs_slow.reference_failed,
                        "p_vs_slow_down": None if vs_slow is None else vs_slow.p,
                        "accuracy_vs_none": accuracy.mean,
                        "beats_none": vs_none.cells > 0 and vs_none.difference < 0 and vs_none.p < ALPHA,
                        "beats_slow_down": vs_slow is not None and vs_slow.difference < 0 and vs_slow.p < ALPHA,
                        "accuracy_vs_slow_down": None if kept is None else kept.mean,
                        "p_accuracy_vs_slow_down": None if kept is None else kept.sign_p,
                        "keeps_more_than_slow_down": kept is not None and kept.higher > kept.lower
                        and kept.sign_p < ALPHA}
    named = [arm for arm in order if arm != GENERIC and results[arm]["beats_none"]
             and (results[arm]["beats_slow_down"] or rule != "failures" and results[arm]["keeps_more_than_slow_down"])]
    if named:
        verdict = _names(named[0])
    elif GENERIC in results and results[GENERIC]["beats_none"]:
        verdict = "generic"
    else:
        verdict = "undetermined"
    n = len(none)
    where = f"{failure['kind']} at step {failure['step']}" if failure else "the run"
    slow = results.get(GENERIC)
    slow_text = f"slowing down: {slow['failed']} of {slow['resamples']}" if slow else "no slow-down arm"
    if named:
        best = results[named[0]]
        beyond = (f"{slow_text}, p = {best['p_vs_slow_down']:.3f}" if best["beats_slow_down"] else
                  f"{slow_text}, but it kept {best['accuracy_vs_slow_down']:+.3f} accuracy over slowing down, "
                  f"p = {best['p_accuracy_vs_slow_down']:.3f}")
        line = (f"{where} — diagnosis: {verdict} ({named[0]} at step {start}: {best['failed']} of {best['resamples']} "
                f"resamples failed vs {best['none_failed']} of {best['resamples']} none, p = {best['p_vs_none']:.3f}; "
                f"{beyond})")
    else:
        tried = [a for a in order if a != GENERIC]
        best = min(tried, key=lambda a: (results[a]["failed"], a)) if tried else None
        versus_slow = results[best]["p_vs_slow_down"] if best else None
        detail = (f"; fewest failures: {best} {results[best]['failed']} of {results[best]['resamples']}, "
                  f"p = {results[best]['p_vs_none']:.3f} against none"
                  + (f", {versus_slow:.3f} against slowing down" if versus_slow is not None else "") if best else "")
        reason = "only slowing down beat chance" if verdict == "generic" else "no arm beat chance and slowing down"
        line = (f"{where} — diagnosis: {verdict} ({reason}; from step {start}, none failed "
                f"{sum(failed.get(NONE, {}).values())} of {n} resamples, {slow_text}{detail})")
    return {"start": start, "point": rows[0].get("point", ""), "verdict": verdict, "line": line, "rule": rule,
            "none_failed": sum(failed.get(NONE, {}).values()), "resamples": n, "arms": results}


def diagnose_run(run: Path, arms_root: Path, rows: Optional[List[dict]] = None,
                 failure: Optional[dict] = None, rule: str = "failures") -> dict:
    """diagnosis.json's content: per branch point of `run`, its verdict (from the arms that ran);
    the failure diagnosed is the run's first label unless one is given."""
    from analysis.labels import label_run

    rows = [r for r in (rows if rows is not None else collect_arms(arms_root)) if r["parent"] == Path(run).name]
    if failure is None:
        labels = label_run(Path(run))
        failure = min(labels, key=lambda l: l.step).record() if labels else None
    points = [point_verdict(group, failure, rule) for _, group in sorted(_by(rows, "start").items())]
    return {"run": Path(run).name, "failure": failure, "rule": rule, "points": points,
            "lines": [p["line"] for p in points]}


def mechanism_tests(rows: Sequence[dict], sharing: str, mechanism: str) -> dict:
    """Across the failed runs of one sharing mode: per run, failures of none minus failures of the
    mechanism (and of slow_down minus the mechanism); the sign test of each across runs."""
    diffs_none, diffs_slow = [], []
    for _, group in _by([r for r in rows if r.get("sharing") == sharing], "parent", "start").items():
        count = {arm: sum(failed_after(r) for r in runs) for (arm,), runs in _by(group, "arm").items()}
        if mechanism not in count or NONE not in count:
            continue
        diffs_none.append(count[NONE] - count[mechanism])
        if GENERIC in count:
            diffs_slow.append(count[GENERIC] - count[mechanism])

    def sign(diffs):
        up, down = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        return {"runs": len(diffs), "saved_more": up, "saved_less": down, "p": binomial_two_sided(min(up, down), up + down),
                "mean": sum(diffs) / len(diffs) if diffs else math.nan}

    vs_none, vs_slow = sign(diffs_none), sign(diffs_slow)
    shown = (vs_none["p"] < ALPHA and vs_none["saved_more"] > vs_none["saved_less"]
             and vs_slow["p"] < ALPHA and vs_slow["saved_more"] > vs_slow["saved_less"])
    return {"sharing": sharing, "mechanism": mechanism, "vs_none": vs_none, "vs_slow_down": vs_slow, "shown": shown,
            "words": worded(max(vs_none["p"], vs_slow["p"]),
                            f"on {sharing} failures, {mechanism} saves more resamples than none and than slow_down",
                            holds=vs_none["saved_more"] > vs_none["saved_less"]
                            and vs_slow["saved_more"] > vs_slow["saved_less"])}


def pooled_failures(rows: Sequence[dict], sharing: str, mechanism: str) -> str:
    """McNemar over every (run, resample) pair of one sharing mode: reported beside the run-level test."""
    arm = {(r["parent"], r["start"], int(r["resample"])): failed_after(r) for r in rows
           if r.get("sharing") == sharing and r["arm"] == mechanism}
    none = {(r["parent"], r["start"], int(r["resample"])): failed_after(r) for r in rows
            if r.get("sharing") == sharing and r["arm"] == NONE}
    keys = sorted(set(arm) & set(none))
    return compare_failures([arm[k] for k in keys], [none[k] for k in keys]).text()


# ------------------------------------------------------------------ diagnoses across a sweep
VERDICTS = ("amplification", "capture", "length drift", "generic", "undetermined")
NOT_FAILED = "did not fail"


def run_verdict(diagnosis: dict) -> str:
    """One verdict per diagnosed run: the first branch point's named mechanism where one names one,
    else "generic" where one point found only slowing down to help, else "undetermined"."""
    verdicts = [p["verdict"] for p in diagnosis.get("points", [])]
    named = [v for v in verdicts if v not in ("generic", "undetermined")]
    return named[0] if named else "generic" if "generic" in verdicts else "undetermined"


def sweep_diagnoses(sweep: Path) -> List[dict]:
    """Per multi-agent run of a sweep: its axes (topology, sharing, a `planted` cause where the sweep
    plants one), whether it failed, and its diagnosis (None: not diagnosed)."""
    import json

    import yaml

    from analysis.load import find_runs

    rows = []
    for run in find_runs(sweep):
        cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
        if cell.get("topology") == "single":
            continue
        found = run / "diagnosis.json"
        diagnosis = json.loads(found.read_text()) if found.is_file() else None
        failed = diagnosis is not None and diagnosis.get("failure") is not None
        if diagnosis is None:
            from analysis.labels import label_run

            failed = bool(label_run(run))
        rows.append({"cell": cell.get("cell_id") or run.name, "topology": cell.get("topology"),
                     "sharing": cell.get("sharing"), "planted": (cell.get("extra") or {}).get("planted"),
                     "failed": failed, "verdict": run_verdict(diagnosis) if diagnosis else None,
                     "line": "; ".join(diagnosis.get("lines", [])) if diagnosis else ""})
    return rows


def mechanism_table(rows: Sequence[dict]):
    """Diagnosed failures by topology x sharing: how many runs each verdict went to."""
    import pandas as pd

    diagnosed = [r for r in rows if r["verdict"]]
    if not diagnosed:
        return pd.DataFrame()
    frame = pd.DataFrame(diagnosed)
    table = pd.crosstab([frame["topology"], frame["sharing"]], frame["verdict"])
    return table.reindex(columns=[v for v in VERDICTS if v in table.columns]).reset_index()


def confusion(rows: Sequence[dict]):
    """Planted cause x diagnosed verdict over a sweep's planted cells (failures not yet diagnosed are
    left out; planted cells that never failed are a column of their own)."""
    import pandas as pd

    planted = [r for r in rows if r.get("planted")]
    if not planted:
        return pd.DataFrame()
    labels = [r["verdict"] if r["verdict"] else NOT_FAILED for r in planted if r["verdict"] or not r["failed"]]
    causes = [str(r["planted"]).replace("_", " ") for r in planted if r["verdict"] or not r["failed"]]
    table = pd.crosstab(pd.Series(causes, name="planted"), pd.Series(labels, name="diagnosed"))
    columns = [v for v in VERDICTS + (NOT_FAILED,) if v in table.columns]
    return table.reindex(columns=columns, fill_value=0).reset_index()


def confusion_summary(rows: Sequence[dict]) -> str:
    """What the confusion matrix shows against its aim: every planted registry cause named, no
    mechanism named for a cause outside the registry."""
    diagnosed = [r for r in rows if r.get("planted") and r["verdict"]]
    inside = [r for r in diagnosed if str(r["planted"]).replace("_", " ") in VERDICTS[:3]]
    outside = [r for r in diagnosed if str(r["planted"]).replace("_", " ") not in VERDICTS[:3]]
    right = sum(r["verdict"] == str(r["planted"]).replace("_", " ") for r in inside)
    wrong_outside = sum(r["verdict"] in VERDICTS[:3] for r in outside)
    undiagnosed = sum(1 for r in rows if r.get("planted") and r["failed"] and not r["verdict"])
    return (f"{right} of {len(inside)} diagnosed failures with a planted registry cause named it; "
            f"{wrong_outside} of {len(outside)} with the cause outside the registry were given a mechanism "
            f"(aim: all and none)" + (f"; {undiagnosed} failed planted cells not diagnosed yet" if undiagnosed else ""))
