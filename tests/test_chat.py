"""The study's chat rendering (harness/chat.py): one message as Qwen3's own template renders it with
Qwen's system message and thinking off; Eval-Opt's shared conversation as upstream's parser renders
it, compared with a fixture built from upstream's prompt.json and parser (tests/fixtures/
study_eval_opt_math.json); the tiny prompts stay one message."""
import json

import pytest
from omegaconf import OmegaConf

from harness import qwen3_tokenizer
from harness.chat import STUDY_SYSTEM, Framed, frame, reply_content, study_chat
from harness.config import DEFAULT_PROMPTS, ConfigError, WorkflowConfig
from harness.episodes import Generation
from harness.models import chat_prompt
from harness.tasks.base import Problem
from harness.tasks.math import MathTask
from harness.workflows.base import Agents, Scheduler
from harness.workflows.graph import GRAPH_DIR, GraphError, GraphWorkflow, load_graph, parse_graph, read_graph
from harness.workflows.prompts import QWEN3_MATH
from tests.conftest import REPO

FIXTURE = json.loads((REPO / "tests" / "fixtures" / "study_eval_opt_math.json").read_text())
# the scripted replies behind the fixture: a wrong draft (with a leaked think block the chat drops),
# a rejection, a right revision, an acceptance
REPLIES = ["<think>\nadd them\n</think>\n\n48 + 24 = 70, so \\boxed{70}", "48 + 24 is 72, not 70.\n\\boxed{Incorrect}",
           "In May she sold 24; 48 + 24 = \\boxed{72}", "\\boxed{Correct}"]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_tokenizer.load()


def test_one_message_is_qwen3s_own_template_with_the_system_message_and_thinking_off(tokenizer):
    text = QWEN3_MATH["solver"].format(question="What is 2+3?")
    messages = [{"role": "system", "content": STUDY_SYSTEM}, {"role": "user", "content": text}]
    real = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert study_chat([("user", text)]) == real
    assert chat_prompt(tokenizer, study_chat([("user", text)])) == real  # a framed prompt is not wrapped again
    assert chat_prompt(tokenizer, text) != real  # the template chat has no system message


def test_reply_content_keeps_what_the_studys_parser_keeps():
    assert reply_content(REPLIES[0]) == "48 + 24 = 70, so \\boxed{70}"
    assert reply_content("a</think>b</think>c ") == "a</think>b</think>c"  # two closings: kept whole, as the parser
    assert reply_content(" x <tool_call>{}</tool_call> ") == "x"
    with pytest.raises(ValueError):
        frame("template", [("user", "q")], "judge")  # one-message chats cannot carry a conversation


def _eval_opt_episode(prompt_set: str, chat: str, script=REPLIES):
    wcfg = OmegaConf.structured(WorkflowConfig)
    wcfg.prompt_set, wcfg.max_iterations = prompt_set, 3
    workflow = GraphWorkflow(MathTask(), wcfg, load_graph(GRAPH_DIR / "eval_opt.yaml"))
    replies = iter(script)
    seen = []

    def generate(policy, prompts, sampling):
        seen.extend(prompts)
        return [Generation([1], [2], next(replies), False) for _ in prompts]

    templates = {**DEFAULT_PROMPTS, **(QWEN3_MATH if prompt_set == "qwen3" else {})}
    scheduler = Scheduler(generate)
    agents = Agents(scheduler, lambda role, i: role, templates, {"generator": 16, "evaluator": 16}, 1.0, False, chat)
    episode = scheduler.run([workflow.episode(Problem("p0", FIXTURE["question"], "72"), agents)])[0]
    return episode, seen


def test_eval_opt_under_the_qwen3_prompts_is_upstreams_conversation_token_for_token(tokenizer):
    """Draft, judge, revise, judge: every prompt is the fixture's text, the reviser and the second
    judge seeing the whole chat (the first prompt and every reply, not the later user prompts)."""
    episode, prompts = _eval_opt_episode("qwen3", "study")
    assert [t.role for t in episode.turns] == ["generator", "evaluator", "generator", "evaluator"]
    assert prompts == FIXTURE["prompts"] and all(isinstance(p, Framed) for p in prompts)
    assert "\\boxed{{}} format" in prompts[2]  # upstream sends the reviser's template unformatted
    assert episode.grade.correct and episode.turns[1].role_correct and episode.turns[3].role_correct
    ids = tokenizer(chat_prompt(tokenizer, prompts[3]), add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == FIXTURE["prompts"][3]
    assert ids.count(tokenizer.convert_tokens_to_ids("<think>")) == 4  # three earlier replies and the open one


def test_the_tiny_prompts_stay_one_message_with_the_latest_draft():
    episode, prompts = _eval_opt_episode("tiny", "template", ["70", "REVISE: sum", "72", "ACCEPT"])
    assert not any(isinstance(p, Framed) for p in prompts)
    assert prompts[0] == DEFAULT_PROMPTS["generator"].format(question=FIXTURE["question"])
    assert "<|im_start|>" not in "".join(prompts) and "70" not in prompts[3]  # the second judge sees only the revision


def test_a_conversation_names_single_call_nodes():
    data = read_graph(GRAPH_DIR / "voting.yaml")
    with pytest.raises(GraphError, match="conversation: 'votes' must be a node that makes one role call"):
        parse_graph({**data, "conversation": ["votes"]})


def test_unitymas_workflows_keep_the_tokenizers_template_and_tiny_prompts_stay_one_message():
    """The study's framing is the study's: UnityMAS-O's trainer renders Qwen3 prompts with the tokenizer's
    own template (its graphs say `chat: template`); tiny prompt sets never frame a chat."""
    from types import SimpleNamespace

    from harness.workflows import build_workflow

    def chat_of(topology: str, prompt_set: str) -> str:
        wcfg = OmegaConf.structured(WorkflowConfig)
        wcfg.prompt_set = prompt_set
        return build_workflow(SimpleNamespace(topology=topology, workflow=wcfg)).chat

    assert [chat_of(t, "qwen3") for t in ("eval_opt", "voting", "single")] == ["study"] * 3
    assert {chat_of(t, "qwen3") for t in ("qd_retrieve_answer", "mask_search", "reflective_code")} == {"template"}
    assert {chat_of(t, "tiny") for t in ("eval_opt", "reflective_code")} == {"template"}
    with pytest.raises(GraphError, match="chat: unknown 'html'; valid choices: template, study"):
        parse_graph({**read_graph(GRAPH_DIR / "voting.yaml"), "chat": "html"})


def test_cells_record_their_chat_and_runs_stored_before_it_keep_the_template(tmp_path):
    """cell.yaml records how the prompts reached the model (workflow.chat, resolved from auto); a run
    stored before the setting existed rendered one message in the tokenizer's template, and reads so:
    it resumes (its config is compared in today's form) and is evaluated as it trained."""
    import yaml

    from harness.run import _already_ended
    from harness.run_dir import RunDir, stored_cell_config
    from harness.workflows import build_workflow
    from tests.conftest import cell

    assert cell(tmp_path, "scale=qwen3-tok", "topology=eval_opt").workflow.chat == "study"
    assert cell(tmp_path, "scale=qwen3-tok", "topology=qd_retrieve_answer", "task=qa-synth").workflow.chat == "template"
    assert cell(tmp_path, "topology=eval_opt").workflow.chat == "template"
    forced = cell(tmp_path, "scale=qwen3-tok", "topology=eval_opt", "workflow.chat=template")
    assert build_workflow(forced).chat == "template"
    tiny = cell(tmp_path, "topology=eval_opt")
    stored = OmegaConf.to_container(OmegaConf.structured(tiny), enum_to_str=True)
    del stored["workflow"]["chat"], stored["local"]["rollout"]  # as a run of an earlier version wrote it
    run = tmp_path / "earlier"
    run.mkdir()
    (run / "cell.yaml").write_text(yaml.safe_dump(stored))
    assert stored_cell_config(run).workflow.chat == "template"
    assert _already_ended(tiny, RunDir(run), lambda *_: None) is None  # the same cell: resumable
    with pytest.raises(ConfigError, match="different config"):  # a Qwen3 run would now be framed otherwise
        _already_ended(cell(tmp_path, "topology=eval_opt", "workflow.chat=study"), RunDir(run), lambda *_: None)
