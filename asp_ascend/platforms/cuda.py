"""CUDA platform: nccl collectives, CUDA_VISIBLE_DEVICES, Ray resource GPU."""
from __future__ import annotations

from typing import Optional

from .base import import_torch, torch_importable


class CudaPlatform:
    name = "cuda"
    device_type = "cuda"
    comm_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource: Optional[str] = "GPU"

    def rollout_engine_args(self, engine_args: dict, max_model_len: int) -> dict:
        """No further vLLM engine arguments: this device's generators take offsets, so vLLM's rewind of a
        seeded request's generator after a partial prefill works (chunked prefill as vLLM sets it)."""
        return {}

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> Optional[str]:
        missing = torch_importable()
        if missing:
            return missing
        import torch

        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a build without CUDA; install a CUDA build of torch"
        if not torch.cuda.is_available():
            return "torch has CUDA support but sees no GPU (driver missing or CUDA_VISIBLE_DEVICES empty?)"
        return None

    def device_count(self) -> int:
        torch = import_torch()
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def torch_device(self, index: int = 0):
        return import_torch().device("cuda", index)

    def set_device(self, index: int) -> None:
        import_torch().cuda.set_device(index)

    def synchronize(self) -> None:
        import_torch().cuda.synchronize()

    def current_stream(self, device=None):
        return import_torch().cuda.current_stream(device)

    def record_event(self, stream):
        """A ``torch.cuda.Event`` recorded on ``stream`` (``query()`` is True once it has run)."""
        event = import_torch().cuda.Event()
        event.record(stream)
        return event

    def empty_cache(self) -> None:
        import_torch().cuda.empty_cache()

    def manual_seed(self, seed: int) -> None:
        torch = import_torch()
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)

    def ray_actor_options(self, num_devices: float) -> dict:
        return {"num_gpus": num_devices}

    def visible_devices_envvars(self, device_ids: list[int]) -> dict:
        return {self.visible_devices_env: ",".join(str(i) for i in device_ids)}

    def device_name(self, index: int = 0) -> str:
        return import_torch().cuda.get_device_name(index)

    def __repr__(self) -> str:
        return "CudaPlatform()"
