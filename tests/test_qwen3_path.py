"""The real-model path with Qwen3's real tokenizer and chat template (no weights): the study's
prompts with thinking off, contracts real replies can meet, and every topology training a few
steps on `scale=qwen3-tok` (a random tiny Qwen3 over that vocabulary): all four on the local engine; on verl
eval_opt, whose evaluator follows the chat (verl's voting and orch_workers cells run in test_verl_engine,
test_critic and test_models_map; a single agent is one policy of one role there, as an SP cell's policy is)."""
import json
import os
import subprocess
import time

import pytest
import yaml

from harness import qwen3_tokenizer
from harness.chat import STUDY_SYSTEM
from harness.models import chat_prompt
from harness.run import run_dir_of
from harness.workflows import build_workflow
from harness.workflows.contracts import ACCEPT, REVISE, parse_index, parse_subtasks, parse_verdict
from harness.workflows.prompts import QWEN3_CODE, QWEN3_MATH
from tests.conftest import REPO, cell, python_cmd

FIXTURE = REPO / "tests" / "fixtures" / "qwen3_judging_replies.jsonl"
TOPOLOGIES = ("single", "eval_opt", "voting", "orch_workers")
ON_ENGINE = {"local": TOPOLOGIES, "verl": ("eval_opt",)}  # a verl cell starts its own Ray: the one with a chat


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_tokenizer.load()  # fetched by `make setup`; a missing file fails here, loudly


def test_qwen3_prompts_leave_no_room_to_think(tokenizer):
    """Thinking off is Qwen3's template closing an empty think block before the reply begins; with
    thinking on the same message opens the reply bare, so the model would think first."""
    text = QWEN3_MATH["solver"].format(question="What is 2+3?")
    off = chat_prompt(tokenizer, text)
    on = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert off.startswith("<|im_start|>user\n") and off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    assert off.count("<think>") == 1 and "\\boxed{}" in off  # the only think block is the empty one
    ids = tokenizer(off, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<think>") in ids and tokenizer.decode(ids) == off


def test_a_freed_tokenizers_template_is_never_served_to_another():
    """The rendered template is cached per tokenizer object and dies with it: keyed by id() it
    outlived its tokenizer, and a Qwen3 tokenizer allocated at the freed one's address was served
    that tokenizer's template (the tiny one's, with no think block)."""
    import gc

    from harness import models

    text = QWEN3_MATH["solver"].format(question="What is 2+3?")
    first = qwen3_tokenizer.load()
    first.chat_template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"  # another template
    assert chat_prompt(first, text) == f"<<{text}>>" and first in models._CHAT_CACHE
    entries = len(models._CHAT_CACHE)
    del first
    gc.collect()
    assert len(models._CHAT_CACHE) == entries - 1  # its entry went with it
    second = qwen3_tokenizer.load()
    assert chat_prompt(second, text).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_every_qwen3_template_names_its_output_format():
    for templates in (QWEN3_MATH, QWEN3_CODE):
        assert "\\boxed{{Correct}}" in templates["evaluator"] and "solution above" in templates["evaluator"]
        assert "\\boxed{{N}}" in templates["aggregator"] and "{solutions}" in templates["aggregator"]
        assert "STRATEGY 1:" in templates["orchestrator"] and "{max_subtasks}" in templates["orchestrator"]
    assert all("\\boxed{{}}" in QWEN3_MATH[r] for r in ("solver", "voter", "worker", "synthesizer"))
    assert "\\boxed{{}} format" in QWEN3_MATH["generator_revise"].format()  # upstream's, sent unformatted
    assert all("```python" in QWEN3_CODE[r] for r in ("solver", "voter", "generator_revise", "worker", "synthesizer"))


def test_the_qwen3_prompts_are_the_studys_word_for_word():
    """Every role's template against upstream's prompt.json (tests/fixtures/study_prompts.json): the same
    text once the study's fields take the harness's names (problem -> question, strategy -> subtask);
    the evaluator's and the reviser's, which upstream sends unformatted, as they reach the model."""
    upstream = json.loads((REPO / "tests" / "fixtures" / "study_prompts.json").read_text())
    mine = {"question": "<Q>", "subtask": "<S>", "solutions": "<A>", "max_subtasks": "<N>"}
    theirs = {"problem": "<Q>", "strategy": "<S>", "solutions": "<A>", "max_subtasks": "<N>"}
    for kind, templates in (("math", QWEN3_MATH), ("code", QWEN3_CODE)):
        for role, text in upstream[kind].items():
            sent = text if role in ("evaluator", "generator_revise") else text.format(**theirs)
            assert templates[role].format(**mine) == sent, (kind, role)


def _fixture():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def _read(row):
    """(meaning as the fixture states it, or None when the parser fell back)."""
    if row["role"] == "evaluator":
        verdict = parse_verdict(row["reply"], tolerant=True, unparsed=REVISE)
        return None if verdict.fallback else verdict.verdict
    if row["role"] == "aggregator":
        index, _, fallback = parse_index(row["reply"], 3, tolerant=True, base=1)
        return None if fallback else index + 1
    parts, _, fallback = parse_subtasks(row["reply"], 3, "the whole problem", tolerant=True)
    return None if fallback else parts


def _same(row, meaning) -> bool:
    if row["role"] != "orchestrator":
        return meaning == row["expected"]
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    return (meaning is not None and len(meaning) == len(row["expected"])
            and all(norm(e) in norm(p) or norm(p) in norm(e) for p, e in zip(meaning, row["expected"])))


def test_realistic_replies_parse_with_their_intended_meaning():
    """>= 60 replies per judging role in the styles Qwen3 writes (reasoning around the verdict,
    'The best candidate is 2.', numbered plans, leaked think blocks), written without the parsers
    in view: >= 95% read as meant."""
    rows = _fixture()
    for role in ("evaluator", "aggregator", "orchestrator"):
        mine = [r for r in rows if r["role"] == role]
        right = sum(_same(r, _read(r)) for r in mine)
        print(f"{role}: {right}/{len(mine)} read as intended")
        assert len(mine) >= 60 and right >= 0.95 * len(mine)


def test_the_studys_first_box_rule_reads_fewer_realistic_replies_than_the_tolerant_one():
    """workflow.parse=study (the default, upstream's rule) against the kept `tolerant` option on the
    same realistic replies: the measured difference docs/study-settings.md states."""
    from harness.workflows.contracts import study_index, study_verdict

    rows = _fixture()
    for role in ("evaluator", "aggregator"):
        mine = [r for r in rows if r["role"] == role]
        if role == "evaluator":
            study = [None if (v := study_verdict(r["reply"], REVISE)).fallback else v.verdict for r in mine]
        else:
            study = [None if (p := study_index(r["reply"], 3, 1))[2] else p[0] + 1 for r in mine]
        right_study = sum(_same(r, m) for r, m in zip(mine, study))
        right_tolerant = sum(_same(r, _read(r)) for r in mine)
        print(f"{role}: study {right_study}/{len(mine)}, tolerant {right_tolerant}/{len(mine)}")
        assert right_study < right_tolerant and right_study >= 0.5 * len(mine)


def test_format_compliance_is_strict_and_apart_from_the_fallback():
    exact = parse_verdict("The total is 12, as claimed.\n\\boxed{Correct}", tolerant=True, unparsed=REVISE)
    loose = parse_verdict("Verdict: the solution is not correct.\nFEEDBACK: the tax is applied twice", tolerant=True,
                          unparsed=REVISE)
    noise = parse_verdict("hmm", tolerant=True, unparsed=REVISE)
    assert (exact.verdict, exact.malformed, exact.fallback) == (ACCEPT, False, False)
    assert (loose.verdict, loose.malformed, loose.fallback) == (REVISE, True, False)
    assert loose.feedback == "the tax is applied twice"
    assert (noise.verdict, noise.malformed, noise.fallback) == (REVISE, True, True)  # the study: keep refining
    assert parse_index("Solution 2 has an arithmetic slip.\n\\boxed{3}", 3, tolerant=True, base=1) == (2, False, False)
    assert parse_index("The best candidate is 2.", 3, tolerant=True, base=1) == (1, True, False)
    assert parse_index("\\boxed{7}", 3, tolerant=True, base=1) == (0, True, True)  # out of range: not a choice
    plan = "STRATEGY 1: count complements\nSTRATEGY 2: sort and use two pointers"
    assert parse_subtasks(plan, 3, "q", tolerant=True) == (["count complements", "sort and use two pointers"], False, False)
    assert parse_subtasks("1. brute force\n2. hashing", 3, "q", tolerant=True) == (["brute force", "hashing"], True, False)
    assert parse_subtasks("no idea", 3, "q", tolerant=True) == (["q"], True, True)
    # a leaked think block is not the reply: only what follows it counts
    assert parse_index("<think>maybe \\boxed{1}</think>\nI pick \\boxed{2}", 3, tolerant=True, base=1)[0] == 1


def test_tiny_contracts_stay_exact():
    assert parse_verdict("REVISE: too high", ["too high"]).verdict == REVISE
    assert parse_verdict("The answer is correct") == parse_verdict("junk")  # no reading: ACCEPT, malformed
    assert parse_verdict("junk").fallback and parse_verdict("junk").verdict == ACCEPT
    assert parse_index("1", 3) == (1, False, False) and parse_index("\\boxed{1}", 3) == (0, True, True)


def test_cells_resolve_the_prompt_set_by_scale(tmp_path):
    qwen = cell(tmp_path, "scale=qwen3-tok", "topology=eval_opt")
    tiny = cell(tmp_path, "topology=eval_opt")
    code = cell(tmp_path, "scale=qwen3-tok", "topology=eval_opt", "task=code-synth")
    assert qwen.workflow.prompt_set == "qwen3" and qwen.workflow.prompts["evaluator"] == QWEN3_MATH["evaluator"]
    assert tiny.workflow.prompt_set == "tiny" and tiny.workflow.prompts["evaluator"] == "check: {question} = {draft}"
    assert code.workflow.prompts["generator"] == QWEN3_CODE["generator"]
    mine = cell(tmp_path, "scale=qwen3-tok", "workflow.prompts.voter='answer: {question}'")
    assert mine.workflow.prompts["voter"] == "answer: {question}"  # an override wins over the set
    assert mine.workflow.prompts["aggregator"] == QWEN3_MATH["aggregator"]


@pytest.mark.timeout(900)  # verl cells, each its own Ray, on two cores
@pytest.mark.parametrize("engine", ["local", "verl"])
def test_the_topologies_train_3_steps_on_qwen3_tok(tmp_path, engine):
    """The topologies run side by side (on engine=verl each cell mostly waits on its own Ray)."""
    common = ["scale=qwen3-tok", f"engine={engine}", "steps=3", "val_every=2", "val_problems=2", "val_samples=2",
              "algo.problems_per_step=2", "algo.group_size=2", "algo.ppo_mini_batch_size=2",
              "workflow.max_new_tokens=16", "samples_every=1", "progress=false", "wandb.enabled=false", "report=false"]
    args = {t: [f"root={tmp_path}", f"topology={t}", *common] for t in ON_ENGINE[engine]}
    procs = {}
    for t, a in args.items():  # verl: one private Ray starting at a time, not all at once on two cores
        procs[t] = subprocess.Popen(python_cmd() + a, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(8 if engine == "verl" else 0)
    errors = {t: p.communicate(timeout=540)[1] for t, p in procs.items()}
    for topology, proc in procs.items():
        assert proc.returncode == 0, f"{topology}: {errors[topology][-3000:]}"
        cfg = cell(tmp_path, *args[topology][1:])
        run = run_dir_of(cfg)
        stored = yaml.safe_load(run.file("cell.yaml").read_text())
        assert stored["workflow"]["prompt_set"] == "qwen3" and stored["engine"] == engine
        metrics = [json.loads(line) for line in run.file("metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [0, 1, 2]
        roles = {k.split("/")[1] for k in metrics[-1] if k.startswith("role/") and k.endswith("/fallback")}
        assert roles == {r for r, _ in build_workflow(cfg).role_instances()}
        for m in metrics:  # a fallback turn is always malformed: fallback rate <= 1 - format compliance
            assert all(m[f"role/{r}/fallback"] <= 1 - m[f"role/{r}/format_ok"] + 1e-9 for r in roles)
        turns = [t for s in map(json.loads, run.file("samples.jsonl").read_text().splitlines()) for t in s["turns"]]
        study = f"<|im_start|>system\n{STUDY_SYSTEM}<|im_end|>\n<|im_start|>user\nYou are"
        assert turns and all(t["prompt"].startswith(study) for t in turns)  # the study's wording, framed as it frames it
        judged = [t for t in turns if t["role"] == "evaluator"]
        assert (topology == "eval_opt") == bool(judged)  # the evaluator follows the chat: the draft is a reply in it
        assert all(t["prompt"].count("<|im_start|>assistant\n") >= 2 and "solution above" in t["prompt"] for t in judged)
        assert all(1 <= t["tokens"] <= 16 for t in turns)


def test_bad_prompt_set_or_missing_tokenizer_is_one_error(tmp_path):
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="unknown prompt set .* valid choices: auto, tiny, qwen3"):
        cell(tmp_path, "workflow.prompt_set=gpt")
    env = {**os.environ, "MARL_CACHE": str(tmp_path / "empty-cache")}
    proc = subprocess.run(python_cmd() + [f"root={tmp_path / 'runs'}", "scale=qwen3-tok"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Qwen3's tokenizer is not set up" in proc.stderr and "make qwen3-tokenizer" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_the_engine_sends_qwen3_the_thinking_off_prompt(tmp_path):
    """What the model is fed (Generation.prompt_ids) ends in the empty think block: the engines'
    shared batched sampler (engines/sampling.generate_grouped, which both engines' generate and the
    verl engine's token-in vLLM requests go through) renders the chat template with thinking off."""
    from harness.engines.local import LocalEngine
    from harness.tasks import build_task
    from harness.warmup import prepare_model
    from harness.episodes import Sampling

    cfg = cell(tmp_path, "scale=qwen3-tok", "topology=single")
    engine = LocalEngine(prepare_model(cfg, build_task(cfg)), ["shared"], cfg)
    prompt = cfg.workflow.prompts["solver"].format(question="What is 2+3?")
    (generation,) = engine.generate("shared", [prompt], Sampling(max_new_tokens=4))
    fed = engine.tokenizer.decode(generation.prompt_ids)
    assert fed.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and prompt in fed
    assert 1 <= len(generation.response_ids) <= 4
