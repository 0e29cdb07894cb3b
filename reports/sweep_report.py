"""The per-sweep report: comparison tables against the single-agent baselines, the gain heatmap,
the failure-mode table, best and worst cells, and links to every run's report.
Written to <sweep>/report/index.html (self-contained) and report.md (+ PNGs)."""
from __future__ import annotations

from pathlib import Path

from analysis.compare import CELL_TABLE, FAILURE_MODES, compare, headline_name, seeds_sentence, write_outputs
from analysis.load import find_runs, load_metrics
from analysis.workflow_metrics import columns_needed, paper_table, workflow_rows
from analysis.plots import gain_heatmap, loop_curves, sp_vs_ip
from reports.render import esc, image, md_table, page, table, write
from reports.run_report import build_run_report
from harness.metric_keys import role_key


def build_sweep_report(sweep: Path, run_reports: bool = True) -> Path:
    sweep = Path(sweep)
    out = sweep / "report"
    runs = find_runs(sweep)
    if not runs:
        raise FileNotFoundError(f"{sweep} holds no run directories (with cell.yaml)")
    if run_reports:
        for run in runs:
            if not (run / "report" / "index.html").is_file():
                build_run_report(run)
    result = compare(sweep)
    write_outputs(result, out / "tables")
    cells, gains = result["cells"], result["gains"]
    links = {row["cell_id"]: f"../{Path(row['run_dir']).name}/report/index.html" for _, row in cells.iterrows()
             if (Path(row["run_dir"]) / "report" / "index.html").is_file()}

    heatmaps = [p for task in result["tables"] if (p := gain_heatmap(result["ci"], task, out / f"heatmap_{task}.png"))]
    metrics = load_metrics(sweep, columns=["val/accuracy"] + [role_key(r, k) for r in
                                                              ("voter", "aggregator", "generator", "evaluator",
                                                               "orchestrator", "worker", "synthesizer")
                                                              for k in ("grad_share", "response_length")])
    side_by_side = [p for topology in sorted(set(cells["topology"]) - {"single"})
                    if (p := sp_vs_ip(metrics, cells, topology, out / f"sp_vs_ip_{topology}.png"))]
    episode_metrics = load_metrics(sweep, columns=columns_needed())
    workflows = workflow_rows(episode_metrics, cells)
    loops = loop_curves(episode_metrics, out / "loops.png")
    paper = paper_table(episode_metrics, cells)
    modes = cells[["cell_id", "state"] + [f"first_{m}" for m in FAILURE_MODES] + ["failure_modes", "alerts"]]
    counts = {state: int((cells["state"] == state).sum()) for state in sorted(set(cells["state"]))}

    finding = sweep_finding(gains, cells)
    body = [f"<h1>Sweep report: {esc(sweep.name)}</h1>", f"<p><strong>Finding:</strong> {esc(finding)}</p>",
            f"<p>{len(cells)} cells ({esc(', '.join(f'{n} {s}' for s, n in counts.items()))}); "
            f"tables as CSV, Markdown and LaTeX in <code>tables/</code>.</p>"]
    for task, grid in result["tables"].items():
        body += [f"<h2>Task {esc(task)}: final {esc(metric_of(cells, task))} − paired baseline (mean [95% CI] over seeds)</h2>",
                 f"<p>{esc(seeds_sentence(result['ci']))}</p>", table(grid.reset_index())]
    body += ["<h2>Gain heatmap</h2>"] + [image(p, p.stem) for p in heatmaps]
    body += ["<h2>SP vs IP</h2>"] + [image(p, p.stem) for p in side_by_side]
    if len(gains):
        body += ["<h2>Cells against their baselines</h2>", table(gains[CELL_TABLE], links=links),
                 "<h2>Best cells</h2>", table(result["best"], links=links)]
        if len(result["worst"]):  # never the best cells again: with few cells there are no "worst" apart
            body += ["<h2>Worst cells</h2>", table(result["worst"], links=links)]
    body += [f"<h2>Workflows: task metric and rounds (first vs last {workflows.attrs.get('window', 20)} steps, "
             "final validation)</h2>",
             table(workflows, links=links)]
    if len(paper):
        body += ["<h2>Workflows as UnityMAS-O reports them: validation F1 (QA) or all-passed rate (code), before "
                 "training and its peak, per scale (mean over seeds)</h2>", table(paper)]
    if loops:
        body += ["<h2>Loop rounds over training (one line per cell)</h2>", image(loops, "loop rounds")]
    indicators = leading_indicators(sweep)
    if indicators is not None:
        body += ["<h2>What led the failures: signals of failing vs surviving cells of a setting, 10-30 steps "
                 "before (<code>python -m reports.indicators</code>)</h2>",
                 f'<p><a href="{esc(indicators.name)}">the ranked table</a></p>', image(indicators.with_suffix(".png"),
                                                                                      "top signals aligned at the failure")]
    diagnoses = diagnosis_tables(sweep)
    if diagnoses:
        for title, frame in diagnoses:
            body += [f"<h2>{esc(title)}</h2>", table(frame)]
    evaluation = evaluation_table(sweep)
    if evaluation is not None:
        body += ["<h2>Checkpoint evaluation (pass@k, <code>python -m analysis.evaluate</code>)</h2>",
                 table(evaluation, links=links)]
    body += ["<h2>Failure modes (from the failure labels: the step each began) and alerts (step each first fired)</h2>", table(modes, links=links),
             "<h2>Run reports</h2>",
             "<ul>" + "".join(f'<li><a href="{esc(href)}">{esc(cid)}</a></li>' for cid, href in sorted(links.items()))
             + "</ul>"]
    write(out / "index.html", page(f"sweep {sweep.name}", body))

    md = [f"# Sweep report: {sweep.name}", "", f"**Finding:** {finding}", "", f"{len(cells)} cells.", ""]
    for task, grid in result["tables"].items():
        md += [f"## Task {task}: final {metric_of(cells, task)} − paired baseline (mean [95% CI] over seeds)", "",
               seeds_sentence(result["ci"]), "", md_table(grid.reset_index()), ""]
    md += [f"![{p.stem}]({p.name})" for p in heatmaps + side_by_side] + [""]
    if len(gains):
        md += ["## Cells against their baselines", "", md_table(gains[CELL_TABLE]), ""]
    md += ["## Workflows: task metric and rounds", "", md_table(workflows), ""]
    if len(paper):
        md += ["## Workflows as UnityMAS-O reports them (before training, peak)", "", md_table(paper), ""]
    if loops:
        md += ["## Loop rounds over training", "", "![loop rounds](loops.png)", ""]
    if indicators is not None:
        md += ["## What led the failures", "", f"[The ranked leading-indicator table]({indicators.name})", ""]
    for title, frame in diagnoses:
        md += [f"## {title}", "", md_table(frame), ""]
    if evaluation is not None:
        md += ["## Checkpoint evaluation (pass@k)", "", md_table(evaluation), ""]
    md += ["## Failure modes", "", md_table(modes), "", "## Run reports", ""]
    md += [f"- [{cid}]({href.replace('index.html', 'report.md')})" for cid, href in sorted(links.items())]
    write(out / "report.md", "\n".join(md))
    return out / "index.html"


def sweep_finding(gains, cells) -> str:
    """The sweep's answer first: how many multi-agent cells end above or below their paired single
    agent (final validation), and how many failed, by the labels."""
    multi = cells[cells["topology"] != "single"]
    failed = multi[multi["failure_modes"].fillna("").astype(str).str.strip().ne("")]
    kinds = sorted({k.split("@")[0].strip() for modes in failed["failure_modes"] for k in str(modes).split(",") if k.strip()})
    failures = (f"{len(failed)} of {len(multi)} multi-agent cells failed ({', '.join(kinds)})" if len(failed)
                else f"none of the {len(multi)} multi-agent cells failed by the labels")
    scored = gains.dropna(subset=["gain_final"]) if len(gains) else gains
    if not len(scored):
        return f"no multi-agent cell has a finished paired single agent to compare with yet; {failures}."
    above, below = int((scored["gain_final"] > 0).sum()), int((scored["gain_final"] < 0).sum())
    where = ("every one below its paired single agent" if below == len(scored) else
             "every one above its paired single agent" if above == len(scored) else
             f"{above} above their paired single agent, {below} below")
    return (f"of {len(scored)} multi-agent cells with a paired single agent, {where} at the final validation "
            f"(mean gain {scored['gain_final'].mean():+.3f}); {failures}.")


def metric_of(cells, task_axis: str) -> str:
    """The headline metric's name for a task axis value (F1 for QA, accuracy otherwise)."""
    return headline_name(cells.loc[cells["task_axis"].astype(str) == str(task_axis), "task"])


def diagnosis_tables(sweep: Path) -> list:
    """(title, table) of the sweep's diagnoses (action=diagnose): each diagnosed run's verdict, the
    verdicts by topology x sharing, and planted x diagnosed where the sweep plants its causes."""
    import pandas as pd

    from analysis.diagnosis import confusion, confusion_summary, mechanism_table, sweep_diagnoses

    rows = sweep_diagnoses(sweep)
    diagnosed = [r for r in rows if r["verdict"]]
    if not diagnosed:
        return []
    out = [("Why the failed runs failed: diagnoses by counterfactual (python -m harness.diagnose)",
            pd.DataFrame(diagnosed)[["cell", "sharing", "verdict", "line"]]),
           ("Diagnoses by topology x sharing", mechanism_table(rows))]
    matrix = confusion(rows)
    if len(matrix):
        out.append((f"Planted cause x diagnosis: {confusion_summary(rows)}", matrix))
    return out


def leading_indicators(sweep: Path):
    """report/indicators.md where some setting has two or more failing and surviving cells (else None)."""
    from analysis.indicators import aligned_table, contrasting_arms, load_cells
    from reports.indicators import build

    table = aligned_table(load_cells(sweep))
    if table.empty or not contrasting_arms(table):
        return None
    return build(sweep, permutations=2000, table=table)


def evaluation_table(sweep: Path):
    """The runs' eval_results.jsonl rows (analysis/evaluate.py), one per cell, mode, checkpoint, task and
    split; None when no run was evaluated."""
    from analysis.evaluate import load_results

    rows = load_results(sweep)
    if rows.empty:
        return None
    scores = sorted((c for c in rows.columns if c.startswith("pass@")), key=lambda c: int(c.split("@")[1]))
    if "split" in rows.columns:  # rows written before splits were named scored the validation problems
        rows["split"] = rows["split"].fillna("validation")
    columns = [c for c in ["cell_id", "mode", "checkpoint", "step", "task", "split", "problems", "samples", *scores,
                           "status"] if c in rows.columns]
    return rows[columns].sort_values([c for c in ("cell_id", "mode", "task", "split") if c in rows.columns],
                                     kind="stable").reset_index(drop=True)


def is_sweep(path: Path) -> bool:
    return not (Path(path) / "cell.yaml").is_file() and bool(find_runs(path))

