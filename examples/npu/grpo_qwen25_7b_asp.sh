#!/usr/bin/env bash
# Async GRPO (Qwen2.5-7B) with the ASP schedule on MindSpeed-RL worker groups, Atlas A3 nodes.
#
# Run the SAME command on every node (docs/ascend.md), from the MindSpeed-RL root:
#   MASTER_ADDR=10.0.0.1 NNODES=2 bash /path/to/asp_ascend/examples/npu/grpo_qwen25_7b_asp.sh [overrides...]
# The node whose IP is MASTER_ADDR starts Ray as head (NPUs as the Ray resource "NPU"), waits
# until NNODES x NPUS_PER_NODE NPUs have joined, then starts training; every other node joins
# the head and returns. Extra arguments are Hydra overrides (asp.KEY=VALUE for our settings).
# Nothing is killed or force-stopped: an existing Ray on a node is an error you resolve yourself.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MINDSPEED_RL_DIR="${MINDSPEED_RL_DIR:-$PWD}"                 # holds cli/, configs/, mindspeed_rl/, megatron/, mindspeed/
CONFIG_DIR="${CONFIG_DIR:-$HERE/../../configs/mindspeed_rl}"
CONFIG_NAME="${CONFIG_NAME:-grpo_qwen25_7b_asp_A3}"
NNODES="${NNODES:-2}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"                        # A3: 16 dies per node
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the head node IP}"
SOCKET_IFNAME="${SOCKET_IFNAME:-}"                          # NIC for HCCL/GLOO, e.g. enp189s0f0 (required for NNODES > 1)
RAY_PORT="${RAY_PORT:-6766}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8260}"
JOIN_TIMEOUT_S="${JOIN_TIMEOUT_S:-1800}"
CANN_SET_ENV="${CANN_SET_ENV:-/usr/local/Ascend/cann/set_env.sh}"       # CANN 8.5; older: ascend-toolkit/set_env.sh
ATB_SET_ENV="${ATB_SET_ENV:-/usr/local/Ascend/nnal/atb/set_env.sh}"
LOG_DIR="${LOG_DIR:-$MINDSPEED_RL_DIR/logs}"
PYTHON="${PYTHON:-python3}"
JEMALLOC="${JEMALLOC:-/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2}"   # MindSpeed-RL's guide: apt install libjemalloc2
RUNTIME_ENV="${RUNTIME_ENV:-$MINDSPEED_RL_DIR/configs/envs/runtime_env.yaml}"

# shellcheck source=../lib/cluster.sh
source "$HERE/../lib/cluster.sh"

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
# HCCL's base port: the value MindSpeed-RL's runtime env gives every Ray worker (12345 there);
# the driver must use the same one, so another value is refused (change it in the runtime env).
runtime_env_port=""
if [ -f "$RUNTIME_ENV" ]; then
  runtime_env_port="$(sed -n "s/^ *HCCL_IF_BASE_PORT: *['\"]*\([0-9]*\).*/\1/p" "$RUNTIME_ENV" | head -n1)"
fi
runtime_env_port="${runtime_env_port:-12345}"
if [ -n "${HCCL_IF_BASE_PORT:-}" ] && [ "$HCCL_IF_BASE_PORT" != "$runtime_env_port" ]; then
  log "HCCL_IF_BASE_PORT=$HCCL_IF_BASE_PORT, but $RUNTIME_ENV gives Ray workers $runtime_env_port; change it there"
  exit 1
fi
export HCCL_IF_BASE_PORT="$runtime_env_port"
export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
export PYTHONPATH="$MINDSPEED_RL_DIR${PYTHONPATH:+:$PYTHONPATH}"
if [ "$NNODES" -gt 1 ] && [ -z "$SOCKET_IFNAME" ]; then
  log "NNODES=$NNODES: set SOCKET_IFNAME to the NIC the nodes reach each other on (HCCL_SOCKET_IFNAME); see ip -4 addr"
  exit 1
fi
if [ -n "$SOCKET_IFNAME" ]; then
  export HCCL_SOCKET_IFNAME="$SOCKET_IFNAME" GLOO_SOCKET_IFNAME="$SOCKET_IFNAME" TP_SOCKET_IFNAME="$SOCKET_IFNAME"
fi
# jemalloc: MindSpeed-RL's install guide needs it for Ray's memory reclaim; set before `ray start`
# so the raylet and every worker use it.
if [ -f "$JEMALLOC" ]; then
  export LD_PRELOAD="$JEMALLOC${LD_PRELOAD:+:$LD_PRELOAD}" MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-512768}"
else
  log "jemalloc not found at $JEMALLOC (apt install libjemalloc2, or set JEMALLOC); Ray may not return memory"
  exit 1
fi
umask 0027
ulimit -n 32768 || true
mkdir -p "$LOG_DIR"

IP="$(current_ip)"
[ -n "$IP" ] || { log "cannot find this node's IP (set SOCKET_IFNAME)"; exit 1; }
refuse_running_ray

RAY_NODE_FLAGS=(--node-ip-address="$IP" --resources="{\"NPU\": $NPUS_PER_NODE}")
WANT=$((NNODES * NPUS_PER_NODE))

if [ "$IP" = "$MASTER_ADDR" ]; then
  setup_ray_auth head "$IP"
  start_head_and_wait NPU "$WANT" --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$DASHBOARD_PORT" "${RAY_NODE_FLAGS[@]}"
  log "all $NNODES nodes joined ($WANT NPUs); training"
  cd "$MINDSPEED_RL_DIR"
  export RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT"
  TRAIN_CMD=("$PYTHON" -m asp_ascend.integrations.mindspeed_rl.entry --config-path "$CONFIG_DIR" --config-name "$CONFIG_NAME")
  "${TRAIN_CMD[@]}" "$@" 2>&1 | tee "$LOG_DIR/${CONFIG_NAME}_$(date +%Y%m%d_%H%M%S).log"
  exit "${PIPESTATUS[0]}"
else
  setup_ray_auth worker "$IP"
  join_head "${RAY_NODE_FLAGS[@]}"
fi
