"""Two SLURM nodes on one machine (`slurm/local-cluster.sh start --nodes 2`): each slurmd runs in a
network namespace of its own, so a two-node job's steps run on two hosts with two addresses, and
`slurm/ray-up.sh` joins them into one Ray cluster; `start` without --nodes goes back to the
single node the other tests use and removes the namespaces."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

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


def test_ray_up_joins_both_nodes_and_a_task_runs_on_each(two_nodes, tmp_path):
    out = tmp_path / "ray.out"
    probe = ("import os, ray; ray.init(address=os.environ['RAY_ADDRESS']); "
             "print('ray nodes', sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])); "
             "where = ray.remote(num_gpus=1)(lambda: os.environ['SLURMD_NODENAME']); "
             "print('ran on', sorted(ray.get([where.remote(), where.remote()])))")
    script = tmp_path / "ray.sh"
    script.write_text(f"#!/bin/bash\nexport PATH={sys.executable.rsplit('/', 1)[0]}:$PATH\n"
                      f"RAY_UP_NUM_GPUS=1 {REPO}/slurm/ray-up.sh python -c \"{probe}\"\n")
    job = sbatch_wait(script, "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2", "--mem=3G", f"--output={out}")
    text = out.read_text()
    assert job.returncode == 0, text[-3000:]
    assert "over 2 node(s)" in text and "ray nodes ['n1', 'n2']" in text, text[-3000:]
    assert "ran on ['n1', 'n2']" in text, text[-3000:]  # one logical GPU a node: one task on each
    job_id = job.stdout.split()[-1]
    assert not (Path("/tmp") / f"ray-{job_id}").exists()  # ray-up tore its cluster down with the job


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
