"""Trainer -> rollout-instance weight push, per inference-TP rank, over a bucketed broadcast.

Communicator j spans the trainer rank holding inference-TP shard j in the first inference
data-parallel group (rank 0, it hosts the store at its node IP) and TP rank j of every
instance (rank 1 + r). :class:`PushEndpoint` is one process's end of it, created on first
use and reused for every version (formed again after a failed one); the platform decides the
library (HCCL on NPU, NCCL on CUDA, gloo on CPU), so the same code runs in the CPU test.
:func:`weight_push_fn` is the orchestration: instances start receiving, the trainer group sends,
both finish.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from ...platforms.recv_wait import STALL_S
from ...platforms.communicators import SenderEndpoint

PORT_KEY = "asp.weight_sync.master_port"
STALL_KEY = "asp.weight_sync.stall_timeout_s"   # a receiver's stall timeout, as MindSpeed-RL's YAML spells it
PORT_FIX = (f"set {PORT_KEY} to the first of a range of ports free on every sending node (communicator j "
            f"listens on {PORT_KEY} + j, one per inference-TP rank), or use the engine-free hf push, "
            f"which takes 0")


class PushEndpoint:
    """This process's end of weight-sync communicator j: the sender's (rank 0) is a
    :class:`~asp_ascend.platforms.communicators.SenderEndpoint` (it binds the configured port, listening
    before it forms the group, as every sender does), a receiver joins the sender's store. A failed
    version drops this end's communicator (the trainer's and the hf push's rule)."""

    def __init__(self, platform_name: str, device_index: int = 0):
        self.platform_name, self.device_index = platform_name, device_index
        # the sender binds the configured port itself: a taken one names the key as MindSpeed-RL's
        # YAML spells it, and the fix this push takes (0 is refused for it: sample_source)
        self._sender = SenderEndpoint(device_index, port_key=PORT_KEY, fix=PORT_FIX)
        self._comm: Optional[Any] = None   # a receiver's communicator, joined on first use

    def _transport(self, comm, bucket_bytes: int, stall_s: float = STALL_S):
        from ...platforms import get_platform
        from ...platforms.transport import BroadcastTransport

        return BroadcastTransport(comm, bucket_bytes, synchronize=get_platform(self.platform_name).synchronize,
                                  stall_s=stall_s, stall_key=STALL_KEY)

    def send(self, named: Iterable[tuple[str, Any]], version: int, host: str, port: int, world: int,
             bucket_bytes: int, stall_s: float = STALL_S) -> int:
        """Broadcast ``named`` as version ``version``; a receiver that gives up, or no receiver progressing
        for ``stall_s`` seconds (``asp.weight_sync.stall_timeout_s``), ends it with
        ``recv_wait.ReceiverFailed``. Returns how many tensors were sent."""
        named = list(named)
        # one group (generation 0): formed at the first version, kept until a version fails
        group = {"gen": 0, "host": host, "port": int(port), "world": int(world), "platform": self.platform_name}

        def broadcast(comm):
            tx = self._transport(comm, bucket_bytes, stall_s)
            tx.send(tx.prepare(version, named), named)

        self._sender.send(group, broadcast, version)   # a failed version drops the group: the next forms it again
        return len(named)

    def recv(self, buckets, version: int, host: str, port: int, rank: int, world: int,
             stall_s: float = STALL_S) -> list[tuple[str, Any]]:
        """Version ``version``'s tensors; a sender that fails, or makes no progress for ``stall_s``
        seconds (``asp.weight_sync.stall_timeout_s``), ends it with ``recv_wait.SenderFailed``."""
        from ...platforms.transport import WeightTicket
        from ...platforms.communicators import create_communicator

        if self._comm is None:
            self._comm = create_communicator(self.platform_name, host, port, rank, world, self.device_index)
        rx = self._transport(self._comm, 1, stall_s)
        try:
            return list(rx.recv(WeightTicket(version, buckets)))
        except BaseException:
            self._comm = None     # ... and every receiver joins it again at the next version
            raise


def weight_push_fn(actor_group, instances, base_port: int, bucket_bytes: int,
                   stall_timeout_s: float = STALL_S) -> Callable[[int], None]:
    """``publish_weights(version)`` for the async trainer.

    ``actor_group.execute_sync_command(name, *args)`` runs a method on every trainer rank and
    returns their results (MindSpeed-RL's ``RayActorGroup``). Trainer ranks implement
    ``asp_weight_manifest(bucket_bytes) -> (j, buckets, ip) | None`` and
    ``asp_push_weights(version, base_port, num_instances, bucket_bytes, stall_timeout_s)`` (its sender's
    ``PushEndpoint.send`` ``stall_s``); instance ``r`` implements
    ``receive_weights(manifests, version, base_port, rank=1 + r, world, stall_timeout_s) -> ObjectRef``
    with ``manifests[j] = (buckets, sender IP)`` (``stall_timeout_s``: ``PushEndpoint.recv``'s
    ``stall_s``). The manifest is asked once (names and shapes never change).
    """
    import ray

    manifests: dict[int, Any] = {}

    def publish(version: int) -> None:
        if not manifests:
            for out in actor_group.execute_sync_command("asp_weight_manifest", bucket_bytes):
                if out is not None:
                    j, buckets, ip = out
                    manifests[j] = (buckets, ip)
            if not manifests:
                raise RuntimeError("no trainer rank reported itself as a weight sender (first inference DP group)")
        world = 1 + len(instances)
        refs = [inst.receive_weights(dict(manifests), version, base_port, 1 + r, world, stall_timeout_s)
                for r, inst in enumerate(instances)]
        actor_group.execute_sync_command("asp_push_weights", version, base_port, len(instances), bucket_bytes,
                                         stall_timeout_s)
        ray.get(refs)

    return publish
