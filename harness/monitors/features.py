"""Windowed features of a run's metric stream, the inputs of the leading-indicator search
(analysis/indicators.py) and of the learned detector (harness/monitors/learned.py).

One class computes them for both, step by step from the records seen so far, so a feature the
search ranks offline is the number the live detector reads at the same step. Per logged signal:

- `<key>`: its mean over the last `window` steps (the level);
- `<key>:vs_early`: that level minus its mean over the run's first `window` steps (the change);
- `<key>:vs_paired`: that level over the paired single agent's level of the same signal (its one
  role for `role/<r>/...`, its one policy for `policy/<p>/...`, the same key otherwise), where the
  paired run logs it and its level is not 0.

Signals that say how a cell was built (instances, calls, samples, optimizer steps, the learning
rate), timings, per-instance duplicates, standard errors and validation (the failure label's own
input) are left out.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

WINDOW = 10  # steps in a level and in the early band
TRANSFORMS = ("level", "vs_early", "vs_paired")
_EXCLUDED = re.compile(
    r"^(step|lr|kl_age|skipped_policies|time/.*|val/.*|.*_se|.*_mb_mean|.*/(calls|samples|instances|"
    r"instances_per_policy|optimizer_steps|turns|prompt_tokens))$")


def is_signal(key: str, value) -> bool:
    """A logged number the search reads: not a build setting, timing, duplicate or the label's input."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or _EXCLUDED.match(key):
        return False
    return not (key.startswith("role/") and key.count("/") > 2)  # role/<r>/<instance>/...: per-instance copies


def feature_name(key: str, transform: str) -> str:
    return key if transform == "level" else f"{key}:{transform}"


def split_feature(name: str) -> Tuple[str, str]:
    """feature name -> (signal key, transform)."""
    key, _, transform = name.partition(":")
    return key, transform or "level"


def generic_key(key: str) -> str:
    """role/<r>/<signal> -> role/*/<signal> (policy likewise): the key a paired single agent logs the
    same signal under, whatever its one role or policy is called."""
    parts = key.split("/")
    return f"{parts[0]}/*/{parts[2]}" if parts[0] in ("role", "policy") and len(parts) == 3 else key


def paired_signals(paired: dict) -> Dict[str, float]:
    """The paired run's record by generic key; empty where it is not one role on one policy (then
    nothing of it pairs with a cell's role or policy)."""
    for kind in ("role", "policy"):
        if len({k.split("/")[1] for k in paired if k.startswith(kind + "/") and k.count("/") == 2}) > 1:
            return {}
    return {generic_key(k): float(v) for k, v in paired.items() if is_signal(k, v)}


def _mean(values: Iterable[float]) -> Optional[float]:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


class SignalWindow:
    """Feed each step's record (and the paired run's record of the same step, or None) in step
    order; `features()` is every feature at the last step fed."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.recent: Deque[Tuple[Dict[str, float], Optional[Dict[str, float]]]] = deque(maxlen=window)
        self.early: Dict[str, List[float]] = {}
        self.fed = 0

    def update(self, record: dict, paired: Optional[dict] = None) -> None:
        signals = {k: float(v) for k, v in record.items() if is_signal(k, v)}
        self.recent.append((signals, paired_signals(paired) if paired else None))
        if self.fed < self.window:
            for key, value in signals.items():
                self.early.setdefault(key, []).append(value)
        self.fed += 1

    def features(self, wanted: Optional[Iterable[str]] = None) -> Dict[str, float]:
        """Every feature (or just `wanted`, by name) at the last step fed; a feature the stream cannot
        give yet (no value in the window, no paired value) is absent."""
        keys = {split_feature(name)[0] for name in wanted} if wanted is not None else \
            {k for signals, _ in self.recent for k in signals}
        out: Dict[str, float] = {}
        for key in sorted(keys):
            level = _mean(signals.get(key) for signals, _ in self.recent)
            if level is None:
                continue
            out[key] = level
            early = _mean(self.early.get(key, []))
            if early is not None:
                out[feature_name(key, "vs_early")] = level - early
            generic = generic_key(key)
            paired = _mean(p.get(generic) for _, p in self.recent if p)
            if paired:
                out[feature_name(key, "vs_paired")] = level / paired
        if wanted is not None:
            out = {name: out[name] for name in wanted if name in out}
        return out
