"""Every detector on constructed metric streams: it fires where it must, stays silent on clean
streams and on noise, and respects the monitor's debounce."""
import math
import random

from harness.config import MonitorConfig
from harness.monitors import Monitor, stop_reason
from harness.monitors.detectors import (AmplificationDetector, CaptureDetector, CollapseDetector,
                                        LengthDriftDetector, NonFiniteDetector)

CFG = MonitorConfig()
VOTING_IP = {"voter": ["voter"], "aggregator": ["aggregator"]}
VOTING_SP = {"voter": ["shared"], "aggregator": ["shared"]}


def stream(n, make):
    return [{"step": s, **make(s)} for s in range(n)]


def fired(detector, records):
    return [a for r in records for a in detector.observe(r)]


def voting_record(s, rng, voter_len=3.0, agg_len=2.0, agg_format=1.0, agg_grad_share=0.25, amp=2.4, coh=1.9,
                  per_policy=3):
    return {"role/voter/response_length": voter_len + rng.gauss(0, 0.05),
            "role/aggregator/response_length": agg_len + rng.gauss(0, 0.05),
            "role/voter/turn_share": 0.75, "role/aggregator/turn_share": 0.25,
            "role/voter/grad_share": 1 - agg_grad_share, "role/aggregator/grad_share": agg_grad_share,
            "role/voter/format_ok": 1.0, "role/aggregator/format_ok": agg_format,
            "role/voter/amplification": amp, "role/voter/coherence": coh,
            "role/voter/instances_per_policy": per_policy}


def test_amplification_fires_on_a_shared_adapter_only_after_patience():
    rng = random.Random(0)
    hot = stream(12, lambda s: voting_record(s, rng))
    alerts = fired(AmplificationDetector(CFG.amplification, VOTING_IP), hot)
    assert alerts and alerts[0].step == CFG.amplification.patience - 1 and alerts[0].role == "voter"
    assert alerts[0].policy == "voter" and "3 voter instances" in alerts[0].message
    # one policy per instance (ip_instance): no shared adapter, nothing to amplify
    control = stream(12, lambda s: voting_record(s, rng, amp=1.0, coh=1.0, per_policy=1))
    assert not fired(AmplificationDetector(CFG.amplification, VOTING_IP), control)
    # instances that cancel (low coherence) or a factor that dips every few steps
    cancel = stream(12, lambda s: voting_record(s, rng, coh=0.5))
    assert not fired(AmplificationDetector(CFG.amplification, VOTING_IP), cancel)
    flicker = stream(30, lambda s: voting_record(s, rng, amp=2.4 if s % 4 else 1.1))
    assert not fired(AmplificationDetector(CFG.amplification, VOTING_IP), flicker)


def test_capture_needs_dominance_and_a_victim():
    rng = random.Random(1)
    base = lambda s: voting_record(s, rng, agg_grad_share=0.25)
    captured = stream(10, base) + stream(20, lambda s: voting_record(
        s + 10, rng, agg_grad_share=0.05, agg_format=max(0.2, 1 - 0.1 * s)))
    for i, r in enumerate(captured):
        r["step"] = i
    alerts = fired(CaptureDetector(CFG.capture, VOTING_SP), captured)
    assert alerts and alerts[0].role == "aggregator" and alerts[0].policy == "shared"
    assert "voter takes" in alerts[0].message and "output contract" in alerts[0].message
    # the same dominance without any victim: silent
    dominant_only = stream(30, lambda s: voting_record(s, rng, agg_grad_share=0.05))
    assert not fired(CaptureDetector(CFG.capture, VOTING_SP), dominant_only)
    # under IP no policy is shared by two roles: nothing to capture
    assert not fired(CaptureDetector(CFG.capture, VOTING_IP), captured)


def test_capture_by_length_moving_toward_the_dominant_role():
    rng = random.Random(2)
    records = stream(10, lambda s: voting_record(s, rng, voter_len=8.0, agg_len=2.0, agg_grad_share=0.1))
    records += stream(20, lambda s: voting_record(s, rng, voter_len=8.0, agg_len=min(7.5, 2 + 0.6 * s),
                                                  agg_grad_share=0.1))
    for i, r in enumerate(records):
        r["step"] = i
    alerts = fired(CaptureDetector(CFG.capture, VOTING_SP), records)
    assert alerts and "toward voter's" in alerts[0].message


def test_length_drift_both_sides_silent_on_noise():
    rng = random.Random(3)
    clean = stream(200, lambda s: {"role/aggregator/response_length": 2.0 + rng.gauss(0, 0.3)})
    assert not fired(LengthDriftDetector(CFG.drift, VOTING_IP), clean)
    grow = stream(60, lambda s: {"role/aggregator/response_length": 2.0 + (0.3 * (s - 20) if s > 20 else 0)})
    alerts = fired(LengthDriftDetector(CFG.drift, VOTING_IP), grow)
    assert alerts and "grew" in alerts[0].message and alerts[0].value > 0 and 20 < alerts[0].step < 45
    shrink = stream(60, lambda s: {"role/voter/response_length": 12.0 - (0.5 * (s - 20) if s > 20 else 0)})
    alerts = fired(LengthDriftDetector(CFG.drift, VOTING_IP), shrink)
    assert alerts and "shrank" in alerts[0].message and alerts[0].value < 0


def test_collapse_from_running_best():
    accs = [0.3, 0.5, 0.6, 0.55, 0.35, 0.3, 0.3]
    records = [{"step": 10 * i, "val/accuracy": a} for i, a in enumerate(accs)]
    alerts = fired(CollapseDetector(CFG.collapse), records)
    assert [a.step for a in alerts][:1] == [50] and math.isclose(alerts[0].value, 0.3)
    noisy = [{"step": 10 * i, "val/accuracy": 0.5 + random.Random(i).uniform(-0.08, 0.08)} for i in range(50)]
    assert not fired(CollapseDetector(CFG.collapse), noisy)
    assert not fired(CollapseDetector(CFG.collapse), [{"step": s} for s in range(10)])


def test_non_finite():
    assert not fired(NonFiniteDetector(CFG.nonfinite), [{"step": 0, "loss": 0.1, "skipped_policies": 0.0}])
    alerts = fired(NonFiniteDetector(CFG.nonfinite), [{"step": 3, "loss": float("nan"), "skipped_policies": 1.0}])
    assert alerts and alerts[0].step == 3 and "loss" in alerts[0].message
    assert fired(NonFiniteDetector(CFG.nonfinite), [{"step": 4, "policy/voter/grad_norm": "inf"}])


def test_monitor_debounces_and_stops():
    rng = random.Random(4)
    cfg = MonitorConfig()
    cfg.amplification.action = "stop"
    monitor = Monitor(cfg, VOTING_IP)
    steps_fired = [a.step for s in range(60) for a in monitor.observe({"step": s, **voting_record(s, rng)})
                   if a.kind == "amplification"]
    assert steps_fired == [4, 29, 54]  # patience 5, then once per debounce window of 25
    alerts = Monitor(cfg, VOTING_IP)
    last = []
    for s in range(5):
        last = alerts.observe({"step": s, **voting_record(s, rng)})
    assert stop_reason(last).startswith("amplification: gradient amplification")
    # replay rebuilds the same state: the next step behaves as in an uninterrupted stream
    records = [{"step": s, **voting_record(s, random.Random(s))} for s in range(40)]
    straight = Monitor(cfg, VOTING_IP)
    expected = [a.step for r in records for a in straight.observe(r)]
    resumed = Monitor(cfg, VOTING_IP)
    resumed.replay(records[:17])
    assert [a.step for r in records[17:] for a in resumed.observe(r)] == [s for s in expected if s >= 17]
