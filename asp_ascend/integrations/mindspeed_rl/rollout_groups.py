"""Rollout instances as separate Ray actor groups on their own devices (placement groups).

MindSpeed-RL's ``RayActorGroup`` places the trainer; rollout instances get their own
placement group each: one bundle ``{NPU: devices_per_instance, CPU: c x devices}`` with
``STRICT_PACK`` (an instance never spans nodes, its TP group stays on one node).
Ray counts NPUs as the custom resource ``NPU`` (``ray start --resources='{"NPU": 16}'``);
MindSpeed-RL's runtime env sets ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES``, so
an instance actor binds its devices itself with
:func:`asp_ascend.platforms.bind_visible_devices` before it imports torch_npu or vllm.
"""
from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...platforms import Platform, bind_visible_devices  # noqa: F401 (re-exported)


def instance_bundles(platform: Platform, devices_per_instance: int, cpus_per_device: float = 4.0) -> list[dict]:
    """One bundle holding all of an instance's devices: its actor claims them all, so Ray's
    accelerator ids name every device the instance's vLLM workers use."""
    if devices_per_instance < 1:
        raise ConfigError([f"rollout.devices_per_instance: {devices_per_instance} must be >= 1"])
    bundle: dict = {"CPU": cpus_per_device * devices_per_instance}
    if platform.ray_resource is not None:
        bundle[platform.ray_resource] = devices_per_instance
    return [bundle]


def check_capacity(cluster_resources: dict, platform: Platform, num_instances: int, devices_per_instance: int,
                   trainer_devices: int) -> None:
    """Refuse a layout the cluster cannot hold, naming the keys to change."""
    if platform.ray_resource is None:
        return
    have = int(cluster_resources.get(platform.ray_resource, 0))
    need = num_instances * devices_per_instance + trainer_devices
    if need > have:
        raise ConfigError([f"rollout.num_instances x rollout.devices_per_instance + trainer devices = "
                           f"{num_instances} x {devices_per_instance} + {trainer_devices} = {need} "
                           f"{platform.ray_resource}s, but the Ray cluster has {have}; lower asp.rollout.num_instances "
                           f"or rl_config.actor_resource.num_npus, or start more nodes"])


def create_instance_placement_groups(platform: Platform, num_instances: int, devices_per_instance: int,
                                     cpus_per_device: float = 4.0, timeout_s: float = 600.0) -> list[Any]:
    """One STRICT_PACK placement group per instance, all ready (raises on timeout)."""
    import ray
    from ray.util.placement_group import placement_group

    pgs = [placement_group(instance_bundles(platform, devices_per_instance, cpus_per_device), strategy="STRICT_PACK",
                           name=f"asp_rollout_{i}") for i in range(num_instances)]
    ready, pending = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
    if pending:
        raise RuntimeError(f"{len(pending)} of {num_instances} rollout placement groups were not placed within "
                           f"{timeout_s:.0f} s; check `ray status` for free {platform.ray_resource or 'CPU'}s")
    return pgs


def instance_actor_options(platform: Platform, pg, devices_per_instance: int, env: dict | None = None) -> dict:
    """Ray ``.options(...)`` for an instance's driver actor: whole placement group, its devices."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    opts: dict[str, Any] = {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)}
    opts.update(platform.ray_actor_options(devices_per_instance))
    if env:
        opts["runtime_env"] = {"env_vars": dict(env)}
    return opts
