"""action=evaluate: every ended cell's checkpoints scored as the study scores them (analysis/evaluate.py)
by jobs of the sweep's launcher (here the local one: real processes), resumable and idempotent."""
import json
import shutil
import subprocess
import sys

from analysis.evaluate import RESULTS, checkpoints_of
from tests.conftest import REPO

SWEEP = ["sweep=smoke", "sweep.axes.topology=[voting]", "sweep.axes.seed=[0,1]", "action=evaluate",
         "evaluate.problems=4", "evaluate.k=1", "evaluate.samples=2"]


def launch(root, *extra):
    return subprocess.run([sys.executable, "grid/launch.py", *SWEEP, f"root={root}", *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=900)


def test_every_ended_cell_is_scored_once_per_checkpoint_by_the_launcher(small_sweep, tmp_path):
    shutil.copytree(small_sweep, tmp_path / "smoke")  # the shared sweep stays as other tests read it
    runs = sorted(p for p in (tmp_path / "smoke").iterdir() if (p / "cell.yaml").is_file())
    assert len(runs) == 6 and not any((run / RESULTS).exists() for run in runs)

    dry = launch(tmp_path, "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    for run in runs:
        names = [name for name, _, _ in checkpoints_of(run)]
        assert f"{run.name}: {len(names)} checkpoint(s) to score: {', '.join(names)}" in dry.stdout
    assert "6 evaluation job(s) (trained, split validation, pass@1 of 2 samples on 4 problems, run lengths); dry run" \
        in dry.stdout
    assert not any((run / RESULTS).exists() for run in runs)  # a dry run scores nothing

    done = launch(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for run in runs:
        rows = [json.loads(line) for line in (run / RESULTS).read_text().splitlines()]
        assert [r["checkpoint"] for r in rows] == [name for name, _, _ in checkpoints_of(run)]
        assert all(r["status"] == "ok" and r["problems"] == 4 and r["samples"] == 2 and r["split"] == "validation"
                   for r in rows)
    ledger = json.loads((tmp_path / "smoke" / ".grid" / "evaluate.json").read_text())
    assert set(ledger) == {run.name for run in runs}

    before = {run.name: (run / RESULTS).read_text() for run in runs}
    again = launch(tmp_path)
    assert again.returncode == 0 and "0 evaluation job(s)" in again.stdout and "nothing to score" in again.stdout
    assert {run.name: (run / RESULTS).read_text() for run in runs} == before  # nothing scored twice
    other = launch(tmp_path, "dry_run=true", "evaluate.split=held_out")  # another split is its own score
    assert "6 evaluation job(s) (trained, split held_out" in other.stdout
    longer = launch(tmp_path, "dry_run=true", "evaluate.lengths=study", "evaluate.problems=null")  # and other budgets
    assert "6 evaluation job(s) (trained, split validation, pass@1 of 2 samples on all problems, study lengths)" \
        in longer.stdout
    wrong = launch(tmp_path, "evaluate.lengths=long")
    assert wrong.returncode != 0 and "unknown evaluate.lengths 'long'; valid choices: run, study" in wrong.stderr
