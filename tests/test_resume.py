"""A SIGKILLed cell resumes from its last checkpoint: no lost or duplicated step, same numbers."""
import os
import signal
import subprocess
import time

from harness.run_dir import read_jsonl
from tests.conftest import REPO, python_cmd

# the study's I6 damping on the voter adapter: its gradient EMA is state a resume must restore too
ARGS = ["topology=voting", "sharing=ip", "steps=16", "ckpt_every=4", "val_every=5", "val_problems=8",
        "progress=false", "algo.coherence_damping={voter:0.3}"]


def _run(root, timeout=300):
    return subprocess.run(python_cmd() + [f"root={root}", *ARGS], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_sigkill_then_resume_continues_exactly(tmp_path, warm_model_dir):
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"
    metrics = killed_root / "default" / "voting-ip-arith-tiny-m-s0" / "metrics.jsonl"
    proc = subprocess.Popen(python_cmd() + [f"root={killed_root}", *ARGS], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while len(read_jsonl(metrics)) < 7 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    logged_before = len(read_jsonl(metrics))
    assert 7 <= logged_before < 16, "the kill must land mid-run"

    resumed = _run(killed_root)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming voting-ip-arith-tiny-m-s0 from step" in resumed.stdout
    steps = [m["step"] for m in read_jsonl(metrics)]
    assert steps == list(range(16))

    clean = _run(clean_root)
    assert clean.returncode == 0, clean.stderr
    reference = read_jsonl(clean_root / "default" / "voting-ip-arith-tiny-m-s0" / "metrics.jsonl")
    for got, want in zip(read_jsonl(metrics), reference):
        assert got["reward/mean"] == want["reward/mean"], got["step"]
        assert abs(got["policy/voter/grad_norm"] - want["policy/voter/grad_norm"]) < 1e-6
        assert abs(got["policy/voter/coherence_cos"] - want["policy/voter/coherence_cos"]) < 1e-6, got["step"]

    again = _run(killed_root)
    assert again.returncode == 0 and "already finished at step 16" in again.stdout
    assert [m["step"] for m in read_jsonl(metrics)] == list(range(16))
