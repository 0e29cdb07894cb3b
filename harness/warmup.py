"""Supervised warm-up of a tiny model on every role's output contract.

A random tiny model cannot follow a prompt, and RL from it gets no reward signal. The warm-up
teaches each role its format from the task's training split: answer roles answer, the
evaluator says ACCEPT or 'REVISE: <feedback>', the aggregator names an index, the orchestrator
lists subtasks, workers solve one, the synthesizer combines. Role demonstrations are
deliberately imperfect (the aggregator picks the right candidate 60% of the time, the
evaluator's verdict is right 70% of the time, plans are wrong 20% of the time) so RL has room to
improve every role. Seeded: the same config gives the same warm checkpoint, cached on disk keyed by
everything that shapes it, so cells and tests share it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from omegaconf import OmegaConf

from harness.config import CellConfig
from harness import cpu_numerics, qwen3_tokenizer
from harness.models import (SCALES, RandomQwen3, TinySize, build_random_qwen3, build_tiny_model, build_tokenizer,
                            cache_root, chat_prompt, resolve_model_path)
from harness.tasks import WARMUP_TASKS, Problem, Task, WarmupSupport
from harness.workflows.contracts import ACCEPT, REVISE
from harness.workflows.prompts import cell_prompts, resolve_prompts

# 2: the warm-up trains on one thread whoever builds it (a launcher's process had its machine's threads and
# a test's one, so one key held different weights depending on who warmed it first)
WARMUP_VERSION = 2
RANDOM_SEED = 0  # the random Qwen3 base of scale qwen3-tok
WARMUP_SEED = 0
Demo = Tuple[str, str]  # (user prompt, assistant response)

VERDICT_ACCURACY = 0.7
PICK_ACCURACY = 0.6
VOTER_ACCURACY = 0.4
PLAN_ACCURACY = 0.8
WORKER_ACCURACY = 0.7
GRAPH_SHARE = 0.5  # of a study task's demonstrations, those of the graph's own roles (workflow D's on code-synth)


def role_demonstration(task: Task, prompts: dict, problem: Problem, rng: random.Random) -> Demo:
    """One demonstration of a randomly chosen role action."""
    assert isinstance(task, WarmupSupport), f"task {task.name} has no warm-up support"
    q, answer = problem.question, problem.answer
    kind = rng.choice(["solver", "generator", "voter", "generator_revise", "evaluator", "aggregator",
                       "orchestrator", "worker", "synthesizer", "solver", "voter", "worker"])
    if kind in ("solver", "generator", "voter"):
        return prompts[kind].format(question=q), answer
    if kind == "generator_revise":
        draft = task.wrong_answer(problem, rng)
        return prompts[kind].format(question=q, draft=draft, feedback=task.direction(problem, draft)), answer
    if kind == "evaluator":
        draft = answer if rng.random() < 0.5 else task.wrong_answer(problem, rng)
        right = rng.random() < VERDICT_ACCURACY
        accept = (draft == answer) == right
        if accept:
            return prompts[kind].format(question=q, draft=draft), ACCEPT
        feedback = task.direction(problem, draft) if draft != answer else rng.choice(task.feedback_vocabulary())
        return prompts[kind].format(question=q, draft=draft), f"{REVISE}: {feedback}"
    if kind == "aggregator":
        n = rng.randint(2, 5)
        votes = [answer if rng.random() < VOTER_ACCURACY else task.wrong_answer(problem, rng) for _ in range(n)]
        good = [i for i, v in enumerate(votes) if v == answer]
        pick = rng.choice(good) if good and rng.random() < PICK_ACCURACY else rng.randrange(n)
        candidates = "\n".join(f"{i}: {v}" for i, v in enumerate(votes))
        return prompts[kind].format(question=q, candidates=candidates), str(pick)
    subtasks = task.decompose(problem)
    if kind == "orchestrator":
        plan = subtasks if rng.random() < PLAN_ACCURACY else _bad_plan(subtasks, q, rng)
        return prompts[kind].format(question=q), "; ".join(plan)
    if kind == "worker":
        subtask = rng.choice(subtasks)
        return prompts[kind].format(subtask=subtask), task.solve_subtask(subtask)
    results = [task.solve_subtask(s) if rng.random() < WORKER_ACCURACY else task.wrong_answer(problem, rng)
               for s in subtasks]
    return prompts["synthesizer"].format(question=q, results="; ".join(results)), task.combine(problem, results)


def graph_templates(cfg, task: Task, workflow=None) -> Dict[str, str]:
    """The templates the cell's workflow graph brings (UnityMAS-O's workflows A-D), and those of the
    graphs the task always warms up (`task.warmup_workflows`: qa-synth's search roles), that the task can
    demonstrate (`task.demonstrate`), so the warm-up covers those roles' contracts too; {} for the
    study topologies on arith and code-synth, whose warm-up is unchanged. `workflow`: the cell's, when
    already built (harness/recipe.py)."""
    from harness.workflows import build_workflow

    from harness.workflows.graph import GRAPH_DIR, load_graph

    demonstrate = getattr(task, "demonstrate", None)
    templates: Dict[str, str] = {}
    for name in getattr(task, "warmup_workflows", ()):
        templates.update(load_graph(GRAPH_DIR / f"{name}.yaml").prompts)
    templates.update((workflow or build_workflow(cfg, task)).templates())
    if demonstrate is None or not templates:
        return {}
    prompts = cell_prompts(cfg.workflow, templates)
    probe = task.problems("train")[0]
    return {name: prompts[name] for name in sorted(templates)
            if demonstrate(name, prompts, probe, random.Random(0)) is not None}


def demonstration(task: Task, prompts: dict, extra: List[str], problem: Problem, rng: random.Random) -> Demo:
    """One warm-up demonstration: a task without the study roles' support (qa-synth) demonstrates
    its solver and the graph's roles; a study task adds the graph's roles to its usual mix."""
    if not isinstance(task, WarmupSupport):
        return task.demonstrate(rng.choice(["solver"] + extra), prompts, problem, rng)
    if extra and rng.random() < GRAPH_SHARE:
        return task.demonstrate(rng.choice(extra), prompts, problem, rng)
    return role_demonstration(task, prompts, problem, rng)


def _bad_plan(subtasks: List[str], question: str, rng: random.Random) -> List[str]:
    if len(subtasks) > 1:
        return subtasks[:1]  # drops part of the problem
    return [question, question]  # solves the same thing twice


def encode_demo(tokenizer, prompt: str, response: str) -> Tuple[List[int], List[int]]:
    prompt_ids = tokenizer(chat_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids, response_ids


def _batch(tokenizer, demos: List[Demo]):
    rows = [encode_demo(tokenizer, p, r) for p, r in demos]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        labels[b, len(p): len(p) + len(r)] = torch.tensor(r)
        attention[b, : len(p) + len(r)] = 1
    return ids, labels, attention


@torch.no_grad()
def greedy_accuracy(model, tokenizer, task: Task, prompt_template: str, problems: List[Problem],
                    max_new_tokens: int = 8) -> float:
    texts = [chat_prompt(tokenizer, prompt_template.format(question=p.question)) for p in problems]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(task.grade(p, r).correct for p, r in zip(problems, replies)) / len(problems)


def warm_up(cfg, size, task: Task, out_dir: Path, log: Callable[[str], None] = print,
            graph: Optional[Dict[str, str]] = None) -> dict:
    """Build tokenizer + tiny model, train on role demonstrations, save to out_dir (`graph`: graph_templates'
    answer, when the caller has it). On one thread: a thread count changes float reductions, and the
    cache key must name one set of weights whichever process builds it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _warm_up(cfg, size, task, out_dir, log, graph)
    finally:
        torch.set_num_threads(threads)


def _warm_up(cfg, size, task: Task, out_dir: Path, log: Callable[[str], None], graph: Optional[Dict[str, str]]) -> dict:
    started = time.time()
    graph = graph_templates(cfg, task) if graph is None else graph
    prompts = cell_prompts(cfg.workflow, graph)
    extra = sorted(graph)
    rng = random.Random(WARMUP_SEED)
    train = task.problems("train")
    corpus_demos = [demonstration(task, prompts, extra, rng.choice(train), rng) for _ in range(4000)]
    corpus = [f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n{r}<|im_end|>" for p, r in corpus_demos]
    tokenizer = build_tokenizer(corpus, size.vocab)
    model = build_tiny_model(size, tokenizer, seed=WARMUP_SEED)
    steps = warmup_steps(cfg, size, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=size.warmup_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    model.train()
    torch.manual_seed(WARMUP_SEED)
    for step in range(steps):
        ids, labels, attention = _batch(tokenizer, [demonstration(task, prompts, extra, rng.choice(train), rng)
                                                    for _ in range(size.warmup_batch)])
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps - 1:
            log(f"[warmup] step {step}/{steps} loss {loss.item():.3f}")
    model.eval()
    val = task.problems("val")[:128]
    info = {"steps": steps, "final_loss": loss.item(), "seconds": round(time.time() - started, 1),
            "solver_greedy_accuracy": greedy_accuracy(model, tokenizer, task, prompts["solver"], val),
            "params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)}
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "warmup.json").write_text(json.dumps(info, indent=2))
    log(f"[warmup] done in {info['seconds']} s: solver greedy accuracy {info['solver_greedy_accuracy']:.2f}")
    return info


def warmup_steps(cfg: CellConfig, size: TinySize, task) -> int:
    """model.warmup_steps, else the scale's length times the task's share: a warm-up must leave
    RL room to improve (code-synth at tiny-m: 1400 steps -> 0.89 accuracy and flat RL; 700 -> ~0.5
    and a rising reward)."""
    return cfg.model.warmup_steps or max(1, round(size.warmup_steps * getattr(task, "warmup_share", 1.0)))


def warm_key(cfg: CellConfig, task, graph: Optional[Dict[str, str]] = None) -> str:
    """Everything that shapes the warm checkpoint; the cell's seed is not in it (paired seeds
    share one base model, as in the seed study)."""
    size = SCALES[cfg.scale]
    steps = warmup_steps(cfg, size, task)
    shape = {k: v for k, v in asdict(size).items() if k != "warmup_steps"}  # steps is keyed on its own
    payload = {"size": shape, "steps": steps, "task": task.name, "task_cfg": _task_fingerprint(cfg),
               "prompts": resolve_prompts(dict(cfg.workflow.prompts)), "version": WARMUP_VERSION,
               "cpu_numerics": cpu_numerics.fingerprint()}  # AVX2 and AVX-512 kernels train different weights
    graph = graph_templates(cfg, task) if graph is None else graph
    if graph:  # a workflow graph's own roles are part of the warm-up (absent: the key is as before)
        payload["graph_prompts"] = graph
        payload["demonstrations"] = getattr(task, "DEMONSTRATIONS_VERSION", 1)  # bumped when `demonstrate` changes
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def random_key(spec: RandomQwen3) -> str:
    """The random model's shape and the tokenizer's checksums (its seed is fixed: one base for all cells)."""
    payload = {"shape": asdict(spec), "tokenizer": qwen3_tokenizer.FILES, "seed": RANDOM_SEED}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def build_random(spec: RandomQwen3, out_dir: Path) -> dict:
    """Save a random Qwen3 of `spec`'s shape with Qwen3's tokenizer as a checkpoint directory."""
    tokenizer = qwen3_tokenizer.load()
    model = build_random_qwen3(spec, tokenizer, RANDOM_SEED)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"steps": 0, "random_init": True, "params": sum(p.numel() for p in model.parameters()),
            "vocab": len(tokenizer), "tokenizer": qwen3_tokenizer.PACKAGE}
    (out_dir / "warmup.json").write_text(json.dumps(info, indent=2))
    return info


def _task_fingerprint(cfg: CellConfig) -> dict:
    node = getattr(cfg, WARMUP_TASKS.get(cfg.task, ""), None)
    return OmegaConf.to_container(OmegaConf.structured(node), enum_to_str=True) if node is not None else {}


def prepare_model(cfg: CellConfig, task, log=print, workflow=None) -> Path:
    """The directory to load the cell's base model and tokenizer from (built and warmed if tiny);
    `workflow`: the cell's, when already built (harness/recipe.py)."""
    path = resolve_model_path(cfg)
    if path is not None:
        return path
    size = SCALES[cfg.scale]
    if isinstance(size, RandomQwen3):
        key, build = random_key(size), lambda out: build_random(size, out)
        what = "building a random Qwen3 over Qwen3's tokenizer"
    else:
        graph = graph_templates(cfg, task, workflow)
        key, build = warm_key(cfg, task, graph), lambda out: warm_up(cfg, size, task, out, log=log, graph=graph)
        what = f"warming up {cfg.scale} on task {task.name}"
    target = cache_root(cfg) / f"{cfg.scale}-{key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one warm-up per key, even with parallel cells
        if (target / "warmup.json").is_file():
            return target
        log(f"[models] {what} (cached at {target})")
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            build(tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def warm_info(model_dir: Path) -> dict:
    info = Path(model_dir) / "warmup.json"
    return json.loads(info.read_text()) if info.is_file() else {}
