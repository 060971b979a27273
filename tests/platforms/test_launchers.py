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
    assert 'source "$HERE/../lib/cluster.sh"' in text  # head start, node wait and join live there
    assert "start_head_and_wait" in text and "join_head" in text and "refuse_running_ray" in text


LIB = ROOT / "examples" / "lib" / "cluster.sh"


def test_cluster_lib_rules():
    text = LIB.read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(LIB)], check=True)
    for bad in ("pkill", "killall", "ray stop", "rm -rf"):
        assert bad not in text.replace("(ray stop) if it is yours", "").replace("(ray stop on this node", ""), bad
    assert "ray start --head" in text and "ray start --address" in text


def _lib_env(tmp_path, counts: list[int], join_failures: int = 0) -> dict:
    """A `ray` on PATH that records its calls (and fails the first join attempts), and a PYTHON
    that reports the next of ``counts`` as the cluster's resource count: the launcher's own
    control flow (wait, time out, retry) runs for real, without starting a cluster."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    (bindir / "ray").write_text(f"""#!/usr/bin/env bash
echo "ray $*" >> {calls}
if [ "$1 $2" = "start --address=127.0.0.2:7000" ]; then
  n=$(grep -c -- '--address' {calls})
  [ "$n" -gt {join_failures} ] || exit 1
fi
[ "$1" = status ] && exit 1
exit 0
""")
    seq = tmp_path / "seq"
    seq.write_text("\n".join(map(str, counts)) + "\n")
    (bindir / "fakepython").write_text(f"""#!/usr/bin/env bash
cat > /dev/null
head -n1 {seq}; tail -n +2 {seq} > {seq}.next; [ -s {seq}.next ] && mv {seq}.next {seq} || rm -f {seq}.next
""")
    for f in ("ray", "fakepython"):
        (bindir / f).chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PYTHON=str(bindir / "fakepython"),
               MASTER_ADDR="127.0.0.2", RAY_PORT="7000", SOCKET_IFNAME="", JOIN_TIMEOUT_S="20")
    return env


def _lib(cmd: str, env: dict) -> subprocess.CompletedProcess:
    script = f'set -euo pipefail; sleep() {{ :; }}; source "{LIB}"; {cmd}'
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_head_waits_until_every_device_joined(tmp_path):
    env = _lib_env(tmp_path, [0, 8, 16])
    res = _lib("start_head_and_wait NPU 16 --resources='{\"NPU\": 8}'", env)
    assert res.returncode == 0, res.stderr
    assert "waiting for nodes: 0/16 NPUs" in res.stdout and "waiting for nodes: 8/16 NPUs" in res.stdout
    assert "all nodes joined (16 NPUs)" in res.stdout
    assert (tmp_path / "calls").read_text().splitlines()[0].startswith("ray start --head --port=7000")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_head_gives_up_when_nodes_never_join(tmp_path):
    env = _lib_env(tmp_path, [8])
    res = _lib("start_head_and_wait GPU 16", env)
    assert res.returncode == 1
    assert "only 8 of 16 GPUs joined after 20s" in res.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_worker_retries_until_the_head_answers(tmp_path):
    env = _lib_env(tmp_path, [0], join_failures=2)
    res = _lib("join_head --num-gpus=8", env)
    assert res.returncode == 0, res.stderr
    joins = [c for c in (tmp_path / "calls").read_text().splitlines() if "--address" in c]
    assert len(joins) == 3 and joins[-1] == "ray start --address=127.0.0.2:7000 --num-gpus=8"
    (tmp_path / "never").mkdir()
    res = _lib("join_head", _lib_env(tmp_path / "never", [0], join_failures=99))
    assert res.returncode == 1 and "could not join the head after 20s" in res.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_an_existing_ray_is_refused_not_stopped(tmp_path):
    env = _lib_env(tmp_path, [0])
    (tmp_path / "bin" / "ray").write_text(f"#!/usr/bin/env bash\necho \"ray $*\" >> {tmp_path / 'calls'}\nexit 0\n")
    res = _lib("refuse_running_ray", env)
    assert res.returncode == 1 and "stop it yourself" in res.stdout
    assert (tmp_path / "calls").read_text().splitlines() == ["ray status"]


def test_npu_launcher_uses_npu_resources_and_our_entry():
    text = (ROOT / "examples/npu/grpo_qwen25_7b_asp.sh").read_text()
    assert '"NPU":' in text.replace("\\", "") and "asp_ascend.integrations.mindspeed_rl.entry" in text
    config = re.search(r'CONFIG_NAME="\$\{CONFIG_NAME:-([^}]+)\}"', text).group(1)
    assert (ROOT / "configs/mindspeed_rl" / f"{config}.yaml").is_file()
