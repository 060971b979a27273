"""Ascend NPU platform: torch_npu, hccl collectives, ASCEND_RT_VISIBLE_DEVICES, Ray resource NPU.

Ray has no built-in NPU resource in the MindSpeed-RL launch convention: every node runs
``ray start --resources='{"NPU": N}'`` and actors ask for ``resources={"NPU": k}``.
"""
from __future__ import annotations

from typing import Optional

from ..errors import BackendMissingError
from .base import import_torch, torch_importable

TORCH_NPU_HINT = ("pip install torch_npu==<the version matching your torch and CANN> "
                  "and source the CANN environment (/usr/local/Ascend/cann/set_env.sh; older CANN: "
                  "ascend-toolkit/set_env.sh), see docs/ascend.md")


def _torch_npu():
    """torch with the npu device registered (importing torch_npu registers it)."""
    torch = import_torch("the Ascend NPU backend")
    try:
        import torch_npu  # noqa: F401
    except ImportError as exc:
        raise BackendMissingError("torch_npu", TORCH_NPU_HINT, "the Ascend NPU backend") from exc
    return torch


class NpuPlatform:
    name = "npu"
    device_type = "npu"
    comm_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource: Optional[str] = "NPU"

    def rollout_engine_args(self, engine_args: dict, max_model_len: int) -> dict:
        """No further vLLM engine arguments: chunked prefill as vllm-ascend sets it. Not checked on an
        NPU: whether vllm-ascend's runner rewinds a seeded request's generator after a partial
        prefill, and whether torch_npu's generator takes the offset (the CPU one does not:
        :meth:`CpuPlatform.rollout_engine_args`, docs/runtime.md)."""
        return {}

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> Optional[str]:
        missing = torch_importable()
        if missing:
            return missing
        try:
            torch = _torch_npu()
        except BackendMissingError as exc:
            return str(exc)
        except Exception as exc:  # torch_npu raises RuntimeError/OSError when CANN is absent
            return f"torch_npu failed to import: {type(exc).__name__}: {exc} (is the CANN toolkit sourced?)"
        if not hasattr(torch, "npu"):
            return "torch_npu imported but registered no torch.npu (a broken or mismatched torch_npu install)"
        if not torch.npu.is_available():
            return "torch_npu is installed but sees no NPU (driver missing or ASCEND_RT_VISIBLE_DEVICES empty?)"
        return None

    def device_count(self) -> int:
        torch = _torch_npu()
        return torch.npu.device_count() if torch.npu.is_available() else 0

    def torch_device(self, index: int = 0):
        return _torch_npu().device(f"npu:{index}")

    def set_device(self, index: int) -> None:
        _torch_npu().npu.set_device(index)

    def synchronize(self) -> None:
        _torch_npu().npu.synchronize()

    def current_stream(self, device=None):
        return _torch_npu().npu.current_stream(device)

    def record_event(self, stream):
        """A ``torch.npu.Event`` recorded on ``stream`` (``query()`` is True once it has run). Never
        ran here (no NPU)."""
        event = _torch_npu().npu.Event()
        event.record(stream)
        return event

    def empty_cache(self) -> None:
        _torch_npu().npu.empty_cache()

    def manual_seed(self, seed: int) -> None:
        torch = _torch_npu()
        torch.manual_seed(seed)
        torch.npu.manual_seed_all(seed)

    def ray_actor_options(self, num_devices: float) -> dict:
        return {"resources": {"NPU": num_devices}}

    def visible_devices_envvars(self, device_ids: list[int]) -> dict:
        return {self.visible_devices_env: ",".join(str(i) for i in device_ids)}

    def device_name(self, index: int = 0) -> str:
        return _torch_npu().npu.get_device_name(index)

    def __repr__(self) -> str:
        return "NpuPlatform()"
