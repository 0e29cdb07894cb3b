"""The GAE critic on engine=verl: per policy, verl's critic worker group (a `TrainingWorker` with
model_type `value_model`: verl's FSDP engine with a value head, the base checkpoint loaded as a
one-label token classifier, trained in full as verl trains its critic) and verl's own clipped
`value_loss`.

The harness's critic is turn-level (harness/algo/critic.py): the value of a state s_t is the
critic's value at the last token of the prompt the role acted on, which is where verl's
value-model output for the first response token is read (`no_padding_2_padding` shifts values by
one). So a turn's value is that column, and the value loss trains that column alone: the
response mask verl's `value_loss` aggregates over keeps the first response position only, with
the turn's return R_t and its old value V_old(s_t) there.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Dict, List, Sequence

import torch
import torch.distributed as dist
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from harness.engines.verl.batch import shard_rows
from harness.engines.verl.worker import HarnessWorker


def critic_worker_config(cfg, model_dir: Path, device: str):
    """verl's config of one policy's critic: the policy's base, no adapter, Adam at algo.verl_critic_lr."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    v = cfg.verl
    model = HFModelConfig(path=str(model_dir), use_remove_padding=True,
                          override_config={"attn_implementation": "sdpa" if device == "cpu" else v.attn_implementation})
    dtype = "fp32" if device == "cpu" else v.param_dtype
    engine = FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", use_torch_compile=False, use_dynamic_bsz=False,
                              micro_batch_size_per_gpu=cfg.algo.micro_batch_size, seed=cfg.seed,
                              mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    optim = FSDPOptimizerConfig(lr=cfg.algo.verl_critic_lr, weight_decay=0.0, clip_grad=cfg.algo.max_grad_norm,
                                total_training_steps=max(cfg.steps, 1) * max(cfg.algo.critic_steps, 1),
                                lr_warmup_steps=0, lr_scheduler_type="constant")
    return TrainingWorkerConfig(model_type="value_model", model_config=model, engine_config=engine,
                                optimizer_config=optim, checkpoint_config=CheckpointConfig())


class CriticWorker(HarnessWorker):
    def __init__(self, config, value_clip: float, seed: int):
        from verl.workers.config import CriticConfig
        from verl.workers.utils.losses import value_loss

        super().__init__(config)
        # verl's CriticConfig only for what value_loss reads: the clip range and token-mean aggregation
        critic = CriticConfig(strategy="fsdp2", ppo_micro_batch_size_per_gpu=1, cliprange_value=value_clip,
                              loss_agg_mode="token-mean")
        self.loss_fn = partial(value_loss, critic)
        self.seed = seed

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset(self):
        """verl's reset, seeded: the value head is new (a one-label classifier on the base), and a
        resumed run must start from the same one before its checkpoint is loaded."""
        torch.manual_seed(self.seed)
        self.engine.initialize()

    def _prepare(self, batch, first_only: bool, tokens=None):
        """This rank's rows in verl's no-padding layout; `tokens` (the global batch's loss tokens)
        makes verl's value_loss a mean over the whole batch, however it is split into micro-batches."""
        rank, world = self.engine.get_data_parallel_rank(), self.engine.get_data_parallel_size()
        mine = shard_rows(batch, rank, world)
        if first_only:  # the value loss reads the first response position: V(s_t) of the turn
            mask = torch.zeros_like(mine["response_mask"])
            mask[:, 0] = mine["response_mask"][:, 0]
            mine["response_mask"] = mask
        data = left_right_2_no_padding(mine)
        tu.assign_non_tensor(data, temperature=1.0, calculate_entropy=False, use_remove_padding=True,
                             use_dynamic_bsz=False, max_token_len_per_gpu=None,
                             micro_batch_size_per_gpu=self._micro_batch_size(data.batch_size[0]),
                             use_fused_kernels=False, dp_size=world, batch_num_tokens=tokens, global_batch_size=None)
        return data, rank, world

    def _values(self, data) -> torch.Tensor:
        with self.engine.eval_mode(), torch.no_grad():
            output = self.engine.infer_batch(data, loss_function=None)
        return no_padding_2_padding(output["model_output"]["values"], data).float().cpu()

    def _gather(self, local: torch.Tensor, rows: int, rank: int, world: int) -> List[float]:
        """Every rank's values back in the batch's row order (rows were dealt round-robin)."""
        if world == 1:
            return local.tolist()[:rows]
        parts: List = [None] * world
        dist.all_gather_object(parts, (rank, local.tolist()), group=self.engine.get_data_parallel_group())
        values = [0.0] * rows
        for r, part in parts:
            for i, value in zip(range(r, rows, world), part):
                values[i] = value
        return values

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def turn_values(self, batch) -> List[float]:
        """V(s_t) of every row (turn): the value head at the prompt's last token."""
        data, rank, world = self._prepare(batch, first_only=True)
        return self._gather(self._values(data)[:, 0], batch.batch_size[0], rank, world)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update(self, batch, old_values: Sequence[float], returns: Sequence[float], steps: int) -> Dict[str, float]:
        """`steps` optimizer steps of verl's clipped value loss on the turns' (V_old, R) at the first
        response position; the first step's loss and clip fraction are reported, and the last
        step's loss (how far the critic fitted this batch)."""
        rows = batch.batch_size[0]
        width = batch["response_mask"].shape[1]
        batch = batch.clone()
        values, targets = torch.zeros((rows, width)), torch.zeros((rows, width))
        values[:, 0], targets[:, 0] = torch.tensor(list(old_values)), torch.tensor(list(returns))
        batch["values"], batch["returns"] = values, targets
        tokens = max(int(batch["response_mask"][:, 0].sum()), 1)
        data, _, _ = self._prepare(batch, first_only=True, tokens=tokens)
        first, last = None, float("nan")
        for _ in range(max(steps, 1)):
            with self.engine.train_mode():
                output = self.engine.train_batch(data.clone(), loss_function=self.loss_fn)
            if output is not None:
                metrics = output["metrics"]
                last = _mean(metrics.get("critic/vf_loss"))
                first = first or {"value_loss": last, "value_clipfrac": _mean(metrics.get("critic/vf_clipfrac"))}
        self.engine.lr_scheduler_step()
        return {**(first or {}), "value_loss_last": last}

def _mean(value) -> float:
    """A metric as verl's loss returns it (a Metric, a tensor, a float or a list of them)."""
    if value is None:
        return float("nan")
    if isinstance(value, list):
        return sum(_mean(v) for v in value) / max(len(value), 1)
    if hasattr(value, "aggregate"):  # verl's Metric: its values over the micro-batches
        return float(value.aggregate())
    return float(value.float().mean()) if isinstance(value, torch.Tensor) else float(value)


class VerlCritic:
    """The controller's view of the verl critics: values of turns and a value-loss update per policy."""

    def __init__(self, groups: Dict[str, object], pad_ids: Dict[str, int], steps: int):
        self.groups, self.pad_ids, self.steps = groups, pad_ids, steps

    def _batch(self, policy: str, turns):
        from harness.engines.verl.batch import turns_to_batch

        return turns_to_batch(list(turns), self.pad_ids[policy])

    def values(self, policy: str, turns) -> List[float]:
        return self.groups[policy].turn_values(self._batch(policy, turns))[0]

    def update(self, policy: str, turns, returns: Sequence[float], old: Sequence[float]) -> Dict[str, float]:
        return self.groups[policy].update(self._batch(policy, turns), list(old), list(returns), self.steps)[0]

    def save(self, directory: Path) -> None:
        for policy, group in self.groups.items():
            group.save(str(Path(directory).resolve() / "verl_critic" / policy))

    def load(self, directory: Path) -> None:
        for policy, group in self.groups.items():
            group.load(str(Path(directory).resolve() / "verl_critic" / policy))
