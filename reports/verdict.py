"""A run's verdict in one line, the first thing its report says: its state, what happened to it
(the failure labels of analysis/labels.py, computed after the fact), what the detectors said (its
alerts, by kind and first step), and which detectors could not judge it and why (a cell built so
that a detector cannot fire is silent by construction, which is not the same as healthy)."""
from __future__ import annotations

from typing import Dict, List, Optional

# why a detector cannot fire on a run, by what watched_by found missing
CANNOT_JUDGE = {
    "amplification": "no policy trained by several role instances with a one-instance reference (a paired run or "
                     "a one-instance policy in the cell)",
    "capture": "fewer than two roles",
    "capture warning": "no judging role (verdict, index, plan or search action)",
    "length_drift": "no judging role (verdict, index, plan or search action)",
    "collapse": "no validation",
    "collapse warning": "no paired single-agent run",
}


def verdict(records: List[dict], alerts: List[dict], labels: list, status: dict,
            role_contracts: Optional[Dict[str, str]] = None, paired_reference: bool = False) -> str:
    from analysis.detector_validation import watched_by

    state = status.get("state", "pending")
    health = ("failed: " + ", ".join(f"{l.kind}" + (f" ({l.role})" if l.role else "") + f" from step {l.step}"
                                     for l in sorted(labels, key=lambda l: l.step))) if labels else \
        (healthy_text(records) if records else "no steps logged")
    first: Dict[str, int] = {}
    for alert in alerts:
        first[alert["kind"]] = min(first.get(alert["kind"], alert["step"]), alert["step"])
    alert_text = ("alerts: " + ", ".join(f"{k} at step {s}" for k, s in sorted(first.items(), key=lambda kv: kv[1]))
                  if first else "no alerts")
    watched = watched_by(records, paired_reference, role_contracts) if records else set()
    blind = [f"{name} ({CANNOT_JUDGE[name]})" for name in CANNOT_JUDGE if name not in watched]
    blind_text = ("; could not judge: " + "; ".join(blind)) if blind else "; every detector could judge it"
    return f"{state} at step {status.get('step', 0)}; {health}; {alert_text} ({len(watched)} detectors watched){blind_text}"


def healthy_text(records: List[dict]) -> str:
    """"healthy", and where validation fell from its best without failing the label's rule, by how
    much and why that is not a collapse (within its noise, or above the label's fraction)."""
    from analysis.labels import LabelConfig

    validations = [(r["val/accuracy"], r.get("val/accuracy_se") or 0.0) for r in records
                   if isinstance(r.get("val/accuracy"), (int, float))]
    if len(validations) < 2:
        return "healthy"
    best, best_se = max(validations, key=lambda v: v[0])
    last, last_se = validations[-1]
    cfg = LabelConfig()
    if best <= 0 or last >= 0.9 * best:
        return "healthy"
    noise = cfg.collapse_se * (best_se ** 2 + last_se ** 2) ** 0.5
    why = (f"within {cfg.collapse_se:g} SE of it ({noise:.2f})" if best - last <= noise else
           f"above {cfg.collapse_fraction:.0%} of it" if last >= cfg.collapse_fraction * best else
           f"below the bar for fewer than {cfg.collapse_patience} validations in a row")
    return (f"healthy by the labels, though validation accuracy ended at {last:.2f} from a best of {best:.2f} "
            f"({why})")
