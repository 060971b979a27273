"""The runtime's collaborators as Protocols (each has more than one implementation).

The loop talks to Ray actors: every call is ``handle.method.remote(*args)`` and returns a
reference that ``ray.get`` resolves. A :class:`RemoteMethod` is that call surface, so a
contract lists the methods the loop uses, each a ``RemoteMethod``.

- :class:`Trainer`: one trainer actor (engines/trainer.py) or ``train.devices`` FSDP ranks
  behind one call surface (engines/fsdp_trainer.py ``TrainerGroup``).
- :class:`RolloutInstance`: a vLLM rollout actor (engines/rollout.py); the tests' in-process
  stand-ins answer the same calls.
- :class:`WeightTransport`: how a published version reaches the instances
  (pipeline/weight_sync.py: object store or broadcast).
- :class:`SampleSource`: where the MindSpeed-RL loop's trainer takes finished groups from
  (integrations/mindspeed_rl ``DispatcherSource`` on real instances; a CPU fake in its tests).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class RemoteMethod(Protocol):
    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class Trainer(Protocol):
    ready: RemoteMethod               # () -> int, once the model is loaded
    begin_iteration: RemoteMethod     # (version, mini_batches)
    train_step: RemoteMethod          # (samples) -> step stats (tokens, padded_tokens, loss, ...)
    accumulate: RemoteMethod          # (samples) -> part stats: forward/backward, no step (stream_groups)
    apply_step: RemoteMethod          # (denom) -> step stats of the accumulated parts
    publish: RemoteMethod             # (version, transport) -> WeightTicket
    send_weights: RemoteMethod        # (version, group) -> broadcast stats
    node_ip: RemoteMethod             # () -> IP where the weight-sync group's store listens (broadcast)
    open_group: RemoteMethod          # (gen, world, port, timeout_s) -> the port that store now listens on
    sft: RemoteMethod                 # (examples, steps, batch_size, lr, seed) -> losses
    save_checkpoint: RemoteMethod     # (path, state) -> path
    load_checkpoint: RemoteMethod     # (path) -> version


@runtime_checkable
class RolloutInstance(Protocol):
    submit: RemoteMethod              # (group_id, prompt_ids, n, max_tokens, temperature, top_p, seed, stop, meta)
    submit_many: RemoteMethod         # ([submit's keyword arguments per group]) -> [admission version]: one hold
    poll: RemoteMethod                # (wait_s, [wake_below]) -> {"groups": [...], "busy_s": float; with
    #                                   rollout.admission=sequences also "running" and "received" (samples)}
    update_weights: RemoteMethod      # (ticket, group=None)
    ready: RemoteMethod               # () -> int
    shutdown: RemoteMethod


class PendingWeights(Protocol):
    version: int
    ticket: Any
    refs: dict                        # instance -> its update_weights ref, until it resolves
    send: Any                         # the trainer's broadcast ref (broadcast only), until it resolves
    t_start: float
    t_end: float
    failed: BaseException | None      # the first error of this try (a broken broadcast group)
    tries: int
    synced: set                       # instances that hold ``version``
    reported: set                     # instances reported hung in this sync

    @property
    def in_flight(self) -> bool: ...

    def waiting(self) -> list: ...

    def overdue(self, ray: Any, now: float, bound_s: float) -> tuple[float | None, list[int]]: ...

    def poll(self, ray: Any, t0: float, on_dead: Callable[[int, BaseException], None]) -> list[int]: ...


@runtime_checkable
class WeightTransport(Protocol):
    stall_timeout_s: float            # weight_sync.stall_timeout_s
    timeout_s: float                  # weight_sync.timeout_s (a broadcast group's rendezvous)
    wait_group: Callable | None       # (call, ref, version, gen, members) -> result: node_ip, open_group awaited

    @property
    def broadcast(self) -> bool: ...

    def publish(self, version: int, t_start: float = 0.0) -> PendingWeights: ...

    def start(self, version: int, members: list[int], t_start: float = 0.0) -> PendingWeights: ...

    def push(self, s: PendingWeights, members: list[int]) -> None: ...

    def regroup(self) -> None: ...

    def catch_up_ticket(self, version: int) -> Any: ...


@runtime_checkable
class SampleSource(Protocol):
    """Blocks until ``count`` complete groups of ``iteration`` are ready and returns them
    (the MindSpeed-RL loop's bounded queue: ``DispatcherSource`` on instances, a CPU fake in tests)."""

    def get_groups(self, iteration: int, count: int) -> list: ...
