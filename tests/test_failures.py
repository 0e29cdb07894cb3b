"""One failure path: whatever fails after the config was accepted leaves status.json `failed` with
a one-line reason and prints one `error:` line, even on a full disk."""
import json
import subprocess

import pytest

from tests.conftest import REPO, python_cmd


@pytest.fixture()
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root, as CI and `make test` run): room for the run's logs, not for many checkpoints."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_cell_with_its_reason_in_status(small_disk, warm_model_dir):
    args = [f"root={small_disk}", "topology=single", "steps=40", "ckpt_every=1", "ckpt_keep=4", "val_every=100",
            "samples_every=1", "progress=false", "wandb.enabled=false", "report=false"]
    proc = subprocess.run(python_cmd() + args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr  # the traceback goes to failure.log when there is room for it
    status = json.loads((small_disk / "default" / "single-arith-tiny-m-s0" / "status.json").read_text())
    assert status["state"] == "failed" and "No space left on device" in status["reason"]
    assert 0 < status["step"] < 40


def test_a_failure_in_training_is_recorded_once(tmp_path, warm_model_dir, monkeypatch):
    from harness.controller import Controller
    from harness.run import CellFailed, run_cell, run_dir_of
    from tests.conftest import cell

    def boom(self, step):
        raise RuntimeError("boom at the first step\nsecond line")

    monkeypatch.setattr(Controller, "train_step", boom)
    cfg = cell(tmp_path, "topology=single", "steps=3")
    with pytest.raises(CellFailed, match=r"^RuntimeError: boom at the first step \(traceback: .*failure.log\)$"):
        run_cell(cfg, log=lambda *_: None)
    run = run_dir_of(cfg)
    status = json.loads(run.file("status.json").read_text())
    assert status["state"] == "failed" and status["reason"] == "RuntimeError: boom at the first step"
    assert "Traceback" in run.file("failure.log").read_text() and "traceback" not in status
