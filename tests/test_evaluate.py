"""Checkpoint evaluation (analysis/evaluate.py) on a real tiny sweep: pass@k per checkpoint in the
trained, base and single-agent-transfer modes, damaged checkpoints reported and skipped, the
table in the sweep report."""
import itertools
import json
import subprocess
import sys

import pytest

from analysis.evaluate import evaluate_run, pass_at_k
from harness.run_dir import read_jsonl
from harness.run import run_cell
from reports.sweep_report import build_sweep_report
from tests.conftest import REPO, cell

EVALUATE = [sys.executable, "-m", "analysis.evaluate"]


def test_pass_at_k_is_the_chance_that_k_of_n_samples_hold_a_correct_one():
    for n, c, k in [(5, 2, 1), (5, 2, 3), (6, 0, 2), (4, 4, 4), (8, 3, 5)]:
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, warm_model_dir):
    root = tmp_path_factory.mktemp("eval")
    common = ("sweep=ev", "steps=4", "ckpt_every=2", "val_every=100", "samples_every=0", "algo.problems_per_step=4")
    for topology in ("single", "voting"):
        cfg = cell(root, f"topology={topology}", *common)
        assert run_cell(cfg, log=lambda *_: None) == "finished"
    return root / "ev"


def test_trained_base_and_transfer_modes_write_pass_at_k_per_checkpoint(sweep):
    voting = sweep / "voting-ip-arith-tiny-m-s0"
    trained = evaluate_run(voting, "trained", k=2, samples=4, problems=6, log=lambda *_: None)
    assert [r["checkpoint"] for r in trained] == ["step_0000002", "step_0000004", "best"]
    assert [r["step"] for r in trained[:2]] == [2, 4]
    for row in trained:
        assert row["status"] == "ok" and row["problems"] == 6 and row["samples"] == 4
        assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
    # the trajectories the study reads: early (the first checkpoint), best and terminal (the last), in full
    kept = sorted(p.name for p in (voting / "eval_trajectories").iterdir())
    assert kept == ["trained-validation-best-best.jsonl", "trained-validation-early-step_0000002.jsonl",
                    "trained-validation-terminal-step_0000004.jsonl"]
    early = read_jsonl(voting / "eval_trajectories" / kept[1])
    assert len(early) == 6 * 4 and all(e["step"] == 2 for e in early)  # every sampled episode
    assert {t["role"] for e in early for t in e["turns"]} == {"voter", "aggregator"}
    assert sum(e["correct"] for e in early) / 6 / 4 == pytest.approx(trained[0]["pass@1"])  # what was scored
    again = evaluate_run(voting, "trained", k=2, samples=4, problems=6, log=lambda *_: None)
    assert [r["pass@2"] for r in again] == [r["pass@2"] for r in trained]  # seeded: the same samples
    base = evaluate_run(voting, "base", k=2, samples=4, problems=6, log=lambda *_: None)
    assert [r["checkpoint"] for r in base] == ["base"] and "step" not in base[0]
    transfer = evaluate_run(voting, "single_agent_transfer", k=2, samples=4, problems=6, log=lambda *_: None)
    assert {r["source_run"] for r in transfer} == {"single-arith-tiny-m-s0"}
    assert [r["checkpoint"] for r in transfer] == ["step_0000002", "step_0000004", "best"]
    stored = read_jsonl(voting / "eval_results.jsonl")  # a re-run replaced its rows instead of adding
    assert len(stored) == 3 + 1 + 3 and {r["mode"] for r in stored} == {"trained", "base", "single_agent_transfer"}
    assert evaluate_run(sweep / "single-arith-tiny-m-s0", "single_agent_transfer", 1, 1, 2, log=lambda *_: None) == []


def test_a_damaged_checkpoint_is_reported_not_evaluated(sweep):
    single = sweep / "single-arith-tiny-m-s0"
    weights = single / "checkpoints" / "step_0000002" / "engine.safetensors"
    original = weights.read_bytes()
    try:
        weights.write_bytes(original[:-8] + b"damaged!")
        rows = evaluate_run(single, "trained", k=1, samples=1, problems=3, log=lambda *_: None)
    finally:
        weights.write_bytes(original)
    damaged = next(r for r in rows if r["checkpoint"] == "step_0000002")
    assert damaged["status"] == "damaged" and "checksum" in damaged["reason"] and "pass@1" not in damaged
    assert all(r["status"] == "ok" for r in rows if r["checkpoint"] != "step_0000002")


def test_the_cli_and_the_sweep_report(sweep):
    proc = subprocess.run(EVALUATE + [str(sweep), "--mode", "trained", "--k", "1", "--problems", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "single-arith-tiny-m-s0 trained step_0000004: pass@1" in proc.stdout
    for args, message in ((["--mode", "greedy"], "unknown mode 'greedy'; valid choices: trained, base"),
                          (["--k", "4", "--samples", "2"], "--samples >= k"),
                          (["--task", "aime"], "--task and --data-path go together")):
        bad = subprocess.run(EVALUATE + [str(sweep), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    empty = subprocess.run(EVALUATE + [str(sweep / "nothing-here")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "is not a directory" in empty.stderr
    index = build_sweep_report(sweep, run_reports=False)
    html, md = index.read_text(), (index.parent / "report.md").read_text()
    assert "Checkpoint evaluation" in html and "## Checkpoint evaluation (pass@k)" in md
    evaluated = [r for r in read_jsonl(sweep / "single-arith-tiny-m-s0" / "eval_results.jsonl") if r["status"] == "ok"]
    assert evaluated and all(f"{r['pass@1']:.3f}" in md for r in evaluated)


def test_a_gae_run_is_scored_like_any_other(tmp_path, warm_model_dir):
    """Evaluation rolls out and grades; a run trained with a critic per policy needs none to be scored."""
    cfg = cell(tmp_path, "topology=eval_opt", "algo.adv_estimator=gae", "steps=2", "ckpt_every=2", "val_every=100",
               "samples_every=0", "algo.problems_per_step=2")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    rows = evaluate_run(tmp_path / "default" / "eval_opt-ip-arith-tiny-m-s0", "trained", k=1, samples=2, problems=4,
                        log=lambda *_: None)
    assert [r["checkpoint"] for r in rows] == ["step_0000000", "step_0000002", "best"]
    assert {r["status"] for r in rows} == {"ok"}
    assert all(0.0 <= r["pass@1"] <= 1.0 for r in rows)


def test_evaluating_on_another_data_set(sweep, tmp_path):
    rows = [{"problem": f"{a}+{b}", "answer": str(a + b)} for a, b in [(3, 4), (10, 5), (7, 7)]]
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = evaluate_run(sweep / "single-arith-tiny-m-s0", "trained", k=1, samples=2, problems=10, task_name="math500",
                       data_path=str(path), log=lambda *_: None)
    assert {r["task"] for r in out} == {"math500"} and {r["problems"] for r in out} == {3}  # all of the file


def test_a_run_logged_before_the_paired_run_was_one_monitors_setting_still_loads(tmp_path):
    """cell.yaml files that kept the paired run under `monitors.amplification` (and `collapse`)."""
    from omegaconf import OmegaConf

    from harness.config import CellConfig
    from harness.run_dir import stored_cell_config

    stored = OmegaConf.to_container(OmegaConf.structured(CellConfig), enum_to_str=True)
    del stored["monitors"]["reference_run"]
    stored["monitors"]["amplification"]["reference_run"] = "/runs/repro/single-math-tiny-m-s0"
    stored["monitors"]["collapse"]["reference_run"] = "/runs/repro/single-math-tiny-m-s0"
    (tmp_path / "cell.yaml").write_text(OmegaConf.to_yaml(stored))
    assert stored_cell_config(tmp_path).monitors.reference_run == "/runs/repro/single-math-tiny-m-s0"


def test_a_resumed_evaluation_scores_only_the_checkpoints_without_a_row(sweep):
    """A killed evaluation job is run again with --resume: what was written stays, the rest is scored."""
    single = sweep / "single-arith-tiny-m-s0"
    first = evaluate_run(single, "trained", k=1, samples=2, problems=4, log=lambda *_: None, split="held_out")
    assert [r["checkpoint"] for r in first] == ["step_0000002", "step_0000004", "best"]
    assert evaluate_run(single, "trained", k=1, samples=2, problems=4, log=lambda *_: None, split="held_out",
                        resume=True) == []
    kept = [r for r in read_jsonl(single / "eval_results.jsonl") if r["checkpoint"] != "step_0000004"
            or r.get("split") != "held_out"]
    (single / "eval_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))  # as if killed
    again = evaluate_run(single, "trained", k=1, samples=2, problems=4, log=lambda *_: None, split="held_out",
                         resume=True)
    assert [r["checkpoint"] for r in again] == ["step_0000004"]
    assert again[0]["pass@1"] == next(r for r in first if r["checkpoint"] == "step_0000004")["pass@1"]
    held = [r for r in read_jsonl(single / "eval_results.jsonl") if r.get("split") == "held_out"]
    assert sorted(r["checkpoint"] for r in held) == ["best", "step_0000002", "step_0000004"]


def test_the_held_out_split_is_the_training_sets_own_not_the_validation_file(tmp_path):
    """full_matrix's math validates on AIME (data.val_path) while the study scores DAPO-Math's own held-out
    10%: --split held_out gives that part, --split validation the file."""
    from analysis.evaluate import evaluation_problems
    from tests.conftest import SHARED

    gsm8k = SHARED / "data" / "gsm8k" / "test.jsonl"
    lines = gsm8k.read_text().splitlines()
    val_file = tmp_path / "val.jsonl"
    val_file.write_text("\n".join(lines[:7]) + "\n")
    args = ("scale=qwen3-tok", "task=gsm8k", f"data.path={gsm8k}", "data.split=hf", "data.test_size=0.1",
            "data.split_seed=42", f"data.val_path={val_file}")
    _, validation = evaluation_problems(cell(tmp_path, *args), "validation")
    task, held_out = evaluation_problems(cell(tmp_path, *args), "held_out")
    assert len(validation) == 7 and len(held_out) == -(-len(lines) // 10)  # ceil(10%), as datasets' split
    assert not {p.question for p in held_out} & {p.question for p in task.problems("train")}  # never trained on
    assert {p.question for p in held_out} != {p.question for p in validation}
    with pytest.raises(ValueError, match="valid choices: validation, held_out"):
        evaluation_problems(cell(tmp_path, *args), "test")


def test_study_lengths_score_every_problem_at_the_studys_budgets_apart_from_the_runs(sweep, monkeypatch):
    """--lengths study: each reply at the study's evaluation budget for the task's kind (its values pinned to
    upstream below; small here so the tiny model's context holds it), every problem with --problems all;
    the rows record the budget, and scores at another budget neither replace them nor count for --resume."""
    import analysis.evaluate as evaluate
    from harness.run_dir import stored_cell_config

    single = sweep / "single-arith-tiny-m-s0"
    run_budget = stored_cell_config(single).workflow.max_new_tokens
    monkeypatch.setitem(evaluate.STUDY_EVAL_NEW_TOKENS, "math", run_budget + 3)
    quiet = {"log": lambda *_: None, "split": "held_out"}
    study = evaluate_run(single, "trained", 1, 1, None, lengths="study", **quiet)
    everything = len(evaluate.evaluation_problems(stored_cell_config(single), "held_out")[1])
    assert {r["max_new_tokens"] for r in study} == {run_budget + 3} and {r["problems"] for r in study} == {everything}
    assert evaluate_run(single, "trained", 1, 1, None, lengths="study", resume=True, **quiet) == []
    at_run = evaluate_run(single, "trained", 1, 1, None, lengths="run", resume=True, **quiet)
    assert [r["checkpoint"] for r in at_run] == ["step_0000002", "step_0000004", "best"]  # not counted as done
    stored = [r for r in read_jsonl(single / "eval_results.jsonl") if r["problems"] == everything]
    assert sorted(r["max_new_tokens"] for r in stored) == [run_budget] * 3 + [run_budget + 3] * 3  # both kept
    older = [{k: v for k, v in r.items() if not (k == "max_new_tokens" and v == run_budget)}  # rows from before
             for r in read_jsonl(single / "eval_results.jsonl")]                            # budgets were kept
    (single / "eval_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in older))
    assert evaluate_run(single, "trained", 1, 1, None, lengths="run", resume=True, **quiet) == []  # read as run's
    assert len(read_jsonl(single / "eval_results.jsonl")) == len(older)
    with pytest.raises(ValueError, match="lengths=study is the study's budgets for math and code; this run's task "
                                         "is qa"):
        evaluate.evaluation_budget(stored_cell_config(single), "qa", "study")


def test_the_studys_evaluation_budgets_are_upstreams():
    """dashboard/task_configs.py:35-42 (math) and 100-107 (code): every workflow's evaluation response
    length, the default of dashboard/evaluate_checkpoints.py (l.1245-1257, without --use-training-lengths)."""
    from analysis.evaluate import (STUDY_EVAL_NEW_TOKENS, STUDY_EVAL_PROMPT_TOKENS, apply_budget, evaluation_prompt_cap,
                                   options_problem)
    from harness.config import CellConfig

    assert STUDY_EVAL_NEW_TOKENS == {"math": 8192, "code": 5120}
    assert STUDY_EVAL_PROMPT_TOKENS == {  # (prompt, response) pairs of the same lines: the prompt caps
        "math": {"eval_opt": 30720, "voting": 25600, "orch_workers": 25600, "single": 15360},
        "code": {"eval_opt": 15360, "voting": 20480, "orch_workers": 20480, "single": 4096}}
    cfg = CellConfig(topology="voting")  # a code voting cell trained at the study's lengths, scored at its evaluation's
    cfg.workflow.max_new_tokens, cfg.data.max_prompt_length, cfg.verl.rollout_max_model_len = 2048, 10240, 12288
    apply_budget(cfg, 5120, evaluation_prompt_cap(cfg, "code", "study"))
    assert (cfg.workflow.max_new_tokens, cfg.data.max_prompt_length) == (5120, 20480)
    assert cfg.verl.rollout_max_model_len == 20480 + 5120
    assert evaluation_prompt_cap(cfg, "code", "run") == 20480  # the run's own (here as just set)
    assert "valid choices: run, study" in options_problem("trained", "held_out", 1, 1, None, lengths="long")
    assert options_problem("trained", "held_out", 1, 1, None, lengths="study") is None
    proc = subprocess.run(EVALUATE + ["/nonexistent", "--problems", "most"], capture_output=True, text=True)
    assert proc.returncode == 2 and "a number or all, got 'most'" in proc.stderr
