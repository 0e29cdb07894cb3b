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


def test_the_study_reads_the_first_boxed_verdict_and_selection():
    """Upstream's parses (evaluator_optimizer_math_workflow.py l.183-194, voting_math_workflow.py
    l.158-184): the first box wins where the tolerant reading takes the last statement."""
    from harness.workflows.contracts import ACCEPT, REVISE, parse_index, parse_verdict, study_index, study_verdict

    restated = "At first I thought \\boxed{Incorrect}, but on checking again: \\boxed{Correct}"
    assert study_verdict(restated).verdict == REVISE and study_verdict(restated).malformed
    assert parse_verdict(restated, tolerant=True, unparsed=REVISE).verdict == ACCEPT
    assert study_verdict("The solution is right. \\boxed{correct}").verdict == ACCEPT  # any case
    none = study_verdict("looks fine to me")
    assert none.verdict == REVISE and none.fallback  # the study keeps refining an unreadable verdict
    assert study_index("Solution 2 is weaker; I pick \\boxed{3}. Not \\boxed{2}.", 3) == (2, True, False)
    assert study_index("\\boxed{3}", 3) == (2, False, False)
    assert study_index("\\boxed{12}, that is solution 2 ... \\boxed{3}", 3) == (1, True, False)  # out of range: the first digit
    assert study_index("\\boxed{7} ... \\boxed{3}", 3) == (0, True, True)  # the first digit (7) is out of range too
    assert study_index("no choice stated", 3) == (0, True, True)  # candidate 1, a fallback
    assert parse_index("\\boxed{7} ... \\boxed{3}", 3, tolerant=True, base=1)[0] == 2  # the last


def test_a_parse_the_harness_does_not_know_is_one_error(tmp_path):
    from harness.validation import ConfigError, load_config

    with pytest.raises(ConfigError, match="workflow.parse.*'guess'.*study, tolerant"):
        load_config(["workflow.parse=guess", f"root={tmp_path}"])
