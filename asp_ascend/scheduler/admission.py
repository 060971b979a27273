"""Admission and lag control: one pure state machine for the simulator and the runtime.

Words (DESIGN 2): iteration i is trained by a trainer holding policy version i and
publishes version i + 1. The *lag* of a sample trained in iteration i is
``i - admission_version``, where the admission version is the version the instance
held when it admitted the prompt (the oldest weights behind any of its tokens).

Rule, the only one:  a prompt of iteration i may start on an instance holding
version v only if ``v >= i - k``  (k = lag bound).  Since the sample is trained in
iteration i, its lag is ``i - v <= k``; nothing is ever dropped. With k = 0 this is
the synchronous pipeline: iteration i is generated only after version i exists.

The :class:`Dispatcher` feeds instances from the schedule through this rule:
each instance has a queue ordered by ``(iteration, dispatch_rank)`` (or all share one
queue, for the ``fifo``-style policies). Decisions (``next_for``) are apart from state
updates (``on_*``); nothing here knows about time, threads, Ray or vLLM.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True, order=True)
class Job:
    """One prompt group to generate. Ordered by (iteration, dispatch_rank, prompt_id)."""
    iteration: int
    dispatch_rank: int
    prompt_id: str = field(compare=True)
    epoch: int = field(default=0, compare=False)
    instance: int = field(default=0, compare=False)
    mini_batch: int = field(default=0, compare=False)
    predicted_length: float = field(default=0.0, compare=False)


class LagViolation(RuntimeError):
    """Raised if a caller tries to admit against the rule (a bug, never a user error)."""


class AdmissionController:
    """Tracks which policy version each instance holds and enforces the lag bound."""

    def __init__(self, lag_bound: int, num_instances: int):
        if lag_bound < 0:
            raise ValueError(f"lag_bound must be >= 0, got {lag_bound}")
        self.k = lag_bound
        self.instance_version = [0] * num_instances
        self.published = 0  # newest version published by the trainer

    # decisions ---------------------------------------------------------------
    def admissible(self, instance: int, iteration: int) -> bool:
        return self.instance_version[instance] >= iteration - self.k

    def min_version_for(self, iteration: int) -> int:
        return max(0, iteration - self.k)

    # state updates -------------------------------------------------------------
    def on_publish(self, version: int) -> None:
        if version < self.published:
            raise ValueError(f"versions only grow: {version} < {self.published}")
        self.published = version

    def on_instance_synced(self, instance: int, version: int) -> None:
        if version > self.published:
            raise ValueError(f"instance {instance} cannot hold unpublished version {version}")
        self.instance_version[instance] = max(self.instance_version[instance], version)

    def on_admit(self, instance: int, iteration: int) -> int:
        """Record an admission; returns the admission version (raises on a lag violation)."""
        if not self.admissible(instance, iteration):
            raise LagViolation(f"iteration {iteration} on instance {instance} holding "
                               f"v{self.instance_version[instance]} exceeds lag bound {self.k}")
        return self.instance_version[instance]

    def add_instance(self) -> int:
        self.instance_version.append(self.published)
        return len(self.instance_version) - 1


class Dispatcher:
    """Hands each instance its next admissible job, by the schedule.

    ``shared=False``: every job is bound to ``job.instance`` (asp, balanced).
    ``shared=True``: instances pull from one queue in ``(iteration, dispatch_rank)``
    order (fifo, random, sorted: a plain dataloader with least-loaded routing).

    Because admission is monotone in the iteration, only a queue's head can be
    admissible first: ``next_for`` is O(log n).
    Failed instances' unfinished jobs are moved to survivors (``on_instance_failed``),
    each exactly once; a job is finished exactly once (``on_finish``).
    """

    def __init__(self, jobs: Iterable[Job], num_instances: int, admission: AdmissionController,
                 shared: bool = False):
        self.adm = admission
        self.shared = shared
        self.alive = [True] * num_instances
        self.queues: list[list[Job]] = [[] for _ in range(1 if shared else num_instances)]
        # keyed by (epoch, prompt_id): a prompt recurs once per epoch
        self.running: dict[tuple[int, str], tuple[int, Job]] = {}  # -> (instance, job)
        self.finished: set[tuple[int, str]] = set()
        self.total = 0
        for job in jobs:
            q = 0 if shared else job.instance
            if not 0 <= q < len(self.queues):
                raise ValueError(f"job {job.prompt_id}: instance {job.instance} out of range 0..{num_instances - 1}")
            self.queues[q].append(job)
            self.total += 1
        for q in self.queues:
            heapq.heapify(q)

    # decisions -----------------------------------------------------------------
    def _queue(self, instance: int) -> list[Job]:
        return self.queues[0 if self.shared else instance]

    def peek(self, instance: int) -> Job | None:
        """The job ``instance`` would take next, or None (queue empty or lag-blocked)."""
        q = self._queue(instance)
        if not q or not self.alive[instance]:
            return None
        job = q[0]
        return job if self.adm.admissible(instance, job.iteration) else None

    def blocked_by_lag(self, instance: int) -> bool:
        q = self._queue(instance)
        return bool(q) and self.alive[instance] and not self.adm.admissible(instance, q[0].iteration)

    def pending(self, instance: int | None = None) -> int:
        if instance is None:
            return sum(len(q) for q in self.queues)
        return len(self._queue(instance))

    @property
    def done(self) -> bool:
        return len(self.finished) == self.total

    # state updates ---------------------------------------------------------------
    def next_for(self, instance: int) -> tuple[Job, int] | None:
        """Pop the next admissible job for ``instance``: (job, admission_version) or None."""
        job = self.peek(instance)
        if job is None:
            return None
        heapq.heappop(self._queue(instance))
        version = self.adm.on_admit(instance, job.iteration)
        self.running[(job.epoch, job.prompt_id)] = (instance, job)
        return job, version

    def on_finish(self, prompt_id: str, epoch: int = 0) -> Job:
        key = (epoch, prompt_id)
        if key in self.finished:
            raise ValueError(f"prompt {prompt_id} of epoch {epoch} finished twice")
        instance, job = self.running.pop(key)
        self.finished.add(key)
        return job

    def on_instance_failed(self, instance: int) -> list[Job]:
        """Mark ``instance`` dead; re-queue its running and queued jobs on survivors.

        Returns the moved jobs. Jobs go to the live instance with the fewest queued
        jobs (per-instance mode) or back to the shared queue; each keeps its
        iteration and rank, so it is trained in the same iteration.
        """
        self.alive[instance] = False
        moved = [job for key, (inst, job) in list(self.running.items()) if inst == instance]
        for job in moved:
            del self.running[(job.epoch, job.prompt_id)]
        if not self.shared:
            moved.extend(self.queues[instance])
            self.queues[instance] = []
        survivors = [i for i, a in enumerate(self.alive) if a]
        if not survivors:
            raise RuntimeError("every rollout instance has failed")
        for job in sorted(moved):
            if self.shared:
                heapq.heappush(self.queues[0], job)
            else:
                target = min(survivors, key=lambda i: (len(self.queues[i]), i))
                heapq.heappush(self.queues[target], job)
        return moved

    def on_instance_restarted(self, instance: int) -> None:
        """A restarted instance rejoins (it must be synced to the current version first)."""
        self.alive[instance] = True
        if not self.shared and instance >= len(self.queues):
            self.queues.append([])
