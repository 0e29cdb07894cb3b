"""How well the alerts predict real failures, over a sweep, scored as what each alert is.

Each run gets its objective failure labels (analysis/labels.py, computed after the fact from its
metrics; the detectors never saw them). Alerts are scored under four rules:

- **Warnings only** (`SCORED`). A warning (amplification; capture's pressure sign; length drift;
  collapse's training-accuracy warning) is scored on **recall at lead >= `MIN_LEAD`**: the failing
  cells where it fired at least that many steps before the failure. Collapse's validation rule and
  capture's "moved" sign apply the labels' own rules: they are **label notifications** (the run has
  failed, said as soon as the evidence allows), never scored, tabled or quoted as detector evidence.
- **Before the label**: an alert counts for a failure only when it fired before it (lead >= 0, and
  >= `MIN_LEAD` to count as caught); one that fired after the failure is late, counted apart.
- **Matched**: an alert counts for a failure only when it names it: capture and length drift the
  captured role, amplification a policy of the failing cell. An alert about another role of a
  failing cell is neither a catch nor a false alarm.
- **Bounded**: the monitors raise nothing before the run's first validation after step 0
  (`monitors.start_step`), so an alert that can only reflect how the cell was set up never counts;
  the config-only baseline fires at that same first step.

A warning's **false-positive rate** is over cells with no failure label at all that it can fire on
(`watched_by`: a single agent has no multi-instance policy to amplify). Per arm (a cell's settings
less its seed) the failure rate comes with a 95% Wilson interval. **Design decides, held-out
scores**: the mixed arms (failure rate over design seeds in `MIXED`, 0.2-0.8: only there can an
alert say something the configuration does not) and the **config-only baseline** (it fires on every
cell of an arm whose failure rate on the design seeds exceeds one half) come from the design seeds
alone. On the mixed arms each warning's recall minus false-positive rate is compared with the
baseline's on the same held-out cells; its interval is a stratified cluster bootstrap
(`against_baseline`): failing and healthy cells resampled apart, each by seed (a seed's IP and SP
cells share one paired single agent), the design seeds resampled too and the baseline refitted on
each resample, no resample dropped. Each mitigated arm is compared with the same settings
unmitigated (difference of failure rates, Newcombe 95% interval).
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Set, Tuple

import pandas as pd
import yaml

from analysis.labels import FailureLabel, LabelConfig, label_records
from analysis.paired import wilson
from analysis.load import find_runs
from harness.run_dir import read_jsonl
from harness.metric_keys import policy_key

if TYPE_CHECKING:
    from harness.config import MonitorConfig


@dataclass(frozen=True)
class Scored:
    """One scored alert: the (kind, signal) alerts it gathers, the failures it warns of or confirms."""

    name: str
    role: str  # "warning" | "notification" (a label's own rule said live: never scored)
    alerts: Tuple[Tuple[str, Optional[str]], ...]
    failures: Tuple[str, ...]


TREND = "training vs paired run"  # harness.monitors.detectors.TREND_SIGNAL
SCORED: Dict[str, Scored] = {s.name: s for s in (
    Scored("amplification", "warning", (("amplification", None),), ("collapse",)),
    Scored("capture warning", "warning", (("capture", "pressure"),), ("capture",)),
    Scored("length_drift", "warning", (("length_drift", "pressure"), ("length_drift", "band")), ("capture",)),
    Scored("collapse warning", "warning", (("collapse", TREND),), ("collapse",)),
    Scored("collapse", "notification", (("collapse", "validation"),), ("collapse",)),
    Scored("capture", "notification", (("capture", "moved"),), ("capture",)),
)}
# the config-only baseline, scored like a warning of any failure (config_baseline sets its alerts)
CONFIG_ONLY = Scored("config-only", "warning", (), ("collapse", "capture", "contract"))
# the learned early warning (harness/monitors/learned.py), scored by studies/early-warning as a warning of any failure
LEARNED = Scored("learned", "warning", (("learned", None),), ("collapse", "capture", "contract"))
WARNINGS = [n for n, s in SCORED.items() if s.role == "warning"]
NOTIFICATIONS = [n for n, s in SCORED.items() if s.role == "notification"]
NOTIFICATION_NOTE = ("Label notifications are not detector evidence: collapse's validation rule is the collapse "
                     "label's own rule (harness/monitors/detectors.py significantly_below, analysis/labels.py), so it "
                     "fires on every labelled collapse, at its second validation below the bar, and on nothing else; "
                     "capture's 'moved' sign is a looser copy of the capture label. They say that a run has failed, as "
                     "soon as the evidence allows, so that action=stop can end it; they are not scored here.")
# the failures each scored alert answers for (kept for callers that read the old name)
TARGETS: Dict[str, Tuple[str, ...]] = {name: s.failures for name, s in SCORED.items()}
FAILURE_KINDS = ("collapse", "capture", "contract")
MIN_LEAD = 10  # steps: a warning must come at least this long before the failure to count
CALIBRATION_WITHIN = 50  # steps: "N of M cells warned this way failed 10-50 steps later"
MIXED = (0.2, 0.8)  # an arm's failure rate over seeds between these: the config does not decide it
# which detector each scored alert's replay needs (its MonitorConfig field)
DETECTOR_OF = {"amplification": "amplification", "capture warning": "capture", "capture": "capture",
               "length_drift": "drift", "collapse warning": "collapse", "collapse": "collapse"}


def scored_name(alert: dict) -> Optional[str]:
    """The scored alert an alerts.jsonl record belongs to (None: a kind no failure is scored for)."""
    key = (alert.get("kind"), alert.get("signal"))
    for name, scored in SCORED.items():
        if key in scored.alerts:
            return name
    if alert.get("kind") in ("capture", "collapse") and alert.get("signal") is None:
        return "capture" if alert.get("kind") == "capture" else None  # logged before the signs were told apart
    return None


def matches(alert: dict, label: FailureLabel, policies: Set[str]) -> bool:
    """An alert names this failure: the captured role (capture, length drift), or a policy of the
    failing cell (amplification: collapse is the whole cell's)."""
    if label.role is not None:
        return alert.get("role") == label.role
    policy = alert.get("policy")
    return policy is None or not policies or any(p in policies for p in str(policy).split(","))


@dataclass
class RunOutcome:
    run_dir: Path
    cell_id: str
    arm: str
    labels: List[FailureLabel]
    first_alert: Dict[str, int]  # scored name -> first step it fired that names the cell's failure (or at all)
    watched: Set[str] = field(default_factory=lambda: set(SCORED))  # scored alerts with something to watch here
    alerts: List[dict] = field(default_factory=list)  # every scored alert the run raised (at or after `start`)
    policies: Set[str] = field(default_factory=set)
    start: int = 0  # the monitors' first step
    val_every: int = 10
    seed: Optional[int] = None  # the cell's seed: a cluster of the bootstrap, and the held-out check

    def failure(self, kinds: Tuple[str, ...]) -> Optional[FailureLabel]:
        found = [label for label in self.labels if label.kind in kinds]
        return min(found, key=lambda label: label.step) if found else None

    def failure_step(self, kinds: Tuple[str, ...]) -> Optional[int]:
        label = self.failure(kinds)
        return None if label is None else label.step


def first_alerts(alerts: Sequence[dict], labels: List[FailureLabel], policies: Set[str]) -> Dict[str, int]:
    """Per scored alert, the first step it fired: matched to the failure it answers for where the cell
    has one (the first such label), else the first step at all (a false alarm on a healthy cell)."""
    first: Dict[str, int] = {}
    for name, scored in SCORED.items():
        found = [label for label in labels if label.kind in scored.failures]
        label = min(found, key=lambda l: l.step) if found else None
        steps = [a["step"] for a in alerts if scored_name(a) == name and isinstance(a.get("step"), int)
                 and (label is None or matches(a, label, policies))]
        if steps:
            first[name] = min(steps)
    return first


def arm_of(cfg: dict) -> str:
    """The cell's settings without its seed: topology, sharing, extra axes (mitigations), task, scale."""
    topology = cfg.get("topology", "?")
    head = topology if topology == "single" else f"{topology}-{cfg.get('sharing', '?')}"
    extra = {k: v for k, v in (cfg.get("extra") or {}).items() if k != "task_axis"}
    tail = "".join(f" {k}={v}" for k, v in sorted(extra.items()))
    return f"{head}{tail} ({cfg.get('task', '?')}, {cfg.get('scale', '?')})"


@dataclass
class ReplayContext:
    """What the monitors of a logged run saw, to replay them: settings (the paired run set), the role
    -> policy and role -> contract maps, and the first step they may alert at."""

    monitors: MonitorConfig
    role_policies: Dict[str, List[str]]
    role_contracts: Optional[Dict[str, str]]
    start: int
    val_every: int


def replay_setup(run: Path) -> ReplayContext:
    """The detectors' context of a logged run, as it was live: default settings with the paired
    single-agent run of the same sweep directory as `monitors.reference_run` (the one the run
    recorded, looked up by name beside it, since a sweep directory may have moved; else the grid's
    id for it), the role maps from status.json, and the start bound from the cell's validations."""
    from harness.config import MonitorConfig
    from harness.run_dir import upgrade_stored
    from harness.monitors.settle import role_contracts_of, role_policies_of

    from grid.expand import cell_id

    cell = upgrade_stored(yaml.safe_load((run / "cell.yaml").read_text()) or {})
    monitors = MonitorConfig()
    recorded = (cell.get("monitors") or {}).get("reference_run")
    paired = run.parent / (Path(recorded).name if recorded else
                           cell_id({"topology": "single", "task": cell.get("task"), "scale": cell.get("scale"),
                                    "seed": cell.get("seed")}, {}))
    if cell.get("topology") != "single" and (paired / "metrics.jsonl").is_file():
        monitors.reference_run = str(paired)
    status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
    val_every = int(cell.get("val_every") or 10)
    start = (cell.get("monitors") or {}).get("start_step")
    return ReplayContext(monitors, role_policies_of(status), role_contracts_of(status),
                         int(start) if start is not None else val_every, val_every)


def replayed_alerts(records: List[dict], context: ReplayContext) -> List[dict]:
    """The alerts today's detectors raise on a run's logged metrics, as they would have live (in the
    context replay_setup gives). For re-scoring a sweep after the detectors changed; the run's own
    alerts.jsonl stays as it was."""
    from harness.monitors import Monitor
    from harness.paired_run import paired_run

    monitor = Monitor(context.monitors, context.role_policies, context.role_contracts, context.start,
                      reference=paired_run(context.monitors))
    return [a.record() for record in records for a in monitor.observe(record)]


def watched_by(records: List[dict], paired_reference: bool = False,
               role_contracts: Optional[Dict[str, str]] = None) -> Set[str]:
    """The scored alerts that can fire on a run at all, from what its metrics hold: amplification needs a
    policy trained by >= 2 role instances and something to compare it with (the paired single-agent
    run, else a one-instance policy in the cell), capture two roles, length drift and capture's warning
    a judging role, collapse validations (its warning the paired run too). A cell built so that an
    alert cannot fire (a single agent, one adapter per instance) is silent by construction: counting
    it as a true negative would lower the false-positive rate by how the sweep is composed, not by
    what the detector does."""
    from harness.monitors.detectors import names_in
    from harness.monitors.roles import judging_roles

    roles = {role for r in records for role in names_in(r, "role", "response_length")}
    kinds = {"collapse"} if any(isinstance(r.get("val/accuracy"), (int, float)) for r in records) else set()
    if paired_reference:
        kinds.add("collapse warning")
    instances = [r[policy_key(p, "instances")] for r in records for p in names_in(r, "policy", "instances")
                 if isinstance(r[policy_key(p, "instances")], (int, float))]
    if any(n >= 2 for n in instances) and (paired_reference or any(n < 2 for n in instances)):
        kinds.add("amplification")
    judging = roles & set(judging_roles(role_contracts))
    if len(roles) >= 2:
        kinds.add("capture")
        if judging:
            kinds.add("capture warning")
    if judging:
        kinds.add("length_drift")
    return kinds


def outcomes(sweep: Path, cfg: LabelConfig = LabelConfig(), replay: bool = False,
             until: Optional[int] = None) -> List[RunOutcome]:
    """Every run's labels and alerts; with `until`, only its steps below `until` count, as if the
    sweep had stopped there (the same cells scored at a shorter horizon: the first steps of a longer
    run are those of the shorter one under a constant learning rate)."""
    results = []
    for run in find_runs(sweep):
        cell = yaml.safe_load((run / "cell.yaml").read_text()) or {}
        context = replay_setup(run)
        records = read_jsonl(run / "metrics.jsonl")
        raised = replayed_alerts(records, context) if replay else read_jsonl(run / "alerts.jsonl")
        alerts = [a for a in raised if scored_name(a) is not None and isinstance(a.get("step"), int)
                  and a["step"] >= context.start and (until is None or a["step"] < until)]
        if until is not None:
            records = [r for r in records if isinstance(r.get("step"), int) and r["step"] < until]
        labels = label_records(records, cfg)
        policies = {p for members in context.role_policies.values() for p in members}
        first = first_alerts(alerts, labels, policies)
        paired = context.monitors.reference_run is not None
        results.append(RunOutcome(run, cell.get("cell_id") or run.name, arm_of(cell), labels, first,
                                  watched_by(records, paired, context.role_contracts) | set(first), alerts,
                                  policies, context.start, context.val_every,
                                  int(cell["seed"]) if cell.get("seed") is not None else None))
    return results


def interval(low: float, high: float) -> str:
    """A 95% interval as the tables print it; "–" where it is undefined (no cell to count)."""
    return "–" if math.isnan(low) or math.isnan(high) else f"[{low:.2f}, {high:.2f}]"


# the aim for an early warning: recall >= 0.8 at a lead >= MIN_LEAD steps, false positives <= 0.1
BAR = {"recall": 0.8, "median lead (steps)": float(MIN_LEAD), "false-positive rate": 0.1}


def meets_bar(row: dict) -> str:
    """yes, or no with what falls short ("no: recall 0.40 < 0.8"), or "not measurable" where the cells
    hold no failing or no healthy cell to score it on. Recall already asks for the lead."""
    if not row["failing cells"] or not row["healthy cells"]:
        return "not measurable"
    recall, fpr = row["recall"], row["false-positive rate"]
    short = []
    if not recall >= BAR["recall"]:
        short.append(f"recall {recall:.2f} < {BAR['recall']:g}")
    if not fpr <= BAR["false-positive rate"]:
        short.append(f"false positives {fpr:.3f} > {BAR['false-positive rate']:g}")
    return "no: " + ", ".join(short) if short else "yes"


def newcombe(k1: int, n1: int, k2: int, n2: int) -> Tuple[float, float]:
    """95% interval of the difference of two proportions k1/n1 - k2/n2 (Newcombe's hybrid score
    method, from the two Wilson intervals)."""
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1), wilson(k2, n2)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def mitigation_effects(results: List[RunOutcome]) -> pd.DataFrame:
    """Each mitigated arm against the same settings without mitigation: failure rates, their
    difference with a 95% interval, and whether the interval shows the mitigated arm lower."""
    by_arm: Dict[str, List[RunOutcome]] = {}
    for r in results:
        by_arm.setdefault(r.arm, []).append(r)
    rows = []
    for arm, part in sorted(by_arm.items()):
        match = re.search(r"mitigation=(\S+)", arm)
        if not match or match.group(1) == "none":
            continue
        control = by_arm.get(arm.replace(match.group(0), "mitigation=none"))
        if not control:
            continue
        k1, n1 = sum(bool(r.labels) for r in part), len(part)
        k2, n2 = sum(bool(r.labels) for r in control), len(control)
        low, high = newcombe(k1, n1, k2, n2)
        verdict = ("lower" if high < 0 else "higher" if low > 0 else
                   "not shown lower: the interval includes 0")
        rows.append({"arm": arm, "failed": f"{k1}/{n1}", "without mitigation": f"{k2}/{n2}",
                     "difference": k1 / n1 - k2 / n2, "95% CI (Newcombe)": f"[{low:+.2f}, {high:+.2f}]",
                     "verdict": verdict})
    return pd.DataFrame(rows)


def definition(name: str) -> Scored:
    return {CONFIG_ONLY.name: CONFIG_ONLY, LEARNED.name: LEARNED}.get(name) or SCORED[name]


def caught(r: RunOutcome, name: str) -> Optional[int]:
    """The lead of warning `name` on the failure it warns of in this cell (None: no such failure, or
    not warned at least MIN_LEAD steps before it)."""
    ahead = lead(r, name)
    return ahead if ahead is not None and ahead >= MIN_LEAD else None


def fired_falsely(r: RunOutcome, name: str) -> bool:
    return not r.labels and name in r.first_alert


def detector_scores(results: List[RunOutcome], names: Sequence[str] = tuple(WARNINGS)) -> pd.DataFrame:
    """Each early warning: recall at lead >= MIN_LEAD on the failing cells it warns of, the median of
    those leads, and its false-positive rate on the healthy cells it watches, with Wilson intervals."""
    rows = []
    healthy = [r for r in results if not r.labels]
    for name in names:
        targets = definition(name).failures
        failing = [r for r in results if r.failure_step(targets) is not None]
        leads = [ahead for ahead in (caught(r, name) for r in failing) if ahead is not None]
        late = sum(1 for r in failing if (lead(r, name) or 0) < 0)
        watching = [r for r in healthy if name in r.watched]
        false = sum(fired_falsely(r, name) for r in watching)
        rows.append({"detector": name, "warns of": ", ".join(targets), "failing cells": len(failing),
                     "caught in time": len(leads), "recall": len(leads) / len(failing) if failing else float("nan"),
                     "recall 95% CI": interval(*wilson(len(leads), len(failing))),
                     "median lead (steps)": median(leads) if leads else float("nan"),
                     "fired after the failure (late)": late,
                     "healthy cells": len(watching), "fired on healthy": false,
                     "false-positive rate": false / len(watching) if watching else float("nan"),
                     "false-positive 95% CI": interval(*wilson(false, len(watching))),
                     "healthy, silent by construction": len(healthy) - len(watching)})
        rows[-1]["meets the aim"] = meets_bar(rows[-1])
    return pd.DataFrame(rows)


def lead(r: RunOutcome, name: str) -> Optional[int]:
    """Steps from the first (matched) alert `name` to the failure it warns of (negative: the alert came
    after the failure, late); None where the cell has no such failure or the alert never fired."""
    step, alert = r.failure_step(definition(name).failures), r.first_alert.get(name)
    return None if step is None or alert is None else step - alert


def notification_delays(results: List[RunOutcome]) -> Dict[str, List[int]]:
    """Per label notification, its delay after the label on each failing cell it notified: when the
    evidence allowed saying that the run had failed (a fact about the rule, not a score)."""
    return {name: [-d for d in (lead(r, name) for r in results) if d is not None] for name in NOTIFICATIONS}


def arm_rates(results: List[RunOutcome]) -> Dict[str, float]:
    by_arm: Dict[str, List[RunOutcome]] = {}
    for r in results:
        by_arm.setdefault(r.arm, []).append(r)
    return {arm: sum(bool(r.labels) for r in part) / len(part) for arm, part in by_arm.items()}


def mixed_arms(results: List[RunOutcome]) -> List[str]:
    """The arms whose failure rate over their seeds lies in MIXED: the settings where the same config
    both fails and survives (single agents excluded: nothing multi-agent to diagnose there)."""
    low, high = MIXED
    return sorted(arm for arm, rate in arm_rates(results).items()
                  if low <= rate <= high and not arm.startswith("single"))


def config_baseline(results: List[RunOutcome], design: List[RunOutcome]) -> Tuple[List[RunOutcome], Set[str]]:
    """The config-only baseline as a scored alert: it fires at the monitors' first step (where the
    detectors may first fire too) on every cell of an arm whose failure rate on the design seeds
    exceeds one half (an arm the design seeds never ran: silent). Returns the cells with its first
    alert set (name "config-only") and the arms it fires on."""
    firing = firing_arms(design)
    return with_baseline(results, firing), firing


def firing_arms(design: List[RunOutcome]) -> Set[str]:
    return {arm for arm, rate in arm_rates(design).items() if rate > 0.5}


def with_baseline(results: List[RunOutcome], firing: Set[str]) -> List[RunOutcome]:
    from dataclasses import replace

    return [replace(r, first_alert={CONFIG_ONLY.name: r.start} if r.arm in firing else {},
                    watched=r.watched | {CONFIG_ONLY.name}) for r in results]


def _youden(cells: List[RunOutcome], name: str, failures: Tuple[str, ...]) -> Tuple[float, int, int]:
    """recall at lead >= MIN_LEAD minus false-positive rate of `name` on `cells` (nan where either is
    unmeasured), and the counts of failing and healthy cells."""
    failing = [r for r in cells if r.failure_step(failures) is not None]
    healthy = [r for r in cells if not r.labels]
    if not failing or not healthy:
        return float("nan"), len(failing), len(healthy)
    hits = sum(caught(r, name) is not None for r in failing)
    return hits / len(failing) - sum(name in r.first_alert for r in healthy) / len(healthy), len(failing), len(healthy)


def _by_seed(cells: List[RunOutcome]) -> Dict[object, List[RunOutcome]]:
    clusters: Dict[object, List[RunOutcome]] = {}
    for r in cells:
        clusters.setdefault(r.seed if r.seed is not None else r.cell_id, []).append(r)
    return clusters


def _cluster_sample(clusters: Dict[object, List[RunOutcome]], rng: random.Random) -> List[RunOutcome]:
    keys = sorted(clusters, key=str)
    return [r for _ in keys for r in clusters[keys[rng.randrange(len(keys))]]]


BOOTSTRAP_NOTE = ("95% interval and two-sided p from a stratified cluster bootstrap (2,000 resamples): the failing "
                  "and the healthy held-out cells are resampled apart (so neither count is ever zero and no resample "
                  "is dropped), each by seed (a seed's cells share one paired single agent), and the design seeds "
                  "are resampled by seed too, the config-only baseline refitted on each.")


def against_baseline(results: List[RunOutcome], design: List[RunOutcome], names: Sequence[str] = tuple(WARNINGS),
                     resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per warning, on the same held-out cells: its recall-minus-false-positive-rate (Youden's J, at
    lead >= MIN_LEAD) against the config-only baseline's (fitted on `design`), and the difference with
    the interval and p-value of BOOTSTRAP_NOTE. Useful where the interval lies above 0."""
    rows = []
    rng = random.Random(seed)
    firing = firing_arms(design)
    design_clusters = _by_seed(design)
    for name in names:
        failures = definition(name).failures
        cells = [r for r in results if name in r.watched or r.failure_step(failures) is not None]
        failing = [r for r in cells if r.failure_step(failures) is not None]
        healthy = [r for r in cells if not r.labels]
        own, n_fail, n_healthy = _youden(cells, name, failures)
        base, _, _ = _youden(with_baseline(cells, firing), CONFIG_ONLY.name, failures)
        diffs: List[float] = []
        if failing and healthy:
            strata = (_by_seed(failing), _by_seed(healthy))
            for _ in range(resamples):
                sample = _cluster_sample(strata[0], rng) + _cluster_sample(strata[1], rng)
                refit = firing_arms(_cluster_sample(design_clusters, rng)) if design_clusters else firing
                a, _, _ = _youden(sample, name, failures)
                b, _, _ = _youden(with_baseline(sample, refit), CONFIG_ONLY.name, failures)
                diffs.append(a - b)
        diffs.sort()
        low, high = (diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]) if diffs else (math.nan, math.nan)
        p = (min(1.0, 2 * min(sum(d <= 0 for d in diffs), sum(d >= 0 for d in diffs)) / len(diffs))
             if diffs else math.nan)
        verdict = ("not measurable" if not diffs else
                   f"beats the config-only baseline (p = {p:.3f})" if low > 0 else
                   f"worse than the config-only baseline (p = {p:.3f})" if high < 0 else
                   f"not shown better than the config-only baseline (p = {p:.3f})")
        rows.append({"detector": name, "failing cells": n_fail, "healthy cells": n_healthy,
                     "J (recall - FPR)": own, "config-only J": base, "difference": own - base,
                     "95% CI (bootstrap)": f"[{low:+.2f}, {high:+.2f}]" if diffs else "–",
                     "p": p, "verdict": verdict})
    return pd.DataFrame(rows)


def calibration_rows(results: List[RunOutcome], within: int) -> List[dict]:
    """Per early warning (its (kind, signal) alerts): of the cells where it fired before any failure it
    warns of (or on a cell without one), how many failed that way `MIN_LEAD`-`within` steps later, how
    many sooner, and on how many more cells it fired only after the failure (late: not a prediction).
    Label notifications get no row: they are not predictions."""
    rows = []
    for name in WARNINGS:
        scored = SCORED[name]
        leads = [lead(r, name) for r in results if name in r.first_alert]
        late = sum(1 for d in leads if d is not None and d < 0)
        warned = [d for d in leads if d is None or d >= 0]
        if not leads:
            continue
        rows.append({"name": name, "alerts": [list(a) for a in scored.alerts], "failure": ", ".join(scored.failures),
                     "warned": len(warned), "in_time": sum(d is not None and MIN_LEAD <= d <= within for d in warned),
                     "soon": sum(d is not None and d < MIN_LEAD for d in warned), "late": late,
                     "min_lead": MIN_LEAD})
    return rows


def failure_coverage(results: List[RunOutcome]) -> pd.DataFrame:
    """Per failure kind (and any failure): the failing cells that some early warning came at least
    MIN_LEAD steps before (whatever failure that warning targets), the median lead of the earliest
    such warning and which one it was. What a user watching every warning would have seen,
    including failures no detector targets."""
    rows = []
    for kind in FAILURE_KINDS + ("any failure",):
        kinds = FAILURE_KINDS if kind == "any failure" else (kind,)
        failing = [r for r in results if r.failure_step(kinds) is not None]
        leads, first_by = [], {}
        for r in failing:
            step = r.failure_step(kinds)
            in_time = {name: alert for name, alert in r.first_alert.items()
                       if name in WARNINGS and alert <= step - MIN_LEAD}
            if in_time:
                first = min(in_time, key=lambda name: (in_time[name], name))
                leads.append(step - in_time[first])
                first_by[first] = first_by.get(first, 0) + 1
        rows.append({"failure": kind, "failing cells": len(failing), "warned in time": len(leads),
                     "share": len(leads) / len(failing) if failing else float("nan"),
                     "median lead (steps)": median(leads) if leads else float("nan"),
                     "first warned by": ", ".join(f"{d} {n}" for d, n in sorted(first_by.items())) or "–"})
    return pd.DataFrame(rows)


def arm_failure_rates(results: List[RunOutcome]) -> pd.DataFrame:
    mixed = set(mixed_arms(results))
    rows = []
    for arm in sorted({r.arm for r in results}):
        part = [r for r in results if r.arm == arm]
        failed = sum(bool(r.labels) for r in part)
        low, high = wilson(failed, len(part))
        kinds = sorted({label.kind for r in part for label in r.labels})
        rows.append({"arm": arm, "cells": len(part), "failed": failed, "failure rate": failed / len(part),
                     "95% CI": f"[{low:.2f}, {high:.2f}]", "failure kinds": ", ".join(kinds) or "–",
                     "mixed": "yes" if arm in mixed else ""})
    return pd.DataFrame(rows)


def cell_table(results: List[RunOutcome]) -> pd.DataFrame:
    rows = []
    for r in results:
        failure = min((label.step for label in r.labels), default=None)
        rows.append({"cell": r.cell_id, "arm": r.arm,
                     "failure": "; ".join(f"{l.kind}{' (' + l.role + ')' if l.role else ''} at {l.step}"
                                          for l in r.labels) or "–",
                     **{f"first {name}": r.first_alert.get(name, float("nan")) for name in SCORED},
                     "first failure": failure if failure is not None else float("nan")})
    return pd.DataFrame(rows)


def seeds_of(results: List[RunOutcome]) -> int:
    """Seeds per arm (the smallest count): the figures rest on at least this many repeats."""
    counts: Dict[str, int] = {}
    for r in results:
        counts[r.arm] = counts.get(r.arm, 0) + 1
    return min(counts.values()) if counts else 0
