"""Workflows as graphs (harness/workflows/graph.py): the four study topologies written as graphs
give today's episodes exactly; a graph in a YAML file outside the package trains from the CLI;
bad graphs are one clear error."""
import json
import subprocess
import textwrap

import pytest
import torch

from harness.config import ConfigError
from harness.controller import Controller
from harness.engines.local import LocalEngine
from harness.sharing import PolicyMap
from harness.tasks import build_task
from harness.warmup import prepare_model
from harness.workflows import build_workflow
from tests.conftest import REPO, cell, python_cmd


def _rollout(tmp_path, topology, *overrides):
    cfg = cell(tmp_path, f"topology={topology}", *overrides)
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances())
    engine = LocalEngine(prepare_model(cfg, task), policy_map.policies, cfg)
    controller = Controller(cfg, task, workflow, policy_map, engine)
    torch.manual_seed(11)
    episodes, scheduler = controller.rollout(controller.problems_for(0)[:6], 4, greedy=False)
    return episodes, scheduler.calls


def _trace(episode):
    return (episode.final_text, episode.grade, [
        (t.role, t.instance, t.policy, t.prompt, t.prompt_ids, t.response_ids, t.malformed, t.fallback,
         t.role_correct, t.stats, t.index) for t in episode.turns])


@pytest.mark.parametrize("overrides", [
    ("sharing=ip",), ("scale=qwen3-tok", "workflow.max_new_tokens=12", "workflow.max_iterations=3"),
])
def test_the_shipped_program_and_its_graph_give_the_same_episodes(tmp_path, warm_model_dir, overrides):
    """The Python extension point (program_example.py) and topology=eval_opt's graph: same turns (roles,
    instances, policies, prompts, tokens, verdicts), same batched generate calls, same answers and grades."""
    program, program_calls = _rollout(tmp_path / "program", "harness.workflows.program_example:EvalOptProgram",
                                      *overrides)
    graph, graph_calls = _rollout(tmp_path / "graph", "eval_opt", *overrides)
    assert program_calls == graph_calls and len(program) == len(graph) == 24
    assert [_trace(e) for e in program] == [_trace(e) for e in graph]
    assert sum(len(e.turns) for e in program) >= 48  # every role acted


def test_the_study_topologies_exist_once_as_graphs():
    from types import SimpleNamespace

    from harness.config import TOPOLOGIES, WorkflowConfig
    from harness.workflows.graph import GRAPH_DIR, GraphWorkflow

    for topology in TOPOLOGIES:
        workflow = build_workflow(SimpleNamespace(topology=topology, workflow=WorkflowConfig()))
        assert isinstance(workflow, GraphWorkflow) and (GRAPH_DIR / f"{topology}.yaml").is_file()
    programs = {p.stem for p in (REPO / "harness" / "workflows").glob("*.py")}
    assert not programs & set(TOPOLOGIES)  # no second, Python form of a study topology


MY_FLOW = """\
    # two voters answer, a judge with the graph's own prompt picks one
    name: my_flow
    roles:
      voter: {contract: answer, instances: 2}
      judge: {contract: index}
    prompts:
      judge_pick: "pick: {question}\\n{candidates}"
    nodes:
      votes: {role: voter, fan_out: 2, inputs: {question: question}}
      pick:
        role: judge
        prompt: judge_pick
        over: votes
        inputs: {question: question, candidates: votes.candidates}
    edges: [[votes, pick]]
    final: pick
"""


def test_a_graph_in_a_yaml_file_outside_the_package_trains_from_the_cli(tmp_path, warm_model_dir):
    graph = tmp_path / "elsewhere" / "my_flow.yaml"
    graph.parent.mkdir()
    graph.write_text(textwrap.dedent(MY_FLOW))
    proc = subprocess.run(python_cmd() + [f"root={tmp_path / 'runs'}", f"topology={graph}", "sharing=ip", "steps=50",
                                          "val_every=25", "samples_every=49", "progress=false", "wandb.enabled=false",
                                          "report=false"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "default" / "my_flow-ip-arith-tiny-m-s0"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(50))
    assert metrics[-1]["policy/voter/optimizer_steps"] == 2 * metrics[-1]["policy/judge/optimizer_steps"]
    assert {"role/voter/accuracy", "role/judge/accuracy", "role/judge/format_ok"} <= set(metrics[-1])
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert [t["role"] for t in sample["turns"]] == ["voter", "voter", "judge"]
    assert sample["turns"][2]["prompt"].startswith("pick: ")
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def _graph(tmp_path, text):
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent(text))
    return f"topology={path}"


@pytest.mark.parametrize("text,message", [
    ("roles: {voter: {contract: answer}}\nnodes: {a: {role: critic, inputs: {question: question}}}\nfinal: a\n",
     "node a: unknown role 'critic'; the graph's roles: voter"),
    ("roles: {g: {contract: answer}, e: {contract: verdict}}\n"
     "nodes: {d: {role: g, inputs: {question: question}}, j: {role: e, judges: d, inputs: {question: question}}}\n"
     "edges: [[d, j], [j, d]]\nfinal: d\n", "unbounded loop d -> j -> d"),
    ("roles: {s: {contract: answer}}\nnodes: {a: {role: s, inputs: {question: question}}, b: {role: s}}\nfinal: a\n",
     "node(s) b cannot be reached from the first node a"),
    ("roles: {s: {contract: answer}}\nnodes: {a: {role: s, inputs: {question: question}},"
     " b: {role: s, inputs: {question: a.feedback}}}\nedges: [[a, b]]\nfinal: b\n",
     "node b: no node writes 'a.feedback' (node a writes text, answer, correct)"),
    ("roles: {s: {contract: answer}}\nnodes: {a: {role: s, prompt: nowhere, inputs: {question: question}}}\nfinal: a\n",
     "uses prompt template 'nowhere'"),
    ("roles: {s: {contract: essay}}\nnodes: {a: {role: s}}\nfinal: a\n", "unknown contract 'essay'"),
    ("roles: {s: {contract: answer}}\nnodes: {a: {role: s, inputs: {question: question}},"
     " t: {tool: 'tests.graph_tools:majority', inputs: {answers: a.text}}}\n"
     "edges: [[a, t], [t, a, {when: t.txt != pass, max_rounds: 1}]]\nfinal: a\n",
     "edge t -> a: no node writes 't.txt' (node t writes value, text, answer)"),
    ("roles: {s: {contract: answer}}\nnodes: {a: {role: s, inputs: {question: question}}}\nfinal: a\n"
     "paper: {one: [s, critic]}\n", "paper sharing group one names unknown role(s) critic"),
])
def test_bad_graphs_are_one_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError) as caught:
        cell(tmp_path, _graph(tmp_path, text))
    assert message in str(caught.value)


def test_an_edge_condition_is_a_fields_truth_or_a_comparison_of_its_text():
    from harness.workflows.graph import _holds, _Result, parse_condition

    state = {"run": _Result([], {"text": "fail", "value": "fail"}), "verify": _Result([], {"revise": False})}
    assert parse_condition("run.text != pass") == ("run.text", "!=", "pass")
    assert parse_condition("verify.revise") == ("verify.revise", None, None)
    assert _holds(parse_condition("run.text != pass"), state) and not _holds(parse_condition("run.text == pass"), state)
    assert _holds(parse_condition("run.text == fail"), state) and not _holds(parse_condition("verify.revise"), state)
    state["run"].fields["text"] = "pass"
    assert not _holds(parse_condition("run.text != pass"), state)


def test_a_missing_graph_from_the_cli_is_one_error_line_and_no_run_dir(tmp_path):
    for topology, message in ((tmp_path / "none.yaml", "does not exist"), ("graph:star", "valid choices: graph:eval_opt")):
        proc = subprocess.run(python_cmd() + [f"root={tmp_path / 'runs'}", f"topology={topology}"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_tool_node_computes_from_the_state_and_can_be_final(tmp_path, warm_model_dir):
    graph = tmp_path / "majority.yaml"
    graph.write_text(textwrap.dedent("""\
        roles: {voter: {contract: answer, instances: 3}}
        nodes:
          votes: {role: voter, fan_out: 3, inputs: {question: question}}
          count: {tool: "tests.graph_tools:majority", inputs: {answers: votes.results}}
        edges: [[votes, count]]
        final: count
    """))
    episodes, _ = _rollout(tmp_path / "runs", str(graph), "sharing=ip")
    from tests.graph_tools import majority

    for episode in episodes:
        answers = "; ".join(_answer(t) for t in episode.turns)
        assert episode.final_text == majority(answers) and [t.role for t in episode.turns] == ["voter"] * 3
        assert episode.grade.correct == (episode.final_text == episode.problem.answer)
    with pytest.raises(ConfigError, match="^node t: tool 'tests.graph_tools:nothing' cannot be loaded: .*nothing"):
        cell(tmp_path, _graph(tmp_path, "roles: {}\nnodes: {t: {tool: 'tests.graph_tools:nothing'}}\nfinal: t\n"))


def _answer(turn):
    from harness.tasks.arith import _INT

    numbers = _INT.findall(turn.text)
    return str(int(numbers[-1])) if numbers else "?"


def test_an_import_path_names_a_graph_or_a_workflow_class(tmp_path, warm_model_dir):
    cfg = cell(tmp_path, "topology=tests.graph_tools:TWO_VOTERS", "sharing=ip")
    assert cfg.cell_id == "TWO_VOTERS-ip-arith-tiny-m-s0"
    assert [(r.name, r.instances) for r in build_workflow(cfg).roles()] == [("voter", 2), ("aggregator", 1)]
    own = cell(tmp_path, "topology=harness.workflows.program_example:EvalOptProgram", "sharing=ip")
    assert [r.name for r in build_workflow(own).roles()] == ["generator", "evaluator"]
    for bad, message in (("tests.graph_tools:majority", "neither a graph dict nor a Workflow class"),
                         ("tests.nowhere:X", "^topology 'tests.nowhere:X' cannot be loaded: No module named 'tests.nowhere'"),
                         ("tests.graph_tools:", "^topology must read 'package.module:function'")):
        with pytest.raises(ConfigError, match=message):
            cell(tmp_path, f"topology={bad}")


def test_a_retrieval_tool_node_puts_passages_into_the_next_prompt(tmp_path, warm_model_dir):
    corpus = REPO / "tests" / "fixtures" / "passages_sample.jsonl"
    graph = tmp_path / "search.yaml"
    graph.write_text(textwrap.dedent(f"""\
        roles: {{solver: {{contract: answer}}}}
        prompts: {{read: "context: {{passages}}\\nsolve: {{question}}"}}
        nodes:
          search: {{tool: "harness.tasks.retriever:retrieve", params: {{corpus: "{corpus}", k: 1}},
                    inputs: {{query: question}}}}
          answer: {{role: solver, prompt: read, inputs: {{question: question, passages: search.text}}}}
        edges: [[search, answer]]
        final: answer
    """))
    episodes, calls = _rollout(tmp_path / "runs", str(graph), "sharing=sp")
    from harness.tasks.retriever import retrieve

    assert calls == [("shared", 24)]
    for episode in episodes:  # the tool's output is the prompt's context, as the retriever gives it
        question = episode.problem.question
        assert episode.turns[0].prompt == f"context: {retrieve(question, str(corpus), 1)}\nsolve: {question}"


def test_a_prompt_override_from_the_command_line_reaches_a_graph_files_own_template(tmp_path, warm_model_dir):
    graph = tmp_path / "my_flow.yaml"
    graph.write_text(textwrap.dedent(MY_FLOW).replace('judge_pick: "pick', 'voter: "ask: {question}"\n  judge_pick: "pick'))
    episodes, _ = _rollout(tmp_path / "runs", str(graph), "sharing=ip",
                           "workflow.prompts.judge_pick='choose one for {question}: {candidates}'")
    for episode in episodes:  # a real episode of the tiny model: the override renders the judge's turn
        question = episode.problem.question
        voters, judge = episode.turns[:2], episode.turns[2]
        assert judge.role == "judge" and judge.prompt.startswith(f"choose one for {question}: 0: ")
        assert [t.prompt for t in voters] == [f"ask: {question}"] * 2  # the graph's own voter, not the built-in one
    cfg = cell(tmp_path / "runs", f"topology={graph}", "workflow.prompts.voter='v2: {question}'")
    task = build_task(cfg)
    workflow = build_workflow(cfg, task)
    prompts = Controller(cfg, task, workflow, PolicyMap.from_config(cfg, workflow.role_instances()), None).prompts
    assert prompts["voter"] == "v2: {question}" and prompts["judge_pick"] == "pick: {question}\n{candidates}"
