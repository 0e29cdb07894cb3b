"""Every topology x {sp, ip} and the single baseline run a few real steps and honour the run-dir contract."""
import json

import pytest
import yaml

from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell

CELLS = [("single", "sp")] + [(t, s) for t in ("eval_opt", "voting", "orch_workers") for s in ("sp", "ip")]
ROLES = {"single": ["solver"], "eval_opt": ["generator", "evaluator"], "voting": ["voter", "aggregator"],
         "orch_workers": ["orchestrator", "worker", "synthesizer"]}


@pytest.mark.parametrize("topology,sharing", CELLS)
def test_cell_runs_and_writes_the_contract(tmp_path, warm_model_dir, topology, sharing):
    cfg = cell(tmp_path, f"topology={topology}", f"sharing={sharing}", "steps=3", "val_every=2",
               "val_problems=8", "samples_every=2", "ckpt_every=2")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    run = run_dir_of(cfg)
    assert run.path == tmp_path / "default" / cfg.cell_id
    stored = yaml.safe_load(run.file("cell.yaml").read_text())
    assert stored["topology"] == topology and stored["cell_id"] == cfg.cell_id
    status = json.loads(run.file("status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 3
    metrics = read_jsonl(run.file("metrics.jsonl"))
    assert [m["step"] for m in metrics] == [0, 1, 2]
    first = metrics[0]
    for role in ROLES[topology]:
        # the gradient's per-role keys over all of the step's mini-batches: with balance_batch (verl's
        # length-stratified order) a role's short turns need not fall in the first one
        for key in ("grad_norm_mb_mean", "grad_share_mb_mean", "token_share", "turn_share", "response_length",
                    "reward", "format_ok", "entropy"):
            assert f"role/{role}/{key}" in first, f"role/{role}/{key}"
        assert f"role/{role}/accuracy" in first or role == "orchestrator"
    assert "val/accuracy" in metrics[0] and "val/accuracy" in metrics[2] and "val/accuracy" not in metrics[1]
    expected_policies = {"sp": 1, "ip": len(ROLES[topology])}[sharing if topology != "single" else "sp"]
    assert len(status["policies"]) == expected_policies
    for policy in status["policies"]:  # every policy steps; it moves whenever its gradient is non-zero
        for m in metrics:
            assert m[f"policy/{policy}/optimizer_steps"] >= 1
            if m[f"policy/{policy}/grad_norm_mb_mean"] > 0:
                assert m[f"policy/{policy}/update_norm"] > 0
    if topology == "voting" and sharing == "ip":
        assert first["policy/voter/instances"] == 3 and "policy/voter/coherence" in first
        assert first["time/generate_calls"] == 2  # voters batched in one call, the aggregator in another
    samples = read_jsonl(run.file("samples.jsonl"))
    assert {s["step"] for s in samples} == {0, 2}
    assert {t["role"] for s in samples for t in s["turns"]} <= set(ROLES[topology])
    assert run.latest_checkpoint().name == "step_0000003"
    assert (run.checkpoints / "best" / "engine.safetensors").is_file() and (run.checkpoints / "best" / "manifest.json").is_file()
