"""The verl engine: one verl worker group (Ray actors, FSDP2) per policy behind the harness's
engine protocol, so the same controller, workflows, probe and run directory drive it.

Each policy also gets one verl rollout replica in hybrid mode (vLLM on a GPU, the harness's HF
backend elsewhere; rollout.py): the controller's generation requests go to it, and after every
update the policy's workers push their adapter to it.

Placement: `colocate` puts every policy's workers on the same GPUs (one Ray resource pool,
fractional GPUs per actor, as verl colocates actor/ref/rollout); `split` gives each policy its
own GPUs. Each policy owns a copy of the base model: stock verl trains one LoRA adapter per
engine. On a CPU (tests, CI) the workers load harness.engines.verl.cpu_platform through
VERL_USE_EXTERNAL_MODULES and Ray is given logical GPUs.
"""
from __future__ import annotations

import asyncio
import importlib
import math
import os
import sys
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from harness.algo.loss import ClipConfig
from harness.engines.adapters import export_initial_adapters
from harness.engines.base import (UpdateResult, clip_coefficients, coherence_lr_scale, finish_update, lr_spike,
                                  measure_kl, record_minibatch, record_step, update_plan)
from harness.engines.multi import instance_config
from harness.engines.sampling import generate_grouped
from harness.engines.verl.rollout import launch_replica, resolve_backend, rollout_config, run_sync
from harness.engines.verl.rollout import sample as rollout_sample
from harness.instrument.probe import PolicyGradients
from harness.episodes import Generation, Sampling, Turn

CPU_PLUGIN = "harness.engines.verl.cpu_platform"


def resolve_device(cfg) -> str:
    if cfg.verl.device != "auto":
        return cfg.verl.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def worker_env(device: str) -> Dict[str, str]:
    """Environment of every worker process: the CPU platform plugin where there is no GPU."""
    repo = str(Path(__file__).resolve().parents[3])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p),
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "VERL_LOGGING_LEVEL": "WARN", "WANDB_MODE": "disabled"}
    if device == "cpu":
        env.update(VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_MODULES=CPU_PLUGIN)
    return env


def logical_resources(cfg, n_policies: int) -> Tuple[int, int]:
    """(CPUs, GPUs) a Ray on CPU-only nodes declares for a cell: verl's resource pools ask for
    GPUs (one per FSDP rank; shared when colocated) and a CPU per colocated actor."""
    per_policy = cfg.verl.gpus_per_policy
    gpus = per_policy if cfg.verl.placement == "colocate" else per_policy * n_policies  # split, per_node
    actors = 3 if cfg.algo.adv_estimator == "gae" else 2  # trainer, rollout server (+ critic)
    return max(4, actors * n_policies * per_policy), gpus


RAY_START_ATTEMPTS = 3


def start_ray(cfg, device: str, n_policies: int) -> None:
    """Join $RAY_ADDRESS (slurm/ray-up.sh) or start a private local Ray for this cell."""
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": worker_env(device)}
    address = cfg.verl.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
        return
    cpus, gpus = logical_resources(cfg, n_policies)
    for attempt in range(RAY_START_ATTEMPTS):
        temp_dir = tempfile.mkdtemp(prefix="ray-", dir=os.environ.get("RAY_TEMP_ROOT", "/tmp"))
        try:
            ray.init(num_cpus=cfg.verl.ray_num_cpus or cpus, num_gpus=gpus if device == "cpu" else None,  # GPUs: detected
                     include_dashboard=False, _temp_dir=temp_dir, runtime_env=env, log_to_driver=False)
            return
        except Exception as exc:  # Ray waits a fixed 30 s for its raylet; several cells starting at once on a
            if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS - 1:  # busy node miss it
                raise
            ray.shutdown()
            print(f"Ray's node timed out during startup (busy machine); starting it again ({attempt + 2} of "
                  f"{RAY_START_ATTEMPTS})", file=sys.stderr)


def node_resources() -> List[str]:
    """Ray's per-node resource names (`node:<address>`) of the alive nodes, the head's first: what
    `verl.placement=per_node` pins a policy's pool to."""
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    alive.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"]))
    return [next(k for k in n["Resources"] if k.startswith("node:") and k != "node:__internal_head__") for n in alive]


def hosts_of(pool) -> List[str]:
    """The Ray node addresses a resource pool's placement groups were given."""
    import ray

    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return sorted({address.get(node, node) for pg in pool.pgs or []
                   for node in ray.util.placement_group_table(pg)["bundles_to_node_id"].values()})


def training_worker_config(cfg, model_dir: Path, adapter_dir: Optional[Path], device: str):
    """verl's own config dataclasses for one policy's TrainingWorker."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    v = cfg.verl
    lora = {} if adapter_dir is None else dict(
        lora_rank=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha, target_modules=list(cfg.model.lora_targets),
        lora_adapter_path=str(adapter_dir))
    model = HFModelConfig(path=str(model_dir), use_remove_padding=True,
                          enable_gradient_checkpointing=v.gradient_checkpointing,
                          override_config={"attn_implementation": "sdpa" if device == "cpu" else v.attn_implementation},
                          **lora)
    dtype = "fp32" if device == "cpu" else v.param_dtype
    engine = FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", use_torch_compile=False,
                              use_dynamic_bsz=v.use_dynamic_bsz, max_token_len_per_gpu=v.max_token_len_per_gpu,
                              micro_batch_size_per_gpu=cfg.algo.micro_batch_size, seed=cfg.seed,
                              mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"})
    optim = FSDPOptimizerConfig(lr=cfg.algo.lr * cfg.algo.lr_factor, weight_decay=cfg.algo.weight_decay, clip_grad=cfg.algo.max_grad_norm,
                                betas=tuple(cfg.algo.adam_betas), override_optimizer_config={"eps": cfg.algo.adam_eps},
                                total_training_steps=max(cfg.steps, 1), lr_warmup_steps=cfg.algo.lr_warmup_steps,
                                lr_scheduler_type=cfg.algo.lr_schedule)
    return TrainingWorkerConfig(model_type="language_model", model_config=model, engine_config=engine,
                                optimizer_config=optim, checkpoint_config=CheckpointConfig())


class VerlEngine:
    """`model_dir` is the cell's base, or {policy: base} when model instances differ (`models:`):
    each policy's worker group and rollout replica then load their own base, tokenizer and LR."""

    def __init__(self, model_dir, policies: List[str], cfg, seed: int, work_dir: Path):
        import ray
        from transformers import AutoTokenizer
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        if cfg.sharing_cfg.full_finetune:
            raise NotImplementedError("engine=verl trains LoRA adapters; full fine-tuning runs on engine=local")
        self.cfg = cfg
        self.policies = list(policies)
        self.device = resolve_device(cfg)
        if self.device == "cpu":  # before verl resolves its platform in this process (engine modules do on import)
            os.environ.update({k: v for k, v in worker_env("cpu").items() if k.startswith("VERL_")})
            importlib.import_module(CPU_PLUGIN)
        from harness.engines.verl.worker import PolicyWorker

        dirs = dict(model_dir) if isinstance(model_dir, dict) else {p: model_dir for p in self.policies}
        self.tokenizers = {p: AutoTokenizer.from_pretrained(dirs[p], padding_side="left") for p in self.policies}
        self.tokenizer = self.tokenizers[self.policies[0]]
        start_ray(cfg, self.device, len(self.policies))
        adapters = {}
        for base in sorted(set(map(str, dirs.values()))):  # one export per base, its policies' adapters together
            mine = [p for p in self.policies if str(dirs[p]) == base]
            adapters.update(export_initial_adapters(Path(base), mine, cfg, seed,
                                                    Path(work_dir) / "initial_adapters" / Path(base).name))
        harness = {"clip": ClipConfig.from_algo(cfg.algo), "algo": cfg.algo, "loss_agg": cfg.algo.loss_agg}
        instance_cfg = {p: instance_config(cfg, p) if p in cfg.models else cfg for p in self.policies}
        self.seed = seed
        per_policy = cfg.verl.gpus_per_policy
        tag = uuid.uuid4().hex[:8]  # Ray names (placement groups, actors) must be unique per cluster
        gae = cfg.algo.adv_estimator == "gae"  # each policy also gets verl's critic, on the policy's GPUs
        per_pool = 2 if gae else 1
        self.pools = []
        if cfg.verl.placement == "colocate":
            self.pools.append(RayResourcePool([per_policy], use_gpu=True, max_colocate_count=per_pool * len(self.policies),
                                              name_prefix=f"cell_{tag}"))
        nodes = node_resources() if cfg.verl.placement == "per_node" else []
        self.groups, configs, critics, pool_of = {}, {}, {}, {}
        for index, policy in enumerate(self.policies):
            if cfg.verl.placement != "colocate":  # split, per_node: the policy's own pool
                # per_node pins the pool to one node through Ray's own node resource (verl puts a pool's
                # accelerator_type into every bundle): policies go round-robin over the nodes
                pin = nodes[index % len(nodes)] if nodes else None
                self.pools.append(RayResourcePool([per_policy], use_gpu=True, max_colocate_count=per_pool,
                                                  name_prefix=f"{policy}_{tag}", accelerator_type=pin))
            self.pools[-1].get_placement_groups(device_name=self.device)  # verl's default asks for "cuda"
            pool_of[policy] = self.pools[-1]
            configs[policy] = training_worker_config(instance_cfg[policy], dirs[policy], adapters[policy], self.device)
            worker = RayClassWithInitArgs(ray.remote(PolicyWorker), config=configs[policy], harness=harness)
            self.groups[policy] = RayWorkerGroup(resource_pool=self.pools[-1], ray_cls_with_init=worker,
                                                 name_prefix=f"{policy}_{tag}")
            if gae:
                from harness.engines.verl.critic import CriticWorker, critic_worker_config

                critic = RayClassWithInitArgs(ray.remote(CriticWorker), value_clip=cfg.algo.value_clip, seed=seed,
                                              config=critic_worker_config(instance_cfg[policy], dirs[policy], self.device))
                critics[policy] = RayWorkerGroup(resource_pool=self.pools[-1], ray_cls_with_init=critic,
                                                 name_prefix=f"{policy}_critic_{tag}")
        self.placement = {policy: hosts_of(pool) for policy, pool in pool_of.items()}  # what the run records
        for group in self.groups.values():
            group.reset()  # builds model, FSDP, optimizer, scheduler on every rank
            group.remember_initial()  # θ_0 for drift, before any checkpoint is loaded
        for group in critics.values():
            group.reset()
        self.critic = None
        if gae:
            from harness.engines.verl.critic import VerlCritic

            self.critic = VerlCritic(critics, {p: self.tokenizers[p].pad_token_id for p in self.policies},
                                     cfg.algo.critic_steps)
        self.rollout = resolve_backend(cfg, self.device)
        self.replicas = {}
        for rank, (policy, group) in enumerate(self.groups.items()):
            config = rollout_config(cfg, self.rollout, len(self.policies), seed)
            group.init_rollout(config, rank)
            self.replicas[policy] = launch_replica(self.rollout, config, configs[policy].model_config, group, rank)
        self._sleep_rollouts()  # as verl's trainer: replicas sleep until the first weight sync
        self._sync_rollouts()

    # ---------------------------------------------------------------- generate
    def generate(self, policy: str, prompts: List[str], sampling: Sampling) -> List[Generation]:
        """Sampled by the policy's rollout replica, which holds the weights of the last update."""
        tok = self.tokenizers[policy]
        server = self.replicas[policy].server_handle

        def sample(input_ids, attention_mask, copies):
            seed = int(torch.randint(0, 2**62, (1,)))  # from the controller's per-step RNG: resumable
            return rollout_sample(self.rollout, server, input_ids, attention_mask, copies, sampling.max_new_tokens,
                                  sampling.temperature, sampling.greedy, tok.eos_token_id, tok.pad_token_id, seed)

        return generate_grouped(tok, prompts, sample, sampling.max_prompt_tokens)

    def _sync_rollouts(self) -> None:
        """Every policy's rollout server gets its trainer's current weights (all groups at once)."""
        import ray

        ray.get([ref for group in self.groups.values() for ref in group.sync_rollout()])

    def _sleep_rollouts(self) -> None:
        """Free the rollout servers' GPU memory for training (vLLM; the HF servers keep theirs)."""
        async def sleep_all():
            await asyncio.gather(*(replica.sleep() for replica in self.replicas.values()))

        run_sync(sleep_all())

    # ---------------------------------------------------------------- update
    def update(self, samples: Sequence[Turn], probe=None, step: int = 0) -> UpdateResult:
        """The plan of engines/base.py on the worker groups, in rounds: every group runs its k-th
        mini-batch's backward at once, the controller takes the clipping factors (per policy, or
        one norm over the cell from the groups' Gram matrices), then every group steps."""
        from harness.engines.verl.batch import turns_to_batch
        import ray

        algo = self.cfg.algo
        want_kl = measure_kl(self.cfg, step)
        self._sleep_rollouts()
        plan = update_plan(samples, algo, self.seed, step)
        policies = [p for p in self.policies if p in plan]
        pad = {p: self.tokenizers[p].pad_token_id for p in policies}
        ray.get([ref for p in policies for ref in self.groups[p].begin_update(
            [(mb.norm, [(slot, turns_to_batch(group, pad[p])) for slot, group in mb.slots.items()]) for mb in plan[p]],
            want_kl)])
        result = UpdateResult(0.0, {}, {}, {})
        role_loss: Dict[Tuple[str, str], float] = defaultdict(float)
        for k in range(max((len(plan[p]) for p in policies), default=0)):
            active = [p for p in policies if k < len(plan[p])]
            pending = {p: self.groups[p].backward_round(k) for p in active}
            rounds = {p: ray.get(refs)[0] for p, refs in pending.items()}
            norms = {p: math.sqrt(max(float(out["gram"].sum()), 0.0)) for p, out in rounds.items()}
            # scope policy: verl's optimizer_step clips each policy itself; cell: one norm, scaled here
            factors = (clip_coefficients(norms, algo.max_grad_norm, "cell") if algo.clip_scope == "cell"
                       else {p: 1.0 for p in active})
            gradients = {p: PolicyGradients([tuple(s) for s in out["slots"]], out["gram"].double())
                         for p, out in rounds.items()}
            lr_scales = {p: coherence_lr_scale(algo, gradients[p]) for p in active}
            steps = {p: self.groups[p].step_round(factors[p], (lr_scales[p] or 1.0) * lr_spike(algo, step))
                     for p in active}
            for policy in active:
                out, stepped = rounds[policy], ray.get(steps[policy])[0]
                if probe is not None:
                    probe.add(policy, gradients[policy])
                finite = math.isfinite(stepped["grad_norm"])  # verl's optimizer_step skips a non-finite step
                record_minibatch(result, role_loss, policy, out["loss"], norms[policy] if finite else stepped["grad_norm"],
                                 out["clipped"], out["tokens"], rows=len(plan[policy][k].turns),
                                 lr_scale=lr_scales[policy])
                record_step(result, policy, stepped["update_norm"] if finite else None)
        ends = {p: self.groups[p].end_update() for p in policies}
        sums: Dict[str, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for policy in policies:
            end = ray.get(ends[policy])[0]
            for kind, values in end["stats"].items():
                for role, value in values.items():
                    sums[kind][role] += value
            result.policy_param_norm[policy] = end["param_norm"]
            result.drift[policy], result.drift_rate[policy] = end["drift"], end["drift_rate"]
            if end["rollout_probs_diff"] is not None:
                result.rollout_probs_diff[policy] = tuple(end["rollout_probs_diff"])
        finish_update(result, {p: plan[p] for p in policies}, role_loss, sums)
        self._sync_rollouts()
        return result

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: Path) -> None:
        for policy, group in self.groups.items():
            group.save(str(Path(path).resolve() / "verl" / policy))

    def load(self, path: Path) -> None:
        for policy, group in self.groups.items():
            group.load(str(Path(path).resolve() / "verl" / policy))
        self._sleep_rollouts()
        self._sync_rollouts()

    def lost_nodes(self, exc: BaseException, wait_s: float = 90.0) -> Optional[str]:
        """After a Ray error, the nodes of this cell's placement that Ray has declared dead, with the
        policies whose workers ran there; None for any other failure. Ray declares a node dead only
        after missed health checks, so the cluster is polled for a while first."""
        import time

        import ray
        from ray.exceptions import RayError

        if not isinstance(exc, RayError) or not getattr(self, "placement", None):
            return None
        hosts = {host for placed in self.placement.values() for host in placed}
        deadline = time.time() + wait_s
        while True:
            try:
                dead = {n["NodeManagerAddress"] for n in ray.nodes() if not n["Alive"]} & hosts
            except Exception:  # noqa: BLE001 - the head itself is gone: nothing to name from here
                return None
            if dead or time.time() > deadline:
                break
            time.sleep(2)
        if not dead:
            return None
        ran = ", ".join(f"{policy} on {host}" for policy, placed in sorted(self.placement.items())
                        for host in placed if host in dead)
        return f"lost Ray node {', '.join(sorted(dead))} ({ran})"

    def shutdown(self) -> None:
        import ray

        for replica in getattr(self, "replicas", {}).values():
            for server in replica.servers:
                ray.kill(server)
        critics = list(self.critic.groups.values()) if getattr(self, "critic", None) is not None else []
        for group in list(self.groups.values()) + critics:
            for worker in group.workers:
                ray.kill(worker)
        for pool in self.pools:
            for placement_group in pool.pgs or []:
                ray.util.remove_placement_group(placement_group)
        self.groups, self.pools, self.replicas = {}, [], {}
