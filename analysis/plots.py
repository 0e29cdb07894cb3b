"""Matplotlib figures (PNG, Agg): per-role curves with alert markers, SP vs IP side by side, and
a heatmap of the gain over the single-agent baseline across the grid."""
from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from harness.metric_keys import policy_key, role_key

ROLE_PANELS = [("grad_norm", "gradient norm"), ("grad_share", "gradient share (solid) vs token share (dashed)"),
               ("response_length", "response length (tokens)"), ("accuracy", "role accuracy"),
               ("format_ok", "format compliance")]
ALERT_COLORS = {"amplification": "tab:red", "capture": "tab:purple", "length_drift": "tab:orange",
                "collapse": "black", "non_finite": "tab:gray"}


def names_of(metrics: pd.DataFrame, kind: str, suffix: str) -> List[str]:
    """The names with a logged `<kind>/<name>/<suffix>` column (kind: role or policy)."""
    return sorted({c.split("/")[1] for c in metrics.columns
                   if c.startswith(kind + "/") and c.count("/") == 2 and c.endswith("/" + suffix)
                   and metrics[c].notna().any()})


def roles_of(metrics: pd.DataFrame) -> List[str]:
    return names_of(metrics, "role", "response_length")


def _smooth(series: pd.Series, window: int) -> pd.Series:
    return series.rolling(window, min_periods=1).mean()


def _mark_alerts(ax, alerts: Optional[pd.DataFrame]) -> None:
    if alerts is None or alerts.empty:
        return
    for _, alert in alerts.iterrows():
        ax.axvline(alert["step"], color=ALERT_COLORS.get(alert["kind"], "gray"), linestyle=":", linewidth=1)


def defined_share(metrics: pd.DataFrame, column: str) -> pd.Series:
    """A gradient share where something was trained: undefined (NaN), not 0, at a step whose total
    gradient was 0 (every advantage 0: nothing to share)."""
    share = metrics[column].astype(float)
    if "grad/total_norm" in metrics:
        share = share.where(metrics["grad/total_norm"].astype(float) > 0)
    return share


def role_curves(metrics: pd.DataFrame, alerts: Optional[pd.DataFrame], out: Path, title: str = "",
                smooth: int = 5, baseline: Optional[pd.DataFrame] = None) -> Path:
    """One run: each role's grad norm, grad vs token share, length, accuracy and format, with alerts;
    the paired single agent's reward and validation accuracy (grey) under the run's own."""
    metrics = metrics.sort_values("step")
    roles = roles_of(metrics)
    fig, axes = plt.subplots(len(ROLE_PANELS) + 1, 1, figsize=(9, 2.3 * (len(ROLE_PANELS) + 1)), sharex=True)
    colors = {role: f"C{i}" for i, role in enumerate(roles)}
    for ax, (key, label) in zip(axes, ROLE_PANELS):
        for role in roles:
            column = role_key(role, key)
            if column in metrics:
                values = defined_share(metrics, column) if key == "grad_share" else metrics[column]
                ax.plot(metrics["step"], _smooth(values, smooth), color=colors[role], label=role)
            if key == "grad_share" and role_key(role, "token_share") in metrics:
                ax.plot(metrics["step"], _smooth(metrics[role_key(role, "token_share")], smooth), color=colors[role],
                        linestyle="--")
        ax.set_ylabel(label, fontsize=8)
        _mark_alerts(ax, alerts)
    ax = axes[-1]
    if "reward/mean" in metrics:
        ax.plot(metrics["step"], _smooth(metrics["reward/mean"], smooth), color="C7", label="sampled reward")
    if "val/accuracy" in metrics:
        val = metrics[["step", "val/accuracy"]].dropna()
        ax.plot(val["step"], val["val/accuracy"], "o-", color="black", label="validation accuracy")
    if baseline is not None and len(baseline):
        baseline = baseline.sort_values("step")
        if "reward/mean" in baseline:
            ax.plot(baseline["step"], _smooth(baseline["reward/mean"], smooth), color="0.6", linestyle="--",
                    label="paired single agent: reward")
        if "val/accuracy" in baseline:
            val = baseline[["step", "val/accuracy"]].dropna()
            ax.plot(val["step"], val["val/accuracy"], "s--", color="0.5", label="paired single agent: validation")
    ax.set_ylabel("reward / accuracy", fontsize=8)
    ax.set_xlabel("step")
    ax.legend(fontsize=7, loc="best")
    _mark_alerts(ax, alerts)
    axes[0].legend(fontsize=7, loc="best", ncol=max(1, len(roles)))
    if alerts is not None and not alerts.empty:
        kinds = sorted(set(alerts["kind"]))
        axes[0].set_title((title + "  |  " if title else "") + "alerts: " +
                          ", ".join(f"{k} ({ALERT_COLORS.get(k, 'gray').replace('tab:', '')})" for k in kinds),
                          fontsize=9)
    elif title:
        axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def sp_vs_ip(metrics: pd.DataFrame, cells: pd.DataFrame, topology: str, out: Path, smooth: int = 5) -> Optional[Path]:
    """The same topology under SP and IP, side by side (first scale/task/seed that has both)."""
    part = cells[(cells["topology"] == topology) & cells["sharing"].isin(["sp", "ip"])]
    for _, group in part.groupby(["scale", "task_axis", "seed"]):
        if set(group["sharing"]) >= {"sp", "ip"}:
            break
    else:
        return None
    fig, axes = plt.subplots(3, 2, figsize=(11, 7), sharex=True, sharey="row")
    for col, sharing in enumerate(["sp", "ip"]):
        run = group[group["sharing"] == sharing].iloc[0]
        m = metrics[metrics["run_dir"] == run["run_dir"]].sort_values("step")
        axes[0, col].set_title(f"{run['cell_id']}", fontsize=9)
        if "val/accuracy" in m:
            val = m[["step", "val/accuracy"]].dropna()
            axes[0, col].plot(val["step"], val["val/accuracy"], "o-", color="black")
        for i, role in enumerate(roles_of(m)):
            axes[1, col].plot(m["step"], _smooth(defined_share(m, role_key(role, "grad_share")), smooth), color=f"C{i}",
                              label=role)
            axes[2, col].plot(m["step"], _smooth(m[role_key(role, "response_length")], smooth), color=f"C{i}", label=role)
        axes[1, col].legend(fontsize=7)
    axes[0, 0].set_ylabel("validation accuracy", fontsize=8)
    axes[1, 0].set_ylabel("gradient share", fontsize=8)
    axes[2, 0].set_ylabel("response length", fontsize=8)
    for ax in axes[2]:
        ax.set_xlabel("step")
    fig.tight_layout()
    return _save(fig, out)


def gain_heatmap(ci: pd.DataFrame, task: str, out: Path) -> Optional[Path]:
    """Mean gain over the baseline: rows topology x sharing, columns scale (n and CI in the cell)."""
    part = ci[ci["task_axis"] == task]
    if part.empty:
        return None
    table = part.pivot_table(index=["topology", "sharing"], columns="scale", values="mean")
    fig, ax = plt.subplots(figsize=(3.2 + 1.6 * table.shape[1], 1.2 + 0.5 * table.shape[0]))
    limit = max(0.05, float(table.abs().max().max()) if table.size else 0.05)
    image = ax.imshow(table.values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(table.shape[1]), table.columns)
    ax.set_yticks(range(table.shape[0]), [f"{t} / {s}" for t, s in table.index], fontsize=8)
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            value = table.values[i, j]
            if not math.isnan(value):
                ax.text(j, i, f"{value:+.3f}", ha="center", va="center", fontsize=8,
                        color="white" if abs(value) > 0.6 * limit else "black")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("final acc. − baseline", fontsize=8)
    ax.set_title(f"gain over the single-agent baseline, task {task}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def policy_curves(metrics: pd.DataFrame, alerts: Optional[pd.DataFrame], out: Path, title: str = "",
                  baseline: Optional[pd.DataFrame] = None) -> Optional[Path]:
    """One run's policies: drift ‖θ_t − θ_0‖ (the paired single agent's dashed) and optimizer steps
    per training step, what the amplification detector compares."""
    metrics = metrics.sort_values("step")
    policies = names_of(metrics, "policy", "drift")
    if not policies:
        return None
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    for i, policy in enumerate(policies):
        axes[0].plot(metrics["step"], metrics[policy_key(policy, "drift")], color=f"C{i}", label=policy)
        if policy_key(policy, "optimizer_steps") in metrics:
            axes[1].plot(metrics["step"], metrics[policy_key(policy, "optimizer_steps")], color=f"C{i}", label=policy)
    if baseline is not None and len(baseline):
        baseline = baseline.sort_values("step")
        for policy in names_of(baseline, "policy", "drift"):
            axes[0].plot(baseline["step"], baseline[policy_key(policy, "drift")], color="0.5", linestyle="--",
                         label=f"paired single agent ({policy})")
    axes[0].set_ylabel("drift ‖θ_t − θ_0‖", fontsize=8)
    axes[1].set_ylabel("optimizer steps per step", fontsize=8)
    axes[1].set_xlabel("step")
    axes[0].legend(fontsize=7, loc="best")
    for ax in axes:
        _mark_alerts(ax, alerts)
    if title:
        axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def signal_curves(trace: pd.DataFrame, alerts: Optional[pd.DataFrame], out: Path, title: str = "",
                  most: int = 8) -> Optional[Path]:
    """Each detector's signal (solid) against its threshold (dashed) over steps, one panel per
    signal (the `most` with the closest approach to their threshold), alerts dotted."""
    if trace is None or trace.empty:
        return None
    margin = trace.assign(margin=(trace["value"] - trace["threshold"]).where(trace["fires"] == "above",
                                                                            trace["threshold"] - trace["value"]))
    order = margin.groupby(["detector", "signal"])["margin"].max().sort_values(ascending=False).index[:most]
    fig, axes = plt.subplots(len(order), 1, figsize=(9, 1.9 * len(order) + 0.4), sharex=True, squeeze=False)
    for ax, (detector, signal) in zip(axes[:, 0], order):
        part = trace[(trace["detector"] == detector) & (trace["signal"] == signal)].sort_values("step")
        color = ALERT_COLORS.get(detector, "tab:gray")
        ax.plot(part["step"], part["value"], color=color, label="signal")
        ax.plot(part["step"], part["threshold"], color=color, linestyle="--", linewidth=1,
                label=f"threshold (fires {part['fires'].iloc[0]})")
        ax.set_title(f"{detector}: {signal}", fontsize=8)
        ax.legend(fontsize=6, loc="best")
        _mark_alerts(ax, None if alerts is None or alerts.empty else alerts[alerts["kind"] == detector])
    axes[-1, 0].set_xlabel("step")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


LOOP_KEYS = (("episode/rounds", "loop rounds per episode"), ("episode/searches", "searches per episode"))


def loop_curves(metrics: pd.DataFrame, out: Path, label: str = "cell_id", smooth: int = 5) -> Optional[Path]:
    """How long the workflows' loops run over training (a verify loop's rounds, a search loop's
    searches), one line per run: whether training rewards longer loops shows here. None when no
    run has a loop."""
    panels = [(key, name) for key, name in LOOP_KEYS if key in metrics and metrics[key].notna().any()]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, (key, name) in zip(axes[:, 0], panels):
        for i, (run, part) in enumerate(metrics[metrics[key].notna()].groupby(label, sort=True)):
            part = part.sort_values("step")
            ax.plot(part["step"], _smooth(part[key], smooth), color=f"C{i % 10}", label=str(run))
        ax.set_ylabel(name, fontsize=8)
        ax.legend(fontsize=6, loc="best")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def failure_curve(metrics: pd.DataFrame, alerts: Optional[pd.DataFrame], failure_step: Optional[int], out: Path,
                  title: str = "", smooth: int = 5) -> Path:
    """A failing cell: validation accuracy and each role's length, the detectors' alerts (dotted, by
    kind) and the labelled failure step (solid red), so the lead time can be seen."""
    metrics = metrics.sort_values("step")
    fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    if "val/accuracy" in metrics:
        val = metrics[["step", "val/accuracy"]].dropna()
        axes[0].plot(val["step"], val["val/accuracy"], "o-", color="black", label="validation accuracy")
    if "reward/mean" in metrics:
        axes[0].plot(metrics["step"], _smooth(metrics["reward/mean"], smooth), color="C7", label="sampled reward")
    for i, role in enumerate(roles_of(metrics)):
        axes[1].plot(metrics["step"], _smooth(metrics[role_key(role, "response_length")], smooth), color=f"C{i}",
                     label=role)
    axes[0].set_ylabel("accuracy / reward", fontsize=8)
    axes[1].set_ylabel("response length (tokens)", fontsize=8)
    axes[1].set_xlabel("step")
    for ax in axes:
        _mark_alerts(ax, alerts)
        if failure_step is not None:
            ax.axvline(failure_step, color="tab:red", linewidth=1.5)
        ax.legend(fontsize=7, loc="best")
    kinds = sorted(set(alerts["kind"])) if alerts is not None and not alerts.empty else []
    axes[0].set_title((title + "  |  " if title else "") + "failure (red)" +
                      ("; alerts: " + ", ".join(f"{k} ({ALERT_COLORS.get(k, 'gray').replace('tab:', '')})"
                                                for k in kinds) if kinds else "; no alert"), fontsize=9)
    fig.tight_layout()
    return _save(fig, out)
