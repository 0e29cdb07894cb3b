"""Failure-mode detectors over the per-step metric stream.

Each detector sees one metrics record at a time (`observe(record) -> alerts`) and keeps only
state derived from the records it has seen, so its output is a pure function of the stream: a
resumed run replays metrics.jsonl and ends in the same state. Thresholds live in
`harness.config.MonitorConfig` (see the README's detector table).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Alert:
    step: int
    kind: str  # amplification | capture | length_drift | collapse | non_finite
    role: Optional[str]
    policy: Optional[str]
    value: float
    threshold: float
    message: str
    action: str = "alert"

    def record(self) -> dict:
        return asdict(self)


class Ewma:
    def __init__(self, alpha: float):
        self.alpha, self.value = alpha, None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.alpha * x + (1 - self.alpha) * self.value
        return self.value


def _roles_in(record: dict, suffix: str) -> List[str]:
    """Role names that have `role/<name>/<suffix>` in the record (instance keys excluded)."""
    return sorted(k.split("/")[1] for k in record if k.startswith("role/") and k.count("/") == 2
                  and k.endswith("/" + suffix))


class AmplificationDetector:
    """A role whose same-type instances share one policy (IP voting: 3 voters, one adapter) and
    whose summed gradient stays well above a single instance's while the instances add up."""

    kind = "amplification"

    def __init__(self, cfg, role_policies: Dict[str, List[str]]):
        self.cfg = cfg
        self.role_policies = role_policies
        self.streak: Dict[str, int] = defaultdict(int)

    def observe(self, record: dict) -> List[Alert]:
        alerts = []
        for role in _roles_in(record, "amplification"):
            if record.get(f"role/{role}/instances_per_policy", 1) < 2:
                continue
            amplification = record[f"role/{role}/amplification"]
            coherence = record.get(f"role/{role}/coherence", 0.0)
            hot = amplification >= self.cfg.min_amplification and coherence >= self.cfg.min_coherence
            self.streak[role] = self.streak[role] + 1 if hot else 0
            if self.streak[role] >= self.cfg.patience:
                policy = ",".join(self.role_policies.get(role, []))
                alerts.append(Alert(
                    record["step"], self.kind, role, policy, amplification, self.cfg.min_amplification,
                    f"gradient amplification: {int(record[f'role/{role}/instances_per_policy'])} {role} instances "
                    f"on policy {policy}: their summed gradient is {amplification:.2f}x one instance's "
                    f"(coherence {coherence:.2f}) for {self.streak[role]} steps", self.cfg.action))
        return alerts


class CaptureDetector:
    """On a policy shared by several roles: one role's gradient share stays far above its share
    of turns while another role's format compliance falls or its length moves toward the
    dominant role's (the evaluator starts writing code, the aggregator writes essays)."""

    kind = "capture"

    def __init__(self, cfg, role_policies: Dict[str, List[str]]):
        self.cfg = cfg
        shared: Dict[str, List[str]] = defaultdict(list)
        for role, policies in role_policies.items():
            for policy in policies:
                shared[policy].append(role)
        self.groups = {p: sorted(rs) for p, rs in shared.items() if len(rs) > 1}
        self.ratio = defaultdict(lambda: Ewma(0.2))
        self.format = defaultdict(lambda: Ewma(0.2))
        self.length = defaultdict(lambda: Ewma(0.2))
        self.baseline: Dict[str, List[Tuple[float, float]]] = defaultdict(list)  # role -> [(format, length)]
        self.streak: Dict[Tuple[str, str], int] = defaultdict(int)
        self.steps = 0

    def observe(self, record: dict) -> List[Alert]:
        self.steps += 1
        for role in _roles_in(record, "turn_share"):
            fmt, length = record.get(f"role/{role}/format_ok", 1.0), record[f"role/{role}/response_length"]
            self.format[role].update(fmt)
            self.length[role].update(length)
            if self.steps <= self.cfg.baseline_steps:
                self.baseline[role].append((fmt, length))
            turn_share = record[f"role/{role}/turn_share"]
            if f"role/{role}/grad_share" in record and turn_share > 0:
                self.ratio[role].update(record[f"role/{role}/grad_share"] / turn_share)
        if self.steps <= self.cfg.baseline_steps:
            return []
        alerts = []
        for policy, roles in self.groups.items():
            for dominant in roles:
                ratio = self.ratio[dominant].value
                victim, why, relative = (None, "", 0.0)
                if ratio is not None and ratio > 1.0:
                    victim, why, relative = self._victim(dominant, ratio, roles)
                key = (policy, dominant)
                self.streak[key] = self.streak[key] + 1 if victim else 0
                if self.streak[key] >= self.cfg.patience:
                    alerts.append(Alert(
                        record["step"], self.kind, victim, policy, relative, self.cfg.share_ratio,
                        f"role capture on policy {policy}: {dominant} takes {ratio:.2f}x its turn share of the "
                        f"gradient, {victim} {self.ratio[victim].value:.2f}x; {victim} {why}", self.cfg.action))
        return alerts

    def _victim(self, dominant: str, ratio: float, roles: Sequence[str]) -> Tuple[Optional[str], str, float]:
        """A role starved of gradient relative to `dominant` that also shows a symptom."""
        for role in roles:
            if role == dominant or not self.baseline[role] or self.ratio[role].value is None:
                continue
            relative = ratio / max(self.ratio[role].value, 1e-3)
            if relative < self.cfg.share_ratio:
                continue
            base_format = sum(f for f, _ in self.baseline[role]) / len(self.baseline[role])
            if self.format[role].value <= base_format - self.cfg.format_drop:
                return role, f"follows its output contract {self.format[role].value:.0%} of the time " \
                             f"(was {base_format:.0%})", relative
            base_gap = abs(_mean_length(self.baseline[role]) - _mean_length(self.baseline[dominant]))
            gap = abs(self.length[role].value - self.length[dominant].value)
            if base_gap > 0 and gap <= (1 - self.cfg.length_approach) * base_gap:
                return role, f"answers at {self.length[role].value:.1f} tokens, toward {dominant}'s " \
                             f"{self.length[dominant].value:.1f} (gap {base_gap:.1f} -> {gap:.1f})", relative
        return None, "", 0.0


def _mean_length(window: List[Tuple[float, float]]) -> float:
    return sum(length for _, length in window) / len(window) if window else 0.0


class LengthDriftDetector:
    """Per role: the response length's EWMA leaves the band of its first `baseline_steps`
    steps by more than z_threshold baseline spreads, on either side."""

    kind = "length_drift"

    def __init__(self, cfg, role_policies: Dict[str, List[str]]):
        self.cfg = cfg
        self.role_policies = role_policies
        self.window: Dict[str, List[float]] = defaultdict(list)
        self.ewma: Dict[str, Ewma] = defaultdict(lambda: Ewma(cfg.ewma_alpha))
        self.streak: Dict[str, int] = defaultdict(int)

    def observe(self, record: dict) -> List[Alert]:
        alerts = []
        for role in _roles_in(record, "response_length"):
            length = record[f"role/{role}/response_length"]
            window = self.window[role]
            if len(window) < self.cfg.baseline_steps:
                window.append(length)
                self.ewma[role].update(length)
                continue
            mean = sum(window) / len(window)
            spread = math.sqrt(sum((x - mean) ** 2 for x in window) / len(window))
            spread = max(spread, self.cfg.min_std_tokens, self.cfg.min_std_fraction * mean)
            z = (self.ewma[role].update(length) - mean) / spread
            self.streak[role] = self.streak[role] + 1 if abs(z) >= self.cfg.z_threshold else 0
            if self.streak[role] >= self.cfg.patience:
                direction = "grew" if z > 0 else "shrank"
                alerts.append(Alert(
                    record["step"], self.kind, role, ",".join(self.role_policies.get(role, [])), z,
                    self.cfg.z_threshold,
                    f"{role} response length {direction} to {self.ewma[role].value:.1f} tokens "
                    f"(early band {mean:.1f} ± {spread:.1f}, z = {z:+.1f})", self.cfg.action))
        return alerts


class CollapseDetector:
    """Validation accuracy below its running best by more than `margin`, `patience` times in a row."""

    kind = "collapse"

    def __init__(self, cfg, role_policies=None):
        self.cfg = cfg
        self.best: Optional[float] = None
        self.streak = 0

    def observe(self, record: dict) -> List[Alert]:
        accuracy = record.get("val/accuracy")
        if accuracy is None or not isinstance(accuracy, (int, float)):
            return []
        self.best = accuracy if self.best is None else max(self.best, accuracy)
        drop = self.best - accuracy
        self.streak = self.streak + 1 if drop > self.cfg.margin else 0
        if self.streak >= self.cfg.patience:
            return [Alert(record["step"], self.kind, None, None, drop, self.cfg.margin,
                          f"late collapse: validation accuracy {accuracy:.2f} is {drop:.2f} below its best "
                          f"{self.best:.2f}", self.cfg.action)]
        return []


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


DETECTORS = {"amplification": AmplificationDetector, "capture": CaptureDetector, "drift": LengthDriftDetector,
             "collapse": CollapseDetector, "nonfinite": NonFiniteDetector}
