"""The SP/IP study's data, on small files in each dataset's published format: DAPO-Math-17k
(original and processed), AIME, MATH-500, DeepCoder (stdin/stdout and call-based tests, graded
in the sandbox), plus the Parquet the hub serves them in."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from harness.config import CellConfig
from harness.tasks import build_task
from harness.tasks.code import deepcoder_tests
from harness.tasks.math import dapo_problem
from tests.conftest import REPO, dry_run_cells, python_cmd

FIXTURES = REPO / "tests" / "fixtures"


def task_for(name, path, **data):
    cfg = CellConfig()
    cfg.task, cfg.data.path, cfg.data.val_size = name, str(path), 1
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return build_task(cfg)


def everything(task):
    return task.problems("train") + task.problems("val")


def test_dapo_math_keeps_the_problem_and_grades_its_integer_answer():
    task = task_for("dapo-math", FIXTURES / "dapo_math_sample.jsonl")
    problems = everything(task)
    assert len(problems) == 8 and len(task.problems("val")) == 1
    for p in problems:  # DAPO's own "Answer: $Answer" instruction is gone: our prompts ask for \boxed{}
        assert "Answer:" not in p.question and not p.question.startswith("Solve the following")
        assert task.grade(p, f"So the result is \\boxed{{{p.answer}}}.").correct
        assert not task.grade(p, f"\\boxed{{{int(p.answer) + 1}}}").correct
    triangle = next(p for p in problems if "triangle" in p.question)
    assert triangle.answer == "13" and triangle.uid.startswith("dapo-9a9b6eb4")
    processed = everything(task_for("dapo-math", FIXTURES / "dapo_math_processed_sample.jsonl"))
    assert {p.question for p in processed} <= {p.question for p in problems}  # the same problems as strings


def test_parquet_reads_like_jsonl(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "dapo_math_sample.jsonl").read_text().splitlines()]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    from_parquet = everything(task_for("dapo-math", tmp_path / "train.parquet"))
    from_jsonl = everything(task_for("dapo-math", FIXTURES / "dapo_math_sample.jsonl"))
    assert sorted((p.uid, p.question, p.answer) for p in from_parquet) == sorted(
        (p.uid, p.question, p.answer) for p in from_jsonl)


def test_aime_and_math500_load_and_grade_with_math_verify():
    aime = everything(task_for("aime", FIXTURES / "aime_sample.jsonl"))
    assert len(aime) == 4 and {p.answer for p in aime} == {"231", "124", "890", "25"}
    task = task_for("math500", FIXTURES / "math500_sample.jsonl")
    problems = {p.uid: p for p in everything(task)}
    assert len(problems) == 5 and problems["test/algebra/2592.json"].meta == {"subject": "Algebra", "level": 1}
    polar = problems["test/precalculus/807.json"]
    assert task.grade(polar, "Thus $\\boxed{(3, \\frac{\\pi}{2})}$.").correct  # equivalent LaTeX, not the same text
    assert not task.grade(polar, "\\boxed{(3, \\pi)}").correct
    assert task.grade(problems["test/prealgebra/1302.json"], "\\boxed{11\\sqrt{2}}").correct


def test_deepcoder_tests_of_every_format_run_in_the_sandbox():
    task = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl")
    rows = [json.loads(line) for line in (FIXTURES / "deepcoder_sample.jsonl").read_text().splitlines()]
    kinds = []
    for row in rows:
        problem = next(p for p in everything(task) if row["problem"] in p.question)
        kinds.append(problem.meta["kind"])
        right = task.grade(problem, f"Here is my solution:\n```python\n{row['solution']}```")
        wrong = task.grade(problem, f"```python\n{row['wrong']}```")
        assert right.correct, (row["problem"], right.reason)
        assert not wrong.correct and "wrong" in wrong.reason, (row["problem"], wrong.reason)
    assert kinds.count("stdio") == 3 and kinds.count("call") == 2
    two_sum = next(p for p in everything(task) if "twoSum" in p.question)
    assert "class Solution" in two_sum.question  # the starter code is shown


def test_deepcoder_programs_cannot_see_or_fake_the_expected_output():
    """The expected output stays in the harness: a program that prints its stdin, reads files or
    returns a lying object does not pass (all it can send back is a string or plain data)."""
    task = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl")
    adder = next(p for p in everything(task) if "Given two integers" in p.question)
    for attack in ("import sys\nprint(sys.stdin.read())",
                   "import os\nprint(os.listdir('/'))",
                   "class Eq(str):\n    def __eq__(self, other): return True\nprint(Eq('3'))",
                   "import builtins\nbuiltins.print = lambda *a, **k: None\n"):
        assert not task.grade(adder, f"```python\n{attack}\n```").correct, attack


def test_deepcoder_runs_under_the_studys_limits_a_test_at_most_3_s_and_a_problem_4_s_a_test_plus_5():
    """rllm/rewards/code_reward.py:249-266: 3 s a test, min(4 x tests + 5, 120) s of wall and CPU time for
    the problem, 4 GB. Two tests of 2.5 s each pass (5 s: a bound of 3 s on the whole problem, or a fixed
    wall limit under 5 s, would fail it); one test of 3.5 s fails as a timeout, though the problem's 13 s
    would hold it."""
    from dataclasses import replace

    from harness.tasks.base import Problem

    task = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl")
    problem = Problem("slow", "echo", "", {"kind": "stdio", "cases": [["1\n", "1\n"], ["2\n", "2\n"]], "fn": None})
    limits = task.limits_for(problem)
    assert (limits.wall_s, limits.cpu_s, limits.memory_mb, limits.call_s) == (13.0, 13, 4096, 3)
    assert task.limits_for(problem, 1).wall_s == 9.0 and task.limits_for(Problem(
        "many", "", "", {"kind": "stdio", "cases": [["", ""]] * 40, "fn": None})).wall_s == 120.0
    task.sandbox.limits = replace(task.sandbox.limits, wall_s=4.0)  # the sandbox's own limit no longer applies
    steady = task.grade(problem, "```python\nimport time\ntime.sleep(2.5)\nprint(input())\n```")
    assert steady.correct, steady.reason
    stuck = task.grade(problem, "```python\nimport time\nn = int(input())\ntime.sleep(3.5 * (n == 2))\nprint(n)\n```")
    assert not stuck.correct and stuck.reason == "timeout: a test ran over 3 s"


def test_deepcoder_questions_are_worded_as_the_study_words_them():
    """LiveCodeBench's wrapper, byte for byte as rllm/data/utils.py l.66-76 builds it (the study's
    question text); data.question_format=plain keeps the bare problem."""
    from harness.tasks.code import livecodebench_question

    assert livecodebench_question("Add two numbers.") == (
        "You are an expert Python programmer. You will be given a question (problem specification) and will generate "
        "a correct Python program that matches the specification and passes all tests.\n\nAdd two numbers.### Format: "
        "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample "
        "inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the "
        "inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n")
    wrapped = everything(task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl"))
    plain = everything(task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl", question_format="plain"))
    assert all(p.question.startswith("You are an expert Python programmer.") for p in wrapped)
    two_sum = next(p for p in wrapped if "twoSum" in p.question)
    assert "### Format: You will use the following starter code" in two_sum.question
    assert not any(p.question.startswith("You are an expert") for p in plain)


def test_the_runtime_filter_runs_before_the_split_as_the_studys(tmp_path):
    """Tests that failed in the study's runtime file are dropped, a problem left with none is
    dropped, and only then is the file split: which problems are held out depends on the filter."""
    rows = [json.loads(line) for line in (FIXTURES / "deepcoder_sample.jsonl").read_text().splitlines()]
    runtime = {"0": {"0": {"status": "passed"}, "1": {"status": "failed"}, "2": {"status": "passed"}},
               "1": {str(i): {"status": "timeout"} for i in range(10)}}
    (tmp_path / "runtime.json").write_text(json.dumps(runtime))
    base = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl", split="hf", test_size=2)
    kept = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl", split="hf", test_size=2,
                    runtime_results=str(tmp_path / "runtime.json"))
    assert len(everything(base)) == len(rows) and len(everything(kept)) == len(rows) - 1
    assert not any(rows[1]["problem"] in p.question for p in everything(kept))  # no passing test left
    adder = next(p for p in everything(kept) if rows[0]["problem"] in p.question)
    assert [case[0] for case in adder.meta["cases"]] == ["1 2\n", "1000000000 1000000000\n"]
    assert [p.question for p in kept.problems("val")] != [p.question for p in base.problems("val")]


def test_deepcoder_test_formats():
    kind, cases, name = deepcoder_tests(json.dumps([{"input": "[1,2]\n3", "output": "true", "testtype": "functional"}]),
                                        json.dumps({"func_name": "check"}))
    assert (kind, cases, name) == ("call", [([[1, 2], 3], True)], "check")
    kind, cases, name = deepcoder_tests({"inputs": ["1\n", "2\n"], "outputs": ["2\n", "4\n"]}, {})
    assert (kind, cases, name) == ("stdio", [("1\n", "2\n"), ("2\n", "4\n")], None)
    with pytest.raises(ValueError, match="function name"):
        deepcoder_tests([{"input": "1", "output": "1", "testtype": "functional"}], {})


def test_dapo_problem_reads_both_prompt_shapes():
    text = ("Solve the following math problem step by step. The last line of your response should be of the form "
            "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is 1+1?\n\n"
            "Remember to put your answer on its own line after \"Answer:\".")
    assert dapo_problem(text) == dapo_problem([{"role": "user", "content": text}]) == "What is 1+1?"


@pytest.mark.parametrize("task", ["dapo-math", "aime", "math500", "deepcoder"])
def test_a_study_task_without_its_file_is_one_error(tmp_path, task):
    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", f"task={task}", "scale=qwen3-tok"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"task {task} needs data.path" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.parametrize("n,test_size", [(57, 0.1), (23, 7)])
def test_the_hf_split_is_hugging_faces_train_test_split(n, test_size):
    """The study split DAPO-Math-17k with train_test_split(test_size=0.1, seed=42) and DeepCoder with
    shuffle(seed=42) and its first 1000 rows as test: the harness's split picks the same rows."""
    import datasets

    from harness.tasks.math import hf_split_indices

    table = datasets.Dataset.from_dict({"row": list(range(n))})
    want = table.train_test_split(test_size=test_size, seed=42)
    train, test = hf_split_indices(n, test_size, 42)
    assert (train, test) == (want["train"]["row"], want["test"]["row"])
    if isinstance(test_size, int):
        shuffled = table.shuffle(seed=42)["row"]
        assert (test, train) == (shuffled[:test_size], shuffled[test_size:])
    with pytest.raises(ValueError, match="no train or no test part"):
        hf_split_indices(5, 1000, 42)


def study_data_root(tmp_path):
    """The study's three files under a data root, in the hub's Parquet, made from the fixtures."""
    root = tmp_path / "data"
    root.mkdir()
    for fixture, name in (("dapo_math_processed_sample.jsonl", "dapo_math_17k_processed_en.parquet"),
                          ("aime_sample.jsonl", "aime_2025.parquet"),
                          ("deepcoder_sample.jsonl", "deepcoder_primeintellect.parquet")):
        rows = [json.loads(line) for line in (FIXTURES / fixture).read_text().splitlines() if line.strip()]
        pd.DataFrame(rows).to_parquet(root / name)
    return root


def test_full_matrix_without_the_data_lists_each_cells_missing_files_and_refuses_to_launch(tmp_path):
    launch = [sys.executable, "grid/launch.py", "sweep=full_matrix", f"root={tmp_path / 'runs'}"]
    env = {k: v for k, v in os.environ.items() if k != "MARL_DATA_ROOT"}
    dry = subprocess.run(launch + ["dry_run=true"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert dry.returncode == 0, dry.stderr
    rows = dry_run_cells(dry.stdout)
    assert len(rows) == 42
    for row in rows:
        files = (["deepcoder_primeintellect.parquet"] if "-deepcoder-" in row else
                 ["dapo_math_17k_processed_en.parquet", "aime_2025.parquet"])
        assert "missing data:" in row and all(f"$MARL_DATA_ROOT/{f}" in row for f in files), row
    refused = subprocess.run(launch + ["launcher=slurm"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "missing data files" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_full_matrix_on_the_study_files_under_a_data_root_dry_runs_clean_and_trains(tmp_path):
    """With the study's files (small ones, in their published formats) under a data root, the dry run
    of full_matrix at scale qwen3-tok is clean, and a voting/IP math cell trains 2 steps on DAPO-Math
    problems and validates on the AIME file."""
    root = study_data_root(tmp_path)
    base = [sys.executable, "grid/launch.py", "sweep=full_matrix", f"root={tmp_path / 'runs'}",
            f"sweep.cell.data.root={root}", "sweep.axes.scale=[qwen3-tok]"]
    dry = subprocess.run(base + ["dry_run=true"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    rows = dry_run_cells(dry.stdout)
    assert len(rows) == 14 and all(row.rstrip().endswith(" ok") for row in rows), dry.stdout
    small = ["sweep.axes.topology=[voting]", "sweep.axes.task=[math]", "sweep.axes.sharing=[ip]", "sweep.baseline=false",
             "sweep.cell.steps=2", "sweep.cell.algo.problems_per_step=2", "sweep.cell.algo.group_size=2",
             "sweep.cell.algo.ppo_mini_batch_size=2", "+sweep.cell.workflow.max_new_tokens=6", "sweep.cell.val_every=1",
             "+sweep.cell.report=false", "+sweep.cell.wandb={enabled:false}"]
    run = subprocess.run(base + small, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    cell_dir = tmp_path / "runs" / "full_matrix" / "voting-ip-dapo-math-qwen3-tok-s0"
    metrics = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all("val/accuracy" in m for m in metrics)
    samples = [json.loads(line) for line in (cell_dir / "samples.jsonl").read_text().splitlines()]
    dapo = {p.question for p in everything(task_for("dapo-math", FIXTURES / "dapo_math_processed_sample.jsonl"))}
    assert samples and all(s["question"] in dapo for s in samples)  # trained on the DAPO problems
    from harness.run_dir import stored_cell_config
    from harness.tasks import build_task as build

    stored = stored_cell_config(cell_dir)
    val = build(stored).problems("val")
    assert {p.answer for p in val} == {"231", "124", "890", "25"}  # the AIME file's problems, all of them
