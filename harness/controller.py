"""One GRPO step of a multi-agent cell, start to finish — the algorithm in one place:

    problems ─▶ G episodes each (workflow programs, batched generate per policy)
             ─▶ reward per turn ─▶ GRPO advantages (a role's turns share their episode's)
             ─▶ engine.update(turns, probe, step): per policy, PPO mini-batches over epochs,
                one optimizer step each (engines/base.py) ─▶ per-role metrics

Every step is seeded from (seed, step) alone, so a resumed run replays exactly the steps a
killed one would have taken.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from harness.algo.grpo import assign_advantages
from harness.engines.base import kl_age, step_lr
from harness.instrument.gradients import gradient_metrics
from harness.instrument.probe import GradientProbe
from harness.instrument.rollout import rollout_metrics
from harness.rewards import assign_rewards
from harness.sharing import PolicyMap
from harness.tasks import Problem, Task
from harness.episodes import Episode, PromptTooLong
from harness.workflows import Agents, Scheduler, Workflow
from harness.workflows.prompts import cell_prompts
from harness.metric_keys import policy_key, role_key


@dataclass
class StepResult:
    metrics: Dict[str, float]
    episodes: List[Episode]


class Controller:
    def __init__(self, cfg, task: Task, workflow: Workflow, policy_map: PolicyMap, engine,
                 prompts: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        self.task = task
        self.workflow = workflow
        self.policy_map = policy_map
        self.engine = engine
        self.prompts = prompts if prompts is not None else cell_prompts(cfg.workflow, workflow.templates())
        roles = [r.name for r in workflow.roles()]
        # a graph's role may need at least some tokens (evidence, notes); a cell's per-role setting wins
        asked, default = workflow.role_budgets(), cfg.workflow.max_new_tokens
        self.budgets = {r: int(cfg.workflow.role_max_new_tokens.get(r, max(default, asked.get(r, default))))
                        for r in roles}
        self.per_instance = {r.name for r in workflow.roles() if r.trajectory == "instance"}  # GRPO's groups
        self.train_problems = task.problems("train")
        self.val_problems = task.problems("val")[: cfg.val_problems]
        self.critic = None
        if cfg.algo.adv_estimator == "gae":  # engine=verl: verl's critic worker groups; local: value heads
            from harness.algo.critic import FeatureCritic, TurnCritic

            self.critic = getattr(engine, "critic", None) or FeatureCritic(engine, TurnCritic(
                {p: engine.hidden_size(p) for p in policy_map.policies}, cfg.algo.critic_lr, cfg.algo.value_clip,
                cfg.algo.critic_steps, cfg.seed), cfg.algo.micro_batch_size)

    @classmethod
    def from_recipe(cls, recipe, engine) -> "Controller":
        """The controller of a cell built once (harness/recipe.py)."""
        return cls(recipe.cfg, recipe.task, recipe.workflow, recipe.policy_map, engine, prompts=recipe.prompts)

    def save(self, directory) -> None:
        """What a checkpoint needs beyond the engine's weights: the critic, when there is one."""
        if self.critic is not None:
            self.critic.save(directory)

    def load(self, directory) -> None:
        if self.critic is not None:
            self.critic.load(directory)

    def _seed(self, step: int, salt: int = 0) -> None:
        base = (self.cfg.seed * 1_000_003 + step) * 7 + salt
        # a resampled stream (cfg.resample j > 0): the same problems, other samples; 0 is the run's own
        torch.manual_seed(base if not self.cfg.resample else base + 104_729 * self.cfg.resample * 1_000_003 ** 2)

    def problems_for(self, step: int) -> List[Problem]:
        rng = random.Random(f"{self.cfg.seed}:{step}")
        return rng.sample(self.train_problems, self.cfg.algo.problems_per_step)

    def rollout(self, problems: List[Problem], group_size: int, greedy: bool) -> Tuple[List[Episode], Scheduler]:
        scheduler = Scheduler(self.engine.generate)

        async def one(problem: Problem, group: int) -> Episode:
            agents = Agents(scheduler, self.policy_map.policy_of, self.prompts, self.budgets,
                            self.cfg.algo.temperature, greedy, self.workflow.chat, self.cfg.data.max_prompt_length)
            try:
                episode = await self.workflow.episode(problem, agents)  # a graph ends a capped episode itself
            except PromptTooLong:  # a Python workflow that did not: its turns so far, no answer
                episode = Episode(problem, list(agents.turns), "", self.task.grade(problem, ""),  # siblings may go on
                                  stats={"prompt_capped": 1.0})
            if agents.max_prompt_tokens is not None:
                episode.stats.setdefault("prompt_capped", 0.0)
            episode.group = group
            return episode

        coroutines = [one(p, g) for g, p in enumerate(problems) for _ in range(group_size)]
        return scheduler.run(coroutines), scheduler

    def train_step(self, step: int) -> StepResult:
        started = time.perf_counter()
        self._seed(step)
        episodes, scheduler = self.rollout(self.problems_for(step), self.cfg.algo.group_size, greedy=False)
        rollout_s = time.perf_counter() - started
        for episode in episodes:
            assign_rewards(episode, self.cfg.reward, self.cfg.algo.adv_estimator)
        if self.critic is None:
            assign_advantages(episodes, self.cfg.algo.norm_adv_by_std, self.cfg.algo.adv_grouping,
                              norm=self.cfg.algo.adv_norm, per_instance=self.per_instance)
        else:
            critic_batch = self._gae_advantages(episodes)
        probe = GradientProbe()
        update_started = time.perf_counter()
        update = self.engine.update([t for e in episodes for t in e.turns], probe, step)  # verl: + rollout weight sync
        update_s = time.perf_counter() - update_started
        metrics = rollout_metrics(episodes)
        if self.critic is not None:
            metrics.update(self._critic_update(critic_batch))
        metrics.update(gradient_metrics(probe))
        metrics.update(update_metrics(update))
        metrics["lr"] = step_lr(self.cfg.algo, self.cfg.steps, step)
        metrics["skipped_policies"] = float(len(update.skipped))
        age = kl_age(self.cfg, step)  # role/<r>/kl is measured on a cadence: steps since its last value
        if age is not None:
            metrics["kl_age"] = float(age)
        metrics["time/rollout_s"] = rollout_s
        metrics["time/update_s"] = update_s
        metrics["time/step_s"] = time.perf_counter() - started
        metrics["time/generate_calls"] = float(len(scheduler.calls))
        return StepResult(metrics, episodes)

    def _gae_advantages(self, episodes: List[Episode]) -> dict:
        """Each turn's value from its policy's critic, GAE over each episode's graph stages (or each turn
        alone: algo.gae_scope=turn), whitened
        within each policy's turns (or the step's: algo.adv_whiten); returns what the critic update
        needs (old values, returns per turn)."""
        from harness.algo.critic import one_step_gae, stage_gae, whiten, whiten_within

        turns = [t for e in episodes for t in e.turns]
        values = {}
        for policy in sorted({t.policy for t in turns}):
            mine = [t for t in turns if t.policy == policy]
            for turn, value in zip(mine, self.critic.values(policy, mine)):
                values[id(turn)] = float(value)
        advantages, returns = {}, {}
        for episode in episodes:
            rewards, olds = [t.reward for t in episode.turns], [values[id(t)] for t in episode.turns]
            if self.cfg.algo.gae_scope == "turn":
                adv, ret = one_step_gae(rewards, olds)
            else:
                adv, ret = stage_gae(rewards, olds, [t.depth for t in episode.turns], self.cfg.algo.gae_gamma,
                                     self.cfg.algo.gae_lambda)
            for turn, a, r in zip(episode.turns, adv, ret):
                advantages[id(turn)], returns[id(turn)] = a, r
        raw = [advantages[id(t)] for t in turns]
        if self.cfg.algo.adv_whiten == "policy":
            whitened = whiten_within(raw, [t.policy for t in turns])
        else:  # one verl batch: masked_whiten over the step's turns
            whitened = whiten(raw)
        for turn, w in zip(turns, whitened):
            turn.advantage = w
        return {"turns": turns, "values": values, "returns": returns, "raw": advantages}

    def _critic_update(self, batch: dict) -> Dict[str, float]:
        """Value-loss steps per policy; per role: mean value, raw advantage, value loss, explained variance."""
        from harness.algo.critic import explained_variance, value_loss

        turns, metrics = batch["turns"], {}
        for policy in sorted({t.policy for t in turns}):
            mine = [t for t in turns if t.policy == policy]
            old = [batch["values"][id(t)] for t in mine]
            target = [batch["returns"][id(t)] for t in mine]
            for key, value in self.critic.update(policy, mine, target, old).items():
                metrics[policy_key(policy, key)] = value
        for role in sorted({t.role for t in turns}):
            mine = [t for t in turns if t.role == role]
            old = torch.tensor([batch["values"][id(t)] for t in mine])
            target = torch.tensor([batch["returns"][id(t)] for t in mine])
            metrics[role_key(role, "value")] = float(old.mean())
            metrics[role_key(role, "adv_mean")] = statistics.fmean(batch["raw"][id(t)] for t in mine)
            metrics[role_key(role, "value_loss")] = float(value_loss(old, target, old, self.cfg.algo.value_clip)[0])
            explained = explained_variance(target.tolist(), old.tolist())
            if explained is not None:
                metrics[role_key(role, "explained_variance")] = explained
        return metrics

    @torch.no_grad()
    def validate(self, step: int) -> Dict[str, float]:
        """`val_samples` sampled episodes per validation problem at the rollout temperature (or one
        greedy episode with `val_greedy`); keys under val/, with the accuracy's standard error over
        problems (each problem's mean over its samples is one observation)."""
        self._seed(step, salt=1)
        k = 1 if self.cfg.val_greedy else self.cfg.val_samples
        episodes, _ = self.rollout(self.val_problems, k, greedy=self.cfg.val_greedy)
        for episode in episodes:
            assign_rewards(episode, self.cfg.reward, self.cfg.algo.adv_estimator)
        metrics = rollout_metrics(episodes, prefix="val/", selection_pressure=False)  # no advantages here
        kept = {k: v for k, v in metrics.items()
                if k.endswith(("accuracy", "format_ok", "fallback", "response_length", "distinct_candidates", "pass_rate",
                               "/f1"))
                or k.startswith("val/episode/")}
        kept["val/accuracy_se"] = accuracy_standard_error(episodes)
        return kept


def accuracy_standard_error(episodes: List[Episode]) -> float:
    """Standard error of the mean accuracy over problems (episodes grouped by `group`)."""
    per_problem: Dict[int, List[float]] = {}
    for e in episodes:
        per_problem.setdefault(e.group, []).append(1.0 if e.grade is not None and e.grade.correct else 0.0)
    means = [sum(v) / len(v) for v in per_problem.values()]
    if len(means) < 2:
        return 0.0
    return statistics.stdev(means) / math.sqrt(len(means))


def update_metrics(update) -> Dict[str, float]:
    """An engine's UpdateResult as flat metric keys (policy/<p>/..., role/<r>/...)."""
    metrics: Dict[str, float] = {"loss": update.loss}
    per_policy = {"grad_norm": update.policy_grad_norm, "grad_norm_mb_mean": update.grad_norm_mean,
                  "update_norm": update.policy_update_norm, "param_norm": update.policy_param_norm,
                  "optimizer_steps": update.optimizer_steps, "drift": update.drift, "drift_rate": update.drift_rate}
    for name, values in per_policy.items():
        for policy, value in values.items():
            metrics[policy_key(policy, name)] = float(value)
    for policy, value in update.policy_update_norm.items():
        metrics[policy_key(policy, "update_ratio")] = value / max(update.policy_param_norm[policy], 1e-12)
    for policy, (mean, largest) in update.rollout_probs_diff.items():
        metrics[policy_key(policy, "rollout_probs_diff_mean")] = mean
        metrics[policy_key(policy, "rollout_probs_diff_max")] = largest
    for policy, damped in update.coherence_damping.items():  # the study's I6, as its actor logs coherence_cos/_scale
        metrics[policy_key(policy, "coherence_cos")] = sum(c for c, _ in damped) / len(damped)
        metrics[policy_key(policy, "coherence_scale")] = sum(s for _, s in damped) / len(damped)
    for policy, steps in update.minibatches.items():  # the first step is on-policy; later ones may clip
        metrics[policy_key(policy, "clipfrac_first")] = steps[0]["clipfrac"]
        if "lr_scale" in steps[0]:  # algo.coherence_reg: the mean learning-rate factor of the steps
            metrics[policy_key(policy, "lr_scale")] = sum(s["lr_scale"] for s in steps) / len(steps)
        later = steps[1:]
        if later:
            metrics[policy_key(policy, "clipfrac_later")] = (sum(s["clipfrac"] * s["tokens"] for s in later)
                                                          / max(sum(s["tokens"] for s in later), 1.0))
    per_role = {"entropy": update.entropy, "kl": update.kl, "clipfrac": update.clipfrac, "ratio": update.ratio}
    for name, values in per_role.items():
        for role, value in values.items():
            metrics[role_key(role, name)] = value
    for role, values in update.role_extra.items():
        for name, value in values.items():
            metrics[role_key(role, name)] = value
    return metrics


def sample_records(step: int, episodes: List[Episode], n: int) -> List[dict]:
    """Full episodes for samples.jsonl: each turn's role, prompt, response, reward and verdicts."""
    records = []
    for episode in episodes[:n]:
        records.append({
            "step": step, "problem": episode.problem.uid, "question": episode.problem.question,
            "reference": episode.problem.answer, "final": episode.final_text,
            "correct": bool(episode.grade and episode.grade.correct),
            "turns": [{"role": t.role, "instance": t.instance, "policy": t.policy, "prompt": t.prompt,
                       "response": t.text, "tokens": len(t.response_ids), "truncated": t.truncated,
                       "malformed": t.malformed, "role_correct": t.role_correct, "reward": t.reward,
                       "advantage": t.advantage} for t in episode.turns],
        })
    return records
