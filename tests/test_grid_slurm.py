"""The grid launcher against a real single-node SLURM cluster (slurm/local-cluster.sh; .ci/run starts it)."""
import json
import math
import os
from pathlib import Path
import random
import re
import signal
import subprocess
import sys
import time
from typing import Optional

import pytest

from harness.run_dir import read_jsonl
from tests.conftest import REPO

LAUNCH = [sys.executable, "grid/launch.py"]


@pytest.fixture(scope="module")
def slurm_cluster():
    proc = subprocess.run(["bash", "slurm/local-cluster.sh", "start"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"the local SLURM cluster did not start:\n{proc.stdout}\n{proc.stderr}"
    return True


def launch(root, *overrides, timeout=900):
    return subprocess.run(LAUNCH + [f"root={root}", "launcher=slurm", *overrides], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def ledger(root, sweep="smoke"):
    return json.loads((root / sweep / ".grid" / "jobs.json").read_text())


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory, warm_model_dir, slurm_cluster):
    """The smoke sweep run once, uninterrupted: the launcher's first output and its root."""
    root = tmp_path_factory.mktemp("uninterrupted")
    return launch(root, "sweep=smoke", "wait=true"), root


def test_smoke_sweep_on_slurm_then_a_relaunch_submits_nothing(smoke_sweep):
    first, tmp_path = smoke_sweep
    assert first.returncode == 0, first.stdout + first.stderr
    assert "submitted 7 cells to SLURM (1 job arrays)" in first.stdout
    assert "summary: 7 finished" in first.stdout
    for cell_id in ledger(tmp_path):
        run = tmp_path / "smoke" / cell_id
        assert json.loads((run / "status.json").read_text())["state"] == "finished"
        assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(20))
        assert (run / "cell.yaml").is_file() and (run / "checkpoints" / "latest.json").is_file()
    jobs = ledger(tmp_path)
    second = launch(tmp_path, "sweep=smoke")
    assert second.returncode == 0 and "nothing to submit: all 7 cells" in second.stdout
    assert f"sweep report: {tmp_path / 'smoke' / 'report' / 'index.html'}" in second.stdout  # where to look, again
    assert ledger(tmp_path) == jobs
    launches = json.loads((tmp_path / "smoke" / "launch.json").read_text())["launches"]  # what action=status composes
    assert [l["overrides"] for l in launches] == [[f"root={tmp_path}", "launcher=slurm", "sweep=smoke"]]
    status = subprocess.run(LAUNCH + [f"root={tmp_path}", "sweep=smoke", "action=status"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert "summary: 7 finished" in status.stdout and ".submitit/" in status.stdout


def status(root) -> str:
    return subprocess.run(LAUNCH + [f"root={root}", "launcher=slurm", "sweep=smoke", "action=status"], cwd=REPO,
                          capture_output=True, text=True, timeout=120).stdout


def _comparable(record: dict) -> dict:
    """A metrics record without wall-clock timings, the only keys allowed to differ between attempts."""
    return {k: v for k, v in record.items() if not k.startswith("time/")}


def _interrupt(root: Path, rng: random.Random, how: str, steps: int, ckpt_every: int = 5) -> Optional[tuple]:
    """scancel or SIGKILL one randomly chosen cell past its first checkpoint and not yet done;
    (cell, steps logged) or None."""
    sweep = root / "smoke"
    running = []
    for cell_id, entry in ledger(root).items():
        status = json.loads((sweep / cell_id / "status.json").read_text()) if (sweep / cell_id / "status.json").is_file() else {}
        logged = len(read_jsonl(sweep / cell_id / "metrics.jsonl"))
        if status.get("state") == "running" and ckpt_every < logged < steps - 1:
            running.append((cell_id, entry["job_id"], status["pid"], logged))
    if not running:
        return None
    cell_id, job_id, pid, logged = rng.choice(sorted(running))
    if how == "scancel":
        subprocess.run(["scancel", job_id], check=True)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
    return cell_id, logged


@pytest.mark.timeout(1200)
def test_soak_random_scancel_and_sigkill_then_relaunch_equals_the_uninterrupted_sweep(tmp_path, smoke_sweep):
    """The smoke sweep again, with cells cancelled (scancel) and killed (SIGKILL) at random moments and
    the launcher run again after each blow, then until everything is done: every cell finishes and every
    logged step equals the uninterrupted sweep's, number for number."""
    reference_root = smoke_sweep[1]
    steps = 20
    rng = random.Random(20261201)
    assert launch(tmp_path, "sweep=smoke").returncode == 0
    landed = []
    for how in ["scancel", "sigkill", "scancel", "sigkill"]:
        deadline = time.time() + rng.uniform(6, 20)
        hit = None
        while hit is None and time.time() < deadline + 120:
            if time.time() >= deadline:
                hit = _interrupt(tmp_path, rng, how, steps)
            time.sleep(0.5)
        if hit is None:
            break  # nothing left mid-run to hit
        landed.append((how, *hit))
        relaunch = launch(tmp_path, "sweep=smoke")  # an impatient user: the blow may still be landing
        assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr
    assert len(landed) >= 3, f"too few interruptions landed mid-run: {landed}"
    for _ in range(4):  # relaunched until done (a launch that finds every cell in flight submits nothing)
        _wait(lambda: not re.search(r"\d+ (running|queued)", status(tmp_path)), 600, "the cells in flight")
        if "summary: 7 finished" in status(tmp_path):
            break
        assert launch(tmp_path, "sweep=smoke").returncode == 0
    assert "summary: 7 finished" in status(tmp_path), status(tmp_path)
    for cell_id in ledger(reference_root):
        got = read_jsonl(tmp_path / "smoke" / cell_id / "metrics.jsonl")
        want = read_jsonl(reference_root / "smoke" / cell_id / "metrics.jsonl")
        assert [m["step"] for m in got] == list(range(steps)), cell_id
        for mine, theirs in zip(got, want):
            assert _comparable(mine) == _comparable(theirs), (cell_id, mine["step"])
    for how, cell_id, logged in landed:  # each blown-up cell resumed from a checkpoint, not from step 0
        out = Path(ledger(tmp_path)[cell_id]["stderr"]).with_suffix(".out").read_text()
        assert f"resuming {cell_id} from step" in out, (how, cell_id, logged)
    print(f"interruptions (how, cell, steps logged): {landed}")


def _wait(predicate, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_cancelled_cell_resumes_on_the_next_launch(tmp_path, warm_model_dir, slurm_cluster):
    one = ["sweep=smoke", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]", "sweep.baseline=false",
           "sweep.cell.steps=60", "sweep.cell.ckpt_every=5"]
    assert launch(tmp_path, *one).returncode == 0
    metrics = tmp_path / "smoke" / "voting-ip-arith-tiny-m-s0" / "metrics.jsonl"
    _wait(lambda: len(read_jsonl(metrics)) >= 12, 240, "12 logged steps")
    [job] = [e["job_id"] for e in ledger(tmp_path).values()]
    subprocess.run(["scancel", job], check=True)
    state = lambda: subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True,
                                   text=True).stdout
    _wait(lambda: "CANCELLED" in state(), 120, "the job to be cancelled")
    in_queue = lambda: subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()
    _wait(lambda: not in_queue(), 120, "the cancelled job to leave the queue")
    logged = len(read_jsonl(metrics))
    assert 12 <= logged < 60
    status = subprocess.run(LAUNCH + [f"root={tmp_path}", "launcher=slurm", "action=status", *one], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert "cancelled" in status.stdout
    again = launch(tmp_path, *one, "wait=true")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [e["job_id"] for e in ledger(tmp_path).values()] != [job]
    assert [m["step"] for m in read_jsonl(metrics)] == list(range(60))  # no lost, no duplicated step
    log = Path(ledger(tmp_path)["voting-ip-arith-tiny-m-s0"]["stderr"]).with_suffix(".out")
    assert "resuming voting-ip-arith-tiny-m-s0 from step" in log.read_text()


def test_verl_cell_runs_on_slurm(tmp_path, warm_model_dir, slurm_cluster):
    """engine=verl through the grid with a private Ray inside the job; slurm/ray-up.sh's Ray over the
    allocation (what a multi-node cell gets) is tests/test_two_node_cluster.py's."""
    args = ["sweep=smoke", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]", "sweep.baseline=false",
            "sweep.cell.steps=4", "sweep.cell.val_every=2", "+sweep.cell.engine=verl", "wait=true"]
    proc = launch(tmp_path, *args, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "summary: 1 finished" in proc.stdout
    run = tmp_path / "smoke" / "voting-ip-arith-tiny-m-s0"
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(4))
    assert "engine: verl" in (run / "cell.yaml").read_text()
    err_path = Path(ledger(tmp_path)["voting-ip-arith-tiny-m-s0"]["stderr"])
    assert "ray-up: cluster at" not in err_path.read_text()  # one node, ray_up=auto: a private Ray


@pytest.mark.parametrize("engine,ray_up,env,wanted", [
    ("verl", "auto", {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}, True),
    ("verl", "auto", {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}, False),
    ("verl", "always", {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}, True),
    ("verl", "never", {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}, False),
    ("verl", "always", {}, False),  # not inside a SLURM job
    ("verl", "always", {"SLURM_JOB_ID": "7", "RAY_ADDRESS": "10.0.0.1:6379"}, False),  # a Ray is already there
    ("local", "always", {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}, False),
])
def test_a_cell_job_brings_ray_up_over_its_allocation_only_where_asked(monkeypatch, engine, ray_up, env, wanted):
    from omegaconf import OmegaConf

    from grid.submit import needs_ray_up
    from harness.config import CellConfig

    for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = OmegaConf.merge(OmegaConf.structured(CellConfig), {"engine": engine, "verl": {"ray_up": ray_up}})
    assert needs_ray_up(cfg) is wanted


def _seconds_per_step(root, *cell):
    """This machine's pace on the cell, from a short local run: the requeue test sizes its cell by it."""
    proc = subprocess.run(LAUNCH + [f"root={root}", "launcher=local", *cell, "sweep.cell.steps=60"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [metrics] = (root / "smoke").glob("*/metrics.jsonl")
    paced = [m["time/step_s"] for m in read_jsonl(metrics)][20:]  # past the first steps' warm-up
    return sum(paced) / len(paced)


def _ledger_so_far(root) -> dict:
    try:
        return ledger(root)
    except (OSError, ValueError):  # not written yet
        return {}


@pytest.mark.timeout(1500)
def test_time_limited_cell_requeues_and_finishes(tmp_path, warm_model_dir, slurm_cluster):
    """A cell that outlives its time limit is signalled before it, checkpoints, requeues and resumes
    with no step lost or duplicated. Slurm may send the signal up to 60 s before the time set
    (sbatch --signal), so a 2-minute limit signalled 25 s before it leaves 35-95 s per attempt;
    the cell is 120 s of steps at this machine's measured pace, so the first attempt cannot finish
    it however fast the machine is. Once the first attempt has been requeued the test lifts the
    job's limit, so the rest runs in one attempt and the test's length does not depend on where
    in Slurm's 60 s the signals fall (a requeued job is eligible again after the cluster's
    cred_expire, 30 s: slurm/local-cluster.sh)."""
    cell = ["sweep=smoke", "sweep.axes.topology=[single]", "sweep.baseline=false",
            "sweep.cell.algo.ppo_mini_batch_size=8", "sweep.cell.val_every=1000"]
    steps = max(450, math.ceil(120 / _seconds_per_step(tmp_path / "pace", *cell)))
    args = [*cell, f"sweep.cell.steps={steps}", "sweep.cell.ckpt_every=10", "cluster.resources.tiny-m.time_min=2",
            "cluster.signal_delay_s=25", "wait=true"]
    proc = subprocess.Popen(LAUNCH + [f"root={tmp_path}", "launcher=slurm", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: "single-arith-tiny-m-s0" in _ledger_so_far(tmp_path), 300, "the cell's submission")
        entry = ledger(tmp_path)["single-arith-tiny-m-s0"]
        err_path = Path(entry["stderr"])
        out_path = err_path.with_suffix(".out")  # submitit logs its INFO lines (the requeue) to stdout
        _wait(lambda: out_path.is_file() and "Requeued job" in out_path.read_text(), 600,
              "the first attempt to be signalled and requeued")
        subprocess.run(["scontrol", "update", f"JobId={entry['job_id']}", "TimeLimit=30"], check=True)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    run = tmp_path / "smoke" / "single-arith-tiny-m-s0"
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(steps))
    log = out_path.read_text()
    assert "resuming single-arith-tiny-m-s0 from step" in log


def test_ray_comes_up_across_the_allocation_and_goes_down_with_it(tmp_path, slurm_cluster):
    script = tmp_path / "ray_job.sh"
    out = tmp_path / "ray_job.out"
    probe = ("import os, ray; ray.init(address=os.environ['RAY_ADDRESS']); "
             "print('cpus', ray.cluster_resources()['CPU']); print('answer', ray.get(ray.remote(lambda: 41 + 1).remote()))")
    script.write_text(f"#!/bin/bash\nexport PATH={sys.executable.rsplit('/', 1)[0]}:$PATH\n"
                      f"{REPO}/slurm/ray-up.sh python -c \"{probe}\"\n")
    job = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=2", "--mem=3G", "--time=5", f"--output={out}",
                          str(script)], capture_output=True, text=True, check=True).stdout.strip()
    _wait(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip(),
          180, "the Ray job to end")
    text = out.read_text()
    assert "cpus 2.0" in text and "answer 42" in text, text[-2000:]
    assert "ray-up: cluster at" in text and "over 1 node(s)" in text
    assert not list(tmp_path.glob("ray-*")) and not (Path("/tmp") / f"ray-{job}").exists()


def test_a_shape_the_cluster_cannot_run_is_refused_before_any_submission(tmp_path, slurm_cluster):
    before = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    proc = launch(tmp_path, "sweep=smoke", "cluster.resources.tiny-m.cpus=512")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the cluster cannot run cells of shape 1n 0g 512c")
    assert "sbatch --test-only" in proc.stderr
    assert not tmp_path.joinpath("smoke").exists()
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout == before


def test_the_evaluate_action_scores_a_sweep_as_slurm_jobs(smoke_sweep):
    """action=evaluate on SLURM: one job per ended cell with the cell's resources; wait=true blocks until
    they end; every checkpoint gets its row, and the jobs' ledger is its own (the cells' is untouched)."""
    from analysis.evaluate import RESULTS, checkpoints_of

    _, root = smoke_sweep
    cells_ledger = ledger(root)
    proc = launch(root, "sweep=smoke", "action=evaluate", "evaluate.problems=2", "wait=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted 7 evaluation jobs to SLURM" in proc.stdout and proc.stdout.count("COMPLETED") == 7
    for cell_id in cells_ledger:
        run = root / "smoke" / cell_id
        rows = read_jsonl(run / RESULTS)
        assert [r["checkpoint"] for r in rows] == [name for name, _, _ in checkpoints_of(run)]
        assert all(r["status"] == "ok" and r["problems"] == 2 for r in rows)
    jobs = json.loads((root / "smoke" / ".grid" / "evaluate.json").read_text())
    assert set(jobs) == set(cells_ledger) and all(e["launcher"] == "slurm" for e in jobs.values())
    assert ledger(root) == cells_ledger
