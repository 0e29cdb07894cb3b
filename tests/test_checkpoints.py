"""Damaged checkpoints are detected and never trained on: a flipped byte, a truncated file, a torn or
dangling latest.json fall back to the previous verified checkpoint with a warning and an alert
record, and the resumed run matches an uninterrupted one; with no usable checkpoint the run stops
with one error and nothing is deleted."""
import json
import shutil

import pytest

from harness.config import ConfigError
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell

COMMON = ("topology=single", "ckpt_every=2", "val_every=100", "samples_every=0")


def _run(root, steps, lines=None):
    cfg = cell(root, *COMMON, f"steps={steps}")
    state = run_cell(cfg, log=(lines.append if lines is not None else (lambda *_: None)))
    return state, run_dir_of(cfg)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm_model_dir):
    """An uninterrupted 8-step run."""
    _, run = _run(tmp_path_factory.mktemp("clean"), 8)
    return read_jsonl(run.file("metrics.jsonl"))


def _damage_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor data, not the header
    path.write_bytes(bytes(data))


def _damage_truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "torn_pointer"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference, damage):
    _, run = _run(tmp_path, 6)  # checkpoints at steps 2, 4, 6: the last two are kept
    assert sorted(p.name for p in run.checkpoints.glob("step_*")) == ["step_0000004", "step_0000006"]
    newest = run.checkpoints / "step_0000006"
    if damage == "flip":
        _damage_flip(newest / "engine.safetensors")
    elif damage == "truncate":
        _damage_truncate(newest / "engine.safetensors")
    elif damage == "remove":
        shutil.rmtree(newest)
    else:
        (run.checkpoints / "latest.json").write_text('{"dir": "step_00')
        _damage_flip(newest / "optimizers.json")
    lines = []
    state, run = _run(tmp_path, 8, lines)
    assert state == "finished"
    warnings = [line for line in lines if line.startswith("warning: checkpoint")]
    assert warnings and warnings[-1].endswith("falling back to step_0000004"), lines
    assert "resuming single-arith-tiny-m-s0 from step 4" in lines
    alerts = [a for a in read_jsonl(run.file("alerts.jsonl")) if a["kind"] == "checkpoint"]
    assert alerts and alerts[0]["step"] == 4 and "damaged checkpoint skipped" in alerts[0]["message"]
    got = read_jsonl(run.file("metrics.jsonl"))
    assert [m["step"] for m in got] == list(range(8))
    for a, b in zip(got, reference):  # the replayed steps are the uninterrupted run's
        assert a["reward/mean"] == b["reward/mean"] and a["policy/shared/param_norm"] == b["policy/shared/param_norm"]


def test_no_usable_checkpoint_is_one_error_and_nothing_is_deleted(tmp_path, warm_model_dir):
    _, run = _run(tmp_path, 6)
    for directory in run.checkpoints.glob("step_*"):
        _damage_flip(directory / "engine.safetensors")
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"no usable checkpoint .*step_0000006: engine.safetensors does not match"):
        _run(tmp_path, 8)
    after = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file() and p.name != ".lock"}
    assert {p: v for p, v in before.items() if p.name != ".lock"} == after  # nothing written, nothing deleted
    # a latest.json naming a directory that is gone, with no other checkpoint: the same, not a silent restart
    shutil.rmtree(run.checkpoints / "step_0000004")
    shutil.rmtree(run.checkpoints / "step_0000006")
    with pytest.raises(ConfigError, match="step_0000006: missing"):
        _run(tmp_path, 8)
    assert [m["step"] for m in read_jsonl(run.file("metrics.jsonl"))] == list(range(6))


def test_every_checkpoint_file_is_in_its_manifest(tmp_path, warm_model_dir):
    _, run = _run(tmp_path, 2)
    directory = run.checkpoints / "step_0000002"
    listed = json.loads((directory / "manifest.json").read_text())["files"]
    assert set(listed) == {"engine.safetensors", "optimizers.json", "trainer.yaml"}
    assert all(len(v["sha256"]) == 64 and v["bytes"] > 0 for v in listed.values())
    assert not list(directory.glob("*.pt"))  # no pickled tensors
