"""RL actually learns on the embedded default: 100 real GRPO steps on the warm tiny model."""
import tempfile
from pathlib import Path
from statistics import mean

import pytest
from scipy import stats

from harness.run_dir import read_jsonl
from harness.run import run_cell, run_dir_of
from tests.conftest import cell, long_case

MARGIN = 0.05  # sampled reward, mean of the last 20 steps over the first 20


GAE = ("algo.adv_estimator=gae", "algo.lr=2e-3")  # PPO with a critic per policy (UnityMAS-O's estimator)


# Open: on the tests' pinned CPU kernels (harness/cpu_numerics.py) the warm tiny-m does not learn arith in 100
# steps: the sampled reward moves less than the spread of each step's problem draw (first 20 -> last 20 steps:
# single 0.250 -> 0.277, voting 0.216 -> 0.261, single with GAE 0.252 -> 0.258; greedy validation 0.38 -> 0.39
# over 150 steps; lr 3e-3 or four mini-batches a step did not help). Other builds of the same warm model did
# (0.36 -> 0.46): learning on arith at this scale depends on the build (docs/models.md).
ARITH_OPEN = long_case("the warm tiny-m does not learn arith in 100 steps on the pinned build (docs/models.md)")


@pytest.mark.parametrize("topology,sharing,task,extra", [
    pytest.param("single", "sp", "arith", (), marks=ARITH_OPEN),
    pytest.param("voting", "ip", "arith", (), marks=ARITH_OPEN),
    ("single", "sp", "code-synth", ()),
    pytest.param("single", "sp", "arith", GAE, marks=ARITH_OPEN),
    ("eval_opt", "ip", "arith", GAE)])
def test_reward_rises_over_100_steps(tmp_path, warm_model_dir, topology, sharing, task, extra):
    """code-synth: every answer is a program graded in the sandbox."""
    cfg = cell(tmp_path, f"topology={topology}", f"sharing={sharing}", f"task={task}", "steps=100",
               "samples_every=50", *extra)
    run_cell(cfg, log=lambda *_: None)
    metrics = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(100))
    rewards = [m["reward/mean"] for m in metrics]
    first, last = mean(rewards[:20]), mean(rewards[-20:])
    print(f"{topology}+{sharing} on {task} {' '.join(extra)}: reward first 20 {first:.3f}, last 20 {last:.3f}")
    if topology == "single":  # a clean baseline raises no alert
        assert read_jsonl(run_dir_of(cfg).file("alerts.jsonl")) == []
    assert last - first >= MARGIN, (first, last)


def held_out_correct(run: Path, problems: int = 256, samples: int = 8) -> tuple[list[int], list[int]]:
    """Correct samples per held-out problem, at the start and at the last step checkpoint, from one random stream."""
    from analysis.evaluate import Evaluator, base_model_dir, checkpoints_of, evaluation_problems
    from harness.run_dir import stored_cell_config
    from harness.sharing import PolicyMap
    from harness.workflows import build_workflow

    cfg = stored_cell_config(run)
    task, held_out = evaluation_problems(cfg, "validation")
    held_out = held_out[:problems]
    policy_map = PolicyMap.from_config(cfg, build_workflow(cfg, task).role_instances())
    last = [directory for name, directory, _ in checkpoints_of(run) if name.startswith("step_")][-1]
    with tempfile.TemporaryDirectory() as work:
        evaluator = Evaluator(cfg, task, base_model_dir(run), policy_map.policies, policy_map.policy_of, Path(work))
        try:
            start, _ = evaluator.correct_per_problem(held_out, samples, seed=97)
            evaluator.engine.load(last)
            trained, _ = evaluator.correct_per_problem(held_out, samples, seed=97)
        finally:
            evaluator.close()
    return start, trained


def test_single_agent_grpo_beats_its_start_on_held_out_arith(tmp_path, warm_model_dir):
    """The trained policy against its own start on the same held-out problems (arith's 200), 8 samples each from
    one random stream: a paired test, free of the per-step problem draw the windows above ride on. At 8 samples
    per problem a step; at the default 4 the gain after 100 steps is +0.018 (p = 0.13) on the pinned build
    (docs/models.md)."""
    cfg = cell(tmp_path, "topology=single", "sharing=sp", "task=arith", "steps=100", "algo.group_size=8",
               "samples_every=50", "val_every=50")
    run_cell(cfg, log=lambda *_: None)
    start, trained = held_out_correct(run_dir_of(cfg).path)
    p = stats.wilcoxon(trained, start, alternative="greater").pvalue
    drawn = 8 * len(start)
    print(f"held-out sampled accuracy over {len(start)} problems {sum(start) / drawn:.3f} -> "
          f"{sum(trained) / drawn:.3f} (Wilcoxon p = {p:.4f})")
    assert sum(trained) > sum(start) and p < 0.05
