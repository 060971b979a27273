#!/usr/bin/env bash
# Async GRPO (Qwen2.5-7B) with the ASP schedule on CUDA GPUs: the asp runtime (vLLM rollout
# instances + torch trainer on Ray), configs/cuda/grpo_qwen25_7b_asp.yaml.
#
# One node:      bash examples/cuda/grpo_qwen25_7b_asp.sh [key=value overrides...]
# Several nodes: run the same command on every node with MASTER_ADDR=<head IP> NNODES=<n>.
# The head starts Ray, waits until NNODES x GPUS_PER_NODE GPUs have joined, then runs
# `asp train`; the other nodes join and return. Nothing is killed or force-stopped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="${REPO:-$(cd "$HERE/../.." && pwd)}"
CONFIG="${CONFIG:-$REPO/configs/cuda/grpo_qwen25_7b_asp.yaml}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
SOCKET_IFNAME="${SOCKET_IFNAME:-}"                          # NIC for NCCL/GLOO (empty: default)
RAY_PORT="${RAY_PORT:-6379}"
JOIN_TIMEOUT_S="${JOIN_TIMEOUT_S:-900}"
LOG_DIR="${LOG_DIR:-$REPO/logs}"
PYTHON="${PYTHON:-python3}"

# shellcheck source=../lib/cluster.sh
source "$HERE/../lib/cluster.sh"

[ "$GPUS_PER_NODE" -ge 1 ] || { log "no GPU found (nvidia-smi -L); set GPUS_PER_NODE"; exit 1; }
if [ -n "$SOCKET_IFNAME" ]; then
  export NCCL_SOCKET_IFNAME="$SOCKET_IFNAME" GLOO_SOCKET_IFNAME="$SOCKET_IFNAME"
fi
export RAY_DEDUP_LOGS=0
mkdir -p "$LOG_DIR"

IP="$(current_ip)"
[ -n "$IP" ] || { log "cannot find this node's IP (set SOCKET_IFNAME)"; exit 1; }
refuse_running_ray
RAY_NODE_FLAGS=(--node-ip-address="$IP" --num-gpus="$GPUS_PER_NODE")
WANT=$((NNODES * GPUS_PER_NODE))

if [ "$IP" = "$MASTER_ADDR" ]; then
  setup_ray_auth head "$IP"
  start_head_and_wait GPU "$WANT" --dashboard-host="$DASHBOARD_HOST" "${RAY_NODE_FLAGS[@]}"
  export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"
  "$PYTHON" -m asp_ascend.cli doctor
  TRAIN_CMD=("$PYTHON" -m asp_ascend.cli train "$CONFIG")
  "${TRAIN_CMD[@]}" "$@" 2>&1 | tee "$LOG_DIR/cuda_grpo_qwen25_7b_asp_$(date +%Y%m%d_%H%M%S).log"
else
  setup_ray_auth worker "$IP"
  join_head "${RAY_NODE_FLAGS[@]}"
fi
