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
  progress, instead of blocking in the device collective. The communicators, the rendezvous store
  and the sender's end of a group are platforms/communicators.py.

torch, ray and vllm are imported inside the methods that need them.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Protocol, runtime_checkable

from ..errors import BackendMissingError, ConfigError
from .communicators import Communicator
from .recv_wait import STALL_KEY, STALL_S, BucketSender, RecvProgress, SenderWatch, start_broadcast, wait_bucket

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
        tx = BucketSender(self.comm, ticket.version, len(ticket.buckets), self.stall_s, self.stall_key, self.src)
        for i, b in enumerate(ticket.buckets):
            tx.bucket(i, torch.cat([by_name[s.name].detach().reshape(-1).to(device) for s in b.tensors]))
        if self.synchronize is not None:
            self.synchronize()

    def recv(self, ticket):
        import torch

        self.store_checks = 0
        watch, n = SenderWatch(self.comm, ticket.version, self.stall_s, self.stall_key), len(ticket.buckets)
        progress = RecvProgress(self.comm, ticket.version)
        progress.step()
        for i, b in enumerate(ticket.buckets):
            flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=self.comm.device)
            pending = start_broadcast(self.comm, flat, self.src)
            try:
                wait_bucket(self.comm, pending, watch, f"bucket {i + 1}/{n}")
            finally:
                self.store_checks = watch.checks
            del pending
            progress.step()
            if self.synchronize is not None:
                self.synchronize()
            for s in b.tensors:
                yield s.name, flat[s.offset:s.offset + s.numel].view(s.shape)


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
