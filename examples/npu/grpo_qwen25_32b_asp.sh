#!/usr/bin/env bash
# Async GRPO (Qwen2.5-32B) with the ASP schedule on MindSpeed-RL worker groups, Atlas A3 nodes.
#
# Run the SAME command on every node (docs/ascend.md), from the MindSpeed-RL root:
#   MASTER_ADDR=10.0.0.1 NNODES=2 bash /path/to/asp_ascend/examples/npu/grpo_qwen25_32b_asp.sh [overrides...]
# The node whose IP is MASTER_ADDR starts Ray as head (NPUs as the Ray resource "NPU"), waits
# until NNODES x NPUS_PER_NODE NPUs have joined, then starts training; every other node joins
# the head and returns. Extra arguments are Hydra overrides (asp.KEY=VALUE for our settings).
# Nothing is killed or force-stopped: an existing Ray on a node is an error you resolve yourself.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MINDSPEED_RL_DIR="${MINDSPEED_RL_DIR:-$PWD}"                 # holds cli/, configs/, mindspeed_rl/, megatron/, mindspeed/
CONFIG_DIR="${CONFIG_DIR:-$HERE/../../configs/mindspeed_rl}"
CONFIG_NAME="${CONFIG_NAME:-grpo_qwen25_32b_asp_A3}"
NNODES="${NNODES:-2}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"                        # A3: 16 dies per node
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the head node IP}"
SOCKET_IFNAME="${SOCKET_IFNAME:-}"                          # NIC for HCCL/GLOO, e.g. enp189s0f0 (empty: default route)
RAY_PORT="${RAY_PORT:-6766}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8260}"
JOIN_TIMEOUT_S="${JOIN_TIMEOUT_S:-1800}"
CANN_SET_ENV="${CANN_SET_ENV:-/usr/local/Ascend/cann/set_env.sh}"       # CANN 8.5; older: ascend-toolkit/set_env.sh
ATB_SET_ENV="${ATB_SET_ENV:-/usr/local/Ascend/nnal/atb/set_env.sh}"
LOG_DIR="${LOG_DIR:-$MINDSPEED_RL_DIR/logs}"
PYTHON="${PYTHON:-python3}"

log() { echo "[$(date +%H:%M:%S) $(hostname)] $*"; }

current_ip() {
  if [ -n "$SOCKET_IFNAME" ]; then
    ip -4 -o addr show "$SOCKET_IFNAME" | awk '{print $4}' | cut -d/ -f1 | head -n1
  else
    ip -4 route get "$MASTER_ADDR" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}' | head -n1
  fi
}

cluster_npus() {  # NPUs registered in the Ray cluster (0 if unreachable)
  "$PYTHON" - "$MASTER_ADDR:$RAY_PORT" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get("NPU", 0)))
PY
}

# --- environment (CANN scripts read unset variables: relax -u while sourcing them)
set +u
# shellcheck disable=SC1090
if [ -f "$CANN_SET_ENV" ]; then source "$CANN_SET_ENV"
elif [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then source /usr/local/Ascend/ascend-toolkit/set_env.sh; fi
# shellcheck disable=SC1090
[ -f "$ATB_SET_ENV" ] && source "$ATB_SET_ENV"
set -u
export RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1
export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
export HCCL_IF_BASE_PORT="${HCCL_IF_BASE_PORT:-24703}"
export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
export PYTHONPATH="$MINDSPEED_RL_DIR${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$SOCKET_IFNAME" ]; then
  export HCCL_SOCKET_IFNAME="$SOCKET_IFNAME" GLOO_SOCKET_IFNAME="$SOCKET_IFNAME" TP_SOCKET_IFNAME="$SOCKET_IFNAME"
fi
ulimit -n 32768 || true
mkdir -p "$LOG_DIR"

IP="$(current_ip)"
[ -n "$IP" ] || { log "cannot find this node's IP (set SOCKET_IFNAME)"; exit 1; }
if ray status >/dev/null 2>&1; then
  log "a Ray runtime is already running on this node; stop it yourself (ray stop) if it is yours, then rerun"
  exit 1
fi

RAY_NODE_FLAGS=(--node-ip-address="$IP" --resources="{\"NPU\": $NPUS_PER_NODE}")
WANT=$((NNODES * NPUS_PER_NODE))

if [ "$IP" = "$MASTER_ADDR" ]; then
  log "head: starting Ray on $IP:$RAY_PORT with $NPUS_PER_NODE NPUs"
  ray start --head --port="$RAY_PORT" --dashboard-host="$IP" --dashboard-port="$DASHBOARD_PORT" "${RAY_NODE_FLAGS[@]}"
  waited=0
  while :; do
    have="$(cluster_npus)"
    [ "$have" -ge "$WANT" ] && break
    if [ "$waited" -ge "$JOIN_TIMEOUT_S" ]; then
      log "only $have of $WANT NPUs joined after ${JOIN_TIMEOUT_S}s; check the worker nodes' logs"
      exit 1
    fi
    log "waiting for nodes: $have/$WANT NPUs"
    sleep 10
    waited=$((waited + 10))
  done
  log "all $NNODES nodes joined ($WANT NPUs); training"
  cd "$MINDSPEED_RL_DIR"
  export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"
  TRAIN_CMD=("$PYTHON" -m asp_ascend.integrations.mindspeed_rl.entry --config-path "$CONFIG_DIR" --config-name "$CONFIG_NAME")
  "${TRAIN_CMD[@]}" "$@" 2>&1 | tee "$LOG_DIR/${CONFIG_NAME}_$(date +%Y%m%d_%H%M%S).log"
  exit "${PIPESTATUS[0]}"
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
