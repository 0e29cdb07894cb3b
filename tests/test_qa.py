"""QA tasks (NQ, HotpotQA) on files in their published formats, EM and token F1 as SQuAD computes
them, and the BM25 retrieval tool over a passage corpus (index built once, then loaded)."""
import pytest

from harness.config import CellConfig
from harness.tasks import build_task
from harness.tasks.qa import exact_match, extract_qa_answer, normalize_answer, token_f1
from harness.tasks.retriever import BM25Retriever, CorpusError, retrieve
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"


def task_for(name, path):
    cfg = CellConfig()
    cfg.task, cfg.data.path, cfg.data.val_size = name, str(path), 1
    return build_task(cfg)


def test_em_and_f1_by_hand():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("the eiffel tower", ["Eiffel Tower"]) == 1.0 and exact_match("Paris", ["Eiffel Tower"]) == 0.0
    # prediction "eiffel tower in paris" (4 tokens) vs gold "eiffel tower" (2): common 2, P = 2/4, R = 2/2, F1 = 2/3
    assert token_f1("the Eiffel Tower in Paris", ["Eiffel Tower"]) == pytest.approx(2 / 3)
    # the best alias counts: "20 July 1969" vs "July 20, 1969" has all 3 tokens in common
    assert token_f1("20 July 1969", ["1969", "July 20, 1969"]) == pytest.approx(1.0)
    assert token_f1("no idea", ["Canberra"]) == 0.0 and token_f1("", [""]) == 1.0
    assert extract_qa_answer("Let me think.\nAnswer: Jane Austen") == "Jane Austen"
    assert extract_qa_answer("so it is \\boxed{\\text{Canberra}}") == "Canberra"
    assert extract_qa_answer("It was painted by\nLeonardo da Vinci") == "Leonardo da Vinci"


def test_nq_and_hotpotqa_fixtures_load_and_grade():
    nq = task_for("nq", FIXTURES / "nq_sample.jsonl")
    problems = nq.problems("train") + nq.problems("val")
    assert len(problems) == 5
    moon = next(p for p in problems if "moon" in p.question)
    assert nq.grade(moon, "Answer: July 20, 1969").correct and nq.grade(moon, "Answer: 1969").correct
    wrong = nq.grade(moon, "Answer: 21 July 1969")
    assert not wrong.correct and "F1 0.67" in wrong.reason and nq.f1(moon, "Answer: 21 July 1969") == pytest.approx(2 / 3)
    assert wrong.score == pytest.approx(2 / 3)  # the partial credit a reward.outcome_metric=f1 cell is paid
    assert nq.grade(moon, "Answer: 1969").score == 1.0 and nq.grade(moon, "no answer line").score == 0.0
    hotpot = task_for("hotpotqa", FIXTURES / "hotpotqa_sample.json")
    problems = {p.uid: p for p in hotpot.problems("train") + hotpot.problems("val")}
    protocol = problems["hotpotqa-5a8c7595554299585d9e36b6"]
    assert protocol.meta["supporting_facts"] == [("Kiss and Tell (1945 film)", 0), ("Shirley Temple", 0), ("Shirley Temple", 1)]
    assert protocol.meta["type"] == "bridge" and hotpot.grade(protocol, "Answer: chief of protocol").correct
    assert hotpot.grade(problems["hotpotqa-5a8b57f25542995d1e6f1371"], "Both are American.\nAnswer: Yes").correct


def test_bm25_finds_the_passage_and_caches_its_index(tmp_path):
    corpus = FIXTURES / "passages_sample.jsonl"
    first = BM25Retriever(corpus, cache=tmp_path)
    hits = first.search("Who was named Chief of Protocol of the United States?", k=2)
    assert hits[0]["title"] == "Shirley Temple" and hits[0]["score"] >= hits[-1]["score"] > 0
    assert first.search("capital of Australia", k=1)[0]["id"] == "canberra"
    second = BM25Retriever(corpus, cache=tmp_path)
    assert first.built and not second.built  # built once, then loaded from the cache
    assert second.search("Leonardo painted which portrait", k=1)[0]["id"] == "monalisa"
    assert first.search("the of and", k=3) == []  # stop words only
    assert retrieve("first humans on the Moon", str(corpus), "1").startswith("[1] Apollo 11: ")


def test_a_missing_or_bad_corpus_is_one_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        BM25Retriever(tmp_path / "none.jsonl", cache=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "fine"}\n{"id": 2}\n')
    with pytest.raises(CorpusError, match="line 2: a passage needs a non-empty 'text'"):
        BM25Retriever(bad, cache=tmp_path)


@pytest.mark.parametrize("task", ["nq", "hotpotqa"])
def test_a_qa_task_without_its_file_is_one_error(tmp_path, task):
    import subprocess

    from tests.conftest import python_cmd

    proc = subprocess.run(python_cmd() + [f"root={tmp_path}", f"task={task}", "scale=qwen3-tok"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"task {task} needs data.path" in proc.stderr and not any(tmp_path.iterdir())
