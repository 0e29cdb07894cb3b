"""Real task loaders and graders on real files: GSM8K's test split, HumanEval from its package,
reasoning-gym generators, and small files in MATH's and MBPP's formats."""
import pytest

from harness.config import CellConfig
from harness.tasks import build_task
from harness.tasks.code import extract_code
from harness.tasks.math import extract_math_answer, last_boxed
from tests.conftest import REPO, SHARED

FIXTURES = REPO / "tests" / "fixtures"


def task_for(name, **data):
    cfg = CellConfig()
    cfg.task = name
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return build_task(cfg)


def test_gsm8k_all_1319_answers_extract_and_grade():
    task = task_for("gsm8k", path=str(SHARED / "data" / "gsm8k" / "test.jsonl"), val_size=200)
    problems = task.problems("train") + task.problems("val")
    assert len(problems) == 1319 and len(task.problems("val")) == 200
    assert not {p.uid for p in task.problems("train")} & {p.uid for p in task.problems("val")}
    for p in problems:
        float(p.answer)  # every reference is a number
        grade = task.grade(p, p.meta["solution"])  # the worked solution ends in '#### <answer>'
        assert grade.correct, (p.uid, grade)
    p = problems[0]
    assert task.grade(p, f"so the answer is \\boxed{{{p.answer}}}").correct
    wrong = task.grade(p, f"#### {float(p.answer) + 1}")
    assert not wrong.correct and wrong.reason.startswith("wrong answer") and "found by ####" in wrong.reason
    none = task.grade(p, "I do not know")
    assert not none.correct and none.parsed is None and none.reason.startswith("no answer found")


def test_boxed_math_with_math_verify():
    task = task_for("math", path=str(FIXTURES / "math_sample.jsonl"), val_size=2)
    by_question = {p.question: p for p in task.problems("train") + task.problems("val")}
    half = by_question["What is $\\frac{3}{6}$ in lowest terms?"]
    assert half.answer == "\\frac{1}{2}"
    assert task.grade(half, "The answer is \\boxed{0.5}").correct
    assert task.grade(half, "\\boxed{\\frac{2}{4}}").correct
    assert not task.grade(half, "\\boxed{\\frac{1}{3}}").correct
    root = by_question["Simplify $\\sqrt{8}$."]
    assert task.grade(root, "\\boxed{2\\sqrt{2}}").correct and not task.grade(root, "\\boxed{2\\sqrt{3}}").correct
    poly = by_question["Expand $(x+1)^2$."]
    assert task.grade(poly, "\\boxed{1 + 2x + x^2}").correct
    assert last_boxed("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_math_answer("no digits") == (None, "none")
    bad = task.grade(half, "\\boxed{\\frac{1}{}")
    assert not bad.correct and bad.reason


@pytest.mark.parametrize("name", ["rg-gsm_symbolic", "rg-basic_arithmetic", "rg-chain_sum"])
def test_reasoning_gym_items_score(name):
    task = task_for(name, rg_size=40, val_size=10)
    for p in task.problems("val"):
        assert task.grade(p, f"The answer is {p.answer}").correct, (p.question, p.answer)
        assert not task.grade(p, "The answer is 123456789").correct


def test_humaneval_task_grades_in_the_sandbox():
    task = task_for("humaneval", val_size=10)
    problems = task.problems("train") + task.problems("val")
    assert len(problems) == 164
    p = problems[0]
    assert task.grade(p, p.answer).correct  # a completion of the prompt
    whole = p.meta["prompt"] + p.answer
    assert task.grade(p, f"Here it is:\n```python\n{whole}\n```\n").correct  # a whole function, fenced
    wrong = task.grade(p, "    return None\n")
    assert not wrong.correct and wrong.reason


def test_mbpp_loader_and_per_test_results():
    task = task_for("mbpp", path=str(FIXTURES / "mbpp_sample.jsonl"), val_size=1)
    problems = {p.uid: p for p in task.problems("train") + task.problems("val")}
    assert sorted(problems) == ["mbpp-901", "mbpp-902", "mbpp-903", "mbpp-904"]
    vowels = problems["mbpp-903"]
    assert "Your code should pass: assert count_vowels('Sandbox') == 2" in vowels.question
    assert task.grade(vowels, f"```python\n{vowels.answer}\n```").correct  # setup code (LONG) is applied
    assert task.test_results(vowels, vowels.answer) == (3, 3)
    half_right = "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower()) if len(s) < 9 else 0"
    assert task.test_results(vowels, half_right) == (2, 3)
    assert not task.grade(vowels, half_right).correct


def test_code_extraction_and_the_synthetic_code_task():
    assert extract_code("x\n```python\ndef f():\n    return 1\n```\nthen\n```\nprint(2)\n```") == "print(2)"
    assert extract_code("x*3") == "x*3" and extract_code("   ") is None
    cfg = CellConfig()
    cfg.task = "code-synth"
    cfg.code_synth.n_train, cfg.code_synth.n_val = 60, 20
    task = build_task(cfg)
    for p in task.problems("val")[:10]:
        assert task.grade(p, p.answer).correct and task.grade(p, f"```\n{p.answer}\n```").correct
        assert not task.grade(p, "x*0 + 1000").correct
    assert not task.grade(task.problems("val")[0], "__import__('os')._exit(0)").correct
    default = CellConfig()
    default.task = "code-synth"
    full = build_task(default)  # the default size exists (distinct problems, disjoint splits)
    assert len(full.problems("train")) == 4000 and len(full.problems("val")) == 200
    assert not {p.question for p in full.problems("train")} & {p.question for p in full.problems("val")}


def test_eval_opt_cell_runs_on_the_synthetic_code_task(tmp_path):
    """Generator drafts a program, the evaluator judges it, the sandbox grades the final draft."""
    from harness.run_dir import read_jsonl
    from harness.run import run_cell, run_dir_of
    from tests.conftest import cell

    cfg = cell(tmp_path, "topology=eval_opt", "sharing=ip", "task=code-synth", "steps=3", "val_every=2",
               "val_problems=8", "samples_every=1")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    run = run_dir_of(cfg)
    metrics = read_jsonl(run.file("metrics.jsonl"))
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for role in ("generator", "evaluator"):
        assert metrics[0][f"role/{role}/turns"] > 0 and metrics[0][f"policy/{role}/grad_norm"] > 0
    assert 0.0 <= metrics[-1]["val/accuracy"] <= 1.0
    samples = read_jsonl(run.file("samples.jsonl"))
    assert {t["role"] for s in samples for t in s["turns"]} == {"generator", "evaluator"}
    assert samples and all(s["reference"].startswith("x") for s in samples)  # x+c / x-c / x*c
    for sample in samples:  # the graded answer is the generator's last draft
        assert sample["final"] == [t for t in sample["turns"] if t["role"] == "generator"][-1]["response"]
