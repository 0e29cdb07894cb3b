"""Evaluate saved checkpoints as the study does: pass@k of the cell's workflow per checkpoint.

    python -m analysis.evaluate <run dir or sweep> --mode trained|base|single_agent_transfer --k 4
        [--samples N] [--problems P|all] [--split validation|held_out] [--lengths run|study] [--resume]
        [--task aime --data-path aime.jsonl] [--temperature T]

Modes (the SP/IP study's `evaluate_checkpoints`):
- `trained`: every verified step checkpoint of the run (and `best/`), in the run's own workflow;
- `base`: the base model in the same workflow (the adapters as initialised: LoRA's B = 0);
- `single_agent_transfer`: the paired single-agent run's trained policy on every role of the
  multi-agent workflow, per checkpoint of that run (does multi-agent training beat putting a
  single-agent-trained model into the same workflow?).
Splits: `validation`, what the run validated on (AIME 2025 for full_matrix's math: `data.val_path`);
`held_out`, the training set's own held-out part (DAPO-Math's 10% at split seed 42), on which the study
reports its math numbers. Lengths: `run`, each episode at the run's own budgets (training lengths); `study`, at
the study's evaluation budgets, longer than training (dashboard/evaluate_checkpoints.py's default without
--use-training-lengths, l.1245-1257: math 8192 and code 5120 new tokens, dashboard/task_configs.py:35-42,100-107).
The study's own scoring: `--split held_out --problems all --lengths study --samples 1 --temperature 0.7`.
Each problem gets N sampled episodes (N >= k, at the run's temperature unless given); pass@k is
the unbiased estimator 1 - C(n-c, k)/C(n, k) averaged over problems. Rows go to
`<run>/eval_results.jsonl` (a re-run replaces the rows of the same mode, checkpoint, task, split and k;
`--resume` keeps them and evaluates only the checkpoints that have none, e.g. after a killed job);
a checkpoint whose files do not match its manifest is recorded as damaged and never evaluated.
The early (first), best and terminal (last) checkpoints' episodes are written in full to
`<run>/eval_trajectories/` (the trajectories the study compares across training).
The sweep report shows the table.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

MODES = ("trained", "base", "single_agent_transfer")
SPLITS = ("validation", "held_out")
LENGTHS = ("run", "study")
STUDY_EVAL_NEW_TOKENS = {"math": 8192, "code": 5120}  # eval_prompt_response_lengths' responses, every workflow
# ... and their prompt caps per workflow (upstream dashboard/task_configs.py l.35-42, l.100-107)
STUDY_EVAL_PROMPT_TOKENS = {"math": {"eval_opt": 30720, "voting": 25600, "orch_workers": 25600, "single": 15360},
                            "code": {"eval_opt": 15360, "voting": 20480, "orch_workers": 20480, "single": 4096}}
RESULTS = "eval_results.jsonl"
TRAJECTORIES = "eval_trajectories"  # <run>/eval_trajectories/<mode>-<split>-<phase>-<checkpoint>.jsonl


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def checkpoints_of(run: Path) -> List[Tuple[str, Path, Optional[str]]]:
    """(name, directory, problem or None) of every step checkpoint, oldest first, then best/."""
    from harness.checkpoints import problem_with, step_of

    root = run / "checkpoints"
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), key=step_of)
    if (root / "best").is_dir():
        found.append(root / "best")
    return [(p.name, p, problem_with(p)) for p in found]


def paired_single_run(run: Path, cfg) -> Optional[Path]:
    """The paired single-agent run of a grid cell: same sweep directory, the grid's id for it."""
    from grid.expand import cell_id

    for task in (cfg.task, (cfg.extra or {}).get("task_axis")):  # ids name the task run (earlier runs: the axis)
        candidate = run.parent / cell_id({"topology": "single", "task": task, "scale": cfg.scale, "seed": cfg.seed}, {})
        if task and (candidate / "cell.yaml").is_file():
            return candidate
    return None


class Evaluator:
    """One run's workflow on an evaluation set, served by an engine whose weights come from a checkpoint."""

    def __init__(self, cfg, task, model_dir: Path, policies: Sequence[str], policy_of, work_dir: Path):
        from harness.controller import Controller
        from harness.engines import build_engine
        from harness.workflows import build_workflow

        cfg = copy.deepcopy(cfg)
        cfg.algo.adv_estimator = "grpo"  # scoring samples needs no critic: a GAE run's value heads are not built
        self.cfg, self.task = cfg, task
        self.workflow = build_workflow(cfg, task)
        self.engine = build_engine(cfg, model_dir, list(policies), work_dir, task=task)
        self.controller = Controller(cfg, task, self.workflow, _Routing(policy_of), self.engine)

    def correct_per_problem(self, problems, samples: int, seed: int) -> Tuple[List[int], list]:
        """Correct episodes of each problem among its `samples`, drawn from the stream `seed` starts (the same
        seed gives two checkpoints the same random numbers: a paired comparison); and the episodes."""
        import torch

        torch.manual_seed(seed)
        with torch.no_grad():
            episodes, _ = self.controller.rollout(problems, samples, greedy=False)
        correct = [0] * len(problems)
        for episode in episodes:
            correct[episode.group] += int(bool(episode.grade and episode.grade.correct))
        return correct, episodes

    def pass_rates(self, problems, samples: int, k: int, seed: int) -> Tuple[Dict[str, float], list]:
        """(pass@1, pass@k and problems solved; the episodes scored, for the trajectories kept)."""
        per_problem, episodes = self.correct_per_problem(problems, samples, seed)
        return {"pass@1": sum(pass_at_k(samples, c, 1) for c in per_problem) / len(problems),
                f"pass@{k}": sum(pass_at_k(samples, c, k) for c in per_problem) / len(problems),
                "problems_solved": float(sum(c > 0 for c in per_problem))}, episodes

    def close(self) -> None:
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()


class _Routing:
    """A PolicyMap's one method the controller uses: which policy serves a role instance."""

    def __init__(self, policy_of):
        self.policy_of = policy_of


def base_model_dir(run: Path) -> Path:
    """The base model a run trained from (status.json), else the one its config prepares."""
    from harness.run_dir import stored_cell_config
    from harness.tasks import build_task
    from harness.warmup import prepare_model

    status = run / "status.json"
    recorded = json.loads(status.read_text()).get("model_dir") if status.is_file() else None
    if recorded and (Path(recorded) / "config.json").is_file():
        return Path(recorded)
    cfg = stored_cell_config(run)
    return prepare_model(cfg, build_task(cfg), log=lambda *_: None)


def evaluation_problems(cfg, split: str = "validation", task_name: Optional[str] = None,
                        data_path: Optional[str] = None):
    """(the task, the problems to score): another task's every problem (`task_name`), else the run's
    validation problems or, for `held_out`, its training set's own held-out part (without the
    validation file the run used instead of it)."""
    from harness.tasks import build_task

    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; valid choices: {', '.join(SPLITS)}")
    if task_name:
        cfg.task, cfg.data.path = task_name, data_path
    elif split == "held_out":
        cfg.data.val_path = None
    task = build_task(cfg)
    return task, (task.problems("train") + task.problems("val")) if task_name else task.problems("val")


def evaluation_budget(cfg, task_kind: str, lengths: str = "run") -> int:
    """New tokens per reply: the run's own (training lengths) or the study's evaluation budget for the
    task's kind (math or code)."""
    if lengths not in LENGTHS:
        raise ValueError(f"unknown lengths '{lengths}'; valid choices: {', '.join(LENGTHS)}")
    if lengths == "run":
        return int(cfg.workflow.max_new_tokens)
    if task_kind not in STUDY_EVAL_NEW_TOKENS:
        raise ValueError(f"lengths=study is the study's budgets for math and code; this run's task is {task_kind} "
                         f"(valid choices for it: run)")
    return STUDY_EVAL_NEW_TOKENS[task_kind]


def apply_budget(cfg, budget: int, prompt_cap: Optional[int] = None) -> None:
    """Score at `budget` new tokens a reply, every role (the study's evaluation gives all agents one
    length): vLLM's context grows by what the budget adds. A `prompt_cap` (the study's evaluation caps)
    replaces the run's data.max_prompt_length, and vLLM's context is at least the cap plus the budget."""
    grown = budget - int(cfg.workflow.max_new_tokens)
    if grown:
        cfg.workflow.role_max_new_tokens = {}
    cfg.workflow.max_new_tokens = budget
    if grown > 0:
        cfg.verl.rollout_max_model_len = int(cfg.verl.rollout_max_model_len) + grown
    if prompt_cap is not None:
        cfg.data.max_prompt_length = prompt_cap
        cfg.verl.rollout_max_model_len = max(int(cfg.verl.rollout_max_model_len), prompt_cap + budget)


def evaluation_prompt_cap(cfg, task_kind: str, lengths: str = "run") -> Optional[int]:
    """The prompt cap to score at: the run's own, or at study lengths the study's evaluation cap for the
    workflow (a workflow the study did not run keeps the run's)."""
    if lengths == "study":
        return STUDY_EVAL_PROMPT_TOKENS.get(task_kind, {}).get(cfg.topology, cfg.data.max_prompt_length)
    return cfg.data.max_prompt_length


def evaluate_run(run: Path, mode: str, k: int, samples: int, problems: Optional[int], task_name: Optional[str] = None,
                 data_path: Optional[str] = None, temperature: Optional[float] = None, log=print,
                 split: str = "validation", resume: bool = False, lengths: str = "run") -> List[dict]:
    """Evaluate one run directory in `mode` on `problems` problems (None: all); returns the rows written
    to its eval_results.jsonl (with `resume`, only those of checkpoints it had no row for)."""
    from harness.run_dir import stored_cell_config
    from harness.sharing import PolicyMap
    from harness.workflows import build_workflow

    cfg = stored_cell_config(run)
    model_dir = base_model_dir(run)
    if temperature is not None:
        cfg.algo.temperature = temperature
    task, eval_set = evaluation_problems(cfg, split, task_name, data_path)
    eval_set = eval_set[:problems]
    apply_budget(cfg, evaluation_budget(cfg, task.kind, lengths), evaluation_prompt_cap(cfg, task.kind, lengths))
    roles = build_workflow(cfg, task).role_instances()
    source, sources = run, []
    if mode == "single_agent_transfer":
        if cfg.topology == "single":
            log(f"{run.name}: a single-agent run has nothing to transfer to; skipped")
            return []
        source = paired_single_run(run, cfg)
        if source is None:
            raise FileNotFoundError(f"{run.name}: no paired single-agent run beside it for single_agent_transfer")
        transferred = PolicyMap.from_config(stored_cell_config(source), [("solver", 0)]).policy_of("solver", 0)
        policies, policy_of = [transferred], (lambda role, instance: transferred)
    else:
        policy_map = PolicyMap.from_config(cfg, roles)
        policies, policy_of = policy_map.policies, policy_map.policy_of
    sources = [("base", None, None)] if mode == "base" else checkpoints_of(source)
    phases = trajectory_phases([name for name, _, _ in sources])
    if resume:  # a checkpoint already scored the same way keeps its row
        done = scored(run, mode, split, k, samples, task=cfg.task, problems=len(eval_set),
                      max_new_tokens=cfg.workflow.max_new_tokens, max_prompt_length=cfg.data.max_prompt_length)
        sources = [s for s in sources if s[0] not in done]
    rows = []
    with tempfile.TemporaryDirectory(prefix="marl-eval-") as work:
        evaluator = Evaluator(cfg, task, model_dir, policies, policy_of, Path(work))
        try:
            for name, directory, problem in sources:
                row = {"mode": mode, "checkpoint": name, "source_run": source.name, "task": cfg.task,
                       "split": split, "k": k,
                       "samples": samples, "problems": len(eval_set), "temperature": cfg.algo.temperature,
                       "max_new_tokens": cfg.workflow.max_new_tokens, "max_prompt_length": cfg.data.max_prompt_length}
                if directory is not None:
                    row["step"] = _trained_steps(directory)
                if problem is not None:
                    rows.append({**row, "status": "damaged", "reason": problem})
                    log(f"{run.name} {mode} {name}: damaged checkpoint ({problem}); not evaluated")
                    continue
                started = time.time()
                if directory is not None:
                    evaluator.engine.load(directory)
                rates, episodes = evaluator.pass_rates(eval_set, samples, k, seed=cfg.seed * 1_000_003 + 97)
                rows.append({**row, "status": "ok", **rates, "seconds": round(time.time() - started, 2)})
                if name in phases:
                    label = f"{mode}-{split}-{phases[name]}-{name}" + ("" if lengths == "run" else f"-{lengths}")
                    write_trajectories(run, label, row.get("step"), episodes)
                log(f"{run.name} {mode} {name}: pass@1 {rates['pass@1']:.3f}, pass@{k} {rates[f'pass@{k}']:.3f}")
        finally:
            evaluator.close()
    write_results(run, rows)
    return rows


def trajectory_phases(names: Sequence[str]) -> Dict[str, str]:
    """The checkpoints whose trajectories the study reads: the first step checkpoint (early), `best`, the
    last step checkpoint (terminal); the base model's as `base`."""
    steps = [n for n in names if n.startswith("step_")]
    phases = {"base": "base"} if "base" in names else {}
    if steps:
        phases.update({steps[0]: "early", steps[-1]: "terminal"})
    if "best" in names:
        phases["best"] = "best"
    return phases


def write_trajectories(run: Path, name: str, step: Optional[int], episodes) -> Path:
    """Every evaluated episode of one checkpoint in full (each turn's role, prompt, response, verdicts),
    as samples.jsonl holds training episodes."""
    from harness.controller import sample_records
    from harness.run_dir import write_atomic

    path = run / TRAJECTORIES / f"{name}.jsonl"
    path.parent.mkdir(exist_ok=True)
    records = sample_records(step if step is not None else -1, episodes, len(episodes))
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return path


def scored(run: Path, mode: str, split: str, k: int, samples: int, task: Optional[str] = None,
           problems: Optional[int] = None, max_new_tokens: Optional[int] = None,
           max_prompt_length: Optional[int] = None) -> set:
    """The checkpoints of `run` with an ok row scored this way (and on this task, number of problems,
    budget and prompt cap, where given; rows from before caps were recorded had none): what `--resume` skips."""
    return {r["checkpoint"] for r in _stored(run) if r.get("status") == "ok"
            and (r.get("mode"), r.get("split", "validation"), r.get("k"), r.get("samples")) == (mode, split, k, samples)
            and task in (None, r.get("task")) and problems in (None, r.get("problems"))
            and max_new_tokens in (None, r.get("max_new_tokens"))
            and (max_prompt_length is None or r.get("max_prompt_length") == max_prompt_length)}


def _trained_steps(directory: Path) -> Optional[int]:
    trainer = directory / "trainer.yaml"
    if not trainer.is_file():
        return None
    from omegaconf import OmegaConf

    return int(OmegaConf.load(trainer)["step"])


def _key(row: dict) -> tuple:
    """What a result row is of: a row of the same key replaces it (rows before splits were validation)."""
    return (row.get("mode"), row.get("checkpoint"), row.get("task"), row.get("split", "validation"), row.get("k"),
            row.get("max_new_tokens"), row.get("max_prompt_length"))


def _stored(run: Path) -> List[dict]:
    """The run's result rows; a row written before rows recorded their budget was scored at the run's own."""
    from harness.run_dir import read_jsonl, stored_cell_config

    rows = read_jsonl(run / RESULTS) if (run / RESULTS).is_file() else []
    if any("max_new_tokens" not in r for r in rows):
        budget = int(stored_cell_config(run).workflow.max_new_tokens)
        rows = [{"max_new_tokens": budget, **r} for r in rows]
    return rows


def write_results(run: Path, rows: List[dict]) -> None:
    """Keep the rows of other (mode, checkpoint, task, split, k, budget) and replace these, atomically."""
    from harness.run_dir import write_atomic

    new = {_key(r) for r in rows}
    kept = [r for r in _stored(run) if _key(r) not in new]
    write_atomic(run / RESULTS, "".join(json.dumps(r) + "\n" for r in kept + rows))


def load_results(sweep: Path):
    """Every run's eval_results.jsonl as one table (cell_id first), or an empty frame."""
    import pandas as pd

    from analysis.load import find_runs
    from harness.run_dir import read_jsonl

    rows = [{"cell_id": run.name, **r} for run in find_runs(sweep) if (run / RESULTS).is_file()
            for r in read_jsonl(run / RESULTS)]
    return pd.DataFrame(rows)


def _problems(text: str) -> Optional[int]:
    """--problems: a count, or `all` (None)."""
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or all, got '{text}'") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a run directory (with cell.yaml) or a sweep directory")
    parser.add_argument("--mode", default="trained", help=f"one of {', '.join(MODES)}")
    parser.add_argument("--k", type=int, default=1, help="pass@k (samples per problem must be >= k)")
    parser.add_argument("--samples", type=int, default=None, help="sampled episodes per problem (default: k)")
    parser.add_argument("--problems", type=_problems, default=32, help="evaluation problems, or all")
    parser.add_argument("--task", default=None, help="evaluate on another task (e.g. aime, math500) ...")
    parser.add_argument("--data-path", default=None, help="... read from this file (all its problems)")
    parser.add_argument("--temperature", type=float, default=None, help="default: the run's algo.temperature")
    parser.add_argument("--split", default="validation", help=f"one of {', '.join(SPLITS)} (held_out: the training "
                        "set's own held-out part, where the study scores math)")
    parser.add_argument("--lengths", default="run", help=f"one of {', '.join(LENGTHS)} (study: the study's evaluation "
                        "budgets, math 8192 and code 5120 new tokens)")
    parser.add_argument("--resume", action="store_true", help="keep the rows written and evaluate only the "
                        "checkpoints without one")
    args = parser.parse_args(argv)
    samples = args.samples or args.k
    problem = _argument_problem(args, samples)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from analysis.load import find_runs

    runs = [args.path] if (args.path / "cell.yaml").is_file() else find_runs(args.path)
    if not runs:
        print(f"error: {args.path} holds no run directory (with cell.yaml)", file=sys.stderr)
        return 2
    try:
        for run in runs:
            evaluate_run(run, args.mode, args.k, samples, args.problems, args.task, args.data_path, args.temperature,
                         split=args.split, resume=args.resume, lengths=args.lengths)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def options_problem(mode: str, split: str, k: int, samples: int, problems: Optional[int], choice: str = "",
                    flag: str = "--", lengths: str = "run") -> Optional[str]:
    """What is wrong with the scoring options, if anything, named as the caller's command line spells
    them (`choice` before a choice's name, `flag` before a number's: this CLI's `--k`, the launcher's
    `evaluate.k`)."""
    if mode not in MODES:
        return f"unknown {choice}mode '{mode}'; valid choices: {', '.join(MODES)}"
    if split not in SPLITS:
        return f"unknown {choice}split '{split}'; valid choices: {', '.join(SPLITS)}"
    if k < 1 or samples < k:
        return f"{flag}k must be >= 1 and {flag}samples >= k (got k={k}, samples={samples})"
    if problems is not None and problems < 1:
        return f"{flag}problems must be >= 1 or all, got {problems}"
    if lengths not in LENGTHS:
        return f"unknown {choice}lengths '{lengths}'; valid choices: {', '.join(LENGTHS)}"
    return None


def _argument_problem(args, samples: int) -> Optional[str]:
    from harness.tasks import TASKS

    problem = options_problem(args.mode, args.split, args.k, samples, args.problems, lengths=args.lengths)
    if problem:
        return problem
    if args.task is not None and args.task not in TASKS:
        return f"unknown task '{args.task}'; valid choices: {', '.join(sorted(TASKS))}"
    if (args.task is None) != (args.data_path is None) and args.task not in (None, "humaneval", "arith", "code-synth"):
        return "--task and --data-path go together"
    if args.data_path is not None and not Path(args.data_path).is_file():
        return f"--data-path {args.data_path} does not exist"
    if not args.path.is_dir():
        return f"{args.path} is not a directory"
    return None


if __name__ == "__main__":
    sys.exit(main())
