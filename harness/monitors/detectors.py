"""Failure-mode detectors over the per-step metric stream.

Each detector sees one metrics record at a time (`observe(record) -> alerts`) and keeps only
state derived from the records it has seen, so its output is a pure function of the stream (and,
for the two that compare with the paired single-agent run, of that run's log: a step it has not
reached yet waits): a resumed run replays metrics.jsonl and ends in the same state, and writes the
alerts of steps that were still waiting when it died (harness.monitors.monitor.held_back). Thresholds live in
`harness.config.MonitorConfig` (see the README's detector table).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict, deque
from typing import Deque, Dict, List, Optional, Tuple

from harness.monitors.base import Alert, PairedStream, Traced
from harness.monitors.roles import judging_roles
from harness.metric_keys import names_in, policy_key, role_key  # noqa: F401  (names_in: read by callers here)


class Ewma:
    def __init__(self, alpha: float):
        self.alpha, self.value = alpha, None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.alpha * x + (1 - self.alpha) * self.value
        return self.value


def _roles_in(record: dict, suffix: str) -> List[str]:
    return names_in(record, "role", suffix)


def validation_bar(best: float, best_se: float, se: float, fraction: float, n_se: float) -> float:
    """The accuracy a validation must fall under to count as below its running best: under
    `fraction` of it and more than `n_se` standard errors of the difference below it."""
    return min(fraction * best, best - n_se * math.sqrt(se ** 2 + best_se ** 2))


def significantly_below(accuracy: float, se: float, best: float, best_se: float, fraction: float,
                        n_se: float) -> bool:
    """A validation accuracy under `fraction` of the running best by more than `n_se` standard errors
    of the difference: the collapse rule of both the detector and the failure label."""
    return accuracy < validation_bar(best, best_se, se, fraction, n_se)


class AmplificationDetector(Traced):
    """A policy trained by several role instances (IP: 3 voters on one adapter; SP: every role) that
    runs away from a one-instance reference: its drift ‖θ_t − θ_0‖ stays `min_ratio` x the
    reference's at the same step (EWMA of the ratio) while its instances' gradients add up (coherence
    EWMA >= `min_coherence`), and that ratio has risen `min_rise` above the ratio of its own early band
    (its first `baseline_steps` judged steps), for `patience` steps. Every gate is a ratio, so the
    alerts are the same at any learning rate or model size (tests/test_detectors.py multiplies every
    drift by 1e-3). A fixed speed-up says how the cell is built (3 voters on one adapter take 3x the
    optimizer steps of a one-instance policy, failing or not); a ratio that keeps rising says the
    policy is pulling away. Reference: the paired single-agent run (`monitors.reference_run`), else
    the median drift of the cell's own one-instance policies; with neither it stays silent."""

    kind = "amplification"
    paired_signals = (None,)  # its alerts judged against the paired run (build_detector gives it the reference)

    def __init__(self, cfg, role_policies: Dict[str, List[str]], reference: Optional[PairedStream] = None):
        self.cfg = cfg
        self.reference = reference
        self.coherence: Dict[str, Ewma] = defaultdict(lambda: Ewma(0.2))
        self.ratio: Dict[str, Ewma] = defaultdict(lambda: Ewma(cfg.ewma_alpha))
        self.early: Dict[str, List[float]] = defaultdict(list)  # the ratio over the first judged steps
        self.streak: Dict[str, int] = defaultdict(int)
        self.pending: List[dict] = []  # steps waiting for the reference run to reach them

    def observe(self, record: dict) -> List[Alert]:
        step = record["step"]
        candidates, singles = {}, []
        for policy in names_in(record, "policy", "drift"):
            coherence = record.get(policy_key(policy, "coherence_mb_mean"), record.get(policy_key(policy, "coherence")))
            if record.get(policy_key(policy, "instances"), 1) < 2:
                singles.append(record[policy_key(policy, "drift")])
            elif isinstance(coherence, (int, float)):
                self.coherence[policy].update(coherence)
                candidates[policy] = (record[policy_key(policy, "drift")], int(record[policy_key(policy, "instances")]))
        singles.sort()
        in_cell = singles[len(singles) // 2] if singles else None
        self.pending.append({"step": step, "candidates": candidates, "in_cell": in_cell,
                             "coherence": {p: self.coherence[p].value for p in candidates}})
        alerts = []
        while self.pending:
            reference, source = self._reference(self.pending[0])
            if reference is None and source == "the paired single-agent run":
                break  # the paired run has not logged this step yet: keep the order, try again next step
            alerts += self._judge(self.pending.pop(0), reference, source)
        return alerts

    def waiting_since(self) -> Optional[int]:
        """The first step still waiting for the paired run (None: every step seen is judged)."""
        return self.pending[0]["step"] if self.pending else None

    def _reference(self, entry: dict) -> Tuple[Optional[float], str]:
        if self.reference is not None:
            value = self.reference.drift_at(entry["step"])
            if value is not None or not self.reference.ended_before(entry["step"]):
                return value, "the paired single-agent run"
        return entry["in_cell"], "this cell's one-instance policies"  # none, or it ended short of this step

    def _judge(self, entry: dict, reference: Optional[float], source: str) -> List[Alert]:
        alerts = []
        for policy, (drift, instances) in entry["candidates"].items():
            if entry["step"] < self.cfg.min_step or not reference:
                continue
            ratio = self.ratio[policy].update(drift / reference)
            early = self.early[policy]
            if len(early) < self.cfg.baseline_steps:
                early.append(drift / reference)
                self.streak[policy] = 0
                continue
            early_ratio = sum(early) / len(early) if early else 0.0  # baseline_steps 0: no rise asked
            self._trace(entry["step"], f"{policy}: drift ratio to {source} (EWMA)", ratio,
                        max(self.cfg.min_ratio, (1 + self.cfg.min_rise) * early_ratio))
            hot = (ratio >= self.cfg.min_ratio and ratio >= (1 + self.cfg.min_rise) * early_ratio
                   and (entry["coherence"][policy] or 0.0) >= self.cfg.min_coherence)
            self.streak[policy] = self.streak[policy] + 1 if hot else 0
            if self.streak[policy] >= self.cfg.patience:
                alerts.append(Alert(
                    entry["step"], self.kind, None, policy, ratio, self.cfg.min_ratio,
                    f"gradient amplification: policy {policy}, trained by {instances} role instances, has drifted "
                    f"{ratio:.2f}x as far as {source} at step {entry['step']} (EWMA; it ran {early_ratio:.2f}x over "
                    f"its first {len(early)} steps), pulling away for {self.streak[policy]} steps; its instances' "
                    f"gradients add up (coherence {entry['coherence'][policy]:.2f})",
                    self.cfg.action))
        return alerts


class EarlyBand:
    """A signal's mean over a role's first `steps` records, then its EWMA."""

    def __init__(self, steps: int, alpha: float):
        self.steps, self.window, self.ewma = steps, [], Ewma(alpha)

    def update(self, x: float) -> None:
        if len(self.window) < self.steps:
            self.window.append(x)
        self.ewma.update(x)

    @property
    def ready(self) -> bool:
        return len(self.window) >= self.steps

    @property
    def early(self) -> float:
        return sum(self.window) / len(self.window)

    @property
    def now(self) -> float:
        return self.ewma.value


class SelectionWindow:
    """A role's selection pressure on one signal over its last `window` steps: the summed covariance
    of turn advantage and signal (role/<r>/selection_<signal>, Price's equation: the direction the
    next updates move the role's mean signal) over its standard error. Each step's batch is a fresh
    sample, so the sum's variance is the sum of the steps' variances; z is None until the window fills."""

    def __init__(self, window: int):
        self.steps: Deque[Tuple[float, float]] = deque(maxlen=window)

    def update(self, record: dict, role: str, signal: str) -> None:
        cov, se = record.get(role_key(role, f"selection_{signal}")), record.get(role_key(role, f"selection_{signal}_se"))
        if isinstance(cov, (int, float)) and isinstance(se, (int, float)) and math.isfinite(cov) and math.isfinite(se):
            self.steps.append((float(cov), float(se)))

    @property
    def z(self) -> Optional[float]:
        if len(self.steps) < (self.steps.maxlen or 0):
            return None
        total, variance = sum(c for c, _ in self.steps), sum(se * se for _, se in self.steps)
        if variance <= 0:
            return 0.0 if total == 0 else math.copysign(math.inf, total)
        return total / math.sqrt(variance)

    @property
    def per_step(self) -> float:
        return sum(c for c, _ in self.steps) / max(len(self.steps), 1)


class CaptureDetector(Traced):
    """A role leaves its contract toward another role's behaviour (the evaluator starts writing code,
    the aggregator writes essays), or is being paid to. Two signs:
    - **pressure** (signal `pressure`, the early warning): a judging role (its contract a verdict,
      an index, a plan or a search action: harness/monitors/roles.py; or those `pressure_roles` names)
      has its length under selection toward the other role's early length: over the last
      `pressure_window` steps the advantage of its turns co-varies with its length beyond
      `pressure_z` standard errors, in the direction of the other role (role/<r>/selection_length);
    - **moved** (signal `moved`, the confirmation): its length closed `length_approach` of its early
      gap to the other role's (on EWMAs against the first `baseline_steps`) while its format
      compliance or role accuracy fell by `contract_drop` of its early level. It reads the capture
      label's own signals, so it says that a capture is under way rather than predicting one, and is
      scored as a confirmation.
    Behaviour, not structure: it watches every pair of roles, on a shared policy (SP, the mechanism
    the study names) or on separate adapters, and a role that moves or is pushed away from the other,
    past it, or the other role moving, is not capture.
    `min_share_rise` (off by default) also asks the other role's gradient share to rise above its
    early share: in the repro runs it did not (eval_opt SP, seed 1: the generator's share 0.5 -> 0.2
    while the evaluator was captured)."""

    kind = "capture"
    by_contract = True  # its pressure sign watches the judging roles (harness/monitors/roles.py)
    signals = ("response_length", "format_ok", "accuracy", "grad_share")

    def __init__(self, cfg, role_policies: Dict[str, List[str]], role_contracts: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        self.role_policies = role_policies
        self.pressure_roles = set(judging_roles(role_contracts, cfg.pressure_roles))
        self.bands: Dict[Tuple[str, str], EarlyBand] = {}
        self.pressure: Dict[str, SelectionWindow] = defaultdict(lambda: SelectionWindow(cfg.pressure_window))
        self.streak: Dict[Tuple[str, str], int] = defaultdict(int)

    def _band(self, role: str, signal: str) -> EarlyBand:
        key = (role, signal)
        if key not in self.bands:
            self.bands[key] = EarlyBand(self.cfg.baseline_steps, self.cfg.ewma_alpha)
        return self.bands[key]

    def observe(self, record: dict) -> List[Alert]:
        roles = _roles_in(record, "response_length")
        for role in roles:
            for signal in self.signals:
                value = record.get(role_key(role, f"{signal}_mb_mean"), record.get(role_key(role, signal)))
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._band(role, signal).update(float(value))
            if role in self.pressure_roles:
                self.pressure[role].update(record, role, "length")
        alerts = []
        for victim in roles:
            for other in roles:
                if other == victim:
                    continue
                for sign, why in (("pressure", self._pressed(victim, other, record["step"])),
                                  ("moved", self._moved(victim, other))):
                    key = (victim, other, sign)
                    self.streak[key] = self.streak[key] + 1 if why else 0
                    if self.streak[key] < self.cfg.patience:
                        continue
                    policies = sorted(set(self.role_policies.get(victim, [])) | set(self.role_policies.get(other, [])))
                    where = (f"on shared policy {policies[0]}" if len(policies) == 1 else
                             f"on separate policies {', '.join(policies)}")
                    what = "role capture warning" if sign == "pressure" else "role capture"
                    alerts.append(Alert(record["step"], self.kind, victim, ",".join(policies), self.streak[key],
                                        self.cfg.patience, f"{what} {where}: {why}", self.cfg.action, signal=sign))
        return alerts

    def _pressed(self, victim: str, other: str, step: int) -> Optional[str]:
        """The early warning: the victim's length is under selection toward the other's early length."""
        length, other_length = self._band(victim, "response_length"), self._band(other, "response_length")
        if not (length.ready and other_length.ready):
            return None
        early_gap = other_length.early - length.early
        z = self.pressure[victim].z if victim in self.pressure_roles and self.cfg.pressure_z is not None else None
        if z is not None:  # toward the other role's length: positive
            self._trace(step, f"{victim}: length pressure toward {other}'s (z)", z if early_gap > 0 else -z,
                        self.cfg.pressure_z)
        if z is None or abs(z) < self.cfg.pressure_z or z * early_gap <= 0:
            return None
        return (f"{victim} is paid to move its length toward {other}'s: over the last "
                f"{len(self.pressure[victim].steps)} steps its advantage co-varies with its length by "
                f"{self.pressure[victim].per_step:+.2f} tokens a step (z = {z:+.1f}), toward {other}'s "
                f"{other_length.early:.1f} tokens from its {length.early:.1f}; it answers at {length.now:.1f} now")

    def _moved(self, victim: str, other: str) -> Optional[str]:
        """The confirmation: the victim's length has closed on the other's while its job fell."""
        length, other_length = self._band(victim, "response_length"), self._band(other, "response_length")
        if not (length.ready and other_length.ready):
            return None
        early_gap = other_length.early - length.early
        gap = other_length.early - length.now
        # toward: its own length closed `length_approach` of the gap to the other's *early* length (so the
        # other role moving is not the victim moving; moving away or far past never qualifies)
        if abs(early_gap) < 1e-9 or abs(gap) > (1 - self.cfg.length_approach) * abs(early_gap):
            return None
        falls = []
        for signal, name in (("format_ok", "format compliance"), ("accuracy", "role accuracy")):
            band = self._band(victim, signal)
            if band.ready and band.early > 0 and band.now <= (1 - self.cfg.contract_drop) * band.early:
                falls.append(f"its {name} fell {band.early:.2f} -> {band.now:.2f}")
        if not falls:
            return None
        share = self._band(other, "grad_share")
        if self.cfg.min_share_rise is not None and share.ready and share.now < share.early + self.cfg.min_share_rise:
            return None
        share_text = f"; {other}'s gradient share {share.early:.2f} -> {share.now:.2f}" if share.ready else ""
        return (f"{victim} answers at {length.now:.1f} tokens (was {length.early:.1f}), toward {other}'s "
                f"{other_length.early:.1f}, and " + " and ".join(falls) + share_text)


class LengthDriftDetector(Traced):
    """A judging role (its contract a verdict, an index, a plan or a search action; or those `roles`
    names) changes its
    length, or is being paid to. Two signs, either way (an aggregator writing essays; an evaluator
    shortening its verdict to the generator's answer):
    - **pressure** (the early warning): over the last `pressure_window` steps the advantage of the
      role's turns co-varies with their length beyond `pressure_z` standard errors, so every update
      moves its length that way while the length itself may not have moved yet. For a role judged at
      its own job the covariance is read net of it (`pressure_net`: role/<r>/selection_length_net,
      within right and within wrong turns): an evaluator whose right verdicts are the longer ones is
      paid for its job, not for length (measured: every healthy verdict-paid evaluator fired without it);
    - **band**: its length EWMA has left its early band by `z_threshold` spreads.
    Capture's early warning. Answer roles (generator, voter, worker, the single agent) may grow or
    shrink as RL reshapes their reasoning: never an alert on their own."""

    kind = "length_drift"
    by_contract = True

    def __init__(self, cfg, role_policies: Dict[str, List[str]], role_contracts: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        self.role_policies = role_policies
        self.roles = set(judging_roles(role_contracts, cfg.roles))
        self.window: Dict[str, List[float]] = defaultdict(list)
        self.ewma: Dict[str, Ewma] = defaultdict(lambda: Ewma(cfg.ewma_alpha))
        self.pressure: Dict[str, SelectionWindow] = defaultdict(lambda: SelectionWindow(cfg.pressure_window))
        self.streak: Dict[Tuple[str, str], int] = defaultdict(int)

    def observe(self, record: dict) -> List[Alert]:
        alerts = []
        for role in _roles_in(record, "response_length"):
            if role not in self.roles:
                continue
            for why in (self._pressed(record, role), self._left_band(record, role)):
                if why is None:
                    continue
                path, z, threshold, text = why
                self._trace(record["step"], f"{role}: {path} |z|", abs(z), threshold)
                key = (role, path)
                self.streak[key] = self.streak[key] + 1 if text else 0
                if self.streak[key] >= self.cfg.patience:
                    alerts.append(Alert(record["step"], self.kind, role, ",".join(self.role_policies.get(role, [])),
                                        z, threshold, f"{role} (a judging role) {text}", self.cfg.action, signal=path))
        return alerts

    # each sign reads (path, z, threshold, message): the message is empty while the sign is quiet,
    # None before it can be read (the window or the early band still filling)
    def _pressed(self, record: dict, role: str) -> Optional[Tuple[str, float, float, str]]:
        if self.cfg.pressure_z is None:
            return None
        pressure = self.pressure[role]
        net = self.cfg.pressure_net and role_key(role, "selection_length_net") in record
        pressure.update(record, role, "length_net" if net else "length")
        z = pressure.z
        if z is None:
            return None
        hot = abs(z) >= self.cfg.pressure_z
        return ("pressure", z, self.cfg.pressure_z,
                f"is paid to {'lengthen' if z > 0 else 'shorten'} its answers: over the last {len(pressure.steps)} "
                f"steps the advantage co-varies with its length{' beyond its job' if net else ''} by "
                f"{pressure.per_step:+.2f} tokens a step "
                f"(z = {z:+.1f}), at {record[role_key(role, 'response_length')]:.1f} tokens now" if hot else "")

    def _left_band(self, record: dict, role: str) -> Optional[Tuple[str, float, float, str]]:
        length = record[role_key(role, "response_length")]
        window = self.window[role]
        if len(window) < self.cfg.baseline_steps:
            window.append(length)
            self.ewma[role].update(length)
            return None
        mean = sum(window) / len(window)
        spread = math.sqrt(sum((x - mean) ** 2 for x in window) / len(window))
        spread = max(spread, self.cfg.min_std_tokens, self.cfg.min_std_fraction * mean)
        z = (self.ewma[role].update(length) - mean) / spread
        hot = abs(z) >= self.cfg.z_threshold
        return ("band", z, self.cfg.z_threshold,
                f"{'grew' if z > 0 else 'shrank'} its answers to {self.ewma[role].value:.1f} tokens "
                f"(early band {mean:.1f} ± {spread:.1f}, z = {z:+.1f})" if hot else "")


TREND_SIGNAL = "training vs paired run"  # the collapse warning's signal (its confirmation: "validation")


class CollapseDetector(Traced):
    """Two rules, both relative and both beyond the estimate's noise, so a low-accuracy model's
    collapse (0.25 -> 0.08) counts and one unlucky sample does not:

    - early warning (training accuracy, every step): over the last `trend_window` steps the cell's
      accuracy relative to the paired single agent's on the same problems (both draw a step's
      problems from the seed) fell below `fraction` of what it was over its first `trend_window`
      steps (r0 = its accuracy over the paired run's there), by more than `se` standard errors of
      the paired differences acc_t - fraction x r0 x ref_t, `trend_patience` steps in a row.
      Pairing step for step removes the batches' difficulty, which moves every cell of a seed
      together (a running-best rule on the raw training accuracy fired on most healthy cells); the
      cell's own first window as the bar keeps a workflow that is simply weaker than a single
      agent from the start (orch_workers at 0.2x in the smoke sweep) from firing. Needs
      `monitors.reference_run`; steps the paired run has not reached yet wait for it.
    - confirmation (validation): validation accuracy below `fraction` of its running best by more
      than `se` standard errors of the difference, `patience` validations in a row (the failure
      label's rule, analysis.labels)."""

    kind = "collapse"
    paired_signals = (TREND_SIGNAL,)  # the warning is judged against the paired run, the confirmation is not

    def __init__(self, cfg, role_policies=None, reference: Optional[PairedStream] = None):
        self.cfg = cfg
        self.best: Optional[Tuple[float, float]] = None  # (accuracy, its standard error)
        self.streak = 0
        self.reference = reference if cfg.trend_window else None
        self.pending: Deque[Tuple[int, float]] = deque()  # (step, training accuracy) waiting for the paired run
        self.pairs: Deque[Tuple[float, float]] = deque(maxlen=max(cfg.trend_window, 2))  # (cell, paired run)
        self.trend_streak = 0
        self.early_ratio: Optional[float] = None  # the cell's accuracy over the paired run's, first window

    def observe(self, record: dict) -> List[Alert]:
        return self._trend(record) + self._validation(record)

    def waiting_since(self) -> Optional[int]:
        """The first step still waiting for the paired run (None: every step seen is judged)."""
        return self.pending[0][0] if self.pending else None

    def _trend(self, record: dict) -> List[Alert]:
        if self.reference is None:
            return []
        accuracy = record.get("accuracy")
        if isinstance(accuracy, (int, float)) and math.isfinite(accuracy):
            self.pending.append((record["step"], float(accuracy)))
        alerts = []
        while self.pending:
            step, accuracy = self.pending[0]
            paired = self.reference.accuracy_at(step)
            if paired is None and not self.reference.ended_before(step):
                break  # the paired run has not logged this step yet: keep the order, try again next step
            self.pending.popleft()
            if paired is None:
                continue  # it ended short of this step: nothing to compare with
            self.pairs.append((accuracy, paired))
            alerts += self._judge_trend(step)
        return alerts

    def _judge_trend(self, step: int) -> List[Alert]:
        if len(self.pairs) < self.pairs.maxlen:  # a full window (of at least two steps: a spread needs two)
            return []
        cell = statistics.fmean(c for c, _ in self.pairs)
        paired = statistics.fmean(p for _, p in self.pairs)
        if self.early_ratio is None:  # the first full window sets the cell's own standing: never judged
            self.early_ratio = cell / paired if paired > 0 else None
            return []
        bar = self.cfg.fraction * self.early_ratio
        gaps = [c - bar * p for c, p in self.pairs]
        noise = statistics.stdev(gaps) / math.sqrt(len(gaps))
        low = statistics.fmean(gaps) < -self.cfg.se * noise
        if noise > 0:
            self._trace(step, "training accuracy vs paired run (mean gap / SE)", statistics.fmean(gaps) / noise,
                        -self.cfg.se, fires="below")
        self.trend_streak = self.trend_streak + 1 if low else 0
        if self.trend_streak < self.cfg.trend_patience:
            return []
        return [Alert(step, self.kind, None, None, cell, bar * paired,
                      f"collapse warning: over the last {len(self.pairs)} steps the cell answered {cell:.2f} of its "
                      f"training problems right, the paired single agent {paired:.2f} of the same problems: below "
                      f"{self.cfg.fraction:.0%} of the {self.early_ratio:.2f}x it managed over its first "
                      f"{len(self.pairs)} steps, by more than {self.cfg.se:g} SE of the paired differences "
                      f"({self.cfg.se * noise:.3f})", self.cfg.action, signal=TREND_SIGNAL)]

    def _validation(self, record: dict) -> List[Alert]:
        accuracy = record.get("val/accuracy")
        if accuracy is None or not isinstance(accuracy, (int, float)):
            return []
        se = float(record.get("val/accuracy_se") or 0.0)
        alerts = []
        if self.best is not None:
            best, best_se = self.best
            bar = validation_bar(best, best_se, se, self.cfg.fraction, self.cfg.se)  # the rule's own bar, drawn
            low = accuracy < bar
            self._trace(record["step"], f"validation accuracy (bar: {self.cfg.fraction:.0%} of the best and "
                        f"{self.cfg.se:g} SE below it; {self.cfg.patience} in a row)", accuracy, bar, fires="below")
            self.streak = self.streak + 1 if low else 0
            if self.streak >= self.cfg.patience:
                alerts.append(Alert(record["step"], self.kind, None, None, accuracy, self.cfg.fraction * best,
                                    f"collapse: validation accuracy {accuracy:.2f} is below {self.cfg.fraction:.0%} "
                                    f"of its best {best:.2f} by more than {self.cfg.se:g} SE "
                                    f"({self.cfg.se * math.sqrt(best_se ** 2 + se ** 2):.2f}), "
                                    f"{self.streak} validations in a row", self.cfg.action, signal="validation"))
        if self.best is None or accuracy > self.best[0]:
            self.best = (float(accuracy), se)
        return alerts


class NonFiniteDetector:
    """NaN or inf anywhere in the step's loss, gradients or parameters (the engine skipped the
    policy's optimizer step, so nothing non-finite was written into the weights)."""

    kind = "non_finite"

    def __init__(self, cfg, role_policies=None):
        self.cfg = cfg

    def observe(self, record: dict) -> List[Alert]:
        bad = sorted(k for k, v in record.items() if _non_finite(v))
        skipped = record.get("skipped_policies", 0) or 0
        if not bad and not skipped:
            return []
        what = ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
        return [Alert(record["step"], self.kind, None, None, float(len(bad) or skipped), 0.0,
                      f"non-finite values ({what or 'gradients'}); {int(skipped)} policy step(s) skipped",
                      self.cfg.action)]


def _non_finite(value) -> bool:
    if isinstance(value, str):
        return value in ("nan", "inf", "-inf")
    return isinstance(value, float) and not math.isfinite(value)


from harness.monitors.learned import LearnedDetector  # noqa: E402

DETECTORS = {"amplification": AmplificationDetector, "capture": CaptureDetector, "drift": LengthDriftDetector,
             "collapse": CollapseDetector, "nonfinite": NonFiniteDetector, "learned": LearnedDetector}


def build_detector(name: str, cfg, role_policies: Dict[str, List[str]], reference: Optional[PairedStream] = None,
                   role_contracts: Optional[Dict[str, str]] = None):
    """DETECTORS[name] on its settings `cfg`; those that compare the cell with its paired
    single-agent run (amplification: drift, collapse: training accuracy) share one `reference`, so
    the paired run's log is read once for both; those that watch judging roles find them by contract."""
    cls = DETECTORS[name]
    if getattr(cls, "paired_signals", ()):
        return cls(cfg, role_policies, reference)
    if getattr(cls, "by_contract", False):
        return cls(cfg, role_policies, role_contracts)
    return cls(cfg, role_policies)


# (kind, signal) of the alerts a detector judges against the paired run: a step that run has not
# logged yet waits, so these are the only alerts a later replay may add (harness.monitors.monitor.held_back)
PAIRED_ALERTS = {(cls.kind, signal) for cls in DETECTORS.values() for signal in getattr(cls, "paired_signals", ())}
