"""The adapter imports without MindSpeed-RL, torch_npu or Ray, and says what to install when used."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asp_ascend.errors import BackendMissingError

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["async_loop", "checker", "config_bridge", "contract", "entry", "rollout_groups", "sample_source",
           "schedule_batches", "trainer", "vllm_receiver"]


def _run(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path) if extra_path else None, str(ROOT),
                                                      env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_every_adapter_module_imports_without_heavy_packages():
    code = ("import sys\n" + "".join(f"import asp_ascend.integrations.mindspeed_rl.{m}\n" for m in MODULES) +
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'mindspeed_rl', 'torch_npu', 'hydra') if m in sys.modules))")
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("factory", ["make_async_grpo_trainer_class", "make_trainer_worker_class",
                                     "register_offpolicy_loss"])
def test_factories_name_what_to_install(factory):
    try:
        import mindspeed_rl.trainer  # noqa: F401
        pytest.skip("MindSpeed-RL is importable here")
    except ImportError:
        pass
    from asp_ascend.integrations.mindspeed_rl import trainer

    with pytest.raises(BackendMissingError) as e:
        getattr(trainer, factory)()
    assert e.value.module == "mindspeed_rl"
    assert "MindSpeed-RL" in str(e.value) and "docs/ascend.md" in str(e.value)


def test_a_missing_dependency_inside_mindspeed_is_named(tmp_path):
    # A source tree whose import chain needs torch_npu (as the real one does at module level).
    pkg = tmp_path / "mindspeed_rl"
    (pkg / "trainer").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from mindspeed_rl import trainer\n")
    (pkg / "trainer" / "__init__.py").write_text("")
    (pkg / "trainer" / "grpo_trainer_hybrid.py").write_text("import torch_npu\n")
    code = ("from asp_ascend.integrations.mindspeed_rl import require_mindspeed\n"
            "from asp_ascend.errors import BackendMissingError\n"
            "try:\n    require_mindspeed()\nexcept BackendMissingError as e:\n    print(e.module, '|', e)\n")
    out = _run(code, extra_path=tmp_path)
    assert out.returncode == 0, out.stderr
    module, msg = out.stdout.split("|", 1)
    assert module.strip() == "torch_npu" and "CANN" in msg and "imported by mindspeed_rl" in msg


def test_rollout_bundles_and_capacity():
    from asp_ascend.errors import ConfigError
    from asp_ascend.integrations.mindspeed_rl.rollout_groups import check_capacity, instance_bundles
    from asp_ascend.platforms import CpuPlatform, NpuPlatform

    assert instance_bundles(NpuPlatform(), 4, 2.0) == [{"NPU": 4, "CPU": 8.0}]
    assert instance_bundles(CpuPlatform(), 1) == [{"CPU": 4.0}]
    check_capacity({"NPU": 32.0}, NpuPlatform(), 8, 2, 16)
    with pytest.raises(ConfigError, match="8 x 2 \\+ 24 = 40 NPUs, but the Ray cluster has 32"):
        check_capacity({"NPU": 32.0}, NpuPlatform(), 8, 2, 24)
    with pytest.raises(ConfigError, match="devices_per_instance"):
        instance_bundles(NpuPlatform(), 0)


def test_instance_engine_args_and_node_fit():
    from asp_ascend.errors import ConfigError
    from asp_ascend.integrations.mindspeed_rl.rollout_groups import check_instances_fit_nodes, instance_engine_args
    from asp_ascend.platforms import CpuPlatform, NpuPlatform

    assert instance_engine_args() == {"distributed_executor_backend": "mp", "load_format": "dummy"}
    check_instances_fit_nodes([{"NPU": 16.0}, {"NPU": 16.0}], NpuPlatform(), 16)
    with pytest.raises(ConfigError, match=r"generate_config.infer_tensor_parallel_size: 32 .* largest node has 16"):
        check_instances_fit_nodes([{"NPU": 16.0}, {"NPU": 16.0}], NpuPlatform(), 32)
    check_instances_fit_nodes([{}], CpuPlatform(), 4)


def test_each_instance_owns_exactly_its_devices(monkeypatch):
    """MindSpeed-RL's runtime env tells Ray not to set ASCEND_RT_VISIBLE_DEVICES; the instance actor
    narrows it to its own NPUs (Ray's accelerator ids) before vLLM starts. Two TP-2 instances on a
    4-NPU node (NPU as the custom resource, as `ray start --resources` declares it) get disjoint
    devices; a TP size that differs from what Ray gave is refused."""
    ray = pytest.importorskip("ray")
    from asp_ascend.integrations.mindspeed_rl.rollout_groups import (create_instance_placement_groups,
                                                                     instance_actor_options, own_devices)
    from asp_ascend.platforms import NpuPlatform

    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "1")
    ray.init(num_cpus=2, resources={"NPU": 4}, include_dashboard=False, logging_level="ERROR")
    try:
        @ray.remote(num_cpus=0)
        class Probe:
            def __init__(self, tp):
                import os

                self.before = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
                self.ids = own_devices("npu", tp, 0)

            def seen(self):
                import os

                return self.before, self.ids, os.environ.get("ASCEND_RT_VISIBLE_DEVICES")

        platform = NpuPlatform()
        pgs = create_instance_placement_groups(platform, 2, 2, cpus_per_device=0.5, timeout_s=60)
        probes = [Probe.options(**instance_actor_options(platform, pg, 2)).remote(2) for pg in pgs]
        seen = ray.get([p.seen.remote() for p in probes])
        assert [s[0] for s in seen] == [None, None]          # Ray left the variable alone
        assert sorted(tuple(s[1]) for s in seen) == [(0, 1), (2, 3)]
        assert [s[2] for s in seen] == [",".join(map(str, s[1])) for s in seen]
        for pg in pgs:
            ray.util.remove_placement_group(pg)
        bad = Probe.options(resources={"NPU": 1}).remote(2)
        with pytest.raises(ray.exceptions.RayActorError, match="Ray gave it devices .* tensor-parallel size is 2"):
            ray.get(bad.seen.remote())
    finally:
        ray.shutdown()
