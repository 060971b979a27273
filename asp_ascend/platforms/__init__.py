"""Device platforms: npu | cuda | cpu.

The only package that touches ``torch.cuda`` / ``torch.npu`` (CI greps for it).
``get_platform("auto")`` picks NPU when torch_npu sees a device, else CUDA, else CPU.
Nothing here imports torch at module import.
"""
from __future__ import annotations

from ..errors import BackendMissingError, ConfigError
from .base import Platform
from .cpu import CpuPlatform
from .cuda import CudaPlatform
from .npu import NpuPlatform

PLATFORMS = {"cpu": CpuPlatform, "cuda": CudaPlatform, "npu": NpuPlatform}

__all__ = ["Platform", "CpuPlatform", "CudaPlatform", "NpuPlatform", "PLATFORMS", "get_platform",
           "bind_visible_devices"]


def get_platform(name: str = "auto", *, check: bool = True) -> Platform:
    """The platform called ``name`` (auto|cpu|cuda|npu).

    ``auto`` tries npu, then cuda, then cpu and never fails. An explicit name with
    ``check=True`` raises when that platform cannot be used: BackendMissingError when
    torch/torch_npu are not installed, ConfigError (key ``platform``) when no device is seen.
    """
    if name == "auto":
        for cls in (NpuPlatform, CudaPlatform):
            p = cls()
            if p.is_available():
                return p
        return CpuPlatform()
    if name not in PLATFORMS:
        raise ConfigError([f"platform: unknown value {name!r}; choose one of auto, {', '.join(PLATFORMS)}"])
    p = PLATFORMS[name]()
    if check:
        reason = p.unavailable_reason()
        if reason is not None:
            if "not installed" in reason:
                raise BackendMissingError(*_missing_module(name, reason))
            raise ConfigError([f"platform: {name!r} is not usable here: {reason}; "
                               f"set platform=auto or platform=cpu, or fix the install"])
    return p


def bind_visible_devices(platform: Platform) -> list[int]:
    """Inside a Ray actor: set the platform's visible-devices variable to Ray's accelerator ids.

    Needed when Ray is told not to set it (MindSpeed-RL's runtime env sets
    ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES``). Call before importing torch_npu/vllm.
    Returns the ids (empty on CPU or outside an actor holding devices).
    """
    import os

    import ray

    if platform.ray_resource is None:
        return []
    ids = [int(i) for i in ray.get_runtime_context().get_accelerator_ids().get(platform.ray_resource, [])]
    if ids:
        os.environ.update(platform.visible_devices_envvars(ids))
    return ids


def _missing_module(name: str, reason: str) -> tuple[str, str, str]:
    if "torch_npu" in reason:
        from .npu import TORCH_NPU_HINT

        return "torch_npu", TORCH_NPU_HINT, f"platform={name}"
    from .base import TORCH_HINT

    return "torch", TORCH_HINT, f"platform={name}"
