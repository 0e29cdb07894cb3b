"""Two SLURM nodes on one machine (`slurm/local-cluster.sh start --nodes 2`): each slurmd runs in a
network namespace of its own, so a two-node job's steps run on two hosts with two addresses, and
`slurm/ray-up.sh` joins them into one Ray cluster; a voting/IP engine=verl cell spans both nodes
(one policy per node), matches the same cell on one node step for step, and when node 2 is lost
mid-run it fails naming the node and a relaunch resumes it to the same metrics; `start` without
--nodes goes back to the single node the other tests use and removes the namespaces."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.run_dir import read_jsonl
from tests.conftest import REPO
from tests.test_grid_slurm import LAUNCH

CELL = "voting-ip-arith-tiny-m-s0"
SPAN = ["sweep=smoke", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]", "sweep.baseline=false",
        "sweep.cell.steps=6", "sweep.cell.ckpt_every=2", "sweep.cell.val_every=3", "+sweep.cell.engine=verl",
        "+sweep.cell.verl.placement=per_node", "cluster.resources.tiny-m.nodes=2", "wait=true"]

CLUSTER = ["bash", "slurm/local-cluster.sh"]


def cluster(*args, timeout=600):
    return subprocess.run(CLUSTER + list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def sbatch_wait(script: Path, *options: str, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--wait", "--time=5", *options, str(script)], capture_output=True, text=True,
                          timeout=timeout)


def netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def two_nodes():
    started = cluster("start", "--nodes", "2")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "up: n1 idle" in started.stdout and "n2 idle" in started.stdout, started.stdout
        yield
    finally:
        back = cluster("start")  # the single-node cluster, whatever happened above
        assert back.returncode == 0, back.stdout + back.stderr


def test_a_two_node_jobs_steps_run_on_two_hosts_with_two_addresses(two_nodes, tmp_path):
    out = tmp_path / "where.out"
    probe = ("import os, socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('10.77.0.1', 9)); "
             "print('step', os.environ['SLURMD_NODENAME'], s.getsockname()[0], socket.gethostbyname(os.environ['SLURMD_NODENAME']))")
    script = tmp_path / "where.sh"
    script.write_text(f"#!/bin/bash\nsrun {sys.executable} -c \"{probe}\"\n")
    job = sbatch_wait(script, "--nodes=2", "--ntasks-per-node=1", f"--output={out}")
    assert job.returncode == 0, job.stdout + job.stderr
    steps = sorted(line.split()[1:] for line in out.read_text().splitlines() if line.startswith("step "))
    # each node's own address, which its name resolves to on every node (Ray's head is named by host)
    assert steps == [["n1", "10.77.0.11", "10.77.0.11"], ["n2", "10.77.0.12", "10.77.0.12"]], out.read_text()


def _launch(root: Path) -> subprocess.Popen:
    return subprocess.Popen(LAUNCH + [f"root={root}", "launcher=slurm", *SPAN], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(condition, seconds: float, what: str, root: Path) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{_diagnostics(root)}")
        time.sleep(0.2)


def _one_node_run(spanning_root: Path, root: Path) -> subprocess.Popen:
    """The same cell on one node: its own private Ray, every policy on it (the overrides the grid
    wrote for the two-node cell, another root)."""
    spec = spanning_root / "smoke" / ".grid" / f"{CELL}.overrides.json"
    overrides = {**json.loads(spec.read_text()), "root": str(root)}
    (root / "overrides.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "overrides.json").write_text(json.dumps(overrides))
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen([sys.executable, "-m", "grid.cell_job", str(root / "overrides.json")], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _diagnostics(root: Path) -> str:
    """What a stuck two-node cell leaves to read: SLURM's queue and nodes, the job's log, the cell's status."""
    lines = [subprocess.run(command, capture_output=True, text=True).stdout
             for command in (["squeue", "-o", "%i %T %R %M %N"], ["sinfo", "-N", "-o", "%N %T %C %m"])]
    for log in sorted((root / "smoke" / ".submitit").glob("*_log.*")):
        lines.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
    status = root / "smoke" / CELL / "status.json"
    lines.append(status.read_text() if status.is_file() else "no status.json")
    return "\n".join(lines)


def _finish(proc: subprocess.Popen, seconds: float, root: Path) -> tuple:
    """A process's (stdout, stderr), or a failure that says where it stood when `seconds` ran out
    (inside pytest's own limit, so the reason is printed instead of a bare timeout)."""
    try:
        return proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"no end after {seconds:.0f} s:\n{_diagnostics(root)}")


def _same_steps(got, want) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(6))
    for a, b in zip(got, want):  # wall-clock keys aside, key for key (parity tolerance 1e-6 for gradient norms)
        assert sorted(k for k in a if not k.startswith("time/")) == sorted(k for k in b if not k.startswith("time/"))
        assert a["reward/mean"] == b["reward/mean"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
        assert a["policy/voter/grad_norm"] == pytest.approx(b["policy/voter/grad_norm"], abs=1e-6), a["step"]


SLOW = pytest.mark.timeout(1200)  # the internal limits below fail first, saying where the cell stood


@pytest.fixture(scope="module")
def lost_and_resumed(two_nodes, tmp_path_factory):
    """A two-node cell that loses node 2 after three steps, is relaunched and finishes; then the same
    cell on one node (one after the other: two Ray clusters training at once on two cores is a load
    test, not this test). The resumed run equals the one-node run step for step, so it shows both the
    spanning cell's parity and a resume that loses and repeats nothing."""
    spanning, alone = tmp_path_factory.mktemp("two-nodes"), tmp_path_factory.mktemp("one-node")
    run = spanning / "smoke" / CELL
    launched = _launch(spanning)
    try:
        _wait(lambda: len(read_jsonl(run / "metrics.jsonl")) >= 3, 300, "three steps", spanning)
        pids = subprocess.run(["ip", "netns", "pids", "marl-n2"], capture_output=True, text=True).stdout.split()
        for pid in pids:  # every process of node 2 but its slurmd: the Ray node there is gone
            if Path(f"/proc/{pid}/comm").read_text().strip() != "slurmd":
                subprocess.run(["kill", "-9", pid], capture_output=True)
        _finish(launched, 200, spanning)
    finally:
        if launched.poll() is None:
            launched.kill()
    lost = json.loads((run / "status.json").read_text()), len(read_jsonl(run / "metrics.jsonl"))
    relaunch = _launch(spanning)
    out, err = _finish(relaunch, 300, spanning)
    assert relaunch.returncode == 0 and "summary: 1 finished" in out, out + err
    reference = _one_node_run(spanning, alone)
    _, err = _finish(reference, 300, alone)
    assert reference.returncode == 0, err[-3000:]
    return run, lost, read_jsonl(alone / "smoke" / CELL / "metrics.jsonl")


@SLOW
def test_a_verl_cell_over_two_nodes_puts_one_policy_on_each_and_matches_one_node(lost_and_resumed):
    run, _, want = lost_and_resumed
    placement = json.loads((run / "placement.json").read_text())
    assert placement == {"placement": "per_node", "policies": {"aggregator": ["n1"], "voter": ["n2"]}}
    _same_steps(read_jsonl(run / "metrics.jsonl"), want)
    # one checkpoint covers the shards both hosts wrote (the voter's on n2, the aggregator's on n1)
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    files = json.loads((run / "checkpoints" / latest["dir"] / "manifest.json").read_text())["files"]
    for policy in ("voter", "aggregator"):
        assert f"verl/{policy}/model_world_size_1_rank_0.pt" in files, sorted(files)[:20]


@SLOW
def test_losing_node_two_fails_the_cell_naming_it_and_a_relaunch_resumes_to_the_same_metrics(lost_and_resumed):
    run, (status, logged), want = lost_and_resumed
    assert status["state"] == "failed", status
    assert status["reason"].startswith("NodeLost: lost Ray node n2 (voter on n2)"), status["reason"]
    assert 3 <= logged < 6
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    _same_steps(read_jsonl(run / "metrics.jsonl"), want)


def test_the_dry_run_of_a_two_node_sweep_prints_what_each_cell_asks_for(two_nodes, tmp_path):
    proc = subprocess.run(LAUNCH + [f"root={tmp_path}", "launcher=slurm", *SPAN[:-1], "dry_run=true",
                                    "cluster.resources.tiny-m.gpus=2"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith(CELL))
    assert "2n 2g 1c 2G 30m" in row and " 2 " in row, row  # two nodes of two GPUs for 30 min: 2 GPU-hours
    assert "nothing submitted" in proc.stdout and not (tmp_path / "smoke" / ".grid").exists()


def test_one_node_again_removes_the_namespaces_and_their_names(two_nodes):
    assert "marl-n1" in netns() and "marl-n2" in netns()
    back = cluster("start")
    assert back.returncode == 0 and "switching from 2 to 1 node(s)" in back.stdout, back.stdout + back.stderr
    assert "marl-n" not in netns() and "marl-local-cluster" not in Path("/etc/hosts").read_text()
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout.split()
    assert nodes[0] not in ("n1", "n2") and nodes[1] in ("idle", "mixed", "allocated"), nodes


@pytest.mark.parametrize("args", [("--nodes", "0"), ("--nodes", "two"), ("--nodes", "12"), ("--nodez", "2")])
def test_a_bad_node_count_is_one_error_and_changes_nothing(args):
    before = netns()
    proc = cluster("start", *args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert netns() == before
