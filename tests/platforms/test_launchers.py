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


def _auth_env(tmp_path, token_auth: bool) -> dict:
    """A PYTHON that answers the Ray-version probe (token auth or not) and makes tokens."""
    import os

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "authpython").write_text(f"""#!/usr/bin/env bash
if [ "$1" = - ]; then cat > /dev/null; exit {0 if token_auth else 1}; fi
echo 0123456789abcdef
""")
    (bindir / "authpython").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return dict(env, PYTHON=str(bindir / "authpython"), HOME=str(tmp_path / "home"))


_SHOW = 'echo "host=$DASHBOARD_HOST mode=${RAY_AUTH_MODE:-none} path=${RAY_AUTH_TOKEN_PATH:-}"'


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_old_ray_binds_the_dashboard_to_localhost(tmp_path):
    res = _lib(f"setup_ray_auth head 10.0.0.1; {_SHOW}", _auth_env(tmp_path, token_auth=False))
    assert res.returncode == 0, res.stderr
    assert "host=127.0.0.1 mode=none path=\n" in res.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_token_auth_on_with_a_private_token_file(tmp_path):
    import stat

    env = _auth_env(tmp_path, token_auth=True)
    res = _lib(f"setup_ray_auth head 10.0.0.1; {_SHOW}", env)
    assert res.returncode == 0, res.stdout + res.stderr
    token = tmp_path / "home" / ".ray" / "asp_auth_token"
    assert f"host=10.0.0.1 mode=token path={token}" in res.stdout
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text().strip()
    # a worker uses the copied token; one others can read is refused, and so is a missing one
    assert _lib(f"setup_ray_auth worker 10.0.0.2; {_SHOW}", env).returncode == 0
    token.chmod(0o644)
    res = _lib("setup_ray_auth worker 10.0.0.2", env)
    assert res.returncode == 1 and "mode 600" in res.stdout
    token.unlink()
    assert _lib("setup_ray_auth worker 10.0.0.2", env).returncode == 1


def test_launchers_turn_on_auth_and_set_the_ascend_environment():
    npu = (ROOT / "examples/npu/grpo_qwen25_7b_asp.sh").read_text()
    for script in [ROOT / "examples/npu/grpo_qwen25_7b_asp.sh", ROOT / "examples/cuda/grpo_qwen25_7b_asp.sh",
                   *ROOT.glob("examples/verl/*.sh")]:
        text = script.read_text()
        if re.search(r'exec bash .*/([\w.]+\.sh)"', text):   # a thin wrapper: the launcher it runs is checked
            assert "setup_ray_auth head" in (script.parent / re.search(r'exec bash .*/([\w.]+\.sh)"', text).group(1)).read_text()
            continue
        assert "setup_ray_auth head" in text and "setup_ray_auth worker" in text, script.name
        assert '--dashboard-host="$IP"' not in text, script.name
    for needed in ("umask 0027", "LD_PRELOAD=", "MALLOC_MMAP_THRESHOLD_=", "HCCL_SOCKET_IFNAME=", "runtime_env.yaml"):
        assert needed in npu, needed
    assert "24703" not in npu  # the HCCL base port comes from MindSpeed-RL's runtime env


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_npu_launcher_refuses_several_nodes_without_a_nic(tmp_path):
    import os

    env = dict(os.environ, MASTER_ADDR="10.0.0.1", NNODES="2", SOCKET_IFNAME="", CANN_SET_ENV="/nonexistent",
               ATB_SET_ENV="/nonexistent", LOG_DIR=str(tmp_path), MINDSPEED_RL_DIR=str(tmp_path))
    res = subprocess.run(["bash", str(ROOT / "examples/npu/grpo_qwen25_7b_asp.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "set SOCKET_IFNAME" in res.stdout
