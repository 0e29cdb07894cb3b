"""Real runs on the tiny model demonstrate each mechanism, measured rather than constructed."""
import json
import subprocess
from statistics import mean

from harness.run_dir import read_jsonl
from harness.wandb_sink import read_wandb_offline
from harness.run import run_cell, run_dir_of
from tests.conftest import REPO, cell, python_cmd


def _run(tmp_path, *overrides):
    cfg = cell(tmp_path, *overrides)
    state = run_cell(cfg, log=lambda *_: None)
    run = run_dir_of(cfg)
    return state, run, read_jsonl(run.file("metrics.jsonl")), read_jsonl(run.file("alerts.jsonl"))


def test_amplification_fires_on_the_faster_adapter_not_on_ip_instance_nor_when_scaled(tmp_path, warm_model_dir):
    # sweep=repro's settings (lr 1.5e-3, mini-batches of 2 problems), where voting IP collapses: 12 voter steps a step.
    # The drift-ratio gate alone (no early band to pull away from, alerts from step 0): the rise above the
    # early band is tested on recorded streams in tests/test_detectors.py
    common = ("topology=voting", "steps=12", "val_every=100", "samples_every=0", "monitors.amplification.patience=2",
              "monitors.amplification.baseline_steps=0", "monitors.start_step=0",
              "algo.lr=1.5e-3", "algo.ppo_mini_batch_size=2", "algo.balance_batch=false")
    _, run, ip, ip_alerts = _run(tmp_path, "sharing=ip", "wandb.enabled=true", *common)
    _, _, control, control_alerts = _run(tmp_path, "sharing=ip_instance", *common)
    _, _, scaled, scaled_alerts = _run(tmp_path, "sharing=ip", "mitigation=role_count_scaling", *common)
    ratio = [m["policy/voter/drift"] / m["policy/aggregator/drift"] for m in ip]
    scaled_ratio = [m["policy/voter/drift"] / m["policy/aggregator/drift"] for m in scaled]
    amp_ip = mean(m["role/voter/amplification_mb_mean"] for m in ip)  # over each step's mini-batches
    coh_ip = mean(m["role/voter/coherence_mb_mean"] for m in ip)
    print(f"voter/aggregator adapter drift by step, IP: {' '.join(f'{r:.2f}' for r in ratio)}; with "
          f"role_count_scaling: {' '.join(f'{r:.2f}' for r in scaled_ratio)}; probe amplification {amp_ip:.2f}, "
          f"coherence {coh_ip:.2f}")
    # the voter adapter (3 instances, 3x the optimizer steps) outruns the aggregator's, each step moving it
    # > 10% of its norm: the alert says so
    assert mean(ratio[3:]) > 1.3 and mean(m["policy/voter/update_ratio"] for m in ip) > 0.1
    amplification = [a for a in ip_alerts if a["kind"] == "amplification"]
    assert amplification and amplification[0]["policy"] == "voter" and amplification[0]["value"] >= 1.3
    # one adapter per voter: no policy has several instances; scaled: the voter adapter keeps the pace
    assert not [a for a in control_alerts if a["kind"] == "amplification"]
    assert mean(scaled_ratio[3:]) < 1.3 and not [a for a in scaled_alerts if a["kind"] == "amplification"]
    # the probe's numbers are still logged; the voters' gradients do not cancel (the detector's coherence gate)
    assert amp_ip > 1.0 and coh_ip >= 0.5
    assert all(abs(m["role/voter_0/coherence"] - 1.0) < 1e-9 for m in control if "role/voter_0/coherence" in m)

    # the same cell's offline wandb run holds the per-role metrics and the alert
    [log] = list(run.path.glob("wandb/offline-run-*/run-*.wandb"))
    records = list(read_wandb_offline(log))
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert len(history) == 12 and "role:voter/amplification" in history[0] and "policy:voter/coherence" in history[0]
    alerts = [r.alert for r in records if r.WhichOneof("record_type") == "alert"]
    assert alerts and alerts[0].title.startswith("amplification") and "3 role instances" in alerts[0].text
    run_record = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run_record.run_group == "default" and "sharing:ip" in list(run_record.tags)


def test_sp_role_with_more_tokens_takes_more_than_its_turn_share(tmp_path, warm_model_dir):
    _, _, metrics, _ = _run(tmp_path, "topology=voting", "sharing=sp", "steps=10", "val_every=100")
    voter = {k: mean(m[f"role/voter/{k}"] for m in metrics) for k in ("grad_share", "turn_share", "token_share")}
    aggregator_tokens = mean(m["role/aggregator/token_share"] for m in metrics)
    print(f"SP voting: voter {voter}, aggregator token share {aggregator_tokens:.2f}")
    assert voter["token_share"] > 3 * aggregator_tokens
    assert voter["grad_share"] > voter["turn_share"] + 0.1


def test_length_drift_stops_the_run_cleanly(tmp_path, warm_model_dir):
    # an aggregator paid per token; T=1.5 so it ever samples past its index (at T=1 the warm model almost never does)
    args = [f"root={tmp_path}", "topology=voting", "sharing=ip", "steps=100", "progress=false", "val_every=20",
            "wandb.enabled=false", "+reward.per_role.aggregator.length=1.0", "algo.temperature=1.5",
            "+workflow.role_max_new_tokens={aggregator:24}", "monitors.drift.action=stop"]
    proc = subprocess.run(python_cmd() + args, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "default" / "voting-ip-arith-tiny-m-s0"
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped_early" and status["reason"].startswith("length_drift")
    stop = [a for a in read_jsonl(run / "alerts.jsonl") if a["action"] == "stop"]
    # no alert before the first validation (step 20): both of length drift's signs may be up by then,
    # each is written, and the run stops once
    assert {(a["step"], a["kind"], a["role"]) for a in stop} == {(stop[0]["step"], "length_drift", "aggregator")}
    assert len({a["signal"] for a in stop}) == len(stop)
    stop.sort(key=lambda a: "is paid to lengthen its answers" not in a["message"])
    assert status["step"] == stop[0]["step"] + 1 < 100
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(status["step"]))
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == status["step"]
    # the warning is the pressure (the advantage pays longer answers), before the length has moved far
    assert "is paid to lengthen its answers" in stop[0]["message"] and stop[0]["value"] >= 4
    records = read_jsonl(run / "metrics.jsonl")
    assert mean(m["role/aggregator/selection_length"] for m in records[:10]) > 0
    # ... while the aggregator's answers are still short: far under the 24 tokens its pay pulls it toward
    assert records[stop[0]["step"]]["role/aggregator/response_length"] <= 0.25 * 24
    again = subprocess.run(python_cmd() + args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already stopped_early" in again.stdout


def test_capture_warns_of_an_outcome_paid_evaluator_before_it_moves_not_of_a_verdict_paid_one(tmp_path,
                                                                                             warm_model_dir):
    # sweep=repro_eval_opt's cells (default lr and mini-batch, GRPO groups per episode as recorded), seed 37,
    # its first 25 steps: paid by the episode's outcome, the evaluator's verdicts are pushed shorter (toward the
    # generator's answers) while their length still holds; paid for its own verdicts, they are pushed longer
    common = ("topology=eval_opt", "sharing=sp", "steps=25", "val_every=100", "samples_every=0", "seed=37",
              "algo.adv_grouping=episode", "monitors.start_step=0")  # no validation to wait for: judged from step 0
    _, _, outcome, outcome_alerts = _run(tmp_path / "outcome", *common)
    _, _, verdict, verdict_alerts = _run(tmp_path / "verdict", *common, "+reward.per_role.evaluator={node: 1.0, traj: 0.0}")
    pushed = mean(m["role/evaluator/selection_length"] for m in outcome)
    pulled = mean(m["role/evaluator/selection_length"] for m in verdict)
    print(f"evaluator length pressure (tokens per unit advantage): outcome-paid {pushed:+.2f}, verdict-paid {pulled:+.2f}")
    assert pushed < 0 < pulled
    capture = [a for a in outcome_alerts if a["kind"] == "capture"]
    assert capture and capture[0]["role"] == "evaluator" and "toward generator's" in capture[0]["message"]
    # when it fired, the evaluator's verdicts had not shrunk yet: the warning came before the behaviour
    early = mean(m["role/evaluator/response_length"] for m in outcome[:5])
    at_alert = mean(m["role/evaluator/response_length"] for m in outcome[capture[0]["step"] - 4: capture[0]["step"] + 1])
    assert at_alert > 0.85 * early
    assert not [a for a in verdict_alerts if a["kind"] in ("capture", "length_drift")]
