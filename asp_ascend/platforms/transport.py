"""Weight-sync transports: trainer -> rollout instances, behind one interface.

Every weight sync is three calls, the same for every transport::

    ticket = tx.prepare(version, named_tensors)     # trainer: metadata (+ payload for CPU paths)
    futs = [instance.update_weights.remote(ticket) for instance in instances]
    tx.send(ticket, named_tensors)                  # trainer: no-op, or the collective broadcast
    ray.get(futs)                                   # each instance: rx.recv(ticket) -> (name, tensor)

Implementations:
- ``InProcessTransport``: the ticket carries CPU copies (tests, single process).
- ``RayObjectStoreTransport``: one ``ray.put`` of the serialized state dict; every instance
  ``ray.get``s it (zero-copy shared memory on one node). The CPU path.
- ``BroadcastTransport``: tensors packed into flat per-dtype buckets of at most
  ``bucket_bytes`` and broadcast from rank 0 over a communicator spanning the trainer's
  sending rank and one rank per instance: vLLM's ``PyNcclCommunicator`` (CUDA) or
  vllm-ascend's ``PyHcclCommunicator`` (NPU) over a ``StatelessProcessGroup`` (Ray's own
  collectives have no HCCL), or a gloo group on CPU. Bucketing cuts the per-tensor launch
  cost; the receiver allocates one buffer per bucket and yields views into it. A sender counts
  its steps in the group's store and marks a failed version there before it drops the group; a
  receiver waits for each bucket polling that (recv_wait.py), so on every backend it fails within
  about ``recv_wait.POLL_S`` of a failure, or after ``weight_sync.stall_timeout_s`` without
  progress, instead of blocking in the device collective.

torch, ray and vllm are imported inside the methods that need them.
"""
from __future__ import annotations

import io
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Protocol, runtime_checkable

from ..errors import BackendMissingError, ConfigError
from .recv_wait import (STALL_KEY, STALL_S, SendProgress, SenderWatch, WorkPending, mark_failed, release_when_done,
                        start_broadcast, store_of, wait_bucket)

DEFAULT_BUCKET_BYTES = 1 << 30


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    offset: int          # in elements, inside its bucket
    numel: int


@dataclass(frozen=True)
class Bucket:
    dtype: str           # torch dtype name without the 'torch.' prefix, e.g. 'bfloat16'
    numel: int
    tensors: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class WeightTicket:
    """What an instance needs to receive one policy version (picklable; crosses Ray calls)."""
    version: int
    buckets: tuple[Bucket, ...]
    payload: Any = field(default=None, compare=False)

    @property
    def names(self) -> list[str]:
        return [t.name for b in self.buckets for t in b.tensors]

    @property
    def nbytes(self) -> int:
        return sum(b.numel * _DTYPE_BYTES.get(b.dtype, 4) for b in self.buckets)

    def layout(self) -> list:
        """The bucket layout as plain lists (crosses vLLM's RPC, which only passes plain data)."""
        return [[b.dtype, b.numel, [[t.name, list(t.shape), t.offset, t.numel] for t in b.tensors]]
                for b in self.buckets]

    @classmethod
    def from_layout(cls, version: int, layout: list) -> "WeightTicket":
        return cls(int(version), tuple(Bucket(d, int(n), tuple(TensorSpec(a, tuple(sh), int(o), int(m))
                                                                for a, sh, o, m in ts)) for d, n, ts in layout))


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def plan_buckets(specs: Iterable[tuple[str, tuple[int, ...], str]], bucket_bytes: int) -> tuple[Bucket, ...]:
    """Group (name, shape, dtype) into flat buckets: one dtype per bucket, parameter order kept,
    at most ``bucket_bytes`` each unless a single tensor is larger (then it gets its own)."""
    if bucket_bytes <= 0:
        raise ConfigError([f"weight_sync.bucket_bytes: must be positive, got {bucket_bytes}"])
    buckets: list[Bucket] = []
    cur: list[TensorSpec] = []
    cur_dtype: Optional[str] = None
    cur_numel = 0

    def close():
        nonlocal cur, cur_numel
        if cur:
            buckets.append(Bucket(cur_dtype, cur_numel, tuple(cur)))
        cur, cur_numel = [], 0

    for name, shape, dtype in specs:
        numel = 1
        for s in shape:
            numel *= int(s)
        size = _DTYPE_BYTES.get(dtype, 4)
        if cur and (dtype != cur_dtype or (cur_numel + numel) * size > bucket_bytes):
            close()
        cur_dtype = dtype
        cur.append(TensorSpec(name, tuple(int(s) for s in shape), cur_numel, numel))
        cur_numel += numel
    close()
    return tuple(buckets)


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def specs_of(named: list) -> list[tuple[str, tuple[int, ...], str]]:
    return [(n, tuple(t.shape), _dtype_name(t)) for n, t in named]


@runtime_checkable
class WeightTransport(Protocol):
    """prepare (trainer) -> recv (each instance, concurrently) + send (trainer)."""

    def prepare(self, version: int, named_tensors: Iterable[tuple[str, Any]]) -> WeightTicket: ...
    def send(self, ticket: WeightTicket, named_tensors: Iterable[tuple[str, Any]]) -> None: ...
    def recv(self, ticket: WeightTicket) -> Iterator[tuple[str, Any]]: ...


class InProcessTransport:
    """The ticket itself carries detached CPU copies. For tests and single-process runs."""

    def prepare(self, version, named_tensors):
        named = [(n, t.detach().to("cpu").clone()) for n, t in named_tensors]
        return WeightTicket(version, plan_buckets(specs_of(named), DEFAULT_BUCKET_BYTES), payload=named)

    def send(self, ticket, named_tensors) -> None:
        """Nothing to do: the data travels in the ticket."""

    def recv(self, ticket):
        yield from ticket.payload


def serialize_state(named: Iterable[tuple[str, Any]]) -> bytes:
    """torch.save of an ordered dict of CPU tensors (vLLM's RPC turns raw tensors into lists)."""
    import torch

    buf = io.BytesIO()
    torch.save({n: t.detach().to("cpu") for n, t in named}, buf)
    return buf.getvalue()


def deserialize_state(blob: bytes) -> list[tuple[str, Any]]:
    import torch

    return list(torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True).items())


class RayObjectStoreTransport:
    """One ``ray.put`` per version; instances ``ray.get`` the blob (the CPU weight-sync path)."""

    def prepare(self, version, named_tensors):
        ray = _ray()
        named = list(named_tensors)
        blob = serialize_state(named)
        return WeightTicket(version, plan_buckets(specs_of(named), DEFAULT_BUCKET_BYTES), payload=ray.put(blob))

    def send(self, ticket, named_tensors) -> None:
        """Nothing to do: prepare already placed the blob in the object store."""

    def recv_bytes(self, ticket) -> bytes:
        """The serialized state dict (to forward into a vLLM worker via collective_rpc)."""
        return _ray().get(ticket.payload)

    def recv(self, ticket):
        yield from deserialize_state(self.recv_bytes(ticket))


@runtime_checkable
class Communicator(Protocol):
    """A weight-sync group's end. A receiver's waits go through ``recv_wait.start_broadcast``, which
    uses ``broadcast_async`` where a communicator has one (gloo), else ``broadcast(..., stream=)``."""
    device: Any

    def broadcast(self, tensor, src: int) -> None: ...


class BroadcastTransport:
    """Bucketed broadcast from rank 0 over ``communicator`` (NCCL, HCCL or gloo).

    The trainer's sending process is rank 0; each receiving instance process holds its own
    ``BroadcastTransport`` over the same communicator with its own rank. ``synchronize``
    (e.g. ``platform.synchronize``) runs after the last bucket so callers see finished data.
    The sender counts its steps in the group's store (``recv_wait.SendProgress``); a receiver waits
    for each bucket without blocking in the collective (``recv_wait.wait_bucket``): if the sender
    marked the version failed, its store no longer answers, or nothing progressed for ``stall_s``
    seconds (``stall_key``, ``weight_sync.stall_timeout_s``), the receive aborts this end of the
    group and raises ``recv_wait.SenderFailed`` naming the version and the bucket. ``store_checks``:
    the store round trips the last :meth:`recv` made, failed or not (none while every bucket
    arrives within ``recv_wait.POLL_S``).
    """

    def __init__(self, communicator: Communicator, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 synchronize=None, src: int = 0, stall_s: float = STALL_S, stall_key: str = STALL_KEY):
        self.comm = communicator
        self.bucket_bytes = int(bucket_bytes)
        self.synchronize = synchronize
        self.src = src
        self.stall_s, self.stall_key = float(stall_s), stall_key
        self.store_checks = 0

    def prepare(self, version, named_tensors):
        return WeightTicket(version, plan_buckets(specs_of(list(named_tensors)), self.bucket_bytes))

    def send(self, ticket, named_tensors) -> None:
        import torch

        by_name = dict(named_tensors)
        device = self.comm.device
        progress = SendProgress(self.comm, ticket.version)
        progress.step()
        for b in ticket.buckets:
            flat = torch.cat([by_name[s.name].detach().reshape(-1).to(device) for s in b.tensors])
            self.comm.broadcast(flat, src=self.src)
            progress.step()
        if self.synchronize is not None:
            self.synchronize()

    def recv(self, ticket):
        import torch

        self.store_checks = 0
        watch, n = SenderWatch(self.comm, ticket.version, self.stall_s, self.stall_key), len(ticket.buckets)
        for i, b in enumerate(ticket.buckets):
            flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=self.comm.device)
            pending = start_broadcast(self.comm, flat, self.src)
            try:
                wait_bucket(self.comm, pending, watch, f"bucket {i + 1}/{n}")
            finally:
                self.store_checks = watch.checks
            del pending
            if self.synchronize is not None:
                self.synchronize()
            for s in b.tensors:
                yield s.name, flat[s.offset:s.offset + s.numel].view(s.shape)


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


def make_transport(kind: str, communicator: Optional[Communicator] = None,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES, synchronize=None) -> WeightTransport:
    """Factory: ``inprocess`` | ``object_store`` | ``broadcast`` (needs a communicator)."""
    if kind == "inprocess":
        return InProcessTransport()
    if kind == "object_store":
        return RayObjectStoreTransport()
    if kind == "broadcast":
        if communicator is None:
            raise ConfigError(["weight_sync: transport 'broadcast' needs a communicator "
                               "(create_communicator(platform, host, port, rank, world_size))"])
        return BroadcastTransport(communicator, bucket_bytes, synchronize)
    raise ConfigError([f"weight_sync.transport: unknown value {kind!r}; choose inprocess, object_store or broadcast"])


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise BackendMissingError("ray", "pip install 'ray[default]'", "the object-store weight sync") from exc
    return ray
