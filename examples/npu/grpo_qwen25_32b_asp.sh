#!/usr/bin/env bash
# Async GRPO (Qwen2.5-32B) with the ASP schedule on MindSpeed-RL worker groups, Atlas A3 nodes.
# The same launcher as the 7B one with the 32B config; run it on every node:
#   MASTER_ADDR=10.0.0.1 NNODES=2 bash /path/to/asp_ascend/examples/npu/grpo_qwen25_32b_asp.sh [overrides...]
set -euo pipefail
CONFIG_NAME="${CONFIG_NAME:-grpo_qwen25_32b_asp_A3}" \
  exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/grpo_qwen25_7b_asp.sh" "$@"
