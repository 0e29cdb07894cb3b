"""A generated multi-hop QA world that a tiny CPU model can learn to search (UnityMAS-O's search
workflows on a CPU).

People live in cities and work for one another; each fact is one passage of a JSONL corpus
("kamo lives in oslo.", "kamo works for tibe."), written once per world under the cache and
indexed by BM25 like any corpus. Questions, seeded:
- lookup: "where does kamo live?" -> oslo; "who is kamo's boss?" -> tibe (one hop);
- compare: "do kamo and tibe live in the same city?" -> yes / no (two facts, found in parallel);
- bridge: "where does kamo's boss live?" -> the boss's city (two hops: the second query needs the
  first answer, which iterative search finds and parallel decomposition cannot).
Each problem keeps its gold sub-queries and facts, so every search role's job can be checked:
a decomposer's sub-queries, a query that finds a needed fact, evidence that states the needed
facts, notes that keep them, a search that stops once the notes hold them all.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from harness.tasks.base import Problem
from harness.tasks.qa import QATask, normalize_answer

CITIES = ("oslo", "rome", "lima", "kiev", "baku", "doha", "riga", "suva")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
KINDS = ("lookup", "compare", "bridge")
SEARCH_WORKFLOWS = ("qd_retrieve_answer", "qd_retrieve_evidence_answer", "mask_search")
WORLD_SEED = 2468  # the world is fixed: every cell sees the same people, corpus and splits
Demo = Tuple[str, str]


def _names(n: int, rng: random.Random) -> List[str]:
    names = set()
    while len(names) < n:
        names.add("".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2)))
    return sorted(names)


def lives(name: str) -> str:
    return f"{name} lives"


def works(name: str) -> str:
    return f"{name} works"


class QASynthTask(QATask):
    name = "qa-synth"
    warmup_share = 1.0
    DEMONSTRATIONS_VERSION = 1  # part of the warm key: bump when `demonstrate` changes

    def __init__(self, cfg, cache: Optional[Path] = None):
        unknown = sorted(set(cfg.kinds) - set(KINDS))
        if unknown or not cfg.kinds:
            raise ValueError(f"qa_synth.kinds: unknown {unknown or 'empty list'}; valid choices: {', '.join(KINDS)}")
        if cfg.n_people < 4:
            raise ValueError("qa_synth.n_people must be at least 4")
        rng = random.Random(WORLD_SEED)
        self.people = _names(cfg.n_people, rng)
        self.city = {p: rng.choice(CITIES) for p in self.people}
        self.boss = {p: rng.choice([q for q in self.people if q != p]) for p in self.people}
        self.facts = {lives(p): f"{p} lives in {self.city[p]}." for p in self.people}
        self.facts.update({works(p): f"{p} works for {self.boss[p]}." for p in self.people})
        self.corpus = str(self._write_corpus(cache))
        self._splits = self._split(cfg, rng)

    def _split(self, cfg, rng: random.Random) -> Dict[str, List[Problem]]:
        """Every question of each kind, shuffled; validation takes its share of each kind (held
        out), training draws kinds evenly from the rest (a question may repeat, as a closed world's do)."""
        pools = {kind: self._questions(kind, rng) for kind in cfg.kinds}
        per_kind = -(-cfg.n_val // len(pools))
        if any(len(pool) <= per_kind for pool in pools.values()):
            raise ValueError(f"qa-synth: too few questions per kind for n_val={cfg.n_val}; raise qa_synth.n_people")
        val = [q for kind in cfg.kinds for q in pools[kind][:per_kind]][: cfg.n_val]
        train = [rng.choice(pools[kind][per_kind:]) for kind in [rng.choice(list(cfg.kinds)) for _ in range(cfg.n_train)]]
        return {"val": self._numbered(val, "v"), "train": self._numbered(train, "t")}

    @staticmethod
    def _numbered(problems: List[Problem], tag: str) -> List[Problem]:
        return [Problem(f"qa-synth-{tag}{i}", p.question, p.answer, p.meta) for i, p in enumerate(problems)]

    def _questions(self, kind: str, rng: random.Random) -> List[Problem]:
        questions = []
        for a in self.people:
            boss = self.boss[a]
            if kind == "lookup":
                questions.append(self._make(kind, f"where does {a} live?", self.city[a], [lives(a)]))
                questions.append(self._make(kind, f"who is {a}'s boss?", boss, [works(a)]))
            elif kind == "bridge":
                questions.append(self._make(kind, f"where does {a}'s boss live?", self.city[boss], [works(a), lives(boss)]))
                questions.append(self._make(kind, f"who is the boss of {a}'s boss?", self.boss[boss],
                                            [works(a), works(boss)]))
            else:
                for b in self.people:
                    if a < b:
                        answer = "yes" if self.city[a] == self.city[b] else "no"
                        questions.append(self._make(kind, f"do {a} and {b} live in the same city?", answer,
                                                    [lives(a), lives(b)]))
        if kind == "compare":  # as many yes as no
            yes = [q for q in questions if q.answer == "yes"]
            no = [q for q in questions if q.answer == "no"]
            rng.shuffle(no)
            questions = yes + no[: len(yes)]
        rng.shuffle(questions)
        return questions

    def _make(self, kind: str, question: str, answer: str, queries: List[str]) -> Problem:
        return Problem("", question, answer, {"answers": [answer], "kind": kind, "queries": queries,
                                              "facts": [self.facts[q] for q in queries]})

    def _write_corpus(self, cache: Optional[Path]) -> Path:
        """The world's passages, one a line, under <cache>/qa-synth/ (written atomically once)."""
        import hashlib
        import os
        import tempfile

        rows = [{"id": key.replace(" ", "-"), "title": key.split()[0], "text": text} for key, text in self.facts.items()]
        body = "".join(json.dumps(r) + "\n" for r in rows)
        root = Path(cache or os.environ.get("MARL_CACHE") or "~/.cache/marl-harness").expanduser() / "qa-synth"
        path = root / f"passages-{hashlib.sha256(body.encode()).hexdigest()[:16]}.jsonl"
        if not path.is_file():
            root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=root, prefix=".passages.")
            with os.fdopen(fd, "w") as handle:
                handle.write(body)
            os.replace(tmp, path)
        return path

    # -- what each search role's job is
    def found(self, problem: Problem, text: str) -> List[str]:
        """The problem's needed facts that a text states."""
        plain = normalize_answer(text)
        return [f for f in problem.meta["facts"] if normalize_answer(f) in plain]

    def query_of(self, problem: Problem, query: str) -> Optional[str]:
        """Which of the problem's needed sub-queries a query is (its words, normalised), or None."""
        for q in problem.meta["queries"]:
            if normalize_answer(query) == normalize_answer(q):
                return q
        return None

    def check_plan(self, problem: Problem, subtasks: List[str]) -> Optional[bool]:
        """A decomposer's sub-queries are exactly the problem's needed ones (any order)."""
        return sorted(normalize_answer(s) for s in subtasks) == sorted(normalize_answer(q) for q in problem.meta["queries"])

    def check_text(self, check: str, problem: Problem, text: str, fields: Dict[str, Any]) -> Optional[bool]:
        needed = problem.meta["facts"]
        if check == "evidence":  # every needed fact the passages hold, and nothing else
            shown = self.found(problem, str(fields.get("passages", "")))
            return bool(shown) and sorted(self.found(problem, text)) == sorted(shown) and \
                len([s for s in text.split(".") if s.strip()]) == len(shown)
        if check == "fact":  # a summary states one needed fact that the passages hold
            shown = self.found(problem, str(fields.get("passages", "")))
            return bool(shown) and normalize_answer(text) in [normalize_answer(f) for f in shown]
        if check == "notes":  # the update keeps the old notes' facts and adds the new evidence's
            kept = set(self.found(problem, str(fields.get("notes", ""))) + self.found(problem, str(fields.get("evidence", ""))))
            return set(self.found(problem, text)) == kept and len([s for s in text.split(".") if s.strip()]) == len(kept)
        if check == "search":  # planning and search: ask for a needed fact not yet in the notes, or stop when all are
            have = set(self.found(problem, str(fields.get("notes", ""))))
            if text == "STOP":
                return have == set(needed)
            query = self.query_of(problem, text.split(":", 1)[-1])
            return query is not None and self.facts[query] not in have and \
                self._askable(problem, query, have)
        raise ValueError(f"qa-synth cannot check '{check}'; valid: evidence, fact, notes, search")

    def _askable(self, problem: Problem, query: str, have: set) -> bool:
        """A bridge's second query names the boss, which only the first fact tells."""
        if problem.meta["kind"] != "bridge" or query == problem.meta["queries"][0]:
            return True
        return problem.meta["facts"][0] in have

    # -- warm-up: imperfect demonstrations of every search role (see harness/warmup.py). The warm-up
    # covers the shipped search workflows' roles (A-C) whatever the cell's topology: one warm model
    # per scale serves them all and the single-agent baseline, so paired cells start from one base.
    warmup_workflows = SEARCH_WORKFLOWS

    def demonstrate(self, template: str, prompts: Dict[str, str], problem: Problem, rng: random.Random) -> Optional[Demo]:
        """One demonstration of the role a template serves, right most of the time; None for a
        template this task cannot demonstrate."""
        q, queries, facts = problem.question, problem.meta["queries"], problem.meta["facts"]
        wrong = rng.random() < 0.3  # leave RL room on every role
        other = rng.choice(self.people)
        if template == "solver":
            answer = problem.answer if not wrong else rng.choice(CITIES + ("yes", "no"))
            return prompts[template].format(question=q), answer
        if template == "decomposer":
            plan = list(queries) if not wrong else [lives(other)] + list(queries[1:])
            return prompts[template].format(question=q), "; ".join(plan)
        if template in ("reader", "answerer"):  # answers from passages / evidence / notes
            shown = [self.search_hits(s) for s in (queries if rng.random() < 0.8 else [lives(other)])]
            answer = self._answer_from(problem, " ".join(shown)) if not wrong else rng.choice(CITIES)
            return prompts[template].format(question=q, passages=" ".join(shown)), answer
        if template == "extractor":
            passages = " ".join(self.search_hits(s) for s in queries)
            evidence = " ".join(self.found(problem, passages)) if not wrong else self.search_hits(rng.choice(queries), 1)
            return prompts[template].format(question=q, passages=passages), evidence or "none"
        rounds = rng.randrange(len(queries) + 1)  # where in the M-ASK loop this demonstration is
        notes = " ".join(facts[:rounds]) or "none"
        if template in ("planner", "searcher"):
            if template == "planner":
                rounds, notes = 0, "none"
            action = f"SEARCH: {queries[rounds]}" if rounds < len(queries) else "STOP"
            if wrong:
                action = "STOP" if action != "STOP" else f"SEARCH: {lives(other)}"
            fields = {"question": q} if template == "planner" else {"question": q, "notes": notes}
            return prompts[template].format(**fields), action
        if template == "summarizer":
            query = queries[min(rounds, len(queries) - 1)]
            passages = self.search_hits(query)
            fact = self.facts[query] if not wrong else passages.split(". ")[-1]
            return prompts[template].format(question=q, passages=passages), fact
        if template == "updater":
            new = facts[min(rounds, len(facts) - 1)]
            kept = " ".join(f for f in facts[:rounds] if f != new)
            reply = f"{kept} {new}".strip() if not wrong else new
            return prompts[template].format(notes=kept or "none", evidence=new), reply
        return None

    def _answer_from(self, problem: Problem, passages: str) -> str:
        """What a faithful reader answers from these passages (the right answer only if they hold it)."""
        if problem.meta["kind"] == "compare":
            cities = [normalize_answer(f).split()[-1] for f in self.found(problem, passages)]
            return ("yes" if cities[0] == cities[1] else "no") if len(cities) == 2 else random.Random(passages).choice(["yes", "no"])
        return problem.answer if len(self.found(problem, passages)) == len(problem.meta["facts"]) else \
            random.Random(passages).choice(CITIES if "live" in problem.question else self.people)

