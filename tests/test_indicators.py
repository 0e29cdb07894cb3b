"""The leading-indicator search and the learned detector find a signal planted to lead failures,
and the live detector reads exactly what the offline search read."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from analysis.early_warning import auroc_by_lead, candidates, examples, first_alerts, fit, scores
from analysis.indicators import CellStream, aligned_rows, aligned_table, bh_qvalues, indicator_table
from analysis.labels import label_records
from harness.config import LearnedConfig, MonitorConfig
from harness.monitors.features import SignalWindow
from harness.monitors.learned import LearnedDetector
from harness.validation import ConfigError, load_config

PLANTED = "role/voter/planted"


def _cell(arm: str, seed: int, failure: int | None, rng: np.random.Generator) -> CellStream:
    """100 steps; validation every 10 (a failing cell's accuracy drops from `failure` on, which the
    collapse label finds); the planted signal rises 20 steps before the failure."""
    records = []
    for step in range(100):
        failing_soon = failure is not None and step >= failure - 20
        record = {"step": step, "accuracy": 0.5 + 0.05 * rng.normal(), PLANTED: rng.normal() + (2.5 if failing_soon else 0),
                  **{f"role/voter/noise{k}": rng.normal() for k in range(6)},
                  "role/aggregator/response_length": 20 + rng.normal(), "policy/voter/instances": 3}
        if step % 10 == 0:
            broken = failure is not None and step >= failure
            record.update({"val/accuracy": 0.1 if broken else 0.5 + 0.01 * rng.normal(), "val/accuracy_se": 0.02})
        records.append(record)
    return CellStream(f"{arm}-s{seed}", arm, seed, records, labels=label_records(records), start=10)


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(7)
    cells = [_cell(arm, seed, 50 + 10 * (seed % 4) if seed < 6 else None, rng)
             for arm in ("ip", "sp") for seed in range(12)]
    assert all((c.failure is not None) == (c.seed < 6) for c in cells)
    assert {c.failure.step for c in cells if c.failure} == {50, 60, 70, 80}
    table = aligned_table(cells)
    return cells, table, indicator_table(table, permutations=2000, resamples=200)


def test_planted_signal_ranks_first_at_its_lead_and_not_before(planted):
    _, _, ranked = planted
    at10 = ranked[ranked["lead"] == 10].reset_index(drop=True)
    assert at10.loc[0, "signal"].startswith(PLANTED)
    assert at10.loc[0, "effect"] > 0.35 and at10.loc[0, "q"] < 0.05
    noise = ranked[ranked["signal"].str.startswith("role/voter/noise")]
    assert noise["q"].min() > 0.05
    assert "policy/voter/instances" not in set(ranked["signal"])  # how the cell was built is not a signal
    at30 = ranked[(ranked["lead"] == 30) & (ranked["signal"] == PLANTED)]
    assert abs(at30["effect"].iloc[0]) < 0.2  # 30 steps ahead it had not risen yet


def test_learned_detector_finds_the_planted_signal(planted):
    cells, table, ranked = planted
    arms = sorted(table["arm"].unique())
    model, selection = fit(examples(table, arms), candidates(ranked), "planted")
    assert model.features[0].startswith(PLANTED) and selection[0]["added"] == model.features[0]
    assert auroc_by_lead(model, table, arms, [10])[0]["AUROC"] > 0.95
    fired = first_alerts(model, table)
    for cell in cells:
        if cell.failure is not None:
            assert cell.cell in fired and cell.failure.step - fired[cell.cell] >= 10


def test_live_detector_reads_what_the_search_read(planted, tmp_path):
    cells, table, ranked = planted
    model, _ = fit(examples(table, sorted(table["arm"].unique())), candidates(ranked), "planted")
    path = tmp_path / "model.json"
    path.write_text(model.to_json())
    cell = cells[0]
    detector = LearnedDetector(LearnedConfig(enabled=True, model=str(path)))
    detector.trace = []
    alerts = [a for r in cell.records for a in detector.observe(r)]
    offline = table[table["cell"] == cell.cell]
    offline_scores = dict(zip(offline["step"], scores(model, offline)))
    live = {row["step"]: row["value"] for row in detector.trace if row["step"] >= cell.start}
    assert live.keys() == offline_scores.keys()
    assert all(math.isclose(live[s], offline_scores[s], rel_tol=1e-4, abs_tol=1e-6) for s in live)
    assert [a.step for a in alerts if a.step >= cell.start] == \
        [s for s, v in sorted(offline_scores.items()) if v >= model.threshold]


def test_features_by_hand():
    window = SignalWindow(window=2)
    window.update({"step": 0, "role/voter/entropy": 1.0, "policy/voter/drift": 4.0, "lr": 1e-5, "role/voter/0/grad_norm": 9.0},
                  {"step": 0, "role/solver/entropy": 2.0, "policy/shared/drift": 2.0})
    window.update({"step": 1, "role/voter/entropy": 3.0, "policy/voter/drift": 8.0},
                  {"step": 1, "role/solver/entropy": 2.0, "policy/shared/drift": 4.0})
    window.update({"step": 2, "role/voter/entropy": 5.0, "policy/voter/drift": 10.0}, None)
    got = window.features()
    assert got["role/voter/entropy"] == 4.0  # the last two steps
    assert got["role/voter/entropy:vs_early"] == 4.0 - 2.0  # minus the first two
    assert got["role/voter/entropy:vs_paired"] == 4.0 / 2.0  # over the paired run's steps in the window
    assert got["policy/voter/drift:vs_paired"] == 9.0 / 4.0
    assert not {"lr", "role/voter/0/grad_norm", "step"} & {k.split(":")[0] for k in got}


def test_bh_qvalues_by_hand():
    q = bh_qvalues([0.01, 0.04, 0.03, 0.2, float("nan")])
    assert np.allclose(q[:4], [0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.2]) and math.isnan(q[4])


def test_learned_detector_without_its_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="monitors.learned.enabled: no model at"):
        load_config(["monitors.learned.enabled=true", f"monitors.learned.model={tmp_path / 'absent.json'}",
                     f"root={tmp_path}"])
    assert MonitorConfig().learned.enabled is False  # shipped off: it did not beat the baseline held out


def test_indicator_report_refuses_a_missing_sweep(tmp_path):
    result = subprocess.run([sys.executable, "-m", "reports.indicators", str(tmp_path / "nope")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == \
        [f"error: {tmp_path / 'nope'} is not a sweep directory"]


def test_aligned_rows_are_causal():
    rng = np.random.default_rng(1)
    cell = _cell("ip", 0, 60, rng)
    full = aligned_rows(cell)
    cut = aligned_rows(CellStream(cell.cell, cell.arm, cell.seed, cell.records[:41], labels=cell.labels))
    assert [r["step"] for r in cut] == [10, 15, 20, 25, 30, 35, 40]
    assert all(a[k] == b[k] for a, b in zip(cut, full) for k in a)  # a row reads nothing after its step
