"""PPO with a GAE critic, UnityMAS-O's alternative to GRPO (`algo.adv_estimator=gae`).

A workflow episode is a path through its graph: stages k = 0..K-1 (Turn.depth), each one turn or
several run at once (three voters, the workers of a plan). Every model instance (policy) has a
critic: a value head on the last prompt token's final hidden state of that policy's own model
(adapter on, features detached, so the critic never moves the actor). The value of a state is the
critic of the policy that acts there. For a turn t at stage k, the successor is stage k+1, shared
by all of stage k's turns; a stage of several turns is read once, as the mean of its turns:

    delta_t = r_t + gamma * V_{k+1} - V(s_t)           V_{k+1}: the mean value of stage k+1 (0 after the last)
    A_t     = delta_t + gamma * lambda * A_{k+1},       A_{k+1}: the mean advantage of stage k+1;  R_t = A_t + V(s_t)

which is verl's `compute_gae_advantage_return` with turns in place of tokens wherever every stage
is one turn (a chain: eval_opt, D's loop; tested equal), and keeps a voter's successor the
aggregator rather than the sibling that happened to finish after it; the advantages
are whitened within each policy's turns (`algo.adv_whiten=policy`, UnityMAS-O's worker groups each
with its own buffer; verl's masked_whiten) or over all the step's turns (`cell`, one verl batch),
the value loss is verl's clipped one,
0.5 * mean(max((V - R)^2, (clip(V, V_old +- c) - R)^2)).

`algo.gae_scope=turn` is UnityMAS-O's own trainer instead: every turn a one-step episode of its
policy (A_t = r_t - V(s_t), R_t = r_t; `one_step_gae`), so nothing bootstraps across turns or models.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

CRITIC_FILE = "critic.safetensors"
CRITIC_SETTINGS = "critic_optimizers.json"


def turn_gae(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float) -> Tuple[List[float], List[float]]:
    """(advantages, returns) of one episode's turns, in order."""
    advantages = [0.0] * len(rewards)
    running, next_value = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t], next_value = running, values[t]
    return advantages, [a + v for a, v in zip(advantages, values)]


def stage_gae(rewards: Sequence[float], values: Sequence[float], depths: Sequence[int], gamma: float,
              lam: float) -> Tuple[List[float], List[float]]:
    """(advantages, returns) of one episode's turns, in their order, over its graph stages (depths)."""
    stages: Dict[int, List[int]] = {}
    for index, depth in enumerate(depths):
        stages.setdefault(depth, []).append(index)
    advantages = [0.0] * len(rewards)
    next_value = next_advantage = 0.0
    for depth in sorted(stages, reverse=True):
        members = stages[depth]
        for i in members:
            advantages[i] = rewards[i] + gamma * next_value - values[i] + gamma * lam * next_advantage
        next_value = sum(values[i] for i in members) / len(members)
        next_advantage = sum(advantages[i] for i in members) / len(members)
    return advantages, [a + v for a, v in zip(advantages, values)]


def one_step_gae(rewards: Sequence[float], values: Sequence[float]) -> Tuple[List[float], List[float]]:
    """(advantages, returns) with every turn a one-step episode (algo.gae_scope=turn): A = r - V(s),
    R = r. UnityMAS-O's trainer files each LLM call as its own trajectory (done, next value 0) and
    runs verl's GAE per model on its own critic's values, so nothing bootstraps across turns or
    models (upstream verl/experimental/star_ppo/ray_trainer.py, _run_model_ppo_update)."""
    return [r - v for r, v in zip(rewards, values)], [float(r) for r in rewards]


def verl_gae(episodes: Sequence[Tuple[Sequence[float], Sequence[float]]], gamma: float,
             lam: float) -> Tuple[List[List[float]], List[List[float]]]:
    """verl's own `compute_gae_advantage_return` over a step's episodes, turns as its tokens (each
    episode one row of (rewards, values), padded and masked): (whitened advantages, returns) per
    episode. The reference the trainer's `stage_gae` + `whiten` are tested against on chains."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    width = max((len(r) for r, _ in episodes), default=0)
    if width == 0:
        return [[] for _ in episodes], [[] for _ in episodes]
    rewards = torch.zeros((len(episodes), width), dtype=torch.float64)
    values = torch.zeros_like(rewards)
    mask = torch.zeros_like(rewards)
    for row, (r, v) in enumerate(episodes):
        rewards[row, : len(r)], values[row, : len(v)], mask[row, : len(r)] = torch.tensor(list(r), dtype=torch.float64), \
            torch.tensor(list(v), dtype=torch.float64), 1.0
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    if int(mask.sum()) < 2:  # verl's whitening needs two turns; one turn has no spread: advantage 0
        advantages = torch.zeros_like(advantages)
    return ([advantages[i, : len(r)].tolist() for i, (r, _) in enumerate(episodes)],
            [returns[i, : len(r)].tolist() for i, (r, _) in enumerate(episodes)])


def whiten(values: Sequence[float], eps: float = 1e-8) -> List[float]:
    """(x - mean) / sqrt(var + eps) with the unbiased variance, as verl's masked_whiten."""
    x = torch.tensor(list(values), dtype=torch.float64)
    if len(x) < 2:
        return [0.0] * len(x)
    return ((x - x.mean()) * torch.rsqrt(x.var(unbiased=True) + eps)).tolist()


def whiten_within(values: Sequence[float], groups: Sequence[str]) -> List[float]:
    """`whiten` within each group (a policy's turns, as a worker group whitens its own buffer)."""
    members: Dict[str, List[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    out = [0.0] * len(values)
    for indices in members.values():
        for index, value in zip(indices, whiten([values[i] for i in indices])):
            out[index] = value
    return out


def value_loss(predicted: torch.Tensor, returns: torch.Tensor, old: torch.Tensor, clip: float) -> Tuple[torch.Tensor, float]:
    """verl's clipped value loss (token-mean over turns) and its clip fraction."""
    clipped = torch.clamp(predicted, old - clip, old + clip)
    plain, worst = (predicted - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.max(plain, worst).mean(), float((worst > plain).float().mean())


def explained_variance(returns: Sequence[float], values: Sequence[float]) -> Optional[float]:
    """1 - Var(R - V) / (Var(R) + 1e-5), verl's `critic/vf_explained_var` (trainer/ppo/metric_utils.py): 1 a
    perfect critic, 0 no better than a constant; finite where R is constant (a batch whose rewards all
    agree is not a numerical fault); None for fewer than two turns, where no variance exists."""
    r, v = torch.tensor(list(returns), dtype=torch.float64), torch.tensor(list(values), dtype=torch.float64)
    if len(r) < 2:
        return None
    return float(1 - (r - v).var() / (r.var() + 1e-5))


class FeatureCritic:
    """The controller's view of engine=local's critics: a TurnCritic on the features the engine
    gives (the last prompt token's final hidden state of the policy's own model, detached)."""

    def __init__(self, engine, critic: "TurnCritic", micro_batch: int):
        self.engine, self.critic, self.micro_batch = engine, critic, micro_batch
        self._features: Dict[int, torch.Tensor] = {}

    def values(self, policy: str, turns) -> List[float]:
        turns = list(turns)
        size = self.micro_batch
        feats = torch.cat([self.engine.prompt_features(policy, [t.prompt_ids for t in turns[i: i + size]])
                           for i in range(0, len(turns), size)])
        for turn, row in zip(turns, feats):
            self._features[id(turn)] = row
        return self.critic.values(policy, feats).tolist()

    def update(self, policy: str, turns, returns: Sequence[float], old: Sequence[float]) -> Dict[str, float]:
        feats = torch.stack([self._features.pop(id(t)) for t in turns])
        return self.critic.update(policy, feats, torch.tensor(list(returns)), torch.tensor(list(old)))

    def save(self, directory: Path) -> None:
        self.critic.save(directory)

    def load(self, directory: Path) -> None:
        self.critic.load(directory)


class TurnCritic:
    """One value head per policy (model instance, each with its own hidden size), each with its own Adam."""

    def __init__(self, hidden: Dict[str, int], lr: float, clip: float, steps: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.heads: Dict[str, torch.nn.Linear] = {}
        for policy, size in sorted(hidden.items()):
            head = torch.nn.Linear(size, 1)
            with torch.no_grad():
                head.weight.copy_(0.01 * torch.randn(head.weight.shape, generator=generator))
                head.bias.zero_()
            self.heads[policy] = head
        self.optimizers = {p: torch.optim.Adam(h.parameters(), lr=lr) for p, h in self.heads.items()}
        self.clip, self.steps = clip, steps

    @torch.no_grad()
    def values(self, policy: str, features: torch.Tensor) -> torch.Tensor:
        return self.heads[policy](features).squeeze(-1)

    def update(self, policy: str, features: torch.Tensor, returns: torch.Tensor, old: torch.Tensor) -> Dict[str, float]:
        """`steps` Adam steps of the clipped value loss on this step's turns of the policy."""
        head, optimizer = self.heads[policy], self.optimizers[policy]
        first = last = None
        for _ in range(self.steps):
            loss, clipfrac = value_loss(head(features).squeeze(-1), returns, old, self.clip)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            last = float(loss.detach())
            if first is None:
                first = (last, clipfrac)
        return {"value_loss": first[0], "value_clipfrac": first[1], "value_loss_last": last}

    def save(self, directory: Path) -> None:
        """Heads and Adam state in safetensors, the optimizers' plain settings in JSON (as the engine's)."""
        from safetensors.torch import save_file

        from harness.engines.local import split_optimizer_state

        tensors = {f"head/{p}/{k}": v.detach().contiguous() for p, h in self.heads.items() for k, v in h.state_dict().items()}
        settings = {p: split_optimizer_state(o.state_dict(), f"optim/{p}/", tensors) for p, o in self.optimizers.items()}
        save_file(tensors, str(Path(directory) / CRITIC_FILE))
        (Path(directory) / CRITIC_SETTINGS).write_text(json.dumps(settings))

    def load(self, directory: Path) -> None:
        from safetensors.torch import load_file

        from harness.engines.local import join_optimizer_state

        tensors = load_file(str(Path(directory) / CRITIC_FILE))
        settings = json.loads((Path(directory) / CRITIC_SETTINGS).read_text())
        for policy, head in self.heads.items():
            head.load_state_dict({k: tensors[f"head/{policy}/{k}"] for k in head.state_dict()})
            self.optimizers[policy].load_state_dict(join_optimizer_state(settings[policy], f"optim/{policy}/", tensors))
