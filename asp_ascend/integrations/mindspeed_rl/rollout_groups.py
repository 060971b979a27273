"""Rollout instances as separate Ray actors on their own devices (placement groups).

MindSpeed-RL's ``RayActorGroup`` places the trainer; rollout instances get their own
placement group each: one bundle ``{NPU: devices_per_instance, CPU: c x devices}`` with
``STRICT_PACK`` (an instance never spans nodes: :func:`check_instances_fit_nodes` refuses a
``generate_config.infer_tensor_parallel_size`` larger than a node before anything is placed).
Ray counts NPUs as the custom resource ``NPU`` (``ray start --resources='{"NPU": 16}'``).

How an instance owns exactly its devices:

- The instance actor claims the whole bundle (all ``devices_per_instance`` NPUs). MindSpeed-RL's
  runtime env sets ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES``, so Ray does not narrow
  ``ASCEND_RT_VISIBLE_DEVICES``: the actor does it itself, first thing in its constructor and
  before vLLM or torch_npu are imported (:func:`instance_actor_class`, through
  :func:`asp_ascend.platforms.bind_visible_devices`), and refuses to start when Ray gave it another
  number of devices than its tensor-parallel size. Without this every instance of a node would run
  on npu:0..tp-1.
- vLLM runs its multiprocessing executor (``distributed_executor_backend="mp"``,
  :func:`instance_engine_args`): its TP workers are child processes that inherit the narrowed
  variable, so worker j uses the instance's j-th device. Left unset, vLLM picks its Ray executor
  whenever it finds itself in a placement group, and that executor wants one bundle per device; the
  placement group is therefore also not captured by the actor's children.
- The engine starts on dummy weights (``load_format="dummy"``): the first weight push (the
  trainer's current version, before any prompt is admitted) brings the real ones, loaded by
  MindSpeed-RL's loaders that the receiver installs before the model is built (:mod:`.vllm_receiver`).
"""
from __future__ import annotations

import os
from typing import Any

from ...errors import ConfigError
from ...platforms import Platform, bind_visible_devices

TP_KEY = "generate_config.infer_tensor_parallel_size"


def instance_engine_args() -> dict:
    """vLLM engine arguments of an NPU instance: multiprocessing executor, dummy weights."""
    return {"distributed_executor_backend": "mp", "load_format": "dummy"}


def instance_env(loaders_path: str) -> dict:
    """Environment of an instance actor (inherited by its vLLM worker processes): where the receiver
    finds MindSpeed-RL's weight loaders to install before the model is built."""
    from .vllm_receiver import LOADERS_ENV

    return {LOADERS_ENV: str(loaders_path)}


def check_instances_fit_nodes(node_resources: list[dict], platform: Platform, devices_per_instance: int) -> None:
    """An instance's devices must sit on one node (its TP group talks over HCCL inside the node)."""
    if platform.ray_resource is None:
        return
    per_node = [int(n.get(platform.ray_resource, 0)) for n in node_resources]
    biggest = max(per_node, default=0)
    if devices_per_instance > biggest:
        raise ConfigError([f"{TP_KEY}: {devices_per_instance} {platform.ray_resource}s per rollout instance, but the "
                           f"largest node has {biggest}; an instance cannot span nodes. Use at most {biggest} "
                           f"(the instance count, asp.rollout.num_instances, spreads instances over nodes)"])


def own_devices(platform_name: str, tensor_parallel_size: int, instance: object = "?") -> list[int]:
    """Inside an instance actor, before vLLM is imported: narrow the visible-devices variable to the
    devices Ray gave this actor, and refuse another count than the tensor-parallel size."""
    from ...platforms import get_platform

    ids = bind_visible_devices(get_platform(platform_name, check=False))
    if platform_name != "cpu" and len(ids) != int(tensor_parallel_size):
        raise RuntimeError(f"rollout instance {instance}: Ray gave it devices {ids}, its tensor-parallel size is "
                           f"{tensor_parallel_size}; it must own exactly that many")
    return ids


def instance_actor_class():
    """The runtime's rollout actor, narrowed to its own devices before vLLM starts (see the module doc)."""
    import ray

    from ...engines.rollout import RolloutEngine
    from ...platforms import get_platform

    class InstanceEngine(RolloutEngine):
        def __init__(self, model_dir: str, *, platform: str = "npu", tensor_parallel_size: int = 1, **kw):
            self.devices = own_devices(platform, tensor_parallel_size, kw.get("instance", "?"))
            super().__init__(model_dir, platform=platform, tensor_parallel_size=tensor_parallel_size, **kw)

        def visible_devices(self) -> dict:
            """(ids Ray gave this actor, the visible-devices variable its vLLM workers inherit)."""
            var = get_platform(self.platform, check=False).visible_devices_env
            return {"ids": list(self.devices), var: os.environ.get(var, "") if var else ""}

    InstanceEngine.__name__ = InstanceEngine.__qualname__ = "InstanceEngine"
    return ray.remote(max_concurrency=4)(InstanceEngine)


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
        placement_group=pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=False)}
    opts.update(platform.ray_actor_options(devices_per_instance))
    if env:
        opts["runtime_env"] = {"env_vars": dict(env)}
    return opts
