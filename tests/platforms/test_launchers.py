"""The bash launchers: valid syntax, strict mode, defaults overridable, no destructive clean-up."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("examples/npu/*.sh"), *ROOT.glob("examples/cuda/*.sh")])


def test_there_are_npu_and_cuda_launchers():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"examples/npu/grpo_qwen25_7b_asp.sh", "examples/cuda/grpo_qwen25_7b_asp.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_launcher_rules(script):
    text = script.read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert "set -euo pipefail" in text
    for bad in ("pkill", "killall", "ray stop --force", "rm -rf"):
        assert bad not in text, f"{script.name}: destructive clean-up ({bad})"
    delegate = re.search(r'exec bash .*/([\w.]+\.sh)"', text)
    if delegate:  # a thin wrapper: another launcher with another config
        assert (script.parent / delegate.group(1)).is_file()
        config = re.search(r'CONFIG_NAME="\$\{CONFIG_NAME:-([^}]+)\}"', text).group(1)
        assert (ROOT / "configs/mindspeed_rl" / f"{config}.yaml").is_file()
        return
    # settings are overridable from the environment: VAR="${VAR:-default}" (or :? for required ones)
    settings = [(n, v) for n, v in re.findall(r'^([A-Z][A-Z0-9_]+)="([^"]*)"', text, re.M) if not v.startswith("$(")]
    assert len(settings) >= 5
    for name, value in settings:
        assert value.startswith(f"${{{name}:"), f"{script.name}: {name} is not overridable ({value})"
    assert "ray start --head" in text and "ray start --address" in text


def test_npu_launcher_uses_npu_resources_and_our_entry():
    text = (ROOT / "examples/npu/grpo_qwen25_7b_asp.sh").read_text()
    assert '"NPU":' in text.replace("\\", "") and "asp_ascend.integrations.mindspeed_rl.entry" in text
    config = re.search(r'CONFIG_NAME="\$\{CONFIG_NAME:-([^}]+)\}"', text).group(1)
    assert (ROOT / "configs/mindspeed_rl" / f"{config}.yaml").is_file()
