"""Analysis and reports on a real (reduced) sweep: comparison vs baselines, CIs, failure-mode
flags, the notebook, and HTML reports checked in headless Chromium."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from analysis.compare import compare, grid_tables, mean_ci
from analysis.labels import label_run
from analysis.load import load_metrics
from reports.screenshots import open_in_chromium
from reports.sweep_report import build_sweep_report
from tests.conftest import REPO

@pytest.fixture(scope="module")
def sweep(small_sweep):
    """The suite's small real sweep (tests/conftest.py): voting x {sp, ip} x seeds {0, 1} + baselines."""
    return small_sweep


def test_mean_ci_matches_a_hand_computed_t_interval():
    mean, low, high, n = mean_ci([0.1, 0.2, 0.3])
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, df=2) * sd / sqrt(n)
    assert n == 3 and math.isclose(mean, 0.2) and math.isclose(low, 0.2 - half) and math.isclose(high, 0.2 + half)
    assert math.isnan(mean_ci([0.4])[1]) and mean_ci([])[3] == 0
    gains = pd.DataFrame({"topology": ["voting"] * 3, "sharing": ["ip"] * 3, "scale": ["tiny-m"] * 3,
                          "task_axis": ["math"] * 3, "gain_final": [0.1, 0.2, 0.3]})
    assert grid_tables(gains)["math"].loc[("voting", "ip"), "tiny-m"] == "+0.200 [-0.048, +0.448] (n=3)"


def test_comparison_pairs_every_cell_with_its_baseline(sweep):
    result = compare(sweep)
    gains = result["gains"]
    assert sorted(gains["cell_id"]) == sorted(f"voting-{s}-arith-tiny-m-s{seed}" for s in ("sp", "ip") for seed in (0, 1))
    metrics = load_metrics(sweep, columns=["val/accuracy"])
    final = {Path(r).name: g.dropna().sort_values("step")["val/accuracy"].iloc[-1]
             for r, g in metrics.groupby("run_dir")}
    for _, row in gains.iterrows():
        assert row["baseline_id"] == f"single-arith-tiny-m-s{row['seed']}"
        assert math.isclose(row["gain_final"], final[row["cell_id"]] - final[row["baseline_id"]])
    for _, row in gains.iterrows():  # failure modes from the labels; each alert kind beside them, first step
        labels = sorted(label_run(Path(row["run_dir"])), key=lambda l: (l.step, l.kind))
        assert row["failure_modes"] == ", ".join(l.kind + (f"({l.role})" if l.role else "") + f"@{l.step}"
                                                 for l in labels)
        logged = [json.loads(l) for l in (Path(row["run_dir"]) / "alerts.jsonl").read_text().splitlines()]
        first = {}
        for alert in logged:
            first[alert["kind"]] = min(first.get(alert["kind"], alert["step"]), alert["step"])
        assert row["alerts"] == ", ".join(f"{k}@{v}" for k, v in sorted(first.items(), key=lambda kv:
                                          ["amplification", "capture", "length_drift", "collapse",
                                           "non_finite"].index(kv[0])))
    ip = gains[gains["sharing"] == "ip"]
    ci = result["ci"].set_index(["topology", "sharing"])
    assert ci.loc[("voting", "ip"), "n"] == 2
    expected = mean_ci(list(ip["gain_final"]))
    assert math.isclose(ci.loc[("voting", "ip"), "mean"], expected[0])
    assert math.isclose(ci.loc[("voting", "ip"), "ci_high"], expected[2])


def test_compare_command_line(sweep, tmp_path):
    out = tmp_path / "tables"
    proc = subprocess.run([sys.executable, "-m", "analysis.compare", str(sweep), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("cells.csv", "gains.csv", "ci.csv", "comparison.md", "grid_math.csv", "grid_math.tex"):
        assert (out / name).stat().st_size > 0, name
    assert "| voting     | ip        |" in (out / "comparison.md").read_text()
    assert "\\begin{table}" in (out / "grid_math.tex").read_text()
    bad = subprocess.run([sys.executable, "-m", "analysis.compare", str(tmp_path / "nope"), "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no such directory")


def test_notebook_runs_as_jupyter_runs_it(sweep, tmp_path, monkeypatch):
    """The kernel starts in the notebook's folder (as `jupyter lab` starts it) and $SWEEP_DIR names the
    sweep relative to the repository root, as the README's `SWEEP_DIR=runs/smoke jupyter lab` does."""
    from nbclient import NotebookClient

    notebook = REPO / "analysis" / "notebooks" / "sweep.ipynb"
    link = REPO / "runs" / f".notebook-test-{os.getpid()}"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(sweep)
    try:
        monkeypatch.setenv("SWEEP_DIR", str(link.relative_to(REPO)))
        monkeypatch.setenv("FIGURES_DIR", str(tmp_path))
        nb = nbformat.read(notebook, as_version=4)
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(notebook.parent)}}).execute()
    finally:
        link.unlink()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"6 cells in {REPO / link.relative_to(REPO)}" in printed
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    grid = next(t for t in tables if "tiny-m" in t and "(n=2)" in t)  # topology x sharing by scale, over 2 seeds
    assert "voting" in grid and ">ip<" in grid and ">sp<" in grid
    assert any("voting-ip-arith-tiny-m-s1" in t and "gain_final" in t for t in tables)  # the per-cell gains
    assert sum(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs) >= 3
    assert (tmp_path / "heatmap_math.png").is_file() and (tmp_path / "roles.png").is_file()


def test_run_and_sweep_reports_render_in_chromium(sweep, tmp_path):
    run = sweep / "voting-ip-arith-tiny-m-s0"
    assert (run / "report" / "index.html").is_file()  # written automatically when the cell ended
    assert (run / "report" / "report.md").is_file() and (run / "report" / "roles.png").is_file()
    index = build_sweep_report(sweep)
    for page, minimum in ((run / "report" / "index.html", 1), (index, 2)):  # heatmap + SP vs IP
        seen = open_in_chromium(page.as_uri(), tmp_path / f"{page.parent.parent.name}.png")
        assert seen["errors"] == [] and seen["dialogs"] == []
        assert len(seen["images"]) >= minimum and all(seen["images"])
        assert (tmp_path / f"{page.parent.parent.name}.png").stat().st_size > 10_000
    linked = [Path(href.removeprefix("file://")) for href in seen["links"] if href.startswith("file://")]
    assert len({p for p in linked if p.name == "index.html"}) == 6 and all(p.is_file() for p in linked)
    text = index.read_text()
    assert "voting-ip-arith-tiny-m-s0" in text and "amplification" in text and "[95% CI]" in text
    md = (sweep / "report" / "report.md").read_text()
    assert "![heatmap_math](heatmap_math.png)" in md and (sweep / "report" / "heatmap_math.png").is_file()


def _md_section_table(md: str, heading: str) -> list:
    """The rows of the first Markdown table under `heading`, as dicts of cell texts."""
    lines = md.split(heading, 1)[1].lstrip("\n").splitlines()
    table = []
    for line in lines:
        if not line.startswith("|"):
            break
        table.append(line)
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[2:]]


def test_sweep_report_tables_read_like_a_person_wrote_them(sweep):
    build_sweep_report(sweep, run_reports=False)
    md = (sweep / "report" / "report.md").read_text()
    assert "nan" not in md.lower()
    assert "Each entry is the mean over 2 seeds (n per entry) with a 95% paired t confidence interval." in md
    cells = _md_section_table(md, "## Cells against their baselines")
    assert len(cells) == 4
    for row in cells:
        for level in ("peak_val", "final_val", "baseline_final"):  # accuracies: no sign, three decimals
            assert re.fullmatch(r"\d\.\d{3}", row[level]), row
        for gain in ("gain_peak", "gain_final"):  # differences: signed
            assert re.fullmatch(r"[+-]\d\.\d{3}", row[gain]), row
    finding = md.split("**Finding:** ", 1)[1].splitlines()[0]  # the answer before the tables
    gains = [float(row["gain_final"]) for row in cells]
    above, below = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
    expected = ("every one below" if below == 4 else "every one above" if above == 4 else f"{above} above their paired single agent, {below} below")
    assert finding.startswith("of 4 multi-agent cells with a paired single agent, " + expected), finding
    assert md.index("**Finding:**") < md.index("## Task")
    modes = _md_section_table(md, "## Failure modes")
    assert modes and all(re.fullmatch(r"–|\d+", row[f"first_{m}"]) for row in modes
                         for m in ("collapse", "capture", "contract"))
    assert any(row["first_collapse"] == "–" for row in modes)  # a failure that never happened reads "–"


def test_run_report_shows_each_policys_steps_and_drift(sweep):
    """What the amplification alert quotes is in the run report: the IP voter adapter takes its three
    voters' optimizer steps to the aggregator's one, and every adapter has moved by the end."""
    md = (sweep / "voting-ip-arith-tiny-m-s0" / "report" / "report.md").read_text()
    rows = {r["policy"]: r for r in _md_section_table(md, "## Policies early vs late")}
    assert set(rows) == {"aggregator", "voter"}
    assert float(rows["voter"]["optimizer steps early"]) == 3 * float(rows["aggregator"]["optimizer steps early"])
    for row in rows.values():
        assert float(row["drift late"]) > float(row["drift early"]) > 0 and float(row["update ratio early"]) > 0
    assert re.fullmatch(r"\d+", rows["voter"]["optimizer steps early"])  # a count reads as one
    # the verdict first: state, what happened, what was said, what could not be judged; the policies' curves
    verdict = md.split("**Verdict:** ", 1)[1].splitlines()[0]
    assert verdict.startswith("finished at step ") and ("healthy" in verdict or "failed: " in verdict)
    assert "detectors watched" in verdict
    assert (sweep / "voting-ip-arith-tiny-m-s0" / "report" / "policies.png").is_file()
    assert "## Per-policy drift and optimizer steps" in md


def test_a_single_seed_says_it_has_no_confidence_interval():
    from analysis.compare import seeds_sentence

    one = seeds_sentence(pd.DataFrame({"n": [1, 1]}))
    assert "a single seed (n=1)" in one and "n=1 carry no confidence interval" in one
    mixed = seeds_sentence(pd.DataFrame({"n": [1, 3]}))
    assert "1 to 3 seeds" in mixed and "n=1 carry no confidence interval" in mixed
    assert "n=1" not in seeds_sentence(pd.DataFrame({"n": [3, 5]}))


def test_a_setting_the_baselines_share_is_part_of_the_pairing():
    """With `paired_axes: [setting]` each setting has its own baseline: a cell's gain is taken against
    the single agent trained the same way, never against both (nor the wrong one)."""
    from analysis.compare import paired_gains

    rows = []
    for setting, base_acc, cell_acc in (("fast", 0.2, 0.1), ("default", 0.5, 0.6)):
        common = {"sweep_dir": "/s", "scale": "tiny-m", "task_axis": "math", "seed": 0, "setting": setting}
        rows.append({**common, "cell_id": f"single-s0-setting={setting}", "topology": "single", "sharing": "sp",
                     "mitigation": None, "peak_val": base_acc, "final_val": base_acc})
        rows.append({**common, "cell_id": f"voting-ip-s0-mitigation=none-setting={setting}", "topology": "voting",
                     "sharing": "ip", "mitigation": "none", "peak_val": cell_acc, "final_val": cell_acc})
    gains = paired_gains(pd.DataFrame(rows))
    assert len(gains) == 2  # one row per cell: the pairing does not fan out over both baselines
    by_setting = gains.set_index("setting")
    assert by_setting.loc["fast", "baseline_id"] == "single-s0-setting=fast"
    assert by_setting.loc["fast", "gain_final"] == pytest.approx(-0.1)
    assert by_setting.loc["default", "gain_final"] == pytest.approx(0.1)


def test_model_text_is_escaped_in_reports(sweep, tmp_path):
    run = tmp_path / "hostile"
    shutil.copytree(sweep / "voting-sp-arith-tiny-m-s1", run)
    samples = [json.loads(l) for l in (run / "samples.jsonl").read_text().splitlines()]
    samples[0]["turns"][0]["response"] = "<script>alert('pwned')</script><img src=x onerror=alert(2)>"
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    from reports.run_report import build_run_report

    page = build_run_report(run)
    html = page.read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    seen = open_in_chromium(page.as_uri(), tmp_path / "hostile.png")
    assert seen["dialogs"] == [] and seen["errors"] == []


def _synthetic_cell(sweep: Path, cell_id: str, seed: int, accuracy, alerts=()):
    """A voting/IP cell's record: validation accuracy every 5 of 40 steps (se 0.02), and its alerts."""
    run = sweep / cell_id
    run.mkdir(parents=True)
    (run / "cell.yaml").write_text(json.dumps({"cell_id": cell_id, "topology": "voting", "sharing": "ip",
                                               "task": "math", "scale": "tiny-m", "seed": seed, "steps": 40}))
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": 40}))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, **({"val/accuracy": accuracy(s), "val/accuracy_se": 0.02} if s % 5 == 0 else {})})
        + "\n" for s in range(40)))
    (run / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))


def test_a_healthy_cell_whose_detector_fired_has_an_alert_and_no_failure_mode(tmp_path):
    sweep = tmp_path / "sweep"
    amplification = {"step": 10, "kind": "amplification", "role": None, "policy": "voter", "value": 1.6,
                     "threshold": 1.3, "action": "alert", "message": "gradient amplification"}
    _synthetic_cell(sweep, "healthy", 0, lambda s: 0.5, [amplification])
    _synthetic_cell(sweep, "collapsed", 1, lambda s: 0.5 if s < 20 else 0.05)
    cells = compare(sweep)["cells"].set_index("cell_id")
    assert cells.loc["healthy", "failure_modes"] == "" and cells.loc["healthy", "alerts"] == "amplification@10"
    assert math.isnan(cells.loc["healthy", "first_collapse"])
    assert cells.loc["collapsed", "failure_modes"] == "collapse@20" and cells.loc["collapsed", "alerts"] == ""
    assert cells.loc["collapsed", "first_collapse"] == 20
    from reports.run_report import build_run_report

    build_run_report(sweep / "healthy")
    md = (sweep / "healthy" / "report" / "report.md").read_text()
    assert "## Failure labels\n\n_no failure_" in md and "amplification" in md.split("## Alerts")[1]
    build_run_report(sweep / "collapsed")
    labels = _md_section_table((sweep / "collapsed" / "report" / "report.md").read_text(), "## Failure labels")
    assert [(row["kind"], row["step"]) for row in labels] == [("collapse", "20")]
    healthy = (sweep / "healthy" / "report" / "report.md").read_text().split("**Verdict:** ", 1)[1].splitlines()[0]
    assert healthy.startswith("finished at step 40; healthy; alerts: amplification at step 10")
    assert "could not judge: amplification (no policy trained by several role instances" in healthy
    collapsed = (sweep / "collapsed" / "report" / "report.md").read_text().split("**Verdict:** ", 1)[1]
    assert collapsed.startswith("finished at step 40; failed: collapse from step 20; no alerts")


def test_reports_read_like_a_person_wrote_them_at_any_length():
    from analysis.compare import best_and_worst
    from analysis.plots import defined_share
    from analysis.tables import format_value
    from analysis.workflow_metrics import window_for

    assert [window_for(n) for n in (1, 10, 39, 40, 500)] == [1, 5, 19, 20, 20]  # never the same steps twice
    gains = pd.DataFrame({"cell_id": list("abcd"), "baseline_id": "s", "gain_final": [0.3, 0.1, -0.2, 0.0],
                          "final_val": 0.5, "baseline_final": 0.4, "failure_modes": "", "alerts": ""})
    best, worst = best_and_worst(gains.head(2))
    assert list(best["cell_id"]) == ["a", "b"] and worst.empty  # two cells: no "worst" repeating the best
    best, worst = best_and_worst(gains)
    assert list(best["cell_id"]) == ["a", "b", "d"] and list(worst["cell_id"]) == ["c"]
    assert [format_value("calls", 1.0), format_value("calls", 1.5), format_value("accuracy", 1.0)] == \
        ["1", "1.50", "1.000"]
    step0 = pd.DataFrame({"role/voter/grad_share": [0.0, 0.7], "grad/total_norm": [0.0, 2.0]})
    share = defined_share(step0, "role/voter/grad_share")
    assert math.isnan(share[0]) and share[1] == 0.7  # nothing trained: undefined, not 0



def test_each_detectors_signal_is_drawn_against_its_threshold_as_it_judged(sweep, tmp_path):
    """The trace is the detectors' own comparison, replayed: every amplification alert of a real run
    sits on a step where its drift ratio was at or above the threshold the trace shows."""
    from analysis.signals import signal_trace
    from harness.run_dir import read_jsonl

    run = sweep / "voting-ip-arith-tiny-m-s0"
    trace = signal_trace(run)
    amplification = trace[trace["detector"] == "amplification"]
    assert len(amplification) and set(amplification["fires"]) == {"above"}
    assert amplification["signal"].str.startswith("voter: drift ratio to the paired single-agent run").all()
    for alert in read_jsonl(run / "alerts.jsonl"):
        if alert["kind"] == "amplification":
            row = amplification[amplification["step"] == alert["step"]].iloc[0]
            assert row["value"] >= row["threshold"]
    assert (trace[trace["detector"] == "collapse"]["fires"] == "below").all()
    assert (run / "report" / "signals.png").is_file()
    assert "## Each detector's signal against its threshold" in (run / "report" / "report.md").read_text()
    # a synthetic collapse: validation under 70% of its best from step 20 on, as the label says
    _synthetic_cell(tmp_path, "collapsed", 1, lambda s: 0.5 if s < 20 else 0.05)
    validation = signal_trace(tmp_path / "collapsed")
    below = validation[validation["value"] < validation["threshold"]]
    assert list(below["step"]) == [20, 25, 30, 35] and list(below["threshold"]) == [0.35] * 4


def test_the_docs_screenshots_are_made_from_a_real_sweep(sweep, tmp_path, capsys):
    from reports.screenshots import main as screenshots

    assert screenshots([str(sweep), "--out", str(tmp_path)]) == 0
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ("run-report.png", "sweep-report.png"))
    assert screenshots([str(sweep), "--cell", "nope", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_figures_show_the_paired_run_and_fit_their_labels(tmp_path, monkeypatch):
    """The run's curves carry its paired single agent (grey), and the heatmap's colour-bar label and
    row labels lie inside the saved figure (they were cut off)."""
    from analysis import plots

    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, out: (fig.canvas.draw(), kept.append(fig), Path(out))[-1])
    steps = list(range(12))
    run = pd.DataFrame({"step": steps, "role/voter/response_length": 5.0, "role/voter/grad_share": 1.0,
                        "reward/mean": 0.5, "val/accuracy": [0.5 if s % 4 == 0 else None for s in steps]})
    paired = pd.DataFrame({"step": steps, "reward/mean": 0.4, "val/accuracy": [0.45 if s % 4 == 0 else None for s in steps],
                           "policy/shared/drift": [0.1 * (s + 1) for s in steps]})
    plots.role_curves(run, None, tmp_path / "roles.png", baseline=paired)
    labels = {t.get_text() for ax in kept[-1].axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert {"paired single agent: reward", "paired single agent: validation"} <= labels
    ci = pd.DataFrame({"task_axis": "math", "topology": ["orch_workers", "voting"], "sharing": ["ip", "sp"],
                       "scale": "tiny-m", "mean": [-0.4, 0.1]})
    plots.gain_heatmap(ci, "math", tmp_path / "heatmap.png")
    fig = kept[-1]
    bounds = fig.bbox
    renderer = fig.canvas.get_renderer()
    texts = [ax.yaxis.label for ax in fig.axes] + [t for ax in fig.axes for t in ax.get_yticklabels()]
    for text in (t for t in texts if t.get_text()):
        box = text.get_window_extent(renderer)
        assert box.x0 >= bounds.x0 - 1 and box.x1 <= bounds.x1 + 1, text.get_text()


def test_a_healthy_verdict_says_when_validation_fell_and_why_it_is_not_a_collapse():
    """A run whose validation accuracy halved once read plain "healthy"; now the verdict says by how
    much it fell and why the label does not call it a collapse."""
    from reports.verdict import verdict

    def run(points):
        return [{"step": 10 * i, "val/accuracy": a, "val/accuracy_se": se} for i, (a, se) in enumerate(points)]

    noisy = verdict(run([(0.25, 0.12), (0.14, 0.12), (0.13, 0.12)]), [], [], {"state": "finished", "step": 30})
    assert "healthy by the labels, though validation accuracy ended at 0.13 from a best of 0.25 (within 2 SE" in noisy
    mild = verdict(run([(0.5, 0.01), (0.4, 0.01)]), [], [], {"state": "finished", "step": 20})
    assert "(above 70% of it)" in mild
    steady = verdict(run([(0.5, 0.01), (0.49, 0.01)]), [], [], {"state": "finished", "step": 20})
    assert "; healthy; " in steady
