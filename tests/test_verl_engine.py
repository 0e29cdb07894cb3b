"""engine=verl (Ray worker groups over verl's FSDP2 TrainingWorker, CPU platform plugin) against
engine=local: the same batch gives the same per-role numbers, and a cell runs, writes the same run
directory and resumes after a SIGKILL."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import ray
import torch
from verl.workers.rollout.replica import RolloutReplicaRegistry

from harness.engines.verl.engine import VerlEngine
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe
from harness.run_dir import read_jsonl
from harness.episodes import Sampling
from tests.conftest import REPO, python_cmd
from tests.test_probe import _setup, spread_advantages

TOL = 1e-4
# bench/gpu_cluster_check.sh runs the parity test on a GPU: MARL_VERL_DEVICE=cuda (fp32, sdpa attention)
DEVICE = os.environ.get("MARL_VERL_DEVICE", "cpu")
DEVICE_OVERRIDES = ((f"verl.device={DEVICE}",) if DEVICE == "cpu" else
                    (f"verl.device={DEVICE}", "verl.param_dtype=fp32", "verl.attn_implementation=sdpa"))


@pytest.fixture(scope="module")
def ray_session():
    yield
    ray.shutdown()


def _close(a: float, b: float, what: str) -> None:
    assert math.isclose(a, b, rel_tol=TOL, abs_tol=TOL), f"{what}: local {a} vs verl {b}"


def _compare(local_result, local_probe, verl_result, verl_probe) -> dict:
    assert local_result.optimizer_steps == verl_result.optimizer_steps
    for policy, norm in local_result.policy_grad_norm.items():
        _close(norm, verl_result.policy_grad_norm[policy], f"{policy} grad norm")
        _close(local_result.grad_norm_mean[policy], verl_result.grad_norm_mean[policy], f"{policy} mean grad norm")
        _close(local_result.policy_update_norm[policy], verl_result.policy_update_norm[policy], f"{policy} update norm")
        _close(local_result.policy_param_norm[policy], verl_result.policy_param_norm[policy], f"{policy} param norm")
        _close(local_result.drift[policy], verl_result.drift[policy], f"{policy} drift")
        _close(local_result.drift_rate[policy], verl_result.drift_rate[policy], f"{policy} drift rate")
        for k, (a, b) in enumerate(zip(local_result.minibatches[policy], verl_result.minibatches[policy])):
            _close(a["loss"], b["loss"], f"{policy} mini-batch {k} loss")
            _close(a["grad_norm"], b["grad_norm"], f"{policy} mini-batch {k} grad norm")
            _close(a["clipfrac"], b["clipfrac"], f"{policy} mini-batch {k} clipfrac")
            assert ("lr_scale" in a) == ("lr_scale" in b)
            _close(a.get("lr_scale", 1.0), b.get("lr_scale", 1.0), f"{policy} mini-batch {k} lr scale")
    assert set(local_result.role_loss) == set(verl_result.role_loss)
    for role, loss in local_result.role_loss.items():
        _close(loss, verl_result.role_loss[role], f"{role} loss")
        _close(local_result.entropy[role], verl_result.entropy[role], f"{role} entropy")
        _close(local_result.kl.get(role, 0.0), verl_result.kl.get(role, 0.0), f"{role} kl")
        _close(local_result.clipfrac[role], verl_result.clipfrac[role], f"{role} clipfrac")
        _close(local_result.ratio[role], verl_result.ratio[role], f"{role} ratio")
    local_metrics, verl_metrics = gradient_metrics(local_probe), gradient_metrics(verl_probe)
    assert set(local_metrics) == set(verl_metrics)
    for key, value in local_metrics.items():  # per-role grad norms, shares, coherence, amplification
        _close(value, verl_metrics[key], key)
    return local_metrics


@pytest.mark.parametrize("overrides", [
    # two FSDP ranks (gloo) per policy: shards reduce to the same Gram matrix; 2 epochs of shuffled
    # mini-batches of 4 problems (voters: 6 optimizer steps, aggregator: 2) with one clip norm over the cell,
    # each voter step's lr divided by its voters' coherence (mitigation coherence_reg)
    ("topology=voting", "sharing=ip", "algo.loss_agg=token-mean", "verl.gpus_per_policy=2",
     "algo.ppo_mini_batch_size=4", "algo.ppo_epochs=2", "algo.shuffle=true", "algo.clip_scope=cell", "instrument.kl_every=1",
     "algo.max_grad_norm=0.3", "mitigation=coherence_reg"),
    # fixed-size micro-batches (5 does not divide every instance's rows) and one group per policy's own GPUs;
    # 3 mini-batches per step, asymmetric clip, cosine LR with warm-up, an induced 3x lr spike on update 1,
    # and the study's sampling temperature: log-probs, entropy, KL and ratios at T=0.7 on both engines
    ("topology=eval_opt", "sharing=sp", "algo.loss_agg=role-balanced", "algo.kl_coef=0.05", "algo.micro_batch_size=5",
     "algo.temperature=0.7",
     "verl.use_dynamic_bsz=false", "verl.placement=split", "algo.ppo_mini_batch_size=3", "algo.clip_ratio_high=0.28",
     "algo.lr_schedule=cosine", "algo.lr_warmup_steps=2", "steps=4",
     "algo.lr_spike_factor=3", "algo.lr_spike_start=1", "algo.lr_spike_steps=1"),
])
def test_same_batch_same_numbers_on_both_engines(tmp_path, warm_model_dir, ray_session, overrides):
    cfg, local, turns = _setup(tmp_path, warm_model_dir, *overrides, *DEVICE_OVERRIDES)
    spread_advantages(turns)
    verl = VerlEngine(warm_model_dir, local.policies, cfg, seed=0, work_dir=tmp_path / "engine")
    try:
        # the same adapters answer the same way (greedy) before any update
        prompts = [t.prompt for t in turns[:3]]
        sampling = Sampling(max_new_tokens=8, temperature=1.0, greedy=True)
        for policy in local.policies:
            assert [g.response_ids for g in local.generate(policy, prompts, sampling)] == \
                   [g.response_ids for g in verl.generate(policy, prompts, sampling)]
        for update in range(2):  # the second step starts from the optimizers' first steps: KL > 0
            local_probe, verl_probe = GradientProbe(), GradientProbe()
            local_result = local.update(turns, local_probe, step=update)  # verl's scheduler counts its own steps
            verl_result = verl.update(turns, verl_probe, step=update)
            metrics = _compare(local_result, local_probe, verl_result, verl_probe)
            assert set(local_result.rollout_probs_diff) == set(verl_result.rollout_probs_diff) == set(local.policies)
            for policy, (mean, largest) in local_result.rollout_probs_diff.items():
                _close(largest, verl_result.rollout_probs_diff[policy][1], f"{policy} rollout probs diff max")
                if update == 0:  # the behaviour weights are the ones that sampled the turns
                    assert largest < 1e-3 and verl_result.rollout_probs_diff[policy][1] < 1e-3, policy
            assert any(abs(v) > 1e-3 for k, v in metrics.items() if k.endswith("grad_norm"))
            assert max(len(r) for r in local_probe.rounds.values()) >= 3  # several optimizer steps were compared
            if update == 1:  # (with warm-up, the LR of step 0 is 0)
                assert max(local_result.kl.values()) > 0
                assert max(abs(r - 1.0) for r in local_result.ratio.values()) > 1e-4  # later mini-batches are off-policy
        if "topology=voting" in overrides:
            assert metrics["role/voter/amplification"] > 1.2  # three voters push one adapter
            assert min(m["lr_scale"] for m in verl_result.minibatches["voter"]) < 0.95  # coherence_reg slowed a step
        # rollout goes through verl's replica registry; each replica serves its trainer's new adapter
        for policy in local.policies:
            assert isinstance(verl.replicas[policy], RolloutReplicaRegistry.get("hf"))
            trained = verl.groups[policy].adapter_state()[0]
            served = ray.get(verl.replicas[policy].server_handle.adapter_state.remote())
            assert trained.keys() == served.keys() and len(trained) > 0
            assert all(torch.equal(trained[k], served[k]) for k in trained), policy
            assert [g.response_ids for g in local.generate(policy, prompts, sampling)] == \
                   [g.response_ids for g in verl.generate(policy, prompts, sampling)]
        # verl's token-in-token-out request (what its agent loop sends a vLLM server) answers alike
        served = verl.generate(local.policies[0], prompts[:1], sampling)[0]
        output = ray.get(verl.replicas[local.policies[0]].server_handle.generate.remote(
            served.prompt_ids, {"temperature": 0.0, "max_tokens": 8}, "request-0"))
        assert output.token_ids == served.response_ids
    finally:
        verl.shutdown()


def test_non_finite_gradient_skips_only_that_policy(tmp_path, warm_model_dir, ray_session):
    """verl's optimizer_step skips a non-finite step; the harness reports the policy as skipped."""
    cfg, _local, turns = _setup(tmp_path, warm_model_dir, "topology=voting", "sharing=ip", *DEVICE_OVERRIDES)
    verl = VerlEngine(warm_model_dir, ["aggregator", "voter"], cfg, seed=0, work_dir=tmp_path / "engine")
    try:
        clean = [t.advantage for t in turns]
        for t in turns:
            if t.role == "aggregator":
                t.advantage = float("nan")
        result = verl.update(turns, GradientProbe())
        assert result.skipped == ["aggregator"] and "aggregator" not in result.policy_update_norm
        assert result.policy_update_norm["voter"] > 0
        for t, advantage in zip(turns, clean):
            t.advantage = advantage
        after = verl.update(turns, GradientProbe())  # the skipped policy's weights stayed finite
        assert after.skipped == [] and all(math.isfinite(v) for v in after.policy_param_norm.values())
    finally:
        verl.shutdown()


ARGS = ["engine=verl", "topology=voting", "sharing=ip", "steps=6", "ckpt_every=2", "val_every=3", "val_problems=8",
        "progress=false", "report=false", "wandb.enabled=false"]
CELL = "voting-ip-arith-tiny-m-s0"


def _run(root, *extra, timeout=400):
    return subprocess.run(python_cmd() + [f"root={root}", *ARGS, *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_verl_cell_runs_writes_the_run_dir_and_resumes_after_sigkill(tmp_path, warm_model_dir):
    """The uninterrupted run it is compared with runs beside it (each its own Ray; a verl cell mostly waits);
    then the resume, a branch of the uninterrupted run (harness.intervene, which repeats its steps after the
    branch point) and the same cell on engine=local run side by side."""
    killed, clean, local = tmp_path / "killed", tmp_path / "clean", tmp_path / "local"
    metrics = killed / "default" / CELL / "metrics.jsonl"
    proc = subprocess.Popen(python_cmd() + [f"root={killed}", *ARGS], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    uninterrupted = subprocess.Popen(python_cmd() + [f"root={clean}", *ARGS], cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while len(read_jsonl(metrics)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len(read_jsonl(metrics)) < 6, "the kill must land mid-run"
    clean_err = uninterrupted.communicate(timeout=400)[1]
    assert uninterrupted.returncode == 0, clean_err[-3000:]

    def start(name, *command):  # its output to files: an unread pipe would stall it while the others run
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            return subprocess.Popen(list(command), cwd=REPO, stdout=out, stderr=err)

    def finish(name, proc):
        proc.wait(timeout=400)
        out, err = ((tmp_path / f"{name}.{stream}").read_text() for stream in ("out", "err"))
        assert proc.returncode == 0, err[-3000:]
        return out

    resuming = start("resume", *python_cmd(), f"root={killed}", *ARGS)
    branching = start("branch", sys.executable, "-m", "harness.intervene", str(clean / "default" / CELL), "--at", "4",
                      "--arms", "none")
    reference = _run(local, "engine=local")
    assert f"resuming {CELL} from step" in finish("resume", resuming)
    got = read_jsonl(metrics)
    assert [m["step"] for m in got] == list(range(6))
    want = read_jsonl(clean / "default" / CELL / "metrics.jsonl")
    for a, b in zip(got, want):
        assert a["reward/mean"] == b["reward/mean"], a["step"]
        assert abs(a["policy/voter/grad_norm"] - b["policy/voter/grad_norm"]) < 1e-6
        assert a["policy/voter/optimizer_steps"] == 3 * a["policy/aggregator/optimizer_steps"] == 3
        assert a["role/voter/coherence_mb_mean"] > 0
        assert ("role/aggregator/kl" in a) == (a["step"] % 10 == 0) and a.get("role/aggregator/kl", 0.0) >= 0.0

    # the same run directory as engine=local: files, metric keys, status, checkpoints
    assert reference.returncode == 0, reference.stderr[-3000:]
    verl_dir, local_dir = killed / "default" / CELL, local / "default" / CELL
    top = lambda d: sorted(p.name for p in d.iterdir() if p.name not in ("engine", "placement.json"))  # noqa: E731 (placement: verl only)
    assert top(verl_dir) == top(local_dir)
    assert set(got[0]) == set(read_jsonl(local_dir / "metrics.jsonl")[0])
    status = json.loads((verl_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 6
    latest = json.loads((verl_dir / "checkpoints" / "latest.json").read_text())
    assert (verl_dir / "checkpoints" / latest["dir"] / "verl" / "voter").is_dir()
    assert torch.isfinite(torch.tensor([m["loss"] for m in got])).all()

    # branched at step 4 (harness.intervene), its none arm repeats the uninterrupted run's last steps
    finish("branch", branching)
    arm = read_jsonl(clean / "default-interventions" / f"{CELL}@4+none" / "metrics.jsonl")
    assert [m["step"] for m in arm] == list(range(6))
    for a, b in zip(arm[4:], want[4:]):
        assert a["reward/mean"] == b["reward/mean"], a["step"]
        assert abs(a["policy/voter/grad_norm"] - b["policy/voter/grad_norm"]) < 1e-6
