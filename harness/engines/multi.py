"""Several model instances in one cell (UnityMAS-O's agent-to-model map phi with different bases):
`models.<name>` gives each instance its own base model (a tiny scale or a checkpoint), training
mode (a LoRA adapter or every parameter) and optimizer, and lists the roles it plays.

Each instance is a LocalEngine of its own holding one policy named after the instance; this engine
routes generation and each policy's turns to it and merges their update summaries, so the probe,
metrics and monitors see one policy per instance as they see one per adapter elsewhere. Policies'
mini-batches never mix (engines/base.py cuts them per policy), so an instance updates exactly as
it would alone.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Dict, List, Sequence

from harness.engines.base import UpdateResult
from harness.episodes import Generation, Sampling, Turn

PER_POLICY = ("policy_grad_norm", "policy_update_norm", "policy_param_norm", "optimizer_steps", "grad_norm_mean",
              "drift", "drift_rate", "minibatches")
PER_ROLE = ("entropy", "kl", "role_loss", "clipfrac", "ratio")


def instance_config(cfg, name: str):
    """The cell's config as one instance sees it: its scale and checkpoint, its training mode, its LR."""
    spec = cfg.models[name]
    own = copy.deepcopy(cfg)
    own.models = {}
    own.scale, own.model.path = spec.scale, spec.path
    own.sharing_cfg.full_finetune = spec.train == "full"
    if spec.lr is not None:
        own.algo.lr = spec.lr
    if spec.weight_decay is not None:
        own.algo.weight_decay = spec.weight_decay
    return own


class MultiModelEngine:
    def __init__(self, cfg, model_dirs: Dict[str, Path], seed: int = 0):
        from harness.engines.local import LocalEngine

        self.cfg = cfg
        self.policies = sorted(model_dirs)
        self.engines: Dict[str, LocalEngine] = {}
        try:
            for name in self.policies:
                self.engines[name] = LocalEngine(model_dirs[name], [name], instance_config(cfg, name), seed=seed)
        except BaseException:  # the engines already built may hold rollout servers
            self.shutdown()
            raise

    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        return self.engines[policy].generate(policy, prompts, sampling)

    def update(self, samples: Sequence[Turn], probe=None, step: int = 0) -> UpdateResult:
        merged = UpdateResult(0.0, {}, {}, {})
        for name, engine in self.engines.items():
            mine = [t for t in samples if t.policy == name]
            if not mine:
                continue
            result = engine.update(mine, probe, step)
            merged.loss += result.loss
            merged.skipped += result.skipped
            for key in PER_POLICY + PER_ROLE:  # a role is played by one instance: no key is shared
                getattr(merged, key).update(getattr(result, key))
        return merged

    def prompt_features(self, policy: str, prompts):
        return self.engines[policy].prompt_features(policy, prompts)

    def hidden_size(self, policy: str) -> int:
        return self.engines[policy].hidden_size(policy)

    def save(self, path: Path) -> None:
        for name, engine in self.engines.items():
            (Path(path) / name).mkdir(parents=True, exist_ok=True)
            engine.save(Path(path) / name)

    def load(self, path: Path) -> None:
        for name, engine in self.engines.items():
            engine.load(Path(path) / name)

    def shutdown(self) -> None:
        """Every engine's, even when one fails to stop; the first failure is raised after."""
        errors = []
        for engine in self.engines.values():
            try:
                engine.shutdown()
            except Exception as exc:  # noqa: BLE001 - re-raised below, once the rest have stopped
                errors.append(exc)
        if errors:
            raise errors[0]
