"""UnityMAS-O's agent-to-model map with different base models (`models:`): a tiny-m planner (LoRA)
and tiny-s workers (all parameters) train in one cell, per instance, and resume exactly."""
import math

import pytest

from harness.config import ConfigError
from harness.engines import build_engine
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from harness.tasks import build_task
from tests.conftest import cell

MODELS = ("topology=orch_workers", "sharing=custom",
          "+models={planner:{scale:tiny-m,roles:[orchestrator,synthesizer]},"
          "workers:{scale:tiny-s,roles:[worker],train:full,lr:5e-4}}")
COMMON = ("val_every=100", "samples_every=0", "ckpt_every=2")


def test_two_base_models_one_full_one_lora_train_per_instance_and_resume_exactly(tmp_path, warm_model_dir):
    straight = cell(tmp_path / "straight", *MODELS, *COMMON, "steps=4")
    assert run_cell(straight, log=lambda *_: None) == "finished"
    engine = build_engine(straight, None, [], tmp_path, task=build_task(straight))
    planner, workers = engine.engines["planner"], engine.engines["workers"]
    assert (planner.model.config.hidden_size, workers.model.config.hidden_size) == (128, 64)  # tiny-m, tiny-s
    assert sum(p.numel() for p in engine.engines["workers"].params["workers"]) == \
        sum(p.numel() for p in workers.model.parameters())  # every parameter trains
    assert sum(p.numel() for p in planner.params["planner"]) < 0.2 * sum(p.numel() for p in planner.model.parameters())
    lrs = {name: e.optimizers[name].param_groups[0]["lr"] for name, e in engine.engines.items()}
    assert lrs == {"planner": straight.algo.lr, "workers": 5e-4}  # each instance its own optimizer
    metrics = read_jsonl(run_dir_of(straight).file("metrics.jsonl"))
    for name in ("planner", "workers"):  # both moved (a step whose groups all scored alike moves nothing)
        assert all(m[f"policy/{name}/optimizer_steps"] >= 1 for m in metrics) and metrics[-1][f"policy/{name}/drift"] > 0
    assert all({"role/orchestrator/grad_norm", "role/worker/grad_norm", "role/synthesizer/grad_norm"} <= set(m)
               for m in metrics)
    assert metrics[-1]["policy/workers/param_norm"] > 3 * metrics[-1]["policy/planner/param_norm"]

    half = cell(tmp_path / "resumed", *MODELS, *COMMON, "steps=2")
    assert run_cell(half, log=lambda *_: None) == "finished"
    rest = cell(tmp_path / "resumed", *MODELS, *COMMON, "steps=4")
    assert run_cell(rest, log=lambda *_: None) == "finished"
    again = read_jsonl(run_dir_of(rest).file("metrics.jsonl"))
    assert [m["step"] for m in again] == [0, 1, 2, 3]
    for a, b in zip(again, metrics):
        for key in ("reward/mean", "policy/planner/drift", "policy/workers/drift", "policy/workers/grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-6), (a["step"], key)
    saved = run_dir_of(straight).path / "checkpoints" / "step_0000004"
    assert (saved / "planner" / "engine.safetensors").is_file() and (saved / "workers" / "engine.safetensors").is_file()


@pytest.mark.parametrize("overrides,message", [
    (MODELS + ("engine=verl",), "a models: instance with train=full needs engine=local"),
    (("topology=orch_workers", "sharing=ip", MODELS[2]), "use sharing=custom"),
    (("topology=orch_workers", "sharing=custom", "+models={a:{scale:huge,roles:[orchestrator,worker,synthesizer]}}"),
     "unknown scale (models.a.scale) 'huge'"),
    (("topology=orch_workers", "sharing=custom", "+models={a:{roles:[orchestrator,synthesizer]},b:{roles:['worker:0']}}"),
     "models.b.roles must list whole roles"),
    (("topology=orch_workers", "sharing=custom", "+models={a:{roles:[orchestrator,synthesizer]}}"),
     "leaves worker:0, worker:1 without a policy"),
    (("topology=orch_workers", "sharing=custom", "+models={a:{roles:[orchestrator,synthesizer],train:half},b:{roles:[worker]}}"),
     "unknown training mode (models.a.train) 'half'; valid choices: lora, full"),
])
def test_bad_model_maps_are_one_error(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as caught:
        cell(tmp_path, *overrides)
    assert message in str(caught.value)


def test_two_base_models_on_the_verl_engine_each_its_own_worker_group(tmp_path, warm_model_dir):
    """engine=verl: one worker group and rollout replica per instance, each loading its own base."""
    import json
    import subprocess

    from safetensors import safe_open

    from tests.conftest import REPO, python_cmd

    lora = ("topology=orch_workers", "sharing=custom",
            "+models={planner:{scale:tiny-m,roles:[orchestrator,synthesizer]},workers:{scale:tiny-s,roles:[worker]}}")
    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", "engine=verl", *lora, "steps=3", "val_every=2",
                                          "ckpt_every=2", "progress=false", "report=false", "wandb.enabled=false"],
                          cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "default" / "orch_workers-custom-arith-tiny-m-s0"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m[f"policy/{p}/optimizer_steps"] >= 1 for m in metrics for p in ("planner", "workers"))
    widths = {}
    for policy in ("planner", "workers"):
        (adapter,) = (run / "engine" / "initial_adapters").glob(f"*/{policy}/adapter_model.safetensors")
        with safe_open(str(adapter), "pt") as weights:
            name = next(k for k in weights.keys() if "q_proj.lora_A" in k)
            widths[policy] = weights.get_tensor(name).shape[1]  # lora_A: (rank, the base's hidden size)
    assert widths == {"planner": 128, "workers": 64}
