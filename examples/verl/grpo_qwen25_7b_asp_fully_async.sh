#!/usr/bin/env bash
# verl GRPO (Qwen2.5-7B) with verl's fully async recipe (FullyAsyncRollouter + FullyAsyncTrainer) and the ASP schedule;
# the same script on NPU and CUDA nodes, run on every node (2 nodes by default: 1 rollout, 1 trainer):
#   MASTER_ADDR=10.0.0.1 DEVICE=npu bash examples/verl/grpo_qwen25_7b_asp_fully_async.sh [Hydra overrides...]
# Everything else (Ray head/join, the train command) is grpo_qwen25_7b_asp.sh with this mode's config.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEVICE="${DEVICE:-npu}"
export DEVICE
export CONFIG_NAME="${CONFIG_NAME:-grpo_qwen25_7b_asp_fully_async_$DEVICE}"
export NNODES="${NNODES:-2}"
export ROLLOUT_NNODES="${ROLLOUT_NNODES:-1}"
exec bash "$HERE/grpo_qwen25_7b_asp.sh" "$@"
