"""The ends of a weight-sync group: the communicators (a stateless gloo group on CPU; vLLM's
``PyNcclCommunicator`` / vllm-ascend's ``PyHcclCommunicator`` over a ``StatelessProcessGroup`` on
CUDA / NPU), rank 0's rendezvous store (:func:`listen_store`) and the sender's end that hosts it
(:class:`SenderEndpoint`: listens before the other ranks are told its port, forms the group, marks a
failed version in its store and drops the group). What travels over them, and how, is
platforms/transport.py; how a receiver waits (and learns of a failed or hung sender) is
platforms/recv_wait.py.

torch and vllm are imported inside the functions that need them.
"""
from __future__ import annotations

import traceback
from typing import Any, Protocol, runtime_checkable

from ..errors import BackendMissingError, ConfigError
from .recv_wait import WorkPending, mark_failed, release_when_done, store_of


@runtime_checkable
class Communicator(Protocol):
    """A weight-sync group's end. A receiver's waits go through ``recv_wait.start_broadcast``, which
    uses ``broadcast_async`` where a communicator has one (gloo), else ``broadcast(..., stream=)``."""
    device: Any

    def broadcast(self, tensor, src: int) -> None: ...


PORT_KEY = "weight_sync.master_port"


def listen_store(host: str, port: int, world_size: int, timeout_s: float = 300.0, port_key: str = PORT_KEY,
                 fix: str = ""):
    """Rank 0's rendezvous store, listening before any other rank is told where it is.

    ``port`` 0: the OS picks a free port while binding, so no other process can take it between
    picking and listening (a port found free first and bound later raced: EADDRINUSE). Any other
    port is bound as given; if it is taken, a ``ConfigError`` names ``port_key``, the port and
    ``fix`` (default: a free range, or 0).
    ``store.port`` is the port it holds: hand that to the joining ranks.
    """
    import datetime

    import torch.distributed as dist

    try:
        return dist.TCPStore(host, int(port), world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        text = str(exc).lower()
        if int(port) and ("eaddrinuse" in text or "address already in use" in text):
            fix = fix or f"set {port_key} to a port range that is free there, or 0 to let the OS pick a free port"
            raise ConfigError([f"{port_key}: port {int(port)} is already in use on the trainer's sending node "
                               f"({host}), where the weight-sync rendezvous listens; {fix}"]) from exc
        raise


class SenderEndpoint:
    """Rank 0's end of a weight-sync group it hosts (the store at ``group["host"]``).

    ``group``: ``{"gen", "host", "port", "world", "platform"}`` and optionally ``"timeout_s"``.
    :meth:`listen` starts the group's rendezvous store before the other ranks are told its port and
    holds that port from then on; :meth:`comm` builds the communicator on that store at the
    generation's first use and keeps it while ``gen`` stays (a new ``gen`` drops the old group
    first; without a held store it listens on ``group["port"]`` now). A taken configured port is
    a ``ConfigError`` naming ``port_key``, with ``fix`` as the remedy (:func:`listen_store`).
    """

    def __init__(self, device_index: int = 0, port_key: str = PORT_KEY, fix: str = ""):
        self.device_index, self.port_key, self.fix = int(device_index), port_key, fix
        self._gen, self._store, self._comm = None, None, None   # a held store belongs to _gen

    def _listen(self, group: dict):
        return listen_store(group["host"], int(group["port"]), int(group["world"]),
                            float(group.get("timeout_s", 300.0)), port_key=self.port_key, fix=self.fix)

    def listen(self, group: dict) -> int:
        """Start ``group``'s store (port 0: the OS picks one) and return the port it holds. The
        previous group and store are dropped first."""
        self.drop()
        self._store, self._gen = self._listen(group), group["gen"]
        return int(self._store.port)

    def comm(self, group: dict) -> Communicator:
        """The communicator of ``group`` (this process is rank 0), built on first use of its ``gen``.
        A formation that fails leaves nothing holding the store: its port is free for the next try."""
        if self._comm is None or self._gen != group["gen"]:
            store = self._store if self._gen == group["gen"] else None
            self._store = None
            self.drop()   # the old group goes before the new one forms
            try:
                store = store if store is not None else self._listen(group)
                self._comm = create_communicator(group["platform"], group["host"], int(group["port"]), 0,
                                                 int(group["world"]), self.device_index,
                                                 float(group.get("timeout_s", 300.0)), store=store)
            except BaseException as exc:
                # the frames of the failed formation (kept by whoever keeps the exception) hold the store
                store = None
                traceback.clear_frames(exc.__traceback__)
                raise
            self._gen = group["gen"]
        return self._comm

    def send(self, group: dict, send, version: int):
        """``send(comm)`` of ``version`` on ``group``'s communicator (:meth:`comm`), returning what it
        returns; if it fails the version is marked failed and the group dropped (:meth:`fail`: a
        broken group is never reused, the next call forms it again on ``group["port"]``, where the
        receivers join again) and the error raised."""
        comm = self.comm(group)
        try:
            return send(comm)
        except BaseException:
            self.fail(version)
            raise

    def mark_failed(self, version: int) -> bool:
        """Mark ``version`` failed in the store this end hosts (``recv_wait.mark_failed``): the
        receivers waiting for it stop within ``recv_wait.POLL_S`` on any backend. Returns whether it
        was set (no store held, or one that fails: the receivers see the store go when it is dropped)."""
        return mark_failed(self._store if self._store is not None else store_of(self._comm), version)

    def fail(self, version: int) -> None:
        """``version`` failed on this side: mark it failed (:meth:`mark_failed`), then :meth:`drop`."""
        self.mark_failed(version)
        self.drop()

    def drop(self) -> None:
        """Let go of the group (after a failed broadcast: a broken group is never reused) and close its
        store now, so this port can be listened on again at once. The communicator is closed
        (:func:`close_communicator`), not just forgotten: a caller that keeps the failed broadcast's
        exception keeps its traceback's frames, and they reference the communicator (the transport's
        ``self.comm``); closed, it no longer holds the store. A caller must not keep the store itself
        (``comm.group.store``, ``GlooCommunicator.store``) past a drop. Receivers already waiting on
        the group learn of a failed version from :meth:`fail`, which marks it first."""
        comm, self._comm, self._store = self._comm, None, None
        if comm is not None:
            close_communicator(comm)


class GlooCommunicator:
    """A stateless gloo group (no global torch.distributed state): the CPU communicator.
    Rank 0 uses ``store`` (from :func:`listen_store`) when given, else starts its own on ``port``."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0, store=None):
        import datetime

        import torch
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")
        if rank == 0:
            store = store if store is not None else listen_store(host, port, world_size, timeout_s)
        else:
            store = dist.TCPStore(host, port, world_size, False, timeout=datetime.timedelta(seconds=timeout_s))
        self.store = store
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore("asp_weight_sync", store), rank, world_size,
                                         datetime.timedelta(seconds=timeout_s))

    def _start(self, tensor, src: int):
        """The group's pending broadcast of ``tensor`` from ``src`` (a torch ``Work``)."""
        import torch.distributed as dist

        if self._pg is None:
            raise RuntimeError("weight sync: broadcast on a closed gloo communicator (a dropped group is never reused)")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return self._pg.broadcast([tensor], opts)

    def broadcast(self, tensor, src: int) -> None:
        self._start(tensor, src).wait()   # waited inline: a kept error keeps no frame holding the work

    def broadcast_async(self, tensor, src: int) -> WorkPending:
        """Start the broadcast; the returned ``recv_wait.WorkPending`` says when it completed."""
        return WorkPending(self._start(tensor, src))

    def close(self) -> None:
        """Abort the gloo group and let go of it and of the store: released with nothing pending, the
        group closes its connections now (a peer's pending receive fails)."""
        pg, self._pg, self.store = self._pg, None, None
        if pg is not None:
            pg.abort()

    def abort(self, work=None) -> None:
        """Let go of the group while ``work`` (its pending operation) may still wait on a peer: gloo
        cannot end it from this side, and releasing the group waits for it, so both go to a thread
        that releases them once it ends (``recv_wait.release_when_done``). Unusable afterwards."""
        pg, self._pg, self.store = self._pg, None, None
        if pg is not None:
            pg.abort()
            release_when_done(work, pg)


def close_communicator(comm) -> None:
    """Let go of what ``comm`` holds of its group, so that on rank 0 the store (and with it the port
    it listens on) closes now even while something still references ``comm``. torch's ``TCPStore``
    has no close: its server stops only when the last reference goes, hence this. Gloo: the group is
    aborted and released (:meth:`GlooCommunicator.close`). vLLM's ``PyNcclCommunicator`` /
    vllm-ascend's ``PyHcclCommunicator``: their ``StatelessProcessGroup`` lets go of the store (the
    device communicator itself goes when the last reference does, as before; newer vllm-ascend's
    ``PyHcclCommunicator.close`` is not called: it synchronizes the device first, which waits on any
    broadcast still pending). ``comm`` is unusable afterwards."""
    if isinstance(comm, GlooCommunicator):
        comm.close()
        return
    group = getattr(comm, "group", None)
    if group is not None and hasattr(group, "store"):
        group.store = None


def create_communicator(platform_name: str, host: str, port: int, rank: int, world_size: int,
                        device_index: int = 0, timeout_s: float = 300.0, store=None) -> Communicator:
    """A weight-sync communicator for ``platform_name`` (cpu|cuda|npu), world = trainer sender + instances.

    cuda: vLLM ``PyNcclCommunicator``; npu: vllm-ascend ``PyHcclCommunicator``; both over
    vLLM's ``StatelessProcessGroup`` so they never touch the trainer's own process groups.
    Rank 0 hosts the rendezvous: pass the ``store`` it already listens on (:func:`listen_store`,
    whose port the other ranks were given); without one it binds ``port`` itself (a configured
    port; a taken one is a ``ConfigError`` naming ``weight_sync.master_port``).
    """
    if platform_name == "cpu":
        return GlooCommunicator(host, port, rank, world_size, timeout_s, store=store)
    if platform_name not in ("cuda", "npu"):
        raise ConfigError([f"platform: no weight-sync communicator for {platform_name!r}; use cpu, cuda or npu"])
    from . import get_platform

    platform = get_platform(platform_name)
    try:
        from vllm.distributed.utils import StatelessProcessGroup
    except ImportError as exc:
        hint = "pip install vllm" if platform_name == "cuda" else "install vllm + vllm-ascend (docs/ascend.md)"
        raise BackendMissingError("vllm", hint, "the weight-sync broadcast") from exc
    if platform_name == "cuda":
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator as Comm
    else:
        try:
            from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator as Comm
        except ImportError as exc:
            raise BackendMissingError("vllm_ascend", "install vllm-ascend (docs/ascend.md)",
                                      "the HCCL weight-sync broadcast") from exc
    if rank == 0:   # the store listens first (vLLM's create would bind ``port`` only now)
        store = store if store is not None else listen_store(host, port, world_size, timeout_s)
        group = StatelessProcessGroup(rank=0, world_size=world_size, store=store)
    else:
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                             store_timeout=int(timeout_s))
    comm = Comm(group, device=platform.torch_device(device_index))
    if getattr(comm, "disabled", False):
        # Both communicators silently disable themselves when the library is missing or the
        # world has one rank; a silent no-op broadcast would leave instances on stale weights.
        raise BackendMissingError(f"{platform_name} collective library",
                                  "check the NCCL/HCCL install and that world_size >= 2",
                                  "the weight-sync broadcast")
    return comm
