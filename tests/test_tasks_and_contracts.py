import random

import pytest

from harness.config import ArithConfig
from harness.tasks.arith import ArithTask
from harness.workflows.contracts import ACCEPT, REVISE, parse_index, parse_subtasks, parse_verdict


@pytest.fixture(scope="module")
def task():
    return ArithTask(ArithConfig(n_train=500, n_val=50))


def test_arith_splits_are_seeded_disjoint_and_correct(task):
    again = ArithTask(ArithConfig(n_train=500, n_val=50))
    assert [p.question for p in task.problems("train")] == [p.question for p in again.problems("train")]
    train = {p.question for p in task.problems("train")}
    val = {p.question for p in task.problems("val")}
    assert len(train) == 500 and len(val) == 50 and not train & val
    for p in task.problems("val"):
        assert int(p.answer) == sum(int(t) for t in p.question.split("+"))
    with pytest.raises(ValueError, match="valid: val, train"):
        task.problems("test")


def test_arith_grading_and_extraction(task):
    p = task.problems("val")[0]
    assert task.grade(p, f"{p.answer}").correct
    assert task.grade(p, f"it is {p.answer}").correct
    wrong = task.grade(p, str(int(p.answer) + 1))
    assert not wrong.correct and "wrong answer" in wrong.reason
    none = task.grade(p, "no idea")
    assert not none.correct and none.parsed is None and none.reason == "no answer found"


def test_arith_decomposition(task):
    three = next(p for p in task.problems("train") if len(p.meta["terms"]) == 3)
    subtasks = task.decompose(three)
    assert len(subtasks) == 2 and task.check_plan(three, subtasks)
    assert not task.check_plan(three, subtasks[:1])
    assert not task.check_plan(three, ["hello"])
    assert task.grade_subtask(subtasks[0], task.solve_subtask(subtasks[0]))
    assert task.grade_subtask("nonsense", "3") is False
    rng = random.Random(0)
    assert all(task.wrong_answer(three, rng) != three.answer for _ in range(50))


def test_verdict_contract():
    assert parse_verdict("ACCEPT") == parse_verdict(" ACCEPT ")
    assert parse_verdict("ACCEPT").verdict == ACCEPT and not parse_verdict("ACCEPT").malformed
    v = parse_verdict("REVISE: too high", ["too high", "too low"])
    assert (v.verdict, v.feedback, v.malformed) == (REVISE, "too high", False)
    assert parse_verdict("REVISE: banana", ["too high", "too low"]).malformed
    for bad in ["", "maybe", "ACCEPT and more", "```python\nprint(1)\n```", "REVISE: ```x```"]:
        v = parse_verdict(bad, ["too high"])
        assert v.malformed and v.verdict == ACCEPT, bad


def test_index_and_subtask_contracts():
    # (meaning, malformed, fallback): the tiny contracts are exact, so malformed and fallback agree
    assert parse_index("2", 3) == (2, False, False)
    assert parse_index("3", 3) == (0, True, True)
    assert parse_index("one", 3) == (0, True, True)
    assert parse_subtasks("1+2; 3", 2, "q") == (["1+2", "3"], False, False)
    assert parse_subtasks("a;b;c", 2, "q") == (["a", "b"], True, False)  # too many: the first two kept
    assert parse_subtasks("  ", 2, "q") == (["q"], True, True)
