#!/usr/bin/env bash
# The GPU check for a bare GPU machine: no network, its own Python with a CUDA torch, transformers
# and peft (no Ray, verl, vLLM, Hydra or wandb), a few minutes. Prepare here with `make gpu-bundle`
# (Qwen3's tokenizer and wheels of anything the check needs that such a machine lacks, < 60 MiB),
# carry the repository and gpu_bundle/ over, then run `bash bench/gpu_check.sh` there.
#   1. installs the bundle's wheels (if any) into a private folder, offline;
#   2. bench/gpu_check.py: the local engine's CPU-vs-CUDA parity (fp32, 1e-4), then its update at
#      Qwen3-0.6B/1.7B/4B shapes in bf16 (step time, response tokens/s, peak memory, shared-prompt
#      forward against the plain one) and its rollout (decode tokens/s), each as a share of the device's
#      matmul and bandwidth limits, which it measures first. What needs Ray or vLLM is listed as not checked.
# Output: stdout, and $OUT/gpu_check.log + $OUT/gpu_check.json ($OUT defaults to /tmp/gpu_check).
# GPU_CHECK_TINY=1 runs the same code on tiny shapes (a CPU rehearsal; tests/test_gpu_check.py);
# GPU_CHECK_BUDGET_S (default 420) skips the shapes not started by then.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu_check}
BUNDLE=${GPU_BUNDLE:-gpu_bundle}
mkdir -p "$OUT_DIR"
[ -f "$BUNDLE/manifest.json" ] || { echo "error: no bundle at $BUNDLE (make gpu-bundle, then carry it over)" >&2; exit 2; }
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  if compgen -G "$BUNDLE/wheels/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --target "$OUT_DIR/site" "$BUNDLE"/wheels/*.whl
    export PYTHONPATH="$OUT_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  $PY bench/gpu_check.py --out "$OUT_DIR" --tokenizer-cache "$BUNDLE" ${GPU_CHECK_TINY:+--tiny} \
    ${GPU_CHECK_BUDGET_S:+--budget-s "$GPU_CHECK_BUDGET_S"}
} 2>&1 | tee "$OUT_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
