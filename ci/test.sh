#!/usr/bin/env bash
# Run the test suite in the project's own virtual environment (created if needed).
#   bash ci/test.sh [pytest args...]      e.g. bash ci/test.sh -m slow
# ASP_STACK=core skips the torch/ray/vllm install (runtime tests then skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/env.sh "${ASP_STACK:-cpu}"
export PYTHONHASHSEED=0
# The rule of the platform layer: no device calls outside asp_ascend/platforms/.
if grep -rnE "torch\.(cuda|npu)\b|import torch_npu" asp_ascend --include='*.py' | grep -v "asp_ascend/platforms/"; then
  echo "device calls outside asp_ascend/platforms/ (route them through the platform layer)" >&2
  exit 1
fi
set +e
python -m pytest -q --durations=15 "$@"
rc=$?
set -e
# pytest exits 5 when no test was collected: that is a failure of the suite, not a pass.
exit $rc
