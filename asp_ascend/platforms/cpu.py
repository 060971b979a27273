"""CPU platform: gloo collectives, no device env var, no Ray device resource."""
from __future__ import annotations

from typing import Optional

from .base import import_torch, torch_importable


class CpuPlatform:
    name = "cpu"
    device_type = "cpu"
    comm_backend = "gloo"
    visible_devices_env = ""
    ray_resource: Optional[str] = None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> Optional[str]:
        return torch_importable()

    def device_count(self) -> int:
        """One logical device: the host (use CPU pinning to emulate several)."""
        return 1

    def torch_device(self, index: int = 0):
        return import_torch().device("cpu")

    def set_device(self, index: int) -> None:
        """Nothing to bind on CPU."""

    def synchronize(self) -> None:
        """CPU ops are synchronous."""

    def empty_cache(self) -> None:
        """No device cache on CPU."""

    def manual_seed(self, seed: int) -> None:
        import_torch().manual_seed(seed)

    def ray_actor_options(self, num_devices: float) -> dict:
        """CPU actors reserve CPUs through num_cpus; no device resource."""
        return {}

    def visible_devices_envvars(self, device_ids: list[int]) -> dict:
        return {}

    def __repr__(self) -> str:
        return "CpuPlatform()"
