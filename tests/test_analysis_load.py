"""Loading run directories: a missing path or a folder with no run is one clear error (never empty
frames), runs are found at any depth, the long-format loader matches the wide one, and a sweep
named relative to the repository root is found from a notebook's folder."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.compare import compare
from analysis.load import (RunsNotFound, find_runs, find_sweep, load_alerts, load_cells, load_metrics,
                           load_metrics_long)
from tests.conftest import REPO

LOADERS = [load_cells, load_metrics, load_alerts, load_metrics_long, compare]


def write_run(run: Path, topology: str, sharing: str, val: list, seed: int = 0) -> Path:
    """A run directory in the format harness.run writes: cell.yaml, metrics.jsonl, status.json."""
    run.mkdir(parents=True)
    (run / "cell.yaml").write_text(yaml.safe_dump({
        "cell_id": run.name, "sweep": run.parent.name, "topology": topology, "sharing": sharing, "task": "arith",
        "scale": "tiny-m", "seed": seed, "steps": len(val), "extra": {"task_axis": "math"}}))
    roles = ["single"] if topology == "single" else ["voter", "aggregator"]
    with open(run / "metrics.jsonl", "w") as out:
        for step, accuracy in enumerate(val):
            record = {"step": step, "reward/mean": 0.1 * step, "val/accuracy": accuracy,
                      "policy/shared/drift": 0.5 * step}
            for i, role in enumerate(roles):
                record[f"role/{role}/grad_norm"] = step + i / 10
                record[f"val/role/{role}/accuracy"] = accuracy / 2
            out.write(json.dumps(record) + "\n")
        out.write('{"step": 99, "reward/mean"')  # a torn last line, as a killed writer leaves
    (run / "status.json").write_text(json.dumps({"state": "finished", "step": len(val)}))
    return run


@pytest.fixture
def deep_sweep(tmp_path) -> Path:
    """A sweep three levels below the root it is loaded from."""
    sweep = tmp_path / "results" / "2026" / "december" / "smoke"
    write_run(sweep / "single-math-tiny-m-s0", "single", "sp", [0.2, 0.3, 0.4])
    write_run(sweep / "voting-ip-math-tiny-m-s0", "voting", "ip", [0.2, 0.5, 0.6])
    return sweep


@pytest.mark.parametrize("loader", LOADERS, ids=lambda f: f.__name__)
def test_a_missing_path_is_one_clear_error(loader, tmp_path):
    with pytest.raises(RunsNotFound, match=r"^no such directory: .*nope"):
        loader(tmp_path / "nope")


@pytest.mark.parametrize("loader", LOADERS, ids=lambda f: f.__name__)
def test_a_folder_without_runs_is_one_clear_error(loader, tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(RunsNotFound, match=r"^no run directories .* under .*empty"):
        loader(tmp_path / "empty")


def test_runs_are_found_at_any_depth(deep_sweep, tmp_path):
    root = tmp_path / "results"
    cells = load_cells(root)
    assert sorted(cells["cell_id"]) == ["single-math-tiny-m-s0", "voting-ip-math-tiny-m-s0"]
    assert set(cells["sweep_dir"]) == {str(deep_sweep)}
    gains = compare(root)["gains"]
    assert list(gains["cell_id"]) == ["voting-ip-math-tiny-m-s0"]
    assert gains["gain_final"].iloc[0] == pytest.approx(0.6 - 0.4)
    assert len(load_metrics(root)) == 6  # 3 steps x 2 runs; the torn line is skipped


def test_a_root_of_links_to_sweeps_loads_each_once(deep_sweep, tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "smoke").symlink_to(deep_sweep)
    (pool / "again").symlink_to(pool)  # a cycle must not loop or count runs twice
    assert [run.name for run in find_runs(pool)] == ["single-math-tiny-m-s0", "voting-ip-math-tiny-m-s0"]


def test_the_long_loader_is_the_wide_one_by_role_and_metric(deep_sweep):
    wide = load_metrics(deep_sweep)
    long = load_metrics_long(deep_sweep)
    assert list(long.columns) == ["cell_id", "step", "role", "metric", "value", "run_dir"]
    values = wide.drop(columns=["run_dir"]).set_index(["cell_id", "step"])
    assert len(long) == values.notna().sum().sum()
    by_role = long.dropna(subset=["role"]).set_index(["cell_id", "step", "role", "metric"])["value"]
    assert by_role[("voting-ip-math-tiny-m-s0", 2, "aggregator", "grad_norm")] == pytest.approx(2.1)
    assert by_role[("voting-ip-math-tiny-m-s0", 1, "voter", "val/accuracy")] == pytest.approx(0.25)
    assert set(long.loc[long["role"] == "single", "metric"]) == {"grad_norm", "val/accuracy"}
    cell = long[long["role"].isna()].set_index(["cell_id", "step", "metric"])["value"]
    assert cell[("single-math-tiny-m-s0", 2, "policy/shared/drift")] == pytest.approx(1.0)
    assert cell[("single-math-tiny-m-s0", 1, "val/accuracy")] == pytest.approx(0.3)
    table = long[long["metric"] == "grad_norm"].pivot_table(index="step", columns="role", values="value")
    assert list(table.columns) == ["aggregator", "single", "voter"]


def test_a_sweep_is_found_from_a_folder_below_where_it_was_named(deep_sweep, tmp_path, monkeypatch):
    """A notebook's kernel runs in the notebook's folder: `results/2026/december/smoke` named from
    the root still reads when the working directory is two folders down."""
    notebook_folder = tmp_path / "analysis" / "notebooks"
    notebook_folder.mkdir(parents=True)
    monkeypatch.chdir(notebook_folder)
    assert find_sweep("results/2026/december/smoke") == deep_sweep
    assert find_sweep(str(deep_sweep)) == deep_sweep
    with pytest.raises(RunsNotFound, match=r"^no such directory: runs/nope"):
        find_sweep("runs/nope")
    with pytest.raises(RunsNotFound, match=r"^no run directories"):
        find_sweep(str(notebook_folder))


def test_compare_command_line_says_why_nothing_was_compared(tmp_path):
    (tmp_path / "empty").mkdir()
    for target, message in ((tmp_path / "empty", "error: no run directories"), (tmp_path / "nope", "error: no such directory")):
        proc = subprocess.run([sys.executable, "-m", "analysis.compare", str(target), "--out", str(tmp_path / "out")],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "out").exists()
