#!/usr/bin/env bash
# The verl engine's GPU check, for a GPU node with the full install (`pip install .[gpu]`: a CUDA
# torch, Ray, verl, vLLM) and this repository; the tiny model is built locally. A bare GPU machine
# without those packages runs bench/gpu_check.sh (the local engine at the study's shapes) instead.
#   1. the parity test on CUDA: engine=local (CPU) and engine=verl (CUDA, fp32) on the same batch
#      give the same per-role losses, grad norms and coherence (1e-4);
#   2. one short engine=verl cell (voting, IP, bf16) with the HF rollout replicas, and one with
#      vLLM rollout replicas (LoRA, hybrid mode) when vllm is installed: steps/s, per-role metrics;
#   3. with vLLM and Qwen3's tokenizer in the cache (make qwen3-tokenizer, before the machine goes
#      offline): the same cell on scale=qwen3-tok, Qwen3's prompts with thinking off through vLLM.
# Output goes to stdout and, if $OUT is set, to $OUT/gpu_cluster_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
LOG=${OUT:-/tmp}/gpu_cluster_check.log
export WANDB_MODE=offline OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} MARL_VERL_DEVICE=cuda
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  $PY -m pytest -q -p no:warnings tests/test_verl_engine.py -k same_batch
  $PY bench/gpu_cluster_check.py --root "${OUT:-/tmp}/gpu_check_runs" --steps "${STEPS:-10}" --rollout hf
  if $PY -c "import vllm" 2>/dev/null; then
    $PY bench/gpu_cluster_check.py --root "${OUT:-/tmp}/gpu_check_runs" --steps "${STEPS:-10}" --rollout vllm
    if $PY -c "from harness import qwen3_tokenizer; raise SystemExit(bool(qwen3_tokenizer.problem()))"; then
      $PY bench/gpu_cluster_check.py --root "${OUT:-/tmp}/gpu_check_runs" --steps 3 --rollout vllm --scale qwen3-tok
    else
      echo "gpu_check: Qwen3's tokenizer is not in the cache; the qwen3-tok vLLM run was not done"
    fi
  else
    echo "gpu_check: vllm is not installed; the vLLM rollout was not run"
  fi
} 2>&1 | tee "$LOG"
