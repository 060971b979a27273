"""How the orchestrator pushes a published policy version to the rollout instances.

``object_store`` (the CPU default): ``trainer.publish(v)`` puts the serialized weights in the
Ray object store once; every instance's ``update_weights(ticket)`` fetches them.

``broadcast`` (the default on CUDA and NPU; works on CPU over gloo): ``publish(v, "broadcast")``
returns only the bucket layout; then every member instance calls ``update_weights(ticket,
group)`` (its vLLM workers join the group and wait) and the trainer's ``send_weights(v, group)``
broadcasts the buckets (NCCL / HCCL / gloo, platforms/transport.py). The group is the trainer
(rank 0) and every vLLM worker of every member instance (``tp`` ranks per instance). It is
built once and reused; when the set of member instances changes (a failure, a restart) or a
broadcast failed, the next sync builds a new one (a new *generation*: with
``weight_sync.master_port: 0`` on a port the trainer's node reports free, else on the next of
``PORTS`` ports from the configured one).
"""
from __future__ import annotations

from typing import Any

PORTS = 50  # generations cycle through base_port .. base_port + PORTS - 1


class WeightSync:
    def __init__(self, trainer, instances: list, transport: str, platform: str, tp: int = 1,
                 base_port: int = 0, timeout_s: float = 120.0):
        if transport not in ("object_store", "broadcast"):
            raise ValueError(f"weight_sync.transport: {transport!r} is not object_store or broadcast")
        self.trainer, self.instances = trainer, instances
        self.transport, self.platform, self.tp, self.base_port = transport, platform, int(tp), int(base_port)
        self.timeout_s = float(timeout_s)
        self._port = 0
        self.gen = -1
        self.members: tuple[int, ...] | None = None
        self._host: str | None = None

    @property
    def broadcast(self) -> bool:
        return self.transport == "broadcast"

    def _group(self, members: list[int]) -> dict:
        import ray

        if self._host is None:
            self._host = ray.get(self.trainer.node_ip.remote())
        if tuple(members) != self.members:
            self.gen += 1
            self.members = tuple(members)
            # base_port 0: a port free on the trainer's node now (runs sharing a node never collide)
            self._port = (self.base_port + self.gen % PORTS if self.base_port
                          else ray.get(self.trainer.free_port.remote()))
        return {"gen": self.gen, "host": self._host, "port": self._port, "world": 1 + self.tp * len(members),
                "platform": self.platform, "timeout_s": self.timeout_s}

    def regroup(self) -> None:
        """The next push builds a new group even if the members are the same (after a failure)."""
        self.members = None

    def start(self, version: int, members: list[int]) -> dict[str, Any]:
        """Publish ``version`` and start pushing it to ``members``: ``{"ticket", "refs", "send"}``
        (``refs``: instance -> update ref; ``send``: the trainer's broadcast ref, or None)."""
        ticket = self.trainer.publish.remote(version, self.transport)
        return {"ticket": ticket, **self.push(version, ticket, members)}

    def push(self, version: int, ticket, members: list[int]) -> dict[str, Any]:
        """(Re)send a published ``version`` to ``members`` (a retry after a failed broadcast
        reuses the ticket: the trainer still holds the weights of ``version``)."""
        if not self.broadcast:
            return {"refs": {r: self.instances[r].update_weights.remote(ticket) for r in members}, "send": None}
        if not members:
            return {"refs": {}, "send": None}
        group = self._group(list(members))
        refs = {r: self.instances[r].update_weights.remote(ticket, {**group, "rank": 1 + j * self.tp})
                for j, r in enumerate(members)}
        return {"refs": refs, "send": self.trainer.send_weights.remote(version, group)}

    def catch_up_ticket(self, version: int):
        """An object-store ticket of ``version`` for one restarted instance (the trainer must
        still hold exactly the weights of ``version``)."""
        return self.trainer.publish.remote(version, "object_store")
