"""verl's ``GlobalRequestLoadBalancer`` routing prompt groups to their schedule instance.

verl 0.9.1 builds its rollout load balancer with ``verl.workers.rollout.router.get_router_handle``:
when ``actor_rollout_ref.rollout.router_config_path`` names a YAML file, the class its
``router_class`` names is created as a Ray actor with ``(servers, yaml_dict)`` (servers in replica
order). :class:`AspLoadBalancer` is that class: verl's balancer (its in-flight counts, sticky
request ids, add/remove of hybrid replicas, ``clear_sticky_cache``) whose ``acquire_server`` sends a
request carrying an ASP priority (:mod:`.routing`) to the group's planned server -- schedule
instance j is the j-th server of the starting pool -- and every other request to verl's own choice.
:func:`install` writes the YAML and sets the key. This module imports verl (verl imports it by the
YAML's ``router_class``).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional

from . import import_verl
from .routing import choose_server, decode_instance

_router = import_verl("verl.workers.rollout.router", "the ASP rollout load balancer")
ROUTER_CLASS = "asp_ascend.integrations.verl.router.AspLoadBalancer"
ROUTER_KEY = "actor_rollout_ref.rollout.router_config_path"


class AspLoadBalancer(_router.GlobalRequestLoadBalancer):
    """verl's load balancer with guided dispatch (the module doc); config keys (the YAML):
    ``num_instances`` (the schedule's R), ``max_num_seqs`` (a server's concurrency, the ``cap``),
    ``dispatch`` (guided | static)."""

    def __init__(self, servers: dict[str, Any], config: Optional[dict] = None):
        super().__init__(servers=servers, max_cache_size=_router.DEFAULT_ROUTING_CACHE_SIZE)
        config = dict(config or {})
        self.num_instances = int(config.get("num_instances", len(servers) or 1))
        self.cap = int(config.get("max_num_seqs", 256))
        self.dispatch = str(config.get("dispatch", "guided"))
        if self.dispatch not in ("guided", "static"):
            raise ValueError(f"{ROUTER_KEY} file: dispatch={self.dispatch!r}; choose guided or static")
        self.instances = list(servers)      # schedule instance j -> the j-th server of the starting pool
        self.groups = _router.LRUCache(maxsize=_router.DEFAULT_ROUTING_CACHE_SIZE)  # priority (a group) -> server
        self.routed: Counter = Counter()    # (planned instance, server) -> groups

    def require_acquire_fields(self) -> list[str]:
        return ["priority"]

    def planned_server(self, instance: int) -> Optional[str]:
        if not self.instances:
            return None
        return self.instances[instance % len(self.instances)]

    def acquire_server(self, request_id: str, priority: int = 0, **extra: Any) -> tuple[str, Any]:
        instance = decode_instance(priority, self.num_instances)
        if instance is None:                                  # verl's own requests (validation, no plan)
            return super().acquire_server(request_id)
        key = int(priority)
        server = self.groups.get(key)
        if server not in self._inflight_requests:             # a new group (or its server left the pool)
            server = choose_server(self.planned_server(instance), self._inflight_requests, self.cap, self.dispatch)
            self.groups[key] = server
            self.routed[(instance, server)] += 1
        self._request_id_to_server[request_id] = server
        self._inflight_requests[server] += 1
        return server, self._servers[server]

    def get_status(self) -> dict:
        status = super().get_status()
        moved = sum(n for (i, s), n in self.routed.items() if s != self.planned_server(i))
        status["asp"] = {"groups": sum(self.routed.values()), "moved": moved, "dispatch": self.dispatch,
                         "routed": {f"{i}->{s}": n for (i, s), n in sorted(self.routed.items())}}
        return status

    def clear_sticky_cache(self) -> dict:
        """verl's rebalance (it aborts every request, then resumes them): groups are chosen again."""
        self.groups.clear()
        return super().clear_sticky_cache()


def router_settings(cfg) -> dict:
    """The YAML verl's ``get_router_handle`` reads, from our config."""
    return {"router_class": ROUTER_CLASS, "num_instances": int(cfg.rollout.num_instances),
            "max_num_seqs": int(cfg.rollout.max_num_seqs), "dispatch": str(cfg.scheduler.dispatch)}


def install(config, cfg, directory: str | Path) -> Path:
    """Write ``directory/router.yaml`` and point verl's ``router_config_path`` at it (``config`` is
    verl's DictConfig, changed in place)."""
    from omegaconf import OmegaConf, open_dict

    from ...io import write_text_atomic

    path = Path(directory).resolve() / "router.yaml"
    write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(router_settings(cfg))))
    with open_dict(config):
        config.actor_rollout_ref.rollout.router_config_path = str(path)
    return path
