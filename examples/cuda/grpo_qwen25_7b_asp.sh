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

log() { echo "[$(date +%H:%M:%S) $(hostname)] $*"; }

current_ip() {
  if [ "$MASTER_ADDR" = "127.0.0.1" ]; then echo 127.0.0.1; return; fi
  if [ -n "$SOCKET_IFNAME" ]; then
    ip -4 -o addr show "$SOCKET_IFNAME" | awk '{print $4}' | cut -d/ -f1 | head -n1
  else
    ip -4 route get "$MASTER_ADDR" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}' | head -n1
  fi
}

cluster_gpus() {
  "$PYTHON" - "$MASTER_ADDR:$RAY_PORT" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get("GPU", 0)))
PY
}

[ "$GPUS_PER_NODE" -ge 1 ] || { log "no GPU found (nvidia-smi -L); set GPUS_PER_NODE"; exit 1; }
if [ -n "$SOCKET_IFNAME" ]; then
  export NCCL_SOCKET_IFNAME="$SOCKET_IFNAME" GLOO_SOCKET_IFNAME="$SOCKET_IFNAME"
fi
export RAY_DEDUP_LOGS=0
mkdir -p "$LOG_DIR"

IP="$(current_ip)"
[ -n "$IP" ] || { log "cannot find this node's IP (set SOCKET_IFNAME)"; exit 1; }
if ray status >/dev/null 2>&1; then
  log "a Ray runtime is already running on this node; stop it yourself (ray stop) if it is yours, then rerun"
  exit 1
fi
RAY_NODE_FLAGS=(--node-ip-address="$IP" --num-gpus="$GPUS_PER_NODE")
WANT=$((NNODES * GPUS_PER_NODE))

if [ "$IP" = "$MASTER_ADDR" ]; then
  log "head: starting Ray on $IP:$RAY_PORT with $GPUS_PER_NODE GPUs"
  ray start --head --port="$RAY_PORT" "${RAY_NODE_FLAGS[@]}"
  waited=0
  until [ "$(cluster_gpus)" -ge "$WANT" ]; do
    if [ "$waited" -ge "$JOIN_TIMEOUT_S" ]; then
      log "only $(cluster_gpus) of $WANT GPUs joined after ${JOIN_TIMEOUT_S}s"
      exit 1
    fi
    log "waiting for nodes: $(cluster_gpus)/$WANT GPUs"
    sleep 10
    waited=$((waited + 10))
  done
  export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"
  "$PYTHON" -m asp_ascend.cli doctor
  TRAIN_CMD=("$PYTHON" -m asp_ascend.cli train "$CONFIG")
  "${TRAIN_CMD[@]}" "$@" 2>&1 | tee "$LOG_DIR/cuda_grpo_qwen25_7b_asp_$(date +%Y%m%d_%H%M%S).log"
else
  log "worker: joining $MASTER_ADDR:$RAY_PORT"
  waited=0
  until ray start --address="$MASTER_ADDR:$RAY_PORT" "${RAY_NODE_FLAGS[@]}"; do
    if [ "$waited" -ge "$JOIN_TIMEOUT_S" ]; then
      log "could not join the head after ${JOIN_TIMEOUT_S}s"
      exit 1
    fi
    sleep 10
    waited=$((waited + 10))
  done
  log "joined; this node now runs the head's Ray workers (ray stop on this node to leave)"
fi
