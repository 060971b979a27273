"""Which verl rollout server takes a prompt group: DESIGN 9a's guided dispatch over verl's request stream.

verl routes every generation request through one load-balancer actor (``acquire_server``,
verl 0.9.1 ``verl/workers/rollout/router.py``); its default picks the server with the fewest
requests in flight. With the ASP schedule each prompt group has an instance, a dispatch position
and a predicted length (DESIGN 6); the request carries them to the balancer in the one per-sample
field verl forwards from the batch to ``acquire_server``: ``priority`` (a ``non_tensor_batch``
column, passed by verl's agent loops to ``generate`` and declared by our balancer in
``require_acquire_fields``).

Encoding (:func:`encode_priority`): ``PRIORITY_BASE + (position x LENGTH_SPAN + length) x R +
instance``; ``position`` the group's place in the epoch-spanning dispatch order, ``length`` its
predicted response length (whole tokens, capped below ``LENGTH_SPAN``), ``R`` the schedule's
instances. Values below ``PRIORITY_BASE`` are verl's own priorities (``arange`` over a batch, 0 by
default, validation): those requests keep verl's least-in-flight choice. The encoding is monotone
in ``position``, so with ``rollout.scheduling_policy=priority`` vLLM also serves earlier-dispatched
groups first (lower value first); with verl's default ``fcfs`` vLLM ignores it.

The decision (:class:`GuidedRoutes`, no verl, no Ray) is the runtime's own executor: a
:class:`~asp_ascend.scheduler.execution.Feeder` over a
:class:`~asp_ascend.scheduler.admission.Dispatcher` whose remaining-work figure is a
:class:`~asp_ascend.scheduler.reestimate.GroupEstimator`. Schedule instance r is the r-th server of
the starting pool; it *can admit* while it has fewer than ``group_slots`` groups in flight
(``rollout.max_num_seqs // G``, as in the simulator and the runtime). A group arriving at the
balancer waits there (not in vLLM's queue) until an instance admits it. Whenever one can admit
(a group arrived, a group finished, a server joined), every instance with room takes its own
highest-priority waiting group; only then (``scheduler.dispatch: guided``) does an instance with
room, fewest groups in flight first, take the highest-priority waiting group of the instance with
the most re-estimated remaining work (its waiting groups' predicted lengths plus its running
groups' re-estimated remaining lengths), and only if that lowers the later of the two instances'
finishes: the helper's remaining work plus the group's predicted length stays below the busy
instance's (the Dispatcher's steal rule). Running groups never move: every sample of a group and
every partial-rollout resume goes to the server that admitted the group. ``static`` runs exactly
the planned groups on each instance.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ...scheduler.admission import AdmissionController, Dispatcher, Job
from ...scheduler.execution import Feeder
from ...scheduler.reestimate import GroupEstimator

PRIORITY_BASE = 1 << 40
LENGTH_SPAN = 1 << 20


class Route(NamedTuple):
    """What an encoded ``priority`` carries."""
    position: int
    instance: int
    predicted_length: int


def encode_priority(position: int, instance: int, num_instances: int, predicted_length: float = 0) -> int:
    """The ``priority`` value that carries a group's dispatch position, schedule instance and
    predicted length."""
    if not 0 <= instance < num_instances:
        raise ValueError(f"instance {instance} outside 0..{num_instances - 1}")
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    length = min(max(int(round(float(predicted_length))), 0), LENGTH_SPAN - 1)
    return PRIORITY_BASE + (int(position) * LENGTH_SPAN + length) * int(num_instances) + int(instance)


def decode_priority(priority, num_instances: int) -> Optional[Route]:
    """The route an encoded ``priority`` carries; ``None`` for verl's own priorities."""
    try:
        p = int(priority)
    except (TypeError, ValueError):
        return None
    if p < PRIORITY_BASE:
        return None
    rest, instance = divmod(p - PRIORITY_BASE, int(num_instances))
    position, length = divmod(rest, LENGTH_SPAN)
    return Route(position, instance, length)


def decode_instance(priority, num_instances: int) -> Optional[int]:
    """The schedule instance of an encoded ``priority``; ``None`` for verl's own priorities."""
    route = decode_priority(priority, num_instances)
    return None if route is None else route.instance


class GuidedRoutes:
    """Which instance runs which group, as groups arrive and finish (see the module doc).

    Groups are keyed by their encoded priority (unique per group and epoch). Every event returns
    the admissions it made, ``[(key, instance), ...]``, in order; a group not in any list waits.
    ``max_length``: the response-length cap (the estimator's ceiling)."""

    def __init__(self, num_instances: int, group_slots: int, group_size: int, *, dispatch: str = "guided",
                 max_length: Optional[float] = None):
        if num_instances < 1 or group_slots < 1:
            raise ValueError(f"num_instances and group_slots must be >= 1, got {num_instances}, {group_slots}")
        self.num_instances = int(num_instances)
        self.estimator = GroupEstimator(group_size, max_length=max_length)
        # admission (the lag bound) happens upstream in verl's feed: every group reaching the
        # balancer is admissible (iteration 0 on instances holding version 0, k = 0)
        self.dispatcher = Dispatcher([], self.num_instances, AdmissionController(0, self.num_instances),
                                     dispatch=dispatch, remaining=self.estimator)
        self.feeder = Feeder(self.dispatcher, group_slots)
        self.instance_of: dict[int, int] = {}        # admitted, unfinished group -> instance

    @property
    def steals(self) -> list[tuple[int, int, int]]:
        """(group, planned instance, instance that ran it) for each group taken by another instance:
        the dispatcher's latest STEAL_RECORD steals (``dispatcher.stolen`` counts them all)."""
        return [(int(job.prompt_id), src, dst) for job, src, dst in self.dispatcher.steals]

    def waiting(self, instance: Optional[int] = None) -> int:
        return self.dispatcher.pending(instance)

    def remaining_work(self, instance: int) -> float:
        return self.dispatcher.remaining_work(instance)

    def arrive(self, key: int, route: Route) -> list[tuple[int, int]]:
        """A new group's first request reached the balancer."""
        instance = route.instance
        self.dispatcher.add([Job(0, int(route.position), str(int(key)), instance=instance,
                                 predicted_length=float(route.predicted_length))])
        return self._fill()

    def finished(self, key: int, lengths=()) -> list[tuple[int, int]]:
        """Every sample of group ``key`` came back (``lengths``, when known, teach the estimator)."""
        key = int(key)
        self.feeder.finished(0, str(key))
        self.instance_of.pop(key, None)
        for n in lengths:
            self.estimator.on_sample_finish((0, str(key)), int(n))
        self.estimator.on_group_finish((0, str(key)))
        return self._fill()

    def server_gone(self, instance: int) -> list[tuple[int, int]]:
        """Instance ``instance``'s server left the pool: its waiting and running groups are queued
        on the others (each keeps its position) and admitted again."""
        moved, _ = self.feeder.failed(instance)
        for job in moved:
            key = int(job.prompt_id)
            self.instance_of.pop(key, None)
            self.estimator.groups.pop((0, str(key)), None)
        return self._fill()

    def server_added(self, instance: int) -> list[tuple[int, int]]:
        """A server joined as instance ``instance`` (a returning one, or a new one with no planned groups)."""
        self.feeder.restarted(instance)
        return self._fill()

    def _fill(self) -> list[tuple[int, int]]:
        out = []
        for r, job, _ in self.feeder.fill():
            key = int(job.prompt_id)
            self.estimator.on_admit((job.epoch, job.prompt_id), job.predicted_length)   # the Dispatcher's key
            self.instance_of[key] = r
            out.append((key, r))
        return out


def priority_table(order, frame, epoch: int, num_instances: int) -> dict[int, int]:
    """Dataset position -> ``priority`` for one epoch: ``order`` the epoch's dispatch order (dataset
    positions, :meth:`.sampler.AspSampler.order`), ``frame`` its schedule rows (``prompt_id``,
    ``instance``, ``predicted_length`` when present). Positions count on across epochs
    (``epoch x len(order) + n``)."""
    ids = frame["prompt_id"].astype(str)
    instance = dict(zip(ids, frame["instance"].astype(int)))
    length = dict(zip(ids, frame["predicted_length"].astype(float))) if "predicted_length" in frame else {}
    base = int(epoch) * len(order)
    return {int(idx): encode_priority(base + n, instance[str(idx)], num_instances, length.get(str(idx), 0.0))
            for n, idx in enumerate(order)}
