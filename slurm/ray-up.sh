#!/usr/bin/env bash
# Bring up a private Ray cluster across the current SLURM allocation, run a command against it,
# and tear it down with the job:
#
#   srun/sbatch ... slurm/ray-up.sh python -m harness.run engine=verl ...
#
# The head runs on the first node of the allocation, one worker per other node via srun; the port
# and temp dir are private to the job (several cells can share a node); RAY_ADDRESS is exported
# so the command attaches to this cluster and never to someone else's. Measured pitfalls this
# avoids: `ray stop` kills every Ray of the user (never used: we kill our own steps), SLURM's
# --mem is not seen by Ray (passed as --memory / --object-store-memory), and a token file in
# ~/.ray silently turning token auth on (each job uses a token of its own).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...] (inside a SLURM allocation)" >&2; exit 2; }
: "${SLURM_JOB_ID:?run inside a SLURM job (sbatch/srun/salloc)}"

RAY=${RAY_BIN:-$(command -v ray || true)}
[ -n "$RAY" ] && [ -x "$RAY" ] || { echo "ray-up: no ray executable: put Ray's bin dir on PATH or set RAY_BIN" >&2; exit 1; }
nodes=($(scontrol show hostnames "${SLURM_JOB_NODELIST}"))
head=${nodes[0]}
port=$((20000 + SLURM_JOB_ID % 20000))
temp_dir=${RAY_TEMP_ROOT:-/tmp}/ray-${SLURM_JOB_ID}
cpus=${RAY_UP_NUM_CPUS:-${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-1}}}
# RAY_UP_NUM_GPUS: logical GPUs for CPU-only nodes (verl's resource pools ask for GPUs)
gpus=${RAY_UP_NUM_GPUS:-$(echo "${SLURM_GPUS_ON_NODE:-0}" | grep -oE '[0-9]+' | head -1 || echo 0)}
mem_bytes=$(( ${SLURM_MEM_PER_NODE:-2048} * 1024 * 1024 ))
object_store=$(( mem_bytes / 4 ))
steps=()
# A token of the job's own: Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists
# (any earlier local ray.init writes one), and then `ray status` never answers this head.
mkdir -p "$temp_dir"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$temp_dir/auth_token"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$temp_dir/auth_token"

teardown() {
  for pid in "${steps[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$temp_dir"
}
trap teardown EXIT

start_node() {  # start_node HOST ARGS...: one Ray node as a job step on HOST
  local host=$1; shift
  srun --overlap --nodes=1 --ntasks=1 -w "$host" "$RAY" start --block --num-cpus="$cpus" --num-gpus="${gpus:-0}" \
       --memory=$((mem_bytes - object_store)) --object-store-memory="$object_store" --temp-dir="$temp_dir" "$@" &
  steps+=($!)
}

start_node "$head" --head --node-ip-address="$head" --port="$port" --dashboard-port=$((port + 1)) \
           --include-dashboard=false
export RAY_ADDRESS="$head:$port"
for _ in $(seq 120); do
  "$RAY" status --address="$RAY_ADDRESS" >/dev/null 2>&1 && break
  sleep 0.5
done
"$RAY" status --address="$RAY_ADDRESS" >/dev/null 2>&1 || { echo "ray-up: head on $head:$port did not start" >&2; exit 1; }
for worker in "${nodes[@]:1}"; do
  start_node "$worker" --address="$RAY_ADDRESS" --node-ip-address="$worker"
done
alive_nodes() { "$RAY" status --address="$RAY_ADDRESS" 2>/dev/null | grep -cE '^ +[0-9]+ node_' || true; }
for _ in $(seq 240); do  # the command starts once every node of the allocation has joined
  [ "$(alive_nodes)" -ge "${#nodes[@]}" ] && break
  sleep 0.5
done
[ "$(alive_nodes)" -ge "${#nodes[@]}" ] || { echo "ray-up: only $(alive_nodes) of ${#nodes[@]} nodes joined $RAY_ADDRESS" >&2; exit 1; }
echo "ray-up: cluster at $RAY_ADDRESS over ${#nodes[@]} node(s), temp dir $temp_dir" >&2
"$@"
