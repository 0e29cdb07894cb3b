"""One policy's verl worker: verl's `TrainingWorker` (FSDP2 engine, its optimizer, LR schedule,
micro-batching, LoRA through peft) with the harness's policy loss and gradient probe inside.

An update is the controller's plan (engines/base.py) in rounds: `begin_update` takes old
log-probs from the behaviour weights (verl's compute_log_prob); for every mini-batch,
`backward_round` runs verl's `forward_backward_batch` once per role instance and `step_round`
verl's `optimizer_step` (the calls verl's `train_mini_batch` -> `train_batch` make per
mini-batch); `end_update` steps the LR scheduler once, as verl does per training step. After each
instance's backward the rank's gradient shard has grown by exactly that instance's gradient
(`torch.autograd.grad` on FSDP2 parameters returns None, so the probe reads `.grad`); each rank
forms the Gram matrix of its shards and one all-reduce gives the exact global one.
"""
from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from contextlib import nullcontext
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_name
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from harness.algo.loss import BatchNorm, aggregate, kl_to_reference, ppo_clip_loss
from harness.config import kl_beta
from harness.engines.base import STAT_SUMS, add_offpolicy
from harness.engines.verl.batch import shard_rows

Slot = Tuple[str, int]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) tensor, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class HarnessWorker(TrainingWorker):
    """What the harness's verl workers (policy and critic) share: the process group on a CPU, the
    micro-batch size that divides a batch's rows, and checkpoints."""

    def __init__(self, config):
        if get_device_name() == "cpu" and not dist.is_initialized():
            # verl asks for "cpu:gloo,<device>:<backend>", which torch rejects when both are cpu
            dist.init_process_group("gloo", rank=int(os.environ.get("RANK", 0)),
                                    world_size=int(os.environ.get("WORLD_SIZE", 1)))
        super().__init__(config)

    def _micro_batch_size(self, rows: int) -> int:
        """Fixed-size micro-batches must divide the rows: the largest size up to the configured one that does."""
        size = max(1, min(self.engine_config.micro_batch_size_per_gpu or 1, rows))
        while rows % size:
            size -= 1
        return size

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save(self, path: str) -> None:
        self.engine.save_checkpoint(path, None, 0, None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load(self, path: str) -> None:
        self.engine.load_checkpoint(path, None, False)


class PolicyWorker(HarnessWorker):
    def __init__(self, config, harness: dict):
        super().__init__(config)
        self.harness = harness
        self.loss_fn = self._loss
        self._role: Optional[str] = None
        self._norm: Optional[BatchNorm] = None
        self._stats: Dict[str, Dict[str, float]] = {}

    # ------------------------------------------------------------------ helpers
    def _trainable(self) -> List[torch.nn.Parameter]:
        return [p for p in self.engine.module.parameters() if p.requires_grad]

    def _flat_grad(self, params) -> torch.Tensor:
        return torch.cat([(_local(p.grad) if p.grad is not None else torch.zeros_like(_local(p)))
                          .detach().reshape(-1).double() for p in params])

    def _all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        group = self.engine.get_data_parallel_group()
        if dist.get_world_size(group) > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor

    def _prepare(self, batch, rank: int, world: int):
        data = left_right_2_no_padding(shard_rows(batch, rank, world))
        size = self._micro_batch_size(data.batch_size[0])  # per role instance's rows
        tu.assign_non_tensor(
            data, temperature=float(self.harness["algo"].temperature), calculate_entropy=True, global_batch_size=None,
            use_remove_padding=self.model_config.get("use_remove_padding", True),
            use_dynamic_bsz=self.engine_config.use_dynamic_bsz,
            max_token_len_per_gpu=self.engine_config.max_token_len_per_gpu,
            micro_batch_size_per_gpu=size, use_fused_kernels=False)
        return data

    # ------------------------------------------------------------------ loss
    def _loss(self, model_output, data, dp_group=None):
        """The harness's clipped policy loss of one micro-batch of one role instance, normalised by
        its mini-batch's counts; scaled by the DP size because FSDP averages gradients across ranks."""
        h, role = self.harness, self._role
        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        fields = ["response_mask", "seq_advantages", "old_log_prob"] + (["ref_log_prob"] if "ref_log_prob" in data else [])
        padded = data.select(*fields).to_padded_tensor()
        mask = padded["response_mask"].to(log_prob.dtype)
        advantages = padded["seq_advantages"].reshape(-1, 1).to(log_prob.dtype)
        policy_loss = ppo_clip_loss(log_prob, padded["old_log_prob"].to(log_prob.dtype), advantages, h["clip"])
        loss_mat = policy_loss.loss_mat
        if "ref_log_prob" in padded.keys():
            kl = kl_to_reference(log_prob, padded["ref_log_prob"].to(log_prob.dtype))
            beta = kl_beta(h["algo"], role)
            if beta > 0:
                loss_mat = loss_mat + beta * kl
            self._stats["kl"][role] += float((kl.detach() * mask).sum())
        if "entropy" in model_output:
            entropy = no_padding_2_padding(model_output["entropy"], data).to(log_prob.dtype)
            self._stats["entropy"][role] += float((entropy.detach() * mask).sum())
        self._stats["tokens"][role] += float(mask.sum())
        self._stats["clipped"][role] += float((policy_loss.clipped * mask).sum())
        self._stats["ratio"][role] += float((policy_loss.ratio * mask).sum())
        self._stats["ratio_dev_sq"][role] += float(((policy_loss.ratio.detach() - 1.0) ** 2 * mask).sum())
        add_offpolicy(self._stats, role, log_prob.detach(), mask, self._sampled(data))
        loss = aggregate(loss_mat, mask, h["loss_agg"], self._norm, role)
        self._round_loss[role] += float(loss.detach())
        return loss * self.engine.get_data_parallel_size(), {}

    @staticmethod
    def _sampled(data) -> List[Optional[List[float]]]:
        """Each row's sampler log-probs (None where the sampler gave none), as the local engine's turns hold them."""
        if "rollout_mask" not in data.keys():
            return [None] * int(data.batch_size[0])
        padded = data.select("rollout_log_probs", "rollout_mask").to_padded_tensor()
        rows = []
        for values, known in zip(padded["rollout_log_probs"], padded["rollout_mask"].bool()):
            rows.append(values[known].tolist() if bool(known.any()) else None)
        return rows

    def _log_probs(self, data, adapter: bool) -> torch.Tensor:
        """Per-token log-probs of the current weights (adapter on: verl's compute_log_prob) or of the
        base model (adapter disabled: the reference), padded like the responses."""
        probe = data.clone()
        tu.assign_non_tensor(probe, calculate_entropy=False)
        with self.engine.eval_mode(), torch.no_grad(), (nullcontext() if adapter else self.engine.disable_adapter()):
            output = self.engine.infer_batch(probe, loss_function=None)
        return no_padding_2_padding(output["model_output"]["log_probs"], probe).float().cpu()

    def _global_norm(self, squares: float) -> float:
        """sqrt of a sum of squares taken over every rank's shards."""
        return float(self._all_sum(torch.tensor([squares], dtype=torch.float64))[0]) ** 0.5

    def _distance(self, params) -> float:
        """‖θ - θ_0‖ over all ranks' shards."""
        return self._global_norm(sum(float((_local(p).detach().double() - p0).pow(2).sum())
                                     for p, p0 in zip(params, self._initial)))

    # ------------------------------------------------------------------ remote calls: one update in rounds
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def remember_initial(self) -> None:
        """θ_0 of the trainable parameters (this rank's shards), before any checkpoint is loaded."""
        self._initial = [_local(p).detach().double().clone() for p in self._trainable()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def begin_update(self, minibatches: List[Tuple[BatchNorm, List[Tuple[Slot, object]]]], want_kl: bool) -> None:
        """Prepare this policy's mini-batches (every rank gets all rows and keeps its own); old
        log-probs of every row come from the weights before the first optimizer step."""
        rank, world = self.engine.get_data_parallel_rank(), self.engine.get_data_parallel_size()
        self._minibatches = []
        self._probs_diff = [0.0, 0.0, 0.0]  # sum, count, max of |p_rollout - p_train| on this rank's tokens
        for norm, slot_batches in minibatches:
            prepared = []
            for slot, batch in slot_batches:
                data = self._prepare(batch, rank, world)
                data["old_log_prob"] = self._log_probs(data, adapter=True)
                self._add_probs_diff(data)
                if want_kl:
                    data["ref_log_prob"] = self._log_probs(data, adapter=False)
                prepared.append((slot, data))
            self._minibatches.append((norm, prepared))
        self._stats = {k: defaultdict(float) for k in STAT_SUMS if k != "kl" or want_kl}  # kl: on measured steps
        self._drift_before = self._distance(self._trainable())

    def _add_probs_diff(self, data) -> None:
        """verl's rollout-vs-trainer check on these rows: the sampler's probability of each sampled
        token against the behaviour weights' (both at the rollout temperature)."""
        if "rollout_mask" not in data.keys():
            return
        where = data["rollout_mask"].bool().cpu()
        if not bool(where.any()):
            return
        diff = (data["rollout_log_probs"].double().cpu().exp() - data["old_log_prob"].double().exp()).abs()[where]
        total, count, largest = self._probs_diff
        self._probs_diff = [total + float(diff.sum()), count + float(diff.numel()), max(largest, float(diff.max()))]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def backward_round(self, k: int) -> dict:
        """Forward and backward of mini-batch k, one role instance after another (verl's
        forward_backward_batch each); returns the exact global Gram matrix of the instances'
        gradients and each role's loss."""
        engine = self.engine
        norm, prepared = self._minibatches[k]
        self._norm, self._round_loss = norm, defaultdict(float)
        params = self._trainable()
        vectors = []
        counts = [sum(self._stats[k].values()) for k in ("clipped", "tokens")]
        with engine.train_mode(zero_grad_on_exit=False):  # the gradient waits for step_round
            engine.optimizer_zero_grad()
            for slot, data in prepared:
                before = self._flat_grad(params)
                self._role = slot[0]
                engine.forward_backward_batch(data, loss_function=self._loss)
                vectors.append(self._flat_grad(params) - before)
        matrix = torch.stack(vectors)
        gram = self._all_sum(matrix @ matrix.T)
        roles = sorted(self._round_loss)
        sums = [self._round_loss[r] for r in roles] + [sum(self._stats[k].values()) - c
                                                        for k, c in zip(("clipped", "tokens"), counts)]
        reduced = self._all_sum(torch.tensor(sums, dtype=torch.float64)).tolist()
        return {"slots": [s for s, _ in prepared], "gram": gram.cpu(), "loss": dict(zip(roles, reduced)),
                "clipped": reduced[-2], "tokens": reduced[-1]}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def step_round(self, factor: float, lr_scale: float = 1.0) -> dict:
        """verl's optimizer_step after scaling the gradient by `factor` (cell-wide clipping; 1 leaves
        the policy's own clipping to verl), at `lr_scale` x the scheduler's learning rate for this
        step only (algo.coherence_reg); returns ‖Δθ‖ of the step."""
        params = self._trainable()
        groups = self.engine.optimizer.param_groups
        scheduled = [group["lr"] for group in groups]
        with self.engine.train_mode():
            if factor < 1.0:
                with torch.no_grad():
                    for p in params:
                        if p.grad is not None:
                            p.grad.mul_(factor)
            before = [_local(p).detach().clone() for p in params]
            for group, lr in zip(groups, scheduled):
                group["lr"] = lr * lr_scale
            try:
                grad_norm = float(self.engine.optimizer_step())
            finally:
                for group, lr in zip(groups, scheduled):
                    group["lr"] = lr
        moved = self._global_norm(sum(float((_local(p) - b).double().pow(2).sum()) for p, b in zip(params, before)))
        return {"grad_norm": grad_norm, "update_norm": moved}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def end_update(self) -> dict:
        """The LR scheduler's step (once per training step, as verl's train_mini_batch) and the
        update's numbers, reduced across ranks."""
        self.engine.lr_scheduler_step()
        params = self._trainable()
        param_norm = self._global_norm(sum(float(_local(p).double().pow(2).sum()) for p in params))
        drift = self._distance(params)
        stats = {}
        for kind, values in self._stats.items():
            roles = sorted(set(values) | set(self._stats["tokens"]))  # the same list on every rank
            reduced = self._all_sum(torch.tensor([values[r] for r in roles], dtype=torch.float64)).tolist()
            stats[kind] = dict(zip(roles, reduced))
        self._minibatches = []
        total, count = self._all_sum(torch.tensor(self._probs_diff[:2], dtype=torch.float64)).tolist()
        largest = torch.tensor([self._probs_diff[2]], dtype=torch.float64)
        group = self.engine.get_data_parallel_group()
        if dist.get_world_size(group) > 1:
            dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
        probs_diff = (total / count, float(largest[0])) if count else None
        return {"param_norm": param_norm, "drift": drift, "drift_rate": drift - self._drift_before, "stats": stats,
                "rollout_probs_diff": probs_diff}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_rollout(self, rollout_config, replica_rank: int) -> None:
        """This policy's rollout inside the worker (verl's `BaseRollout` for the configured backend),
        talking to the replica server numbered `replica_rank`."""
        from verl.workers.rollout.base import get_rollout_class

        from harness.engines.verl.hf_rollout import register

        register()  # "hf" in verl's registries of this worker process

        self.rollout = get_rollout_class(rollout_config.name, rollout_config.mode)(
            config=rollout_config, model_config=self.model_config, device_mesh=None, replica_rank=replica_rank)
        self._base_synced = "dummy" not in rollout_config.load_format

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def sync_rollout(self, global_steps: Optional[int] = None) -> None:
        """Push the trainer's weights to the rollout server: verl's naive hybrid sync
        (`ActorRolloutRefWorker.update_weights`): wake the weights, send the base once when the
        server started without it, send the adapter, wake the KV cache."""
        free = self.rollout.config.free_cache_engine
        if free:
            await self.rollout.resume(tags=["weights"])
        weights, peft_config = self.engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
        if peft_config is not None and not self._base_synced:
            base, base_peft = self.engine.get_per_tensor_param(layered_summon=False, base_sync_done=False)
            await self.rollout.update_weights(base, peft_config=base_peft, base_sync_done=False,
                                              global_steps=global_steps)
        await self.rollout.update_weights(weights, peft_config=peft_config, base_sync_done=True,
                                          global_steps=global_steps)
        self._base_synced = True
        if free:
            await asyncio.to_thread(dist.barrier)
            await self.rollout.resume(tags=["kv_cache"])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def adapter_state(self) -> Dict[str, torch.Tensor]:
        """The trained adapter, full tensors (tests compare it with the rollout server's)."""
        from peft import get_peft_model_state_dict

        module = getattr(self.engine.module, "_fsdp_wrapped_module", self.engine.module)
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().cpu()
                for k, v in get_peft_model_state_dict(module).items()}
