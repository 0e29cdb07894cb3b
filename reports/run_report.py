"""The per-run diagnostic report: what each role did, readable in two minutes.

Summary (cell, status, peak/final accuracy, gain over the paired baseline when it is in the same
sweep), the alerts timeline, per-role curves with alert markers, a per-role early-vs-late table,
and each role's outputs early vs late, so capture can be seen (the evaluator's text at step 10
and at step 400). Written to <run>/report/index.html (self-contained) and report.md (+ PNGs).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import pandas as pd

from analysis.compare import HEADLINE_COLUMNS, accuracy_summary, headline, paired_gains
from analysis.detector_validation import replay_setup
from analysis.labels import label_records
from analysis.load import load_alerts, load_cells, load_metrics, load_samples
from analysis.plots import loop_curves, names_of, policy_curves, role_curves, signal_curves
from analysis.signals import signal_trace
from analysis.workflow_metrics import WINDOW, agent_rows, window_for, workflow_rows
from harness.run_dir import read_jsonl
from reports.render import esc, image, kv_table, md_code, md_table, page, table, write
from reports.verdict import verdict

ROLE_COLUMNS = [("grad_share", "grad share"), ("token_share", "token share"), ("turn_share", "turn share"),
                ("response_length", "length"), ("format_ok", "format ok"), ("fallback", "fallback"),
                ("accuracy", "accuracy"), ("grad_norm", "grad norm"),
                ("selection_length", "selection on length")]  # cov(advantage, length): where updates push it
# what the amplification alert quotes, per policy (lr scale: mitigation coherence_reg)
POLICY_COLUMNS = [("optimizer_steps", "optimizer steps"), ("drift", "drift"), ("update_ratio", "update ratio"),
                  ("coherence", "coherence"), ("lr_scale", "lr scale")]


def _baseline_gain(run: Path) -> Optional[dict]:
    """The cell's gain over its baseline, when the baseline ran in the same sweep directory."""
    cells = load_cells(run.parent)
    if cells.empty or "single" not in set(cells["topology"]):
        return None
    gains = paired_gains(accuracy_summary(cells, load_metrics(run.parent, columns=HEADLINE_COLUMNS)))
    row = gains[gains["run_dir"] == str(run)]
    return None if row.empty else row.iloc[0].to_dict()


def paired_metrics(paired: Path) -> pd.DataFrame:
    """The paired run's metrics.jsonl as a frame (the paired run need not be a full run directory)."""
    frame = pd.DataFrame(read_jsonl(paired / "metrics.jsonl"))
    return frame.apply(pd.to_numeric, errors="coerce") if len(frame) else frame


def early_late(metrics: pd.DataFrame, kind: str = "role") -> pd.DataFrame:
    """Per role (or per policy: kind="policy"), the mean of each metric over the first and the last
    10% of steps."""
    n = max(1, len(metrics) // 10)
    early, late = metrics.head(n), metrics.tail(n)
    names = names_of(metrics, kind, "response_length" if kind == "role" else "drift")
    columns = ROLE_COLUMNS if kind == "role" else POLICY_COLUMNS
    rows = []
    for name in names:
        row = {kind: name}
        for key, label in columns:
            column = f"{kind}/{name}/{key}"
            if column in metrics:
                row[f"{label} early"] = early[column].mean()
                row[f"{label} late"] = late[column].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def sample_turns(samples: List[dict]) -> List[dict]:
    """The first episode at the earliest and at the latest sampled step, role by role."""
    if not samples:
        return []
    steps = sorted({s["step"] for s in samples})
    chosen = {steps[0]: None, steps[-1]: None}
    for s in samples:
        if s["step"] in chosen and chosen[s["step"]] is None:
            chosen[s["step"]] = s
    rows = []
    for step, episode in chosen.items():
        for turn in episode["turns"]:
            rows.append({"step": step, "role": f"{turn['role']}[{turn['instance']}]", "prompt": turn["prompt"],
                         "response": turn["response"], "tokens": turn["tokens"],
                         "format ok": not turn["malformed"], "reward": turn["reward"]})
    return rows


def validation_text(metrics: pd.DataFrame, task: str) -> str:
    """'peak P, final F' of the task's headline validation metric (QA: F1, with EM beside it)."""
    def peak_final(column: str) -> str:
        val = metrics[column].dropna() if column in metrics else pd.Series(dtype=float)
        return f"peak {val.max():.3f}, final {val.iloc[-1]:.3f}" if len(val) else "n/a"

    column, name = headline(task)
    text = peak_final(column)
    if column != "val/accuracy" and "val/accuracy" in metrics:
        text += f" (EM {peak_final('val/accuracy')})"
    return text


def diagnosis_lines(run: Path) -> List[str]:
    """The counterfactual verdict of `python -m harness.diagnose`, once its arms have run (diagnosis.json)."""
    found = Path(run) / "diagnosis.json"
    if not found.is_file():
        return []
    try:
        return [str(line) for line in json.loads(found.read_text()).get("lines", [])]
    except (json.JSONDecodeError, AttributeError):
        return [f"diagnosis.json is damaged; re-run python -m harness.diagnose {run}"]


def build_run_report(run: Path) -> Path:
    run = Path(run)
    out = run / "report"
    cells = load_cells(run)
    if cells.empty:
        raise FileNotFoundError(f"{run} is not a run directory (no cell.yaml)")
    cell = cells.iloc[0].to_dict()
    metrics = load_metrics(run)
    alerts = load_alerts(run)
    status = json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
    records = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    context = replay_setup(run)  # the paired run beside the cell, as the detectors' replay finds it
    paired = Path(context.monitors.reference_run) if context.monitors.reference_run else None
    baseline = paired_metrics(paired) if paired is not None else None
    curves = role_curves(metrics, alerts, out / "roles.png", title=cell["cell_id"], baseline=baseline) \
        if len(metrics) else None
    signal_plot = signal_curves(signal_trace(run, records, context), alerts, out / "signals.png", title=cell["cell_id"]) \
        if len(metrics) else None
    policy_plot = policy_curves(metrics, alerts, out / "policies.png", title=cell["cell_id"], baseline=baseline) \
        if len(metrics) else None
    loop_plot = loop_curves(metrics.assign(cell_id=cell["cell_id"]), out / "loops.png") if len(metrics) else None
    gain = _baseline_gain(run)
    val_text = validation_text(metrics, str(cell["task"]))
    summary = [("cell", esc(cell["cell_id"])), ("topology / sharing", esc(f"{cell['topology']} / {cell['sharing']}")),
               ("task / scale / seed", esc(f"{cell['task']} / {cell['scale']} / {cell['seed']}")),
               ("status", f'<span class="state-{esc(cell["state"])}">{esc(cell["state"])}</span> at step '
                          f'{esc(cell["step"])} of {esc(cell["steps"])}' +
                          (f" — {esc(status.get('reason'))}" if status.get("reason") else "")),
               (f"validation {headline(str(cell['task']))[1]}", esc(val_text)),
               ("policies", esc("; ".join(f"{p}: {', '.join(m)}" for p, m in (status.get("policies") or {}).items())))]
    if gain is not None and not pd.isna(gain.get("gain_final")):
        summary.append(("gain over baseline", esc(f"{gain['gain_final']:+.3f} final, {gain['gain_peak']:+.3f} peak "
                                                  f"(vs {gain['baseline_id']})")))
    late_column = ["late"] if "late" in alerts.columns else []  # judged after the run ended (harness/monitors/settle.py)
    alert_frame = alerts[["step", "kind", "role", "policy", "value", "threshold", "action", "message"] + late_column] \
        if len(alerts) else pd.DataFrame()
    if late_column:
        alert_frame = alert_frame.assign(late=alert_frame["late"].eq(True).map({True: "late", False: ""}))
    found = label_records(records)
    labels = pd.DataFrame([label.record() for label in found])
    the_verdict = verdict(records, alerts.to_dict("records"), found, status, context.role_contracts, paired is not None)
    roles = early_late(metrics) if len(metrics) else pd.DataFrame()
    policies = early_late(metrics, "policy") if len(metrics) else pd.DataFrame()
    agents = agent_rows(metrics) if len(metrics) else pd.DataFrame()
    task_metrics = workflow_rows(metrics, cells).drop(columns=["cell_id", "topology", "sharing", "task"]) \
        if len(metrics) else pd.DataFrame()
    task_window = window_for(int(metrics["accuracy"].notna().sum())) if "accuracy" in metrics else WINDOW
    turns = sample_turns(load_samples(run))

    diagnosis = diagnosis_lines(run)
    body = [f"<h1>Run report: {esc(cell['cell_id'])}</h1>", f'<p class="verdict"><b>Verdict:</b> {esc(the_verdict)}</p>',
            *[f'<p class="verdict"><b>Diagnosis:</b> {esc(line)}</p>' for line in diagnosis],
            "<h2>Summary</h2>", kv_table(summary),
            "<h2>Failure labels (what happened: analysis/labels.py)</h2>",
            table(labels) if len(labels) else '<p class="muted">no failure</p>',
            "<h2>Alerts (what the detectors predicted)</h2>", table(alert_frame) if len(alert_frame) else '<p class="muted">no alerts</p>',
            "<h2>Per-role curves</h2>", image(curves, "per-role curves") if curves else "<p>no metrics yet</p>",
            "<h2>Each detector's signal against its threshold</h2>",
            image(signal_plot, "detector signals") if signal_plot else '<p class="muted">no detector could judge this run</p>',
            "<h2>Per-policy drift and optimizer steps</h2>",
            image(policy_plot, "per-policy curves") if policy_plot else '<p class="muted">no policy metrics</p>',
            "<h2>Roles early vs late (first and last 10% of steps)</h2>", table(roles) if len(roles) else "",
            "<h2>Policies early vs late (drift ‖θ_t − θ_0‖, each step's Σ‖Δθ‖/‖θ‖)</h2>",
            table(policies) if len(policies) else "",
            f"<h2>Task metric and rounds (first vs last {task_window} steps)</h2>",
            table(task_metrics) if len(task_metrics) else "",
            *(["<h2>Loop rounds over training</h2>", image(loop_plot, "loop rounds")] if loop_plot else []),
            "<h2>Per agent (UnityMAS-O's figures, mean over training steps)</h2>",
            table(agents) if len(agents) else "",
            "<h2>Role outputs early vs late</h2>"]
    if turns:
        rows = "".join(f"<tr><td>{t['step']}</td><td>{esc(t['role'])}</td><td><pre>{esc(t['prompt'])}</pre></td>"
                       f"<td><pre>{esc(t['response'])}</pre></td><td>{t['tokens']}</td><td>{t['format ok']}</td>"
                       f"<td>{t['reward']:.2f}</td></tr>" for t in turns)
        body.append("<table><thead><tr><th>step</th><th>role</th><th>prompt</th><th>response</th><th>tokens</th>"
                    f"<th>format ok</th><th>reward</th></tr></thead><tbody>{rows}</tbody></table>")
    else:
        body.append('<p class="muted">no samples</p>')
    write(out / "index.html", page(f"run {cell['cell_id']}", body))

    md = [f"# Run report: {cell['cell_id']}", "", f"**Verdict:** {the_verdict}", "",
          *[f"**Diagnosis:** {line}\n" for line in diagnosis], "## Summary", ""]
    md += [f"- **{k}**: {v}" for k, v in [("topology / sharing", f"{cell['topology']} / {cell['sharing']}"),
                                         ("status", f"{cell['state']} at step {cell['step']} of {cell['steps']}"),
                                         (f"validation {headline(str(cell['task']))[1]}", val_text)]]
    if gain is not None and not pd.isna(gain.get("gain_final")):
        md.append(f"- **gain over baseline**: {gain['gain_final']:+.3f} final vs {gain['baseline_id']}")
    md += ["", "## Failure labels", "", md_table(labels) if len(labels) else "_no failure_", "",
           "## Alerts", "", md_table(alert_frame) if len(alert_frame) else "_no alerts_", "",
           "## Per-role curves", "", "![per-role curves](roles.png)" if curves else "", "",
           "## Each detector's signal against its threshold", "",
           "![detector signals](signals.png)" if signal_plot else "_no detector could judge this run_", "",
           "## Per-policy drift and optimizer steps", "", "![per-policy curves](policies.png)" if policy_plot else "", "",
           "## Roles early vs late", "", md_table(roles) if len(roles) else "", "",
           "## Policies early vs late", "", md_table(policies) if len(policies) else "", "",
           f"## Task metric and rounds (first vs last {task_window} steps)", "", md_table(task_metrics) if len(task_metrics) else "",
           "", *(["## Loop rounds over training", "", "![loop rounds](loops.png)", ""] if loop_plot else []),
           "## Per agent", "", md_table(agents) if len(agents) else "", "", "## Role outputs early vs late", ""]
    for t in turns:
        md += [f"**step {t['step']}, {t['role']}** ({t['tokens']} tokens, format ok: {t['format ok']})", "",
               md_code(f"{t['prompt']}\n--> {t['response']}"), ""]
    write(out / "report.md", "\n".join(md))
    return out / "index.html"
