#!/usr/bin/env bash
# verl GRPO (Qwen2.5-7B) with the ASP schedule; the same script on NPU and CUDA nodes.
#   MASTER_ADDR=10.0.0.1 NNODES=2 DEVICE=npu bash examples/verl/grpo_qwen25_7b_asp.sh [Hydra overrides...]
# Run it on every node: the node whose IP is MASTER_ADDR starts Ray as head, waits for
# NNODES x DEVICES_PER_NODE devices, then starts python -m asp_ascend.integrations.verl.main_ppo;
# the others join. Overrides are verl's (key=value) or ours (+asp.KEY=VALUE). Not yet run on hardware.
# ROLLOUT_NNODES > 0 (one-step-off and fully async: separate rollout devices) gives that many of the
# NNODES nodes to rollout (verl's rollout.nnodes), the rest to the trainer (trainer.nnodes); the
# wrappers grpo_qwen25_7b_asp_{one_step_off,fully_async}.sh set it with their configs.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEVICE="${DEVICE:-npu}"                                  # npu | cuda
CONFIG_DIR="${CONFIG_DIR:-$HERE/../../configs/verl}"
CONFIG_NAME="${CONFIG_NAME:-grpo_qwen25_7b_asp_$DEVICE}"
NNODES="${NNODES:-1}"
ROLLOUT_NNODES="${ROLLOUT_NNODES:-0}"
DEVICES_PER_NODE="${DEVICES_PER_NODE:-8}"
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the head node IP}"
SOCKET_IFNAME="${SOCKET_IFNAME:-}"
RAY_PORT="${RAY_PORT:-6766}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8260}"
JOIN_TIMEOUT_S="${JOIN_TIMEOUT_S:-1800}"
PYTHON="${PYTHON:-python3}"
# shellcheck source=../lib/cluster.sh
source "$HERE/../lib/cluster.sh"

RESOURCE=GPU
RAY_NODE_FLAGS=(--port="$RAY_PORT")
if [ "$DEVICE" = "npu" ]; then
  for f in "${CANN_SET_ENV:-/usr/local/Ascend/cann/set_env.sh}" /usr/local/Ascend/ascend-toolkit/set_env.sh; do
    if [ -f "$f" ]; then source "$f"; break; fi
  done
  export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
  RESOURCE=NPU
  RAY_NODE_FLAGS+=(--resources="{\"NPU\": $DEVICES_PER_NODE}")
fi
if [ -n "$SOCKET_IFNAME" ]; then
  export HCCL_SOCKET_IFNAME="$SOCKET_IFNAME" GLOO_SOCKET_IFNAME="$SOCKET_IFNAME" NCCL_SOCKET_IFNAME="$SOCKET_IFNAME"
fi
NODES=(trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$DEVICES_PER_NODE")
if [ "$ROLLOUT_NNODES" -gt 0 ]; then
  if [ "$ROLLOUT_NNODES" -ge "$NNODES" ]; then
    log "ROLLOUT_NNODES=$ROLLOUT_NNODES leaves no node of NNODES=$NNODES to the trainer; raise NNODES"
    exit 1
  fi
  NODES=(trainer.nnodes="$((NNODES - ROLLOUT_NNODES))" trainer.n_gpus_per_node="$DEVICES_PER_NODE"
         rollout.nnodes="$ROLLOUT_NNODES" rollout.n_gpus_per_node="$DEVICES_PER_NODE")
fi
IP="$(current_ip)"
[ -n "$IP" ] || { log "cannot find this node's IP (set SOCKET_IFNAME)"; exit 1; }
refuse_running_ray
WANT=$((NNODES * DEVICES_PER_NODE))
if [ "$IP" = "$MASTER_ADDR" ]; then
  setup_ray_auth head "$IP"
  start_head_and_wait "$RESOURCE" "$WANT" --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$DASHBOARD_PORT" "${RAY_NODE_FLAGS[@]}"
  RAY_ADDRESS="$IP:$RAY_PORT" "$PYTHON" -m asp_ascend.integrations.verl.main_ppo \
    --config-path "$CONFIG_DIR" --config-name "$CONFIG_NAME" "${NODES[@]}" "$@"
else
  setup_ray_auth worker "$IP"
  join_head "${RAY_NODE_FLAGS[@]}"
fi
