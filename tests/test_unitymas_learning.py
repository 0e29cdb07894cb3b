"""UnityMAS-O's workflows learn on the tiny model: A, B and C on qa-synth, D on code-synth, each a
short GRPO run under the paper's agents-to-models map (`sharing=paper`) from the scale's default
warm model. The task metric is the training batch's (F1 on qa-synth, all examples passed on
code-synth), the mean of the last steps against the first: every step draws 32 episodes, so a window
holds a few hundred, where the held-out validation (32 problems x 4) is too small to read a 40-step
change from. Validation before and after is printed beside it."""
from statistics import mean

import pytest

from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell

STEPS = 40
WINDOW = 10  # steps in each of the first and last windows
MARGIN = 0.05  # the task metric's rise, last window over the first (measured rises: 0.10 to 0.21)


@pytest.mark.parametrize("topology,task,metric", [
    ("qd_retrieve_answer", "qa-synth", "episode/f1"),            # A
    ("qd_retrieve_evidence_answer", "qa-synth", "episode/f1"),   # B
    ("mask_search", "qa-synth", "episode/f1"),                   # C: planner + answerer on one model
    # D: all examples passed. Open: upstream's plan-code-verify-reflect loop on the tests' pinned CPU kernels
    # rises less than the margin (0.519 -> 0.547 over 40 steps; validation 0.492 -> 0.508; docs/unitymas.md)
    pytest.param("reflective_code", "code-synth", "accuracy", marks=pytest.mark.xfail(
        reason="D's training batches rise less than the 0.05 margin in 40 steps on the pinned build (docs/unitymas.md)", strict=False)),
])
def test_a_workflow_learns_its_task(tmp_path, topology, task, metric):
    cfg = cell(tmp_path, f"topology={topology}", f"task={task}", "sharing=paper", "scale=tiny-s",
               f"steps={STEPS}", f"val_every={STEPS}", "val_problems=32")
    run_cell(cfg, log=lambda *_: None)
    rows = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS))
    first, last = mean(r[metric] for r in rows[:WINDOW]), mean(r[metric] for r in rows[-WINDOW:])
    before, after = [r[f"val/{metric}"] for r in rows if f"val/{metric}" in r]
    loops = {k: (round(rows[0][k], 2), round(rows[-1][k], 2)) for k in ("episode/rounds", "episode/searches") if k in rows[0]}
    print(f"{topology} on {task}: {metric} first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}; "
          f"validation {before:.3f} -> {after:.3f} {loops}")
    assert last - first >= MARGIN, (first, last)
