"""How the orchestrator pushes a published policy version to the rollout instances.

``object_store`` (the CPU default): ``trainer.publish(v)`` puts the serialized weights in the
Ray object store once; every instance's ``update_weights(ticket)`` fetches them.

``broadcast`` (the default on CUDA and NPU; works on CPU over gloo): ``publish(v, "broadcast")``
returns only the bucket layout; then every member instance calls ``update_weights(ticket,
group)`` (its vLLM workers join the group and wait) and the trainer's ``send_weights(v, group)``
broadcasts the buckets (NCCL / HCCL / gloo, platforms/transport.py). The group is the trainer
(rank 0) and every vLLM worker of every member instance (``tp`` ranks per instance). It is
built once and reused; when the set of member instances changes (a failure, a restart) or a
broadcast failed, the next sync builds a new one (a new *generation*). The trainer starts each
generation's rendezvous store first (``open_group``) and reports the port it listens on; only then
are the instances told that port, so no other process can take it in between. With
``weight_sync.master_port: 0`` the OS picks the port; else it is the next of ``PORTS`` ports from
the configured one, and a taken port stops the run with an error naming that key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..platforms.recv_wait import STALL_S

PORTS = 50  # generations cycle through base_port .. base_port + PORTS - 1


@dataclass
class PendingSync:
    """One published version on its way to the instances."""
    version: int
    ticket: Any                      # ObjectRef of the WeightTicket
    refs: dict                       # instance -> update_weights ref, until it resolves
    send: Any = None                 # the trainer's broadcast ref (broadcast only), until it resolves
    t_start: float = 0.0
    t_end: float = 0.0
    failed: BaseException | None = None
    tries: int = 1
    synced: set = field(default_factory=set)   # instances that hold ``version``
    t_recv_done: float | None = None           # monotonic: since when no receiver of this try is pending
    t_send_done: float | None = None           # monotonic: since when the send of this try is not pending
    reported: set = field(default_factory=set)  # receivers already reported hung

    @property
    def in_flight(self) -> bool:
        return bool(self.refs) or self.send is not None

    def waiting(self) -> list:
        return list(self.refs.values()) + ([self.send] if self.send is not None else [])

    def overdue(self, ray, now: float, bound_s: float) -> tuple[float | None, list[int]]:
        """What of this try is overdue at ``now`` (``time.monotonic()``): the seconds the trainer's
        broadcast has stayed in flight since no receiver was pending any more, once past ``bound_s``
        (else None), and the receivers still pending ``bound_s`` after the broadcast ended (else []).
        The refs are only looked at, not taken (:meth:`poll` takes them)."""
        refs = {ref: r for r, ref in self.refs.items()}
        ready = set(ray.wait(list(refs), num_returns=len(refs), timeout=0)[0]) if refs else set()
        pending = [r for ref, r in refs.items() if ref not in ready]
        send_done = self.send is None or bool(ray.wait([self.send], timeout=0)[0])
        self.t_recv_done = None if pending else (self.t_recv_done or now)
        self.t_send_done = (self.t_send_done or now) if send_done else None
        late_send = None
        if not send_done and self.t_recv_done is not None and now - self.t_recv_done > bound_s:
            late_send = now - self.t_recv_done
        late = pending if pending and send_done and now - self.t_send_done > bound_s else []
        return late_send, late

    def poll(self, ray, t0: float, on_dead: Callable[[int, BaseException], None]) -> list[int]:
        """Take the parts that finished; returns the instances that now hold ``version``. A dead
        instance goes to ``on_dead``; any other error marks the sync ``failed``."""
        newly = []
        for r, ref in list(self.refs.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            del self.refs[r]
            try:
                res = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                on_dead(r, exc)
                continue
            except ray.exceptions.RayTaskError as exc:  # e.g. a broken broadcast group
                self.failed = self.failed or exc
                continue
            self.synced.add(r)
            newly.append(r)
            self.t_end = max(self.t_end, res["t_end"] - t0)
        if self.send is not None and ray.wait([self.send], timeout=0)[0]:
            try:
                ray.get(self.send)
            except ray.exceptions.RayError as exc:
                self.failed = self.failed or exc
            self.send = None
        return newly


class WeightSync:
    stall_timeout_s: float = STALL_S   # weight_sync.stall_timeout_s (set per instance; the contract names it)
    timeout_s: float = 120.0           # weight_sync.timeout_s (set per instance): a group's rendezvous
    # how the trainer's calls that form a group (node_ip, open_group) are awaited, (call, ref, version, gen,
    # members) -> their result: the loop and the warm-up set their bounded wait (pipeline/trainer_waits.py,
    # pipeline/start_waits.py); None: ray.get, unbounded
    wait_group: Callable | None = None

    def __init__(self, trainer, instances: list, transport: str, platform: str, tp: int = 1,
                 base_port: int = 0, timeout_s: float = 120.0, stall_timeout_s: float = STALL_S):
        if transport not in ("object_store", "broadcast"):
            raise ValueError(f"weight_sync.transport: {transport!r} is not object_store or broadcast")
        self.trainer, self.instances = trainer, instances
        self.transport, self.platform, self.tp, self.base_port = transport, platform, int(tp), int(base_port)
        self.timeout_s, self.stall_timeout_s = float(timeout_s), float(stall_timeout_s)
        self._port = 0
        self.gen = -1
        self.members: tuple[int, ...] | None = None
        self._host: str | None = None

    @property
    def broadcast(self) -> bool:
        return self.transport == "broadcast"

    def _group(self, members: list[int], version: int) -> dict:
        import ray

        if tuple(members) != self.members:
            self.gen += 1
            self.members = tuple(members)
            wait = self.wait_group or (lambda _call, ref, *_: ray.get(ref))
            if self._host is None:   # once, before the run's first group
                self._host = wait("node_ip", self.trainer.node_ip.remote(), version, self.gen, list(members))
            # the trainer's store listens before anyone joins; base_port 0: on a port the OS picks
            want = self.base_port + self.gen % PORTS if self.base_port else 0
            ref = self.trainer.open_group.remote(self.gen, self._world(members), want, self.timeout_s)
            self._port = int(wait("open_group", ref, version, self.gen, list(members)))
        return {"gen": self.gen, "host": self._host, "port": self._port, "world": self._world(members),
                "platform": self.platform, "timeout_s": self.timeout_s, "stall_timeout_s": self.stall_timeout_s}

    def _world(self, members) -> int:
        return 1 + self.tp * len(members)

    def regroup(self) -> None:
        """The next push builds a new group even if the members are the same (after a failure)."""
        self.members = None

    def publish(self, version: int, t_start: float = 0.0) -> PendingSync:
        """The trainer's ``publish`` of ``version``, sent (not waited for): its sync, pushed to no one yet
        (``s.ticket`` is the call's reference)."""
        return PendingSync(version, self.trainer.publish.remote(version, self.transport), {}, t_start=t_start,
                           t_end=t_start)

    def start(self, version: int, members: list[int], t_start: float = 0.0) -> PendingSync:
        """Publish ``version`` and start pushing it to ``members``."""
        s = self.publish(version, t_start)
        self.push(s, members)
        return s

    def push(self, s: PendingSync, members: list[int]) -> None:
        """(Re)send ``s.version`` to ``members`` (a retry after a failed broadcast reuses the
        ticket: the trainer still holds the weights of that version)."""
        if not self.broadcast:
            s.refs.update({r: self.instances[r].update_weights.remote(s.ticket) for r in members})
            return
        if not members:
            return
        group = self._group(list(members), s.version)
        s.refs.update({r: self.instances[r].update_weights.remote(s.ticket, {**group, "rank": 1 + j * self.tp})
                       for j, r in enumerate(members)})
        s.send = self.trainer.send_weights.remote(s.version, group)

    def catch_up_ticket(self, version: int):
        """An object-store ticket of ``version`` for one restarted instance (the trainer must
        still hold exactly the weights of ``version``)."""
        return self.trainer.publish.remote(version, "object_store")
