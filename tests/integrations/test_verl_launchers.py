"""The verl launchers and their configs, all three modes: each launcher, run as the head node with a `ray`
and a PYTHON on PATH that record their calls (the launcher's own control flow runs for real), starts Ray
and then one train command; that command line, composed by Hydra as ``python -m
asp_ascend.integrations.verl.main_ppo`` composes it, is a config verl accepts (its own
``validate_config``, the fully async rollouter's asserts) and our bridge translates to the intended mode."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from verl_fixtures import HAVE_VERL, SKIP_REASON

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = {"sync": "grpo_qwen25_7b_asp.sh", "one_step_off": "grpo_qwen25_7b_asp_one_step_off.sh",
             "fully_async": "grpo_qwen25_7b_asp_fully_async.sh"}


def run_launcher(tmp_path: Path, mode: str, device: str, extra_env=None, args=()) -> tuple[int, list[str], str]:
    """(exit code, the train command's argv, output) of the launcher run as the head node."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls, argv = tmp_path / "ray_calls", tmp_path / "argv"
    (bindir / "ray").write_text(f'#!/usr/bin/env bash\necho "ray $*" >> {calls}\n[ "$1" = status ] && exit 1\nexit 0\n')
    (bindir / "fakepython").write_text(f"""#!/usr/bin/env bash
if [ "$1" = - ]; then
  if grep -q cluster_resources; then echo "$WANT_DEVICES"; exit 0; fi
  exit 1    # no token auth (an older Ray)
fi
printf '%s\\n' "$@" > {argv}
""")
    for f in ("ray", "fakepython"):
        (bindir / f).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(PATH=f"{bindir}:{env['PATH']}", PYTHON=str(bindir / "fakepython"), MASTER_ADDR="127.0.0.1",
               DEVICE=device, HOME=str(tmp_path), JOIN_TIMEOUT_S="0", CANN_SET_ENV="/nonexistent",
               WANT_DEVICES="16", **(extra_env or {}))
    for key in ("NNODES", "ROLLOUT_NNODES", "CONFIG_NAME", "CONFIG_DIR"):
        if key not in (extra_env or {}):
            env.pop(key, None)
    res = subprocess.run(["bash", str(ROOT / "examples" / "verl" / LAUNCHERS[mode]), *args], env=env,
                         capture_output=True, text=True, timeout=60)
    got = argv.read_text().splitlines() if argv.is_file() else []
    if got:
        assert calls.read_text().splitlines()[0] == "ray status"  # an existing Ray is refused, never stopped
    return res.returncode, got, res.stdout + res.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("mode", list(LAUNCHERS))
def test_launcher_starts_ray_then_one_train_command(tmp_path, mode):
    text = (ROOT / "examples" / "verl" / LAUNCHERS[mode]).read_text()
    assert "set -euo pipefail" in text and not any(b in text for b in ("pkill", "killall", "ray stop", "rm -rf"))
    rc, argv, out = run_launcher(tmp_path, mode, "cuda", {"NNODES": "2"} if mode == "sync" else None)
    assert rc == 0, out
    assert argv[:2] == ["-m", "asp_ascend.integrations.verl.main_ppo"]
    assert argv[argv.index("--config-name") + 1] == ("grpo_qwen25_7b_asp_cuda" if mode == "sync"
                                                     else f"grpo_qwen25_7b_asp_{mode}_cuda")
    assert Path(argv[argv.index("--config-path") + 1]).resolve() == ROOT / "configs" / "verl"
    ray_calls = (tmp_path / "ray_calls").read_text()
    assert "ray start --head --port=6766" in ray_calls
    nodes = {a.split("=")[0]: a.split("=")[1] for a in argv if a.startswith(("trainer.nnodes", "rollout.nnodes"))}
    assert nodes == ({"trainer.nnodes": "2"} if mode == "sync" else {"trainer.nnodes": "1", "rollout.nnodes": "1"})


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_launcher_refuses_giving_every_node_to_rollout(tmp_path):
    rc, argv, out = run_launcher(tmp_path, "fully_async", "cuda", {"NNODES": "1", "ROLLOUT_NNODES": "1"})
    assert rc == 1 and not argv and "leaves no node of NNODES=1 to the trainer" in out


def compose_argv(argv: list[str]):
    """Hydra's composition of the entry's command line (what ``@hydra.main`` does with it)."""
    from hydra import compose, initialize_config_dir

    path = argv[argv.index("--config-path") + 1]
    name = argv[argv.index("--config-name") + 1]
    overrides = [a for a in argv[argv.index("--config-name") + 2:]]
    with initialize_config_dir(config_dir=str(Path(path).resolve()), version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("device", ["npu", "cuda"])
@pytest.mark.parametrize("mode", list(LAUNCHERS))
def test_launchers_command_line_is_a_config_verl_accepts(tmp_path, mode, device):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from asp_ascend.integrations.verl.config_bridge import translate
    from asp_ascend.integrations.verl.main_ppo import fully_async_config, one_step_off_config

    rc, argv, out = run_launcher(tmp_path, mode, device, args=["trainer.total_epochs=2"])
    assert rc == 0, out
    config = compose_argv(argv)
    assert config.asp.verl.mode == mode and config.trainer.device == device and config.trainer.total_epochs == 2
    if mode != "sync":                    # every setting of verl's own recipe config is in ours
        import verl
        import yaml

        recipe = Path(verl.__file__).parent / "experimental" / f"{mode}_policy" / "config" / f"{mode}_ppo_trainer.yaml"
        flat = _flatten({k: v for k, v in yaml.safe_load(recipe.read_text()).items() if k not in ("hydra", "defaults")})
        missing = [k for k in flat if OmegaConf.select(config, k, default="<missing>") == "<missing>"]
        assert not missing, f"{recipe.name} keys missing from our config: {missing}"
    if mode == "fully_async":
        config = fully_async_config(config)
        assert config.data.train_batch_size == 0 and config.data.gen_batch_size == 1     # FullyAsyncRollouter's asserts
        assert config.actor_rollout_ref.rollout.calculate_log_probs
    elif mode == "one_step_off":
        config = one_step_off_config(config)
    OmegaConf.resolve(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    ours, _ = translate(OmegaConf.to_container(config, resolve=True))
    assert ours.train.group_size == 8 and ours.scheduler.adaptive and ours.platform == device
    if mode == "sync":
        assert ours.rollout.num_instances == 8 // 2 and ours.pipeline.mode == "sync"
        assert ours.train.global_batch_size == 256
    else:                                  # one rollout node of 8 devices, TP 2: verl's 4 servers
        assert ours.rollout.num_instances == 4 and not config.actor_rollout_ref.hybrid_engine
        assert config.actor_rollout_ref.rollout.nnodes == 1 and config.trainer.nnodes == 1
        assert ours.pipeline.lag_bound == 1 and ours.verl.route_servers
        assert ours.train.global_batch_size == (256 if mode == "one_step_off" else 64 * 1 * 4)


def _flatten(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out
