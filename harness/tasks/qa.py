"""Open-domain and multi-hop QA (UnityMAS-O's search workflows): NQ and HotpotQA in their published
formats, graded by exact match and token F1 after SQuAD's answer normalisation.

- NQ-open (`nq`): JSON lines `{"question": ..., "answer": [aliases...]}`.
- HotpotQA (`hotpotqa`): the JSON array of the distractor/fullwiki files (or JSON lines) with
  `_id`, `question`, `answer`, `supporting_facts` [[title, sentence index]], `context`
  [[title, [sentences]]], `type`, `level`; the supporting facts are kept with the problem.
A response states its answer as `Answer: ...` (the last such line), else `\\boxed{...}`, else its
last non-empty line.
"""
from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence

from harness.tasks.base import Grade, Problem, Task
from harness.tasks.math import last_boxed, split


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(g) for g in golds))


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """The best token-level F1 of the prediction against any gold answer (SQuAD's)."""
    def f1(pred: str, gold: str) -> float:
        p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
        common = sum((Counter(p) & Counter(g)).values())
        if not p or not g:
            return float(p == g)
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    return max((f1(prediction, g) for g in golds), default=0.0)


def extract_qa_answer(text: str) -> Optional[str]:
    stated = re.findall(r"^\s*\**answer\**\s*[:：]\s*(.+?)\s*$", text, re.I | re.M)
    if stated:
        return stated[-1].strip().strip("*").strip()
    boxed = last_boxed(text)
    if boxed:
        return re.sub(r"^\\text\{(.*)\}$", r"\1", boxed).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


class QATask(Task):
    kind = "qa"
    corpus: Optional[str] = None  # the passage corpus its search workflows retrieve from (JSONL)

    def search_hits(self, query: str, k: int = 2) -> str:
        """The top-k BM25 passages' texts for a query, joined; 'none' when nothing matches."""
        from harness.tasks.retriever import CorpusError, retriever_for

        if self.corpus is None:
            raise CorpusError(f"task {self.name} has no passage corpus to search: set data.corpus=/path/to/passages.jsonl")
        return " ".join(h["text"] for h in retriever_for(self.corpus).search(query, k)) or "none"

    def extract_answer(self, text: str) -> Optional[str]:
        return extract_qa_answer(text)

    def states_answer_exactly(self, text: str) -> bool:
        return re.search(r"^\s*answer\s*:", text, re.I | re.M) is not None

    def grade(self, problem: Problem, text: str) -> Grade:
        answer = self.extract_answer(text)
        if answer is None:
            return Grade(False, None, "no answer found", score=0.0)
        golds = problem.meta["answers"]
        if exact_match(answer, golds):
            return Grade(True, answer, score=1.0)
        f1 = token_f1(answer, golds)
        return Grade(False, answer, f"wrong answer {answer!r} (F1 {f1:.2f} against {golds[0]!r})", score=f1)

    def f1(self, problem: Problem, text: str) -> float:
        answer = self.extract_answer(text)
        return token_f1(answer, problem.meta["answers"]) if answer is not None else 0.0


def _rows(path: Path) -> List[dict]:
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class NQTask(QATask):
    name = "nq"

    def __init__(self, data):
        problems = []
        for i, row in enumerate(_rows(Path(data.path))):
            answers = row.get("answer") or row.get("answers")
            answers = [answers] if isinstance(answers, str) else list(answers or [])
            if not row.get("question") or not answers:
                raise ValueError(f"{data.path} row {i + 1}: NQ rows need 'question' and 'answer' (a list of aliases)")
            problems.append(Problem(f"nq-{row.get('id', i)}", row["question"], answers[0], {"answers": answers}))
        self._splits = split(problems, data.val_size, data.seed)
        self.corpus = data.corpus


class HotpotQATask(QATask):
    name = "hotpotqa"

    def __init__(self, data):
        problems = []
        for i, row in enumerate(_rows(Path(data.path))):
            try:
                question, answer = row["question"], row["answer"]
            except KeyError as exc:
                raise ValueError(f"{data.path} row {i + 1}: HotpotQA rows need 'question' and 'answer' ({exc})") from None
            problems.append(Problem(f"hotpotqa-{row.get('_id', i)}", question, answer, {
                "answers": [answer], "supporting_facts": [tuple(f) for f in row.get("supporting_facts", [])],
                "titles": [c[0] for c in row.get("context", [])], "type": row.get("type"), "level": row.get("level")}))
        self._splits = split(problems, data.val_size, data.seed)
        self.corpus = data.corpus


def search(query: str, task: QATask, k: int = 2) -> str:
    """The retrieval tool of the search workflows (A-C): the task corpus' top-k passages for a
    query, as text for the next role's prompt; 'none' for an empty query."""
    return task.search_hits(query, int(k)) if query.strip() else "none"
