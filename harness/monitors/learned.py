"""The learned early warning: a small logistic model over windowed signals, fitted on design seeds
(analysis/early_warning.py) and stored as a JSON of its features, their standardisation, its
coefficients and its threshold (harness/monitors/learned.json by default). Live it reads the same
features as the offline search (harness/monitors/features.py) every `every` steps and alerts when
its score reaches the threshold. Off by default: it ships on only where it beat the config-only
baseline on held-out seeds (studies/early-warning)."""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Deque, Dict, List, Optional

from harness.monitors.base import Alert, PairedStream, Traced
from harness.monitors.features import SignalWindow

DEFAULT_MODEL = Path(__file__).with_name("learned.json")


@dataclass
class LearnedModel:
    features: List[str]
    mean: List[float]
    scale: List[float]
    coef: List[float]
    intercept: float
    threshold: float  # alert at a score >= this (chosen on design seeds for a stated false-positive rate)
    every: int = 5  # steps between reads
    window: int = 10
    source: str = ""  # what it was fitted on and how

    @classmethod
    def load(cls, path: Path = DEFAULT_MODEL) -> "LearnedModel":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"monitors.learned.model: no model at {path}; fit one with "
                                    f"python -m analysis.studies render (studies/early-warning)") from None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    def score(self, values: Dict[str, float]) -> float:
        """P(failure ahead) from the features; a missing one counts as its design mean."""
        z = self.intercept
        for name, mean, scale, coef in zip(self.features, self.mean, self.scale, self.coef):
            value = values.get(name)
            if value is not None and math.isfinite(value):
                z += coef * (value - mean) / scale
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


class LearnedDetector(Traced):
    """monitors.learned: the fitted model's score every `every` steps, judged against its threshold.
    Its vs_paired features need the paired run's step: a step it has not logged yet waits."""

    kind = "learned"
    paired_signals = (None,)

    def __init__(self, cfg, role_policies=None, reference: Optional[PairedStream] = None):
        self.cfg = cfg
        self.model = LearnedModel.load(Path(cfg.model) if cfg.model else DEFAULT_MODEL) if cfg.enabled else None
        self.window = SignalWindow(self.model.window) if self.model else None
        self.reference = reference
        self.pending: Deque[dict] = deque()

    def waiting_since(self) -> Optional[int]:
        return self.pending[0]["step"] if self.pending else None

    def observe(self, record: dict) -> List[Alert]:
        if self.model is None or not isinstance(record.get("step"), int):
            return []
        self.pending.append(record)
        alerts = []
        while self.pending:
            step = self.pending[0]["step"]
            paired = self.reference.record_at(step) if self.reference else None
            if self.reference is not None and paired is None and not self.reference.ended_before(step):
                break
            alerts += self._judge(self.pending.popleft(), paired)
        return alerts

    def _judge(self, record: dict, paired: Optional[dict]) -> List[Alert]:
        self.window.update(record, paired)
        step = record["step"]
        if step % self.model.every:
            return []
        score = self.model.score(self.window.features(self.model.features))
        self._trace(step, "learned score", score, self.model.threshold)
        if score < self.model.threshold:
            return []
        return [Alert(step, self.kind, None, None, score, self.model.threshold,
                      f"learned warning: score {score:.2f} >= {self.model.threshold:.2f} from "
                      f"{', '.join(self.model.features)} ({self.model.source})", self.cfg.action)]
