"""Which verl rollout server takes a prompt group: the schedule's instance (guided dispatch).

verl routes every generation request through one load-balancer actor (``acquire_server``,
verl 0.9.1 ``verl/workers/rollout/router.py``); its default picks the server with the fewest
requests in flight. With the ASP schedule each prompt group has an instance (DESIGN 6), and the
request carries it to the balancer in the one per-sample field verl forwards from the batch to
``acquire_server``: ``priority`` (a ``non_tensor_batch`` column, passed by verl's agent loops to
``generate`` and declared by our balancer in ``require_acquire_fields``).

Encoding (:func:`encode_priority`): ``PRIORITY_BASE + position x R + instance``, ``position`` the
group's place in the epoch-spanning dispatch order, ``R`` the schedule's instances. Values below
``PRIORITY_BASE`` are verl's own priorities (``arange`` over a batch, 0 by default, validation):
those requests keep verl's least-in-flight choice. The encoding is monotone in ``position``, so
with ``rollout.scheduling_policy=priority`` vLLM also serves earlier-dispatched groups first
(lower value first); with verl's default ``fcfs`` vLLM ignores it.

The decision (:func:`choose_server`, pure): the group's planned server unless it is gone
(removed from the pool), or -- ``scheduler.dispatch: guided`` -- it already runs ``cap``
requests (vLLM's ``max_num_seqs``) while another server runs fewer: then the least-loaded server
takes the group (DESIGN 9a: an instance with room takes a not-yet-started group of a loaded
one). ``static`` keeps every group on its planned server while it exists. The first request of a
group decides; its siblings and partial-rollout resumes follow it (the balancer remembers the
group), so one server generates the whole group. No verl, no torch.
"""
from __future__ import annotations

from typing import Mapping, Optional

PRIORITY_BASE = 1 << 40


def encode_priority(position: int, instance: int, num_instances: int) -> int:
    """The ``priority`` value that carries a group's dispatch position and schedule instance."""
    if not 0 <= instance < num_instances:
        raise ValueError(f"instance {instance} outside 0..{num_instances - 1}")
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return PRIORITY_BASE + int(position) * int(num_instances) + int(instance)


def decode_instance(priority, num_instances: int) -> Optional[int]:
    """The schedule instance of an encoded ``priority``; ``None`` for verl's own priorities."""
    try:
        p = int(priority)
    except (TypeError, ValueError):
        return None
    if p < PRIORITY_BASE:
        return None
    return (p - PRIORITY_BASE) % int(num_instances)


def choose_server(planned: Optional[str], loads: Mapping[str, int], cap: int, dispatch: str = "guided") -> str:
    """The server for a new group (see the module doc). ``loads``: server -> requests in flight, in
    the pool's order (ties go to the first); ``planned``: the schedule's server (None: none)."""
    if not loads:
        raise RuntimeError("No available servers in load balancer")
    least = min(loads, key=loads.__getitem__)
    if planned is None or planned not in loads:
        return least
    if dispatch == "static" or loads[planned] < cap or loads[least] >= cap:
        return planned
    return least


def priority_table(order, frame, epoch: int, num_instances: int) -> dict[int, int]:
    """Dataset position -> ``priority`` for one epoch: ``order`` the epoch's dispatch order (dataset
    positions, :meth:`.sampler.AspSampler.order`), ``frame`` its schedule rows (``prompt_id``,
    ``instance``). Positions count on across epochs (``epoch x len(order) + n``)."""
    instance = dict(zip(frame["prompt_id"].astype(str), frame["instance"].astype(int)))
    base = int(epoch) * len(order)
    return {int(idx): encode_priority(base + n, instance[str(idx)], num_instances) for n, idx in enumerate(order)}
