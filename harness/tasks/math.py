"""Real math tasks: GSM8K, MATH/DAPO-style problems with \\boxed{} answers, and reasoning-gym's
offline generators. Answers are extracted per format and graded with math-verify (numbers,
fractions, LaTeX expressions); a failed grade says why (nothing found, unparseable, wrong).

Data comes from a local jsonl (`data.path`) or, on clusters with a hub cache, from `datasets`.
"""
from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from harness.tasks.base import Grade, Problem, Task

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_boxed(text: str) -> Optional[str]:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin:i - 1].strip() if depth == 0 else None


def normalize_number(text: str) -> str:
    value = text.replace(",", "").strip().rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", value):
        value = value.split(".")[0]
    return value


def extract_math_answer(text: str) -> Tuple[Optional[str], str]:
    """(answer, how): '#### X', else the last \\boxed{}, else the last number."""
    marked = re.findall(r"####\s*([^\n]+)", text)
    if marked:
        return normalize_number(marked[-1]), "####"
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    numbers = _NUMBER.findall(text)
    if numbers:
        return normalize_number(numbers[-1]), "last number"
    return None, "none"


def verify_math(gold: str, answer: str) -> Tuple[bool, str]:
    """math-verify equivalence of two answers (LaTeX or plain); (correct, reason if not)."""
    from math_verify import parse, verify

    gold_parsed = parse(f"\\boxed{{{gold}}}")
    parsed = parse(f"\\boxed{{{answer}}}")
    if not parsed:
        return False, f"unparseable answer {answer!r}"
    if not gold_parsed:  # a reference math-verify cannot read: compare as text
        return answer.strip() == gold.strip(), f"wrong answer {answer!r} != {gold!r}"
    return (True, "") if verify(gold_parsed, parsed) else (False, f"wrong answer {answer!r} != {gold!r}")


class MathTask(Task):
    kind = "math"

    def extract_answer(self, text: str) -> Optional[str]:
        return extract_math_answer(text)[0]

    def grade(self, problem: Problem, text: str) -> Grade:
        answer, how = extract_math_answer(text)
        if answer is None:
            return Grade(False, None, "no answer found (no '####', \\boxed{} or number)")
        correct, reason = verify_math(problem.answer, answer)
        return Grade(correct, answer, "" if correct else f"{reason} (found by {how})")


def read_jsonl(path: Path) -> List[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_rows(path: Path) -> List[dict]:
    """A dataset file as rows: JSON lines, or Parquet (the hub's format for DAPO-Math-17k and DeepCoder)."""
    if Path(path).suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    return read_jsonl(Path(path))


def _field(row: dict, *names: str):
    """The first of `names` the row has (datasets spell the same field Problem/problem/question)."""
    for name in names:
        if row.get(name) is not None:
            return row[name]
    raise KeyError(f"none of the fields {', '.join(names)}")


def split(items: List[Problem], val_size: int, seed: int) -> Dict[str, List[Problem]]:
    """A seeded, disjoint train/val split of one list (val at most a quarter)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    n_val = min(val_size, max(1, len(order) // 4))
    return {"val": order[:n_val], "train": order[n_val:]}


def hf_split_indices(n: int, test_size: float, seed: int) -> Tuple[List[int], List[int]]:
    """(train, test) row indices of Hugging Face datasets' `train_test_split(test_size, seed=seed)`:
    a PCG64 permutation, its first ceil(test_size * n) rows the test part (test_size < 1 is a
    fraction, >= 1 a count). The study split DAPO-Math-17k with (0.1, 42); DeepCoder's
    `shuffle(seed=42)` and first 1000 rows as test are the same permutation with test_size 1000."""
    import numpy as np

    n_test = math.ceil(test_size * n) if test_size < 1 else int(test_size)
    if not 0 < n_test < n:
        raise ValueError(f"data.test_size {test_size} leaves no train or no test part of {n} problems")
    permutation = np.random.default_rng(seed).permutation(n).tolist()
    return permutation[n_test:], permutation[:n_test]


def split_problems(items: List[Problem], data) -> Dict[str, List[Problem]]:
    """A task's train/val split as `data.split` says: the harness's seeded hold-out, or the study's
    Hugging Face split (validation on its test part, unless `data.val_path` gives a file)."""
    if data.split == "hf":
        train, test = hf_split_indices(len(items), data.test_size, data.split_seed)
        return {"val": [items[i] for i in test], "train": [items[i] for i in train]}
    return split(items, data.val_size, data.seed)


class _SplitTask(MathTask):
    def __init__(self, problems: List[Problem], data):
        if not problems:
            raise ValueError(f"task {self.name}: no problems loaded")
        self._splits = split_problems(problems, data)


class GSM8KTask(_SplitTask):
    """Grade-school math; the reference is the text after '#### ' in the answer field."""

    name = "gsm8k"

    def __init__(self, data):
        rows = read_jsonl(Path(data.path)) if data.path else _hub("openai/gsm8k", "main")
        problems = [Problem(f"gsm8k-{i}", row["question"], normalize_number(row["answer"].split("####")[-1]),
                            {"solution": row["answer"]}) for i, row in enumerate(rows)]
        super().__init__(problems, data)


class BoxedMathTask(_SplitTask):
    """MATH / DAPO-style: fields problem + answer, or problem + solution holding \\boxed{answer}."""

    name = "math"

    def __init__(self, data):
        if not data.path:
            raise ValueError("task math needs data.path: a jsonl with 'problem' and 'answer' or 'solution'")
        problems = []
        for i, row in enumerate(read_jsonl(Path(data.path))):
            answer = row.get("answer") or last_boxed(row.get("solution", ""))
            if answer is None:
                raise ValueError(f"{data.path} line {i + 1}: no 'answer' and no \\boxed{{}} in 'solution'")
            problems.append(Problem(f"math-{i}", row["problem"], str(answer).strip(), {}))
        super().__init__(problems, data)


# DAPO-Math-17k wraps each problem in its own instruction ("... of the form Answer: $Answer ...");
# the harness's prompts ask for \\boxed{}, so the loader keeps the problem between the two.
_DAPO_HEAD = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.S)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def dapo_problem(prompt) -> str:
    """The problem text of a DAPO prompt: the original's list of chat messages (its user message) or
    the processed set's string, without DAPO's answer-format instruction."""
    if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
        messages = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        prompt = next(m["content"] for m in messages if m.get("role") == "user")
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", str(prompt))).strip()


class DapoMathTask(_SplitTask):
    """DAPO-Math-17k (the study's math training set): `prompt` (chat messages, or a string in the
    processed set) and the integer answer in `reward_model.ground_truth` (or `solution`)."""

    name = "dapo-math"

    def __init__(self, data):
        problems = []
        for i, row in enumerate(read_rows(Path(data.path))):
            reward_model = row.get("reward_model") or {}
            answer = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
            answer = answer if answer is not None else row.get("solution")
            if answer is None:
                raise ValueError(f"{data.path} row {i + 1}: no reward_model.ground_truth and no solution")
            index = (row.get("extra_info") or {}).get("index", i) if isinstance(row.get("extra_info"), dict) else i
            problems.append(Problem(f"dapo-{index}", dapo_problem(row["prompt"]), str(answer).strip(),
                                    {"source": row.get("data_source", "dapo")}))
        super().__init__(problems, data)


class EvalMathTask(_SplitTask):
    """Evaluation sets with a short reference answer: AIME (`problem`/`Problem`, `answer`/`Answer`)
    and MATH-500 (`problem`, `answer`, `solution`, `subject`, `level`, `unique_id`)."""

    def __init__(self, name: str, data):
        self.name = name
        problems = []
        for i, row in enumerate(read_rows(Path(data.path))):
            try:
                question, answer = _field(row, "problem", "Problem", "question"), _field(row, "answer", "Answer")
            except KeyError as exc:
                raise ValueError(f"{data.path} row {i + 1}: {exc.args[0]}") from None
            uid = str(row.get("unique_id") or row.get("id") or row.get("ID") or f"{name}-{i}")
            problems.append(Problem(uid, str(question), str(answer).strip(),
                                    {k: row[k] for k in ("subject", "level", "year") if k in row}))
        super().__init__(problems, data)


class ReasoningGymTask(MathTask):
    """reasoning-gym's offline generators (gsm_symbolic, basic_arithmetic, chain_sum, ...),
    graded by the dataset's own `score_answer` on the extracted answer."""

    def __init__(self, generator: str, data):
        import reasoning_gym

        self.name = f"rg-{generator}"
        self.dataset = reasoning_gym.create_dataset(generator, size=data.rg_size, seed=data.seed)
        problems = [Problem(f"{self.name}-{i}", e["question"], str(e["answer"]), {"index": i})
                    for i, e in enumerate(self.dataset)]
        self._splits = split_problems(problems, data)

    def grade(self, problem: Problem, text: str) -> Grade:
        answer, how = extract_math_answer(text)
        if answer is None:
            return Grade(False, None, "no answer found (no '####', \\boxed{} or number)")
        score = self.dataset.score_answer(answer=answer, entry=self.dataset[problem.meta["index"]])
        return Grade(score >= 1.0, answer, "" if score >= 1.0 else f"score {score:.2f} for {answer!r} (found by {how})")


def _hub(name: str, config: str) -> List[dict]:
    """Cluster path: a dataset from the local `datasets` cache (never downloaded here)."""
    import os

    os.environ["HF_DATASETS_OFFLINE"] = "1"  # never a download at run time
    from datasets import load_dataset

    try:
        return list(load_dataset(name, config, split="train"))
    except Exception as exc:  # noqa: BLE001 - any cache miss reads the same to a user
        raise ValueError(f"no data.path given and the local `datasets` cache has no {name} ({type(exc).__name__}); "
                         f"give data.path=/path/to/file.jsonl") from None
