"""A non-finite gradient skips that policy's optimizer step: nothing non-finite reaches the weights,
the other policies still train, and the monitor raises a non_finite alert."""
import math

import torch

from harness.config import MonitorConfig
from harness.monitors import Monitor
from tests.test_probe import _setup


def test_nan_advantage_skips_only_that_policy(tmp_path, warm_model_dir):
    cfg, engine, turns = _setup(tmp_path, warm_model_dir, "topology=voting", "sharing=ip")
    before = {p: [t.detach().clone() for t in engine.params[p]] for p in engine.policies}
    for t in turns:
        if t.role == "aggregator":
            t.advantage = float("nan")
    result = engine.update(turns)
    assert result.skipped == ["aggregator"] and "aggregator" not in result.policy_update_norm
    assert all(torch.equal(a, b) for a, b in zip(engine.params["aggregator"], before["aggregator"]))
    assert not all(torch.equal(a, b) for a, b in zip(engine.params["voter"], before["voter"]))
    assert all(torch.isfinite(t).all() for p in engine.policies for t in engine.params[p])
    assert all(t.grad is None for t in engine.params["aggregator"])
    record = {"step": 7, "loss": result.loss, "skipped_policies": float(len(result.skipped))}
    assert math.isnan(record["loss"])
    alerts = Monitor(MonitorConfig(), {"voter": ["voter"], "aggregator": ["aggregator"]}).observe(record)
    assert [a.kind for a in alerts] == ["non_finite"] and "1 policy step(s) skipped" in alerts[0].message
