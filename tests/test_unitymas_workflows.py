"""UnityMAS-O's workflows A-D (harness/workflows/graphs/): the generated QA world, the search and
free-text contracts, the loops' bounds (D stops when its code passes the shown examples, never past 3 rounds;
M-ASK stops on STOP, never past 3 searches), per-agent metrics, and every workflow training from
the CLI on the tiny model."""
import json
import random
import subprocess

import pytest
from omegaconf import OmegaConf

from harness.config import CodeSynthConfig, ConfigError, QASynthConfig, SandboxConfig
from harness.instrument.rollout import rollout_metrics
from harness.tasks.code import CodeSynthTask
from harness.tasks.qa_synth import QASynthTask
from harness.episodes import Generation
from harness.workflows.base import Agents, Scheduler
from harness.workflows.contracts import parse_search, parse_text
from harness.workflows.graph import GRAPH_DIR, GraphWorkflow, load_graph
from tests.conftest import REPO, cell, python_cmd


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return QASynthTask(OmegaConf.structured(QASynthConfig), tmp_path_factory.mktemp("cache"))


def test_the_qa_world_holds_out_its_validation_questions_and_answers_from_its_corpus(world):
    train = {p.question for p in world.problems("train")}
    val = world.problems("val")
    assert not train & {p.question for p in val}
    assert {p.meta["kind"] for p in val} == {"lookup", "compare", "bridge"}
    compare = [p for p in world.problems("train") if p.meta["kind"] == "compare"]
    assert 0.35 < sum(p.answer == "yes" for p in compare) / len(compare) < 0.65
    passages = [json.loads(line)["text"] for line in open(world.corpus)]
    for problem in val:
        assert all(fact in passages for fact in problem.meta["facts"])
        for query, fact in zip(problem.meta["queries"], problem.meta["facts"]):
            assert fact in world.search_hits(query, 2)  # BM25 finds each needed fact from its sub-query
    again = QASynthTask(OmegaConf.structured(QASynthConfig), None)
    assert [p.question for p in again.problems("val")] == [p.question for p in val]  # seeded world


def test_search_roles_are_judged_on_their_job(world):
    bridge = next(p for p in world.problems("val") if p.meta["kind"] == "bridge")
    first, second = bridge.meta["facts"]
    q1, q2 = bridge.meta["queries"]
    check = world.check_text
    assert check("search", bridge, f"SEARCH: {q1}", {"question": bridge.question})
    assert not check("search", bridge, f"SEARCH: {q2}", {"question": bridge.question})  # needs the first hop's answer
    assert check("search", bridge, f"SEARCH: {q2}", {"notes": first})
    assert not check("search", bridge, "STOP", {"notes": first})
    assert check("search", bridge, "STOP", {"notes": f"{first} {second}"})
    assert check("notes", bridge, f"{first} {second}", {"notes": first, "evidence": second})
    assert not check("notes", bridge, second, {"notes": first, "evidence": second})  # dropped a kept fact
    passages = f"{first} {second}"
    assert check("evidence", bridge, passages, {"passages": passages + " zzzz lives in oslo."})
    assert not check("evidence", bridge, first, {"passages": passages})
    assert world.check_plan(bridge, [q2, q1]) and not world.check_plan(bridge, [q1])


def test_search_and_text_contracts_parse_as_documented():
    assert parse_search("SEARCH: kamo lives") == parse_search("SEARCH:kamo lives")
    assert parse_search("SEARCH: kamo lives").query == "kamo lives"
    assert parse_search("STOP").stop and not parse_search("STOP").malformed
    garbled = parse_search("kamo lives")
    assert garbled.stop and garbled.fallback and garbled.malformed  # nothing readable stops the search
    tolerant = parse_search("I need the boss first.\nSEARCH: kamo works", tolerant=True)
    assert tolerant.query == "kamo works" and tolerant.malformed and not tolerant.fallback
    assert parse_text("kamo lives in oslo.") == ("kamo lives in oslo.", False, False)
    assert parse_text("  ") == ("", True, True)
    assert parse_text("a\nb")[1] and not parse_text("a\nb", tolerant=True)[1]


def _episode(workflow, problem, script, prompts=None):
    """One episode with scripted replies (reply = script(prompt)): the control flow alone, its turns
    rendered from `prompts` (default: the graph's own templates)."""
    def generate(policy, prompts, sampling):
        return [Generation([1], [2] * len(script(p).split()), script(p), False) for p in prompts]

    scheduler = Scheduler(generate)
    prompts = {**workflow.templates()} if prompts is None else prompts
    roles = [r.name for r in workflow.roles()]
    agents = Agents(scheduler, lambda role, i: role, prompts, {r: 16 for r in roles}, 1.0, False)
    return scheduler.run([workflow.episode(problem, agents)])[0]


@pytest.fixture(scope="module")
def code_task():
    return CodeSynthTask(OmegaConf.structured(CodeSynthConfig), OmegaConf.structured(SandboxConfig))


def _reflective(task):
    cfg = cell_free_workflow_cfg()
    return GraphWorkflow(task, cfg, load_graph(GRAPH_DIR / "reflective_code.yaml"))


def cell_free_workflow_cfg():
    from harness.config import WorkflowConfig

    return OmegaConf.structured(WorkflowConfig)


def _fixed_in_round_two(task, problem, wrong):
    """Scripted D replies: round 1 plans 'mul' and fails; the reflection names the rule, the next
    round's planner follows it and its coder passes. The run, not a model, ends the loop."""
    right = task.PLANS[problem.meta["op"]]

    def reply(prompt):
        if prompt.startswith("approach:"):
            return right if prompt.endswith(f"hint: {right}") else "mul"
        if prompt.startswith("reflect:"):
            return right
        return problem.answer if f"idea: {right}" in prompt else wrong

    return reply


def test_reflective_code_stops_when_its_code_passes_the_shown_examples_and_never_runs_past_three_rounds(code_task):
    """Upstream's loop: each round plans, codes and runs the code; a failed run is reflected on, and
    the reflection reaches the next round's planner, the last program the next coder."""
    workflow = _reflective(code_task)
    problem = code_task.problems("val")[0]
    wrong = code_task.wrong_answer(problem, random.Random(0))
    assert code_task.check_text("plan", problem, "mul", {}) is False  # this problem's rule is not a product

    def stubborn(prompt):  # a coder that never gets it right, whatever the plan says
        return "mul" if prompt.startswith(("approach:", "reflect:")) else wrong

    episode = _episode(workflow, problem, stubborn)
    assert episode.stats["rounds"] == 3
    assert [t.role for t in episode.turns] == ["planner", "coder"] + ["reflector", "planner", "coder"] * 2
    assert not episode.grade.correct
    reflections = [t for t in episode.turns if t.role == "reflector"]
    assert all(t.prompt.endswith("run: fail") for t in reflections)  # the reflector reads the jail's run
    assert [t.role_correct for t in reflections] == [False, False]  # it named the wrong operation
    planners = [t.prompt for t in episode.turns if t.role == "planner"]
    assert planners[0].endswith("hint: none") and planners[1].endswith("hint: mul")
    qwen3 = _episode(workflow, problem, stubborn, {**workflow.spec.prompts, **workflow.spec.prompt_sets["qwen3"]})
    coders = [t.prompt for t in qwen3.turns if t.role == "coder"]  # the real models' coder sees its last program
    assert "Previous attempt's code: none" in coders[0] and f"Previous attempt's code: {wrong}" in coders[1]

    right = code_task.PLANS[problem.meta["op"]]
    episode = _episode(workflow, problem, _fixed_in_round_two(code_task, problem, wrong))
    assert episode.stats["rounds"] == 2 and episode.grade.correct
    assert [t.role for t in episode.turns] == ["planner", "coder", "reflector", "planner", "coder"]
    assert [t.role_correct for t in episode.turns if t.role != "coder"] == [False, True, True]

    episode = _episode(workflow, problem, lambda p: right if p.startswith("approach:") else problem.answer)
    assert [t.role for t in episode.turns] == ["planner", "coder"] and episode.stats["rounds"] == 1


def test_mask_search_follows_the_notes_and_stops_within_three_searches(world):
    workflow = GraphWorkflow(world, cell_free_workflow_cfg(), load_graph(GRAPH_DIR / "mask_search.yaml"))
    bridge = next(p for p in world.problems("val") if p.meta["kind"] == "bridge")
    q1, q2 = bridge.meta["queries"]
    f1, f2 = bridge.meta["facts"]

    def faithful(prompt):
        if prompt.startswith("plan:"):
            return f"SEARCH: {q1}"
        if prompt.startswith("sum:"):
            return f1 if f1 in prompt else f2
        if prompt.startswith("note:"):
            notes, new = prompt[len("note: "):].split("\nnew: ")
            return new if notes == "none" else f"{notes} {new}"
        if prompt.startswith("next:"):
            return "STOP" if f2 in prompt else f"SEARCH: {q2}"
        return bridge.answer

    episode = _episode(workflow, bridge, faithful)
    assert episode.grade.correct and episode.stats["searches"] == 2
    assert [t.role for t in episode.turns] == ["planner", "summarizer", "updater", "answerer", "searcher",
                                               "summarizer", "updater", "answerer", "searcher"]  # an answer every round
    assert all(t.role_correct for t in episode.turns)
    never_done = _episode(workflow, bridge, lambda p: f"SEARCH: {q1}" if p.startswith(("plan:", "next:")) else "x")
    assert never_done.stats["searches"] == 3  # bounded: the first search and at most 2 more
    assert [t.role for t in never_done.turns][-2:] == ["updater", "answerer"]  # no query asked after the third answer

    metrics = rollout_metrics([episode, never_done])
    for key in ("episode/em", "episode/f1", "episode/searches", "role/searcher/calls", "role/planner/prompt_tokens",
                "role/updater/output_tokens", "role/answerer/advantage_mean", "role/summarizer/samples",
                "role/searcher/format_ok"):
        assert key in metrics, key
    assert metrics["episode/searches"] == 2.5 and metrics["role/searcher/calls"] == 2.0
    assert metrics["role/answerer/calls"] == 2.5


def test_cs_upstream_allocator_pays_each_answer_its_f1_and_each_round_its_gain(world):
    """reward.allocator=harness.allocators:mask_turn_level on C's real control flow, F1_r the token F1 of
    round r's answer: the answerer gets F1_r, the round's query, summary and notes update its gain over the
    round before, a searcher that stops 0; a malformed reply costs 1 (upstream's format reward)."""
    from harness.allocators import mask_turn_level

    workflow = GraphWorkflow(world, cell_free_workflow_cfg(), load_graph(GRAPH_DIR / "mask_search.yaml"))
    bridge = next(p for p in world.problems("val") if p.meta["kind"] == "bridge")
    q1, q2 = bridge.meta["queries"]
    half = f"{bridge.answer} extra words"  # a partial answer: F1 strictly between 0 and 1

    def two_rounds(prompt):
        if prompt.startswith("plan:"):
            return f"SEARCH: {q1}"
        if prompt.startswith("next:"):
            return f"SEARCH: {q2}" if "x2" not in prompt else "STOP"
        if prompt.startswith("note:"):
            return "x2" if "x1" in prompt else "x1"
        if prompt.startswith("answer:"):
            return bridge.answer if "x2" in prompt else half
        return "fact"

    episode = _episode(workflow, bridge, two_rounds)
    f1 = [t.stats["f1"] for t in episode.turns if t.role == "answerer"]
    assert 0 < f1[0] < 1 and f1[1] == 1.0 and episode.grade.correct  # the episode's answer is the last round's
    # planner, summarizer, updater, answerer | searcher (opens round 2), summarizer, updater, answerer | searcher (stops)
    gain = 1.0 - f1[0]
    assert mask_turn_level(episode, None) == pytest.approx([f1[0]] * 4 + [gain] * 3 + [1.0, 0.0])
    episode.turns[4].malformed = True
    assert mask_turn_level(episode, None)[4] == pytest.approx(gain - 1.0)

    def three_rounds(prompt):  # round 1 right, round 2 partial, round 3 right: a negative gain, then no query
        if prompt.startswith(("plan:", "next:")):
            return f"SEARCH: {q1}"
        if prompt.startswith("note:"):
            return {"none": "x1", "x1": "x2"}.get(prompt[len("note: "):].split("\n")[0], "x3")
        if prompt.startswith("answer:"):
            return half if "x2" in prompt else bridge.answer
        return "fact"

    three = _episode(workflow, bridge, three_rounds)
    assert [t.role for t in three.turns][-1] == "answerer" and three.stats["searches"] == 3
    loss = f1[0] - 1.0
    assert mask_turn_level(three, None) == pytest.approx([1.0] * 4 + [loss] * 3 + [f1[0]] + [-loss] * 3 + [1.0])
    stopping = _episode(workflow, bridge, lambda p: "STOP" if p.startswith(("plan:", "next:")) else bridge.answer)
    assert [t.stats.get("stop") for t in stopping.turns if t.role in ("planner", "searcher")] == [1.0, 1.0]
    assert mask_turn_level(stopping, None) == [0.0, 1.0, 1.0, 1.0, 0.0]  # a stopping planner is paid nothing
    with pytest.raises(ValueError, match="got role voter"):
        episode.turns[0].role = "voter"
        mask_turn_level(episode, None)


def test_parallel_retrieval_calls_the_tool_once_per_sub_query(world):
    workflow = GraphWorkflow(world, cell_free_workflow_cfg(), load_graph(GRAPH_DIR / "qd_retrieve_answer.yaml"))
    compare = next(p for p in world.problems("val") if p.meta["kind"] == "compare")
    seen = []

    def script(prompt):
        seen.append(prompt)
        return "; ".join(compare.meta["queries"]) if prompt.startswith("split:") else compare.answer

    episode = _episode(workflow, compare, script)
    assert all(fact in seen[-1] for fact in compare.meta["facts"])  # the reader saw both sub-queries' passages
    assert episode.grade.correct and episode.turns[0].role_correct


@pytest.mark.parametrize("overrides,message", [
    (("topology=mask_search", "task=arith"), "searches passages"),
    (("topology=reflective_code", "task=arith"), "use task code-synth, mbpp or deepcoder"),
    (("topology=voting", "task=qa-synth"), "use topology single"),
    (("topology=qd_retrieve_answer", "sharing=partial", "task=qa-synth"), "declares none"),
    (("topology=eval_opt", "sharing=partial"), "declares none"),
])
def test_workflows_and_tasks_that_do_not_fit_are_one_clear_error(tmp_path, overrides, message):
    result = subprocess.run(python_cmd() + [f"root={tmp_path}", *overrides], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not any(tmp_path.iterdir())


def test_nq_search_needs_its_corpus(tmp_path):
    fixture = REPO / "tests" / "fixtures" / "nq_sample.jsonl"
    base = [f"root={tmp_path}", "topology=qd_retrieve_answer", "task=nq", "scale=qwen3-tok", f"data.path={fixture}"]
    for extra, message in (((), "needs data.corpus="), (("data.corpus=/nowhere.jsonl",), "does not exist")):
        result = subprocess.run(python_cmd() + base + list(extra), cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def _check_run(run, topology, task, sharing, steps=3):
    """A finished run's per-agent UnityMAS-O metrics, its task metric and its loop counts."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "accuracy" in r] == list(range(steps))
    from harness.workflows import build_workflow

    roles = [r.name for r in build_workflow(cell(run.parent, f"topology={topology}", f"task={task}",
                                                 f"sharing={sharing}")).roles()]
    for role in roles:
        for name in ("reward", "advantage_mean", "samples", "prompt_tokens", "output_tokens", "calls", "format_ok"):
            assert f"role/{role}/{name}" in rows[-1], (role, name)
    episode_key = "episode/rounds" if topology == "reflective_code" else "episode/f1"
    assert episode_key in rows[-1] and f"val/{episode_key}" in rows[-1]
    if topology == "reflective_code":
        assert all(1 <= r["episode/rounds"] <= 3 for r in rows if "episode/rounds" in r)
    if topology == "mask_search":
        assert all(1 <= r["episode/searches"] <= 3 for r in rows if "episode/searches" in r)


# The mechanics, not the learning (the README's sweep measures that): a short warm-up, shared by the
# CLI runs and the SLURM sweep's cells of the same task.
WARMUP = "model.warmup_steps=300"


# ip for all four runs in the SLURM sweep test below; partial here (D's loop bounds: the scripted test above)
@pytest.mark.parametrize("topology,task,sharing", [("mask_search", "qa-synth", "partial")])
def test_workflows_train_from_the_cli(tmp_path, topology, task, sharing):
    result = subprocess.run(python_cmd() + [f"root={tmp_path}", f"topology={topology}", f"task={task}",
                                            f"sharing={sharing}", "scale=tiny-s", "steps=3", "val_every=3", WARMUP,
                                            "val_problems=8", "progress=false", "wandb.enabled=false", "cell_id=c"],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_run(tmp_path / "default" / "c", topology, task, sharing)


def test_unitymas_sweep_runs_on_slurm_and_its_report_shows_the_four_workflows(tmp_path):
    from playwright.sync_api import sync_playwright

    from reports.screenshots import find_chromium
    from tests.test_grid_slurm import launch

    started = subprocess.run(["bash", "slurm/local-cluster.sh", "start"], cwd=REPO, capture_output=True, text=True,
                             timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    result = launch(tmp_path, "sweep=unitymas_grpo", "sweep.axes.scale=[tiny-s]", "sweep.axes.sharing=[ip]",
                    "sweep.cell.steps=3", "sweep.cell.val_every=3", "sweep.cell.val_problems=8", f"+sweep.cell.{WARMUP}",
                    "wait=true",
                    timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted 6 cells to SLURM" in result.stdout and "summary: 6 finished" in result.stdout, result.stdout
    report = tmp_path / "unitymas_grpo" / "report" / "index.html"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(report.as_uri())
        text = page.inner_text("body")
        browser.close()
    section = text.split("Workflows: task metric and rounds")[1].split("Failure modes")[0]
    for topology in ("qd_retrieve_answer", "qd_retrieve_evidence_answer", "mask_search", "reflective_code"):
        assert f"{topology}-ip-" in section, topology
        task = "code-synth" if topology == "reflective_code" else "qa-synth"
        _check_run(tmp_path / "unitymas_grpo" / f"{topology}-ip-{task}-tiny-s-s0", topology, task, "ip")
    # 3 steps a cell: the first step against the last (never the same steps twice)
    assert "EM first 1" in section and "F1 last 1" in section and "rounds first 1" in section
    assert "all passed first 1" in section and "first vs last 1 steps" in section
    # UnityMAS-O's results table: workflow x sharing rows, the headline metric before training and its peak per scale
    paper = text.split("Workflows as UnityMAS-O reports them")[1].split("Loop rounds over training")[0]
    assert "tiny-s before" in paper and "tiny-s peak" in paper and "all passed" in paper and "F1" in paper, paper
    assert all(topology in paper for topology in ("qd_retrieve_answer", "mask_search", "reflective_code"))
    assert "## Workflows as UnityMAS-O reports them" in (report.parent / "report.md").read_text()
    # the loops' length over training: the sweep's figure and the run reports' of the looping workflows
    assert "Loop rounds over training" in text and (report.parent / "loops.png").stat().st_size > 5000
    for looping in ("reflective_code-ip-code-synth-tiny-s-s0", "mask_search-ip-qa-synth-tiny-s-s0"):
        run_report = tmp_path / "unitymas_grpo" / looping / "report"
        assert (run_report / "loops.png").is_file() and "Loop rounds over training" in (run_report / "index.html").read_text()
    assert not (tmp_path / "unitymas_grpo" / "qd_retrieve_answer-ip-qa-synth-tiny-s-s0" / "report" / "loops.png").exists()


def test_a_graph_brings_its_reward_weights_and_the_cell_overrides_them(tmp_path):
    cfg = cell(tmp_path, "topology=mask_search", "task=qa-synth", "+reward.per_role={summarizer:{node:0.2,turn:0.1}}")
    assert cfg.reward.per_role["summarizer"] == {"node": 0.2, "turn": 0.1}  # the cell's win
    assert cfg.reward.per_role["updater"] == {"node": 0.5} and "answerer" not in cfg.reward.per_role
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="rewards: judge must be a role"):
        from harness.workflows.graph import parse_graph

        parse_graph({"roles": {"a": {}}, "nodes": {"n": {"role": "a"}}, "final": "n", "rewards": {"judge": {"node": 1}}})


def test_on_qwen3_scales_the_workflows_take_the_real_models_wording_on_hotpotqa(tmp_path):
    """The GPU-cluster configuration, validated on the CPU: HotpotQA's format with a BM25 corpus, and
    every graph's qwen3 prompts (the real models' wording) in place of the tiny ones."""
    from harness.tasks import build_task
    from harness.tasks.qa import search
    from harness.workflows import build_workflow

    fixtures = REPO / "tests" / "fixtures"
    data = [f"data.path={fixtures / 'hotpotqa_sample.json'}", f"data.corpus={fixtures / 'passages_sample.jsonl'}",
            "data.val_size=1"]
    for topology, role, wording in (("mask_search", "searcher", "Decide the next step"),
                                    ("qd_retrieve_evidence_answer", "extractor", "Copy the sentences"),
                                    ("qd_retrieve_answer", "decomposer", "Break the question")):
        cfg = cell(tmp_path, f"topology={topology}", "task=hotpotqa", "scale=qwen3-tok", "sharing=ip", *data)
        templates = build_workflow(cfg).templates()
        assert cfg.workflow.prompt_set == "qwen3" and templates[role].startswith(wording), topology
    hits = search("Scott Derrickson nationality", build_task(cfg))  # BM25 over the corpus the cell names
    assert hits.startswith("Scott Derrickson (born July 16, 1966) is an American director")


def test_ds_upstream_allocator_pays_each_round_its_gain_and_the_reflector_the_next_rounds(code_task):
    """reward.allocator=harness.allocators:code_turn_level on D's real control flow, R_i the share of the
    problem's tests round i's program passes (as upstream's verifier counts them): a loop that fixes
    the program in round 2 pays round 1 its pass rate, the reflection and round 2 the gain; a
    malformed reply costs 1 (upstream's format reward); a loop that never improves pays its first
    round's rate and nothing after."""
    from harness.allocators import code_turn_level

    workflow = _reflective(code_task)
    problem = next(p for p in code_task.problems("val") if p.meta["op"] != "*")  # round 1's plan ('mul') is wrong
    shown = tuple(x for x, _ in problem.meta["tests"][:2])
    wrong = f"{problem.answer} if x not in {shown} else -1"  # right on the 3 hidden tests only
    right = code_task.PLANS[problem.meta["op"]]
    rate = _share(wrong, problem)
    assert rate == 0.6
    episode = _episode(workflow, problem, _fixed_in_round_two(code_task, problem, wrong))
    assert [t.role for t in episode.turns] == ["planner", "coder", "reflector", "planner", "coder"]
    assert [t.stats["pass_rate"] for t in episode.turns if t.role == "coder"] == [rate, 1.0]
    assert code_turn_level(episode, None) == pytest.approx([rate, rate, 1 - rate, 1 - rate, 1 - rate])
    episode.turns[3].malformed = True
    assert code_turn_level(episode, None) == pytest.approx([rate, rate, 1 - rate, -rate, 1 - rate])
    first_try = _episode(workflow, problem, lambda p: right if p.startswith("approach:") else problem.answer)
    assert code_turn_level(first_try, None) == [1.0, 1.0]
    never = _episode(workflow, problem, lambda p: "mul" if p.startswith(("approach:", "reflect:")) else wrong)
    assert code_turn_level(never, None) == pytest.approx([rate, rate] + [0.0] * 6)


def _share(expression: str, problem) -> float:
    """The share of the problem's tests `f(x) = <expression>` passes, computed here (our own generator's
    arithmetic), not by the sandbox."""
    tests = problem.meta["tests"]
    return sum(eval(expression, {"x": x}) == y for x, y in tests) / len(tests)  # noqa: S307 - trusted


def test_d_trains_as_upstream_does_per_turn_gae_on_its_turn_level_rewards(tmp_path):
    from harness.run import run_cell, run_dir_of
    from harness.run_dir import read_jsonl

    cfg = cell(tmp_path, "topology=reflective_code", "task=code-synth", "sharing=paper", "scale=tiny-s", "steps=2",
               "val_every=100", "algo.adv_estimator=gae", "algo.gae_scope=turn",
               "reward.allocator=harness.allocators:code_turn_level")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    rows = read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))
    for row in rows:  # each turn its own one-step episode: advantage = the allocator's reward - the value
        for role in ("planner", "coder", "reflector"):
            if f"role/{role}/adv_mean" in row:
                gap = row[f"role/{role}/adv_mean"] - (row[f"role/{role}/reward"] - row[f"role/{role}/value"])
                assert abs(gap) < 1e-6, (role, gap)
    assert {"role/planner/adv_mean", "role/coder/adv_mean"} <= set(rows[-1])


def test_ds_verification_runs_the_shown_example_in_the_jail_and_the_grade_runs_all(code_task):
    from harness.tasks.code import run_shown
    from tests.test_study_data import FIXTURES, everything, task_for

    deepcoder = task_for("deepcoder", FIXTURES / "deepcoder_sample.jsonl")
    for row in (json.loads(line) for line in (FIXTURES / "deepcoder_sample.jsonl").read_text().splitlines()):
        problem = next(p for p in everything(deepcoder) if row["problem"] in p.question)
        assert deepcoder.shown_checks(problem).startswith(f"_CASES = {problem.meta['cases'][:1]!r}")
        assert run_shown(f"```python\n{row['solution']}```", problem, deepcoder) == "pass"
        assert run_shown("?", problem, deepcoder) == "none"
    problem = code_task.problems("val")[0]
    assert run_shown(problem.answer, problem, code_task) == "pass"
    assert run_shown(code_task.wrong_answer(problem, random.Random(1)), problem, code_task) == "fail"


def test_a_prompt_override_from_the_command_line_reaches_a_built_in_graphs_own_template(tmp_path):
    from harness.controller import Controller
    from harness.sharing import PolicyMap
    from harness.tasks import build_task
    from harness.workflows import build_workflow

    cfg = cell(tmp_path, "topology=mask_search", "task=qa-synth", "workflow.prompts.planner='first query for: {question}'")
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances(), workflow.sharing_maps())
    prompts = Controller(cfg, task, workflow, policy_map, None).prompts  # what the cell's turns render from
    problem = task.problems("val")[0]
    episode = _episode(workflow, problem, lambda p: "STOP", prompts)
    planner, summarizer = episode.turns[0], episode.turns[1]
    assert planner.role == "planner" and planner.prompt == f"first query for: {problem.question}"
    assert summarizer.prompt.startswith(f"sum: {problem.question}\n")  # the graph's other templates as they were
    assert cfg.workflow.prompts["planner"] == "first query for: {question}"  # cell.yaml records the override


def test_a_prompt_override_naming_no_template_of_the_graph_is_one_error_naming_its_templates(tmp_path):
    with pytest.raises(ConfigError, match="workflow.prompts.planer: workflow graph mask_search has no prompt template "
                                          "'planer'; its templates: answerer, planner, searcher, summarizer, updater"):
        cell(tmp_path, "topology=mask_search", "task=qa-synth", "workflow.prompts.planer='P: {question}'")
    proc = subprocess.run(python_cmd() + [f"root={tmp_path / 'runs'}", "topology=reflective_code", "task=code-synth",
                                          "workflow.prompts.judge=x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "its templates: coder, planner, reflector" in proc.stderr
    assert not (tmp_path / "runs").exists()
