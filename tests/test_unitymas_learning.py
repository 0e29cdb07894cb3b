"""UnityMAS-O's workflows learn on the tiny model as `sweep=unitymas` trains them: A, B and C on
qa-synth, D on code-synth, each a short run under the paper's agents-to-models map (`sharing=paper`),
PPO with GAE over one-step turns and C's and D's upstream reward allocators (the sweep's own settings), from
the scale's default warm model. The task metric is the training batch's (F1 on qa-synth, all
examples passed on code-synth), the mean of the last steps against the first: every step draws 32
episodes, so a window holds a few hundred, where the held-out validation (32 problems x 4) is too
small to read a 40-step change from. Validation along the way is printed beside it. A rises in 40 steps
(`make test`); B, and C paid either way, take 120 and D does not rise in 120 (`make test-long`)."""
from statistics import mean

import pytest
from omegaconf import OmegaConf

from grid.launch import compose
from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell, long_case

STEPS, LONG = 40, 120
WINDOW = 10  # steps in each of the first and last windows
MARGIN = 0.05  # the task metric's rise, last window over the first (measured rises: 0.17 and 0.19)


def paper_settings(topology: str) -> list:
    """sweep=unitymas's training settings for one workflow, as overrides (its `cell.algo` and the
    workflow's `topology_cell`)."""
    sweep = compose(["sweep=unitymas"]).sweep
    algo = [f"algo.{k}={v}" for k, v in OmegaConf.to_container(sweep.cell.algo).items()]
    own = OmegaConf.to_container(sweep.get("topology_cell") or {}).get(topology) or {}
    return algo + [f"reward.{k}={v}" for k, v in (own.get("reward") or {}).items()]


@pytest.mark.parametrize("topology,task,metric,extra,steps", [
    ("qd_retrieve_answer", "qa-synth", "episode/f1", (), STEPS),            # A
    # C paid the harness's own way (its graph's node rewards beside the shared outcome): 0.206 -> 0.316 in 40 steps
    # on Intel's pinned kernels; on an AMD EPYC's 0.241 -> 0.259 in 40 and 0.241 -> 0.361 in 120 (docs/unitymas.md)
    pytest.param("mask_search", "qa-synth", "episode/f1", ("reward.allocator=null",), LONG,
                 id="mask_search-harness-rewards", marks=long_case()),
    # B, C under upstream's rewards and D: in 40 steps they rise less than the margin (B 0.247 -> 0.283, C 0.263 ->
    # 0.234, D 0.537 -> 0.584); in 120, B 0.247 -> 0.566 (validation 0.14 -> 0.55) and C 0.259 -> 0.341
    # (validation 0.16 -> 0.16) do, D 0.537 -> 0.541 does not (validation 0.49 -> 0.53; docs/unitymas.md)
    pytest.param("qd_retrieve_evidence_answer", "qa-synth", "episode/f1", (), LONG, marks=long_case()),
    pytest.param("mask_search", "qa-synth", "episode/f1", (), LONG, marks=long_case()),
    pytest.param("reflective_code", "code-synth", "accuracy", (), LONG, marks=long_case(
        "D rises less than the margin in 120 steps of the paper's training (docs/unitymas.md)")),
])
def test_a_workflow_learns_its_task(tmp_path, topology, task, metric, extra, steps):
    cfg = cell(tmp_path, f"topology={topology}", f"task={task}", "sharing=paper", "scale=tiny-s",
               f"steps={steps}", f"val_every={STEPS}", "val_problems=32", *paper_settings(topology), *extra)
    assert cfg.algo.adv_estimator == "gae" and cfg.algo.gae_scope == "turn"
    assert bool(cfg.reward.allocator) == (topology in ("mask_search", "reflective_code") and not extra)
    run_cell(cfg, log=lambda *_: None)
    rows = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(steps))
    first, last = mean(r[metric] for r in rows[:WINDOW]), mean(r[metric] for r in rows[-WINDOW:])
    validated = [r for r in rows if f"val/{metric}" in r]  # at the start, every STEPS steps and at the end
    assert [r["step"] for r in validated] == sorted({*range(0, steps, STEPS), steps - 1})
    validation = [round(r[f"val/{metric}"], 3) for r in validated]
    loops = {k: (round(rows[0][k], 2), round(rows[-1][k], 2)) for k in ("episode/rounds", "episode/searches") if k in rows[0]}
    print(f"{topology} on {task}: {metric} first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}; "
          f"validation every {STEPS} steps {validation} {loops}")
    assert last - first >= MARGIN, (first, last)
