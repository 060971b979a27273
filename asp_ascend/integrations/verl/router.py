"""verl's ``GlobalRequestLoadBalancer`` with DESIGN 9a's guided dispatch.

verl 0.9.1 builds its rollout load balancer with ``verl.workers.rollout.router.get_router_handle``:
when ``actor_rollout_ref.rollout.router_config_path`` names a YAML file, the class its
``router_class`` names is created as a Ray actor with ``(servers, yaml_dict)`` (servers in replica
order). :class:`AspLoadBalancer` is that class: verl's balancer (its in-flight counts, sticky
request ids, add/remove of servers, ``clear_sticky_cache``) whose ``acquire_server`` hands a request
carrying an ASP priority (:mod:`.routing`) to :class:`.routing.GuidedRoutes` -- the runtime's
``Feeder``/``Dispatcher``/``GroupEstimator`` -- and every other request to verl's own choice. A new
group's requests wait in the balancer (an ``async`` method: Ray runs the class as an async actor)
until an instance admits the group; :data:`AspLoadBalancerActor`, the class the YAML names, is
created with a concurrency limit above any number of waiting requests, so ``release_server`` is
never queued behind them. :func:`install` writes the YAML and sets the key. This module imports
verl (verl imports it by the YAML's ``router_class``).
"""
from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from . import import_verl
from .routing import GuidedRoutes, decode_priority

_router = import_verl("verl.workers.rollout.router", "the ASP rollout load balancer")
ROUTER_CLASS = "asp_ascend.integrations.verl.router.AspLoadBalancerActor"
ROUTER_KEY = "actor_rollout_ref.rollout.router_config_path"
MAX_CONCURRENCY = 1 << 20      # waiting acquire_server calls + releases the actor may hold at once


class _Group:
    __slots__ = ("server", "admitted", "inflight", "returned", "done")

    def __init__(self):
        self.server: Optional[str] = None
        self.admitted = asyncio.Event()
        self.inflight = 0           # its requests now on a server
        self.returned = 0           # its requests released so far (finished or aborted)
        self.done = False


class AspLoadBalancer(_router.GlobalRequestLoadBalancer):
    """verl's load balancer with guided dispatch (the module doc); config keys (the YAML):
    ``num_instances`` (the schedule's R), ``group_slots`` (groups in flight per instance),
    ``group_size`` (requests per group, ``rollout.n``), ``max_response_length``, ``dispatch``
    (guided | static)."""

    def __init__(self, servers: dict[str, Any], config: Optional[dict] = None):
        super().__init__(servers=servers, max_cache_size=_router.DEFAULT_ROUTING_CACHE_SIZE)
        config = dict(config or {})
        self.num_instances = int(config.get("num_instances", len(servers) or 1))
        self.group_size = int(config.get("group_size", 1))
        self.dispatch = str(config.get("dispatch", "guided"))
        if self.dispatch not in ("guided", "static"):
            raise ValueError(f"{ROUTER_KEY} file: dispatch={self.dispatch!r}; choose guided or static")
        self.routes = GuidedRoutes(self.num_instances, int(config.get("group_slots", 1)), self.group_size,
                                   dispatch=self.dispatch, max_length=config.get("max_response_length"))
        # schedule instance r -> the r-th server of the starting pool; servers beyond R are outside
        # the plan (verl's own requests only)
        self.instances: list[Optional[str]] = list(servers)[: self.num_instances]
        self.instances += [None] * (self.num_instances - len(self.instances))
        self.asp_groups = _router.LRUCache(maxsize=_router.DEFAULT_ROUTING_CACHE_SIZE)       # priority -> _Group
        self.asp_requests = _router.LRUCache(maxsize=_router.DEFAULT_ROUTING_CACHE_SIZE)     # request id -> priority
        self.routed: Counter = Counter()    # (planned instance, instance that ran it) -> groups
        for r, server in enumerate(self.instances):
            if server is None:
                self.routes.server_gone(r)

    def require_acquire_fields(self) -> list[str]:
        return ["priority"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def planned_server(self, instance: int) -> Optional[str]:
        return self.instances[instance % self.num_instances]

    async def acquire_server(self, request_id: str, priority: int = 0, **extra: Any) -> tuple[str, Any]:
        route = decode_priority(priority, self.num_instances)
        if route is None:                                     # verl's own requests (validation, no plan)
            return super().acquire_server(request_id)
        key = int(priority)
        group = self.asp_groups.get(key)
        if group is None:                                     # a new group: it waits until admitted
            group = self.asp_groups[key] = _Group()
            self._admitted(self.routes.arrive(key, route), planned={key: route.instance})
        while group.server not in self._inflight_requests:    # not admitted yet, or its server left
            group.admitted.clear()
            await group.admitted.wait()
        server = group.server
        group.inflight += 1
        self.asp_requests[request_id] = key
        self._request_id_to_server[request_id] = server
        self._inflight_requests[server] += 1
        return server, self._servers[server]

    def release_server(self, server_id: str, request_id: Optional[str] = None) -> None:
        super().release_server(server_id, request_id)
        key = self.asp_requests.get(request_id) if request_id is not None else None
        group = self.asp_groups.get(key) if key is not None else None
        if group is None or group.done:
            return
        group.inflight -= 1
        group.returned += 1
        if group.inflight <= 0 and group.returned >= self.group_size:   # every sample came back
            group.done = True
            self._admitted(self.routes.finished(key))

    def report_lengths(self, priority: int, lengths: list[int]) -> None:
        """A finished group's response lengths (the fully async rollouter sends them; the sync and
        one-step-off trainers through :meth:`report_groups`): the estimator
        learns its spread and prediction bias from them (the re-estimated remaining work of the
        groups still running)."""
        route = decode_priority(priority, self.num_instances)
        if route is None or len(lengths) < 2:
            return
        est = self.routes.estimator
        key = ("reported", int(priority))
        est.on_admit(key, max(1, route.predicted_length))
        for n in lengths[: est.G]:
            est.on_sample_finish(key, int(n))
        est.on_group_finish(key)

    def report_groups(self, reports: list) -> None:
        """``[(priority, lengths), ...]``: the groups of a batch the sync or one-step-off trainer trained
        (``AspTrainer.asp_report``), each as :meth:`report_lengths`."""
        for priority, lengths in reports:
            self.report_lengths(priority, list(lengths))

    def _admitted(self, admissions, planned: Optional[dict] = None) -> None:
        for key, r in admissions:
            group = self.asp_groups.get(key)
            if group is None:
                continue
            group.server = self.instances[r]
            route = decode_priority(key, self.num_instances)
            self.routed[(route.instance, r)] += 1
            group.admitted.set()

    def add_servers(self, servers: dict[str, Any]) -> None:
        super().add_servers(servers)
        for sid in servers:
            if sid in self.instances:                         # a schedule instance's server came back
                self._admitted(self.routes.server_added(self.instances.index(sid)))

    def remove_servers(self, server_ids: list[str]) -> None:
        super().remove_servers(server_ids)
        for sid in server_ids:
            if sid in self.instances:
                r = self.instances.index(sid)
                for key, group in list(self.asp_groups.items()):
                    if group.server == sid and not group.done:
                        group.server = None
                        group.admitted.clear()
                self._admitted(self.routes.server_gone(r))

    def get_status(self) -> dict:
        status = super().get_status()
        moved = sum(n for (i, r), n in self.routed.items() if i != r)
        status["asp"] = {"groups": sum(self.routed.values()), "moved": moved, "dispatch": self.dispatch,
                         "waiting": self.routes.waiting(),
                         "routed": {f"{i}->{r}": n for (i, r), n in sorted(self.routed.items())},
                         "steals": self.routes.steals}
        return status


AspLoadBalancerActor = _router.ray.remote(max_concurrency=MAX_CONCURRENCY)(AspLoadBalancer)


def router_settings(cfg) -> dict:
    """The YAML verl's ``get_router_handle`` reads, from our config."""
    from ...scheduler.execution import ExecutionSettings

    return {"router_class": ROUTER_CLASS, "num_instances": int(cfg.rollout.num_instances),
            "group_slots": ExecutionSettings.from_config(cfg).group_slots, "group_size": int(cfg.train.group_size),
            "max_response_length": int(cfg.lengths.max_response_length), "dispatch": str(cfg.scheduler.dispatch)}


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
