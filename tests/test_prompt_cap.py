"""data.max_prompt_length, the study's prompt cap: a prompt longer than the cap is not sampled and ends
its episode there, as upstream's engine ends it (MAX_PROMPT_LENGTH_EXCEEDED), the earlier turns kept."""
import pytest

from harness.config import DEFAULT_PROMPTS
from harness.episodes import Generation
from harness.run import run_cell, run_dir_of
from harness.run_dir import read_jsonl
from harness.workflows.base import Agents, Scheduler
from harness.workflows.graph import GRAPH_DIR, GraphWorkflow, load_graph
from tests.conftest import cell


def test_a_prompt_over_the_cap_is_encoded_but_never_sampled(warm_model_dir):
    from transformers import AutoTokenizer

    from harness.engines.sampling import generate_grouped

    from harness.models import chat_prompt

    tokenizer = AutoTokenizer.from_pretrained(warm_model_dir)
    short, long = "solve: 1+2", "solve: " + "+".join(["1"] * 40)
    length = {p: len(tokenizer(chat_prompt(tokenizer, p), add_special_tokens=False)["input_ids"]) for p in (short, long)}
    cap = length[long] - 1  # counted on the prompt as the model reads it (framed), as upstream counts it
    assert length[short] <= cap
    asked = []

    def sample(input_ids, attention_mask, copies):
        asked.append((input_ids.shape[0], copies))
        return [[tokenizer.eos_token_id]] * (input_ids.shape[0] * copies), None

    out = generate_grouped(tokenizer, [short, long, short], sample, max_prompt_tokens=cap)
    assert asked == [(1, 2)]  # the two copies of the short prompt, one row group; the long one never sampled
    assert [g.over_prompt_cap for g in out] == [False, True, False]
    assert out[1].response_ids == [] and len(out[1].prompt_ids) == cap + 1
    asked.clear()
    assert not any(g.over_prompt_cap for g in generate_grouped(tokenizer, [short, long, short], sample))
    assert sorted(asked) == [(1, 1), (1, 2)]


def _voting_episode(task, cap_prefix: str, capped_voter: int = -1):
    """A scripted voting episode whose prompts starting with `cap_prefix` are over the cap (or only the
    voter `capped_voter` of the fan-out's batch)."""
    problem = task.problems("val")[0]

    def generate(policy, prompts, sampling):
        assert sampling.max_prompt_tokens == 8
        capped = [p.startswith(cap_prefix) or i == capped_voter for i, p in enumerate(prompts)]
        return [Generation([1] * 9, [], "", False, over_prompt_cap=True) if over
                else Generation([1], [2], problem.answer if p.startswith("vote:") else "0", False)
                for over, p in zip(capped, prompts)]

    workflow = GraphWorkflow(task, task_free_cfg(), load_graph(GRAPH_DIR / "voting.yaml"))
    scheduler = Scheduler(generate)
    roles = [r.name for r in workflow.roles()]
    prompts = {**DEFAULT_PROMPTS, **workflow.templates()}
    agents = Agents(scheduler, lambda role, i: role, prompts, {r: 4 for r in roles}, 1.0, False, max_prompt_tokens=8)
    return problem, scheduler.run([workflow.episode(problem, agents)])[0]


def task_free_cfg():
    from omegaconf import OmegaConf

    from harness.config import WorkflowConfig

    return OmegaConf.structured(WorkflowConfig)


@pytest.fixture(scope="module")
def arith():
    from harness.config import CellConfig
    from harness.tasks import build_task

    return build_task(CellConfig())


def test_a_capped_aggregator_ends_the_episode_with_its_voters_kept_and_paid_their_own_rewards(arith):
    """Upstream ends the episode before the final outcome is propagated to every trajectory: the voters
    keep their own correctness as their reward, where a finished episode pays every turn its outcome."""
    from harness.config import RewardConfig
    from harness.rewards import assign_rewards

    problem, episode = _voting_episode(arith, "pick:")
    assert [t.role for t in episode.turns] == ["voter"] * 3 and all(t.role_correct for t in episode.turns)
    assert episode.stats["prompt_capped"] == 1.0 and not episode.grade.correct  # no pick: no answer
    assign_rewards(episode, RewardConfig())  # the study's: the outcome on every turn (traj 1)
    assert [t.reward for t in episode.turns] == [1.0, 1.0, 1.0]
    _, whole = _voting_episode(arith, "never")
    assert whole.stats["prompt_capped"] == 0.0 and [t.role for t in whole.turns][-1] == "aggregator"
    assign_rewards(whole, RewardConfig())
    assert {t.reward for t in whole.turns} == {float(whole.grade.correct)}


def test_one_capped_call_of_a_fan_out_drops_the_whole_fan_out(arith):
    _, episode = _voting_episode(arith, "never", capped_voter=1)
    assert episode.turns == [] and episode.stats["prompt_capped"] == 1.0


def test_eval_opt_under_a_cap_between_its_first_and_its_revision_prompts_never_revises(tmp_path):
    """The tiny arith prompts: a first draft's ~15 tokens and a judgement's ~21 pass a cap of 25, a
    revision's (question, draft and note) does not: every episode stops at its first judgement, those
    whose judge asked for a revision counted as capped; without the cap some are revised."""
    def run(name, *extra):
        cfg = cell(tmp_path / name, "topology=eval_opt", "task=arith", "scale=tiny-s", "steps=1", "val_every=100",
                   *extra)
        assert run_cell(cfg, log=lambda *_: None) == "finished"
        return read_jsonl(run_dir_of(cfg).file("metrics.jsonl"))[0]

    capped = run("capped", "data.max_prompt_length=25")
    assert capped["role/generator/calls"] == 1.0 and capped["episode/turns"] == 2.0
    assert 0 < capped["episode/prompt_capped"] < 1 and 0 < capped["val/episode/prompt_capped"] < 1
    free = run("free")
    assert free["role/generator/calls"] > 1.0 and "episode/prompt_capped" not in free
