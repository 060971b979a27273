"""What every device platform provides, and the lazy torch import they share.

A platform names the device type, the collective backend, the env var that limits
visible devices and the Ray resource that counts devices. Methods touch torch only
when called, so importing this package never imports torch.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

from ..errors import BackendMissingError

TORCH_HINT = "pip install torch  (CPU: pip install torch==2.13.0; NPU: the torch version torch_npu pins)"


@runtime_checkable
class Platform(Protocol):
    """The device interface the runtime uses (no other code calls torch.cuda/torch.npu)."""

    name: str
    device_type: str            # 'cpu' | 'cuda' | 'npu'
    comm_backend: str           # 'gloo' | 'nccl' | 'hccl'
    visible_devices_env: str    # '' | 'CUDA_VISIBLE_DEVICES' | 'ASCEND_RT_VISIBLE_DEVICES'
    ray_resource: Optional[str]  # None | 'GPU' | 'NPU'

    def is_available(self) -> bool: ...
    def unavailable_reason(self) -> Optional[str]: ...
    def device_count(self) -> int: ...
    def torch_device(self, index: int = 0) -> Any: ...
    def set_device(self, index: int) -> None: ...
    def synchronize(self) -> None: ...
    # ``device``'s current stream (collectives are enqueued there), and an event recorded on a stream
    # that says (``query()``) when what was enqueued before it finished: how a weight-sync receiver
    # polls a device broadcast (platforms/recv_wait.py). None on CPU, where nothing is asynchronous.
    def current_stream(self, device: Any = None) -> Any: ...
    def record_event(self, stream: Any) -> Any: ...
    def empty_cache(self) -> None: ...
    def manual_seed(self, seed: int) -> None: ...
    def ray_actor_options(self, num_devices: float) -> dict: ...
    def visible_devices_envvars(self, device_ids: list[int]) -> dict: ...
    # further vLLM engine arguments a rollout instance on this device needs, given the caller's
    # (``engine_args``) and the instance's max_model_len; raises ConfigError on ones it cannot run
    def rollout_engine_args(self, engine_args: dict, max_model_len: int) -> dict: ...


def import_torch(purpose: str = "the trainer and rollout runtime"):
    """Import torch or raise BackendMissingError with the install command."""
    try:
        import torch
    except ImportError as exc:
        raise BackendMissingError("torch", TORCH_HINT, purpose) from exc
    return torch


def torch_importable() -> Optional[str]:
    """None when torch imports, else the reason it does not."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"torch is not installed ({exc}); {TORCH_HINT}"
    return None
