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

import bisect
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


class _RankQueue:
    """Jobs bucketed by iteration; each bucket a heap by (epoch, dispatch_rank, prompt_id).

    ``best(limit)`` returns the lowest-ranked job among iterations <= ``limit`` (the
    admissible ones). Only the few iterations at or below the limit are looked at.
    """

    def __init__(self):
        self.buckets: dict[int, list] = {}
        self.iters: list[int] = []  # sorted iterations with a non-empty bucket
        self.size = 0
        self.work = 0.0  # sum of queued jobs' predicted lengths (stealing picks the largest)

    def push(self, job: Job) -> None:
        b = self.buckets.get(job.iteration)
        if b is None:
            b = self.buckets[job.iteration] = []
            bisect.insort(self.iters, job.iteration)
        heapq.heappush(b, (job.epoch, job.dispatch_rank, job.prompt_id, job))
        self.size += 1
        self.work += job.predicted_length

    def best(self, limit: int) -> Job | None:
        best = None
        for it in self.iters:
            if it > limit:
                break
            head = self.buckets[it][0]
            if best is None or head[:3] < best[:3]:
                best = head
        return None if best is None else best[3]

    def pop(self, job: Job) -> None:
        b = self.buckets[job.iteration]
        heapq.heappop(b)
        self.size -= 1
        self.work -= job.predicted_length
        if not b:
            del self.buckets[job.iteration]
            self.iters.remove(job.iteration)

    def first_iteration(self) -> int | None:
        return self.iters[0] if self.iters else None

    def drain(self) -> list[Job]:
        jobs = [entry[3] for b in self.buckets.values() for entry in b]
        self.buckets, self.iters, self.size, self.work = {}, [], 0, 0.0
        return jobs

    def __len__(self) -> int:
        return self.size


class Dispatcher:
    """Hands each instance its next admissible job, by the schedule.

    ``shared=False``: every job is bound to ``job.instance`` (asp, balanced).
    ``shared=True``: instances pull from one queue (fifo, random, sorted: a plain
    dataloader with least-loaded routing).

    Order: lowest ``(epoch, dispatch_rank)`` first among the *admissible* jobs (iteration
    <= instance version + k). So a schedule may interleave iterations (start a long
    group of iteration i+1 ahead of short ones of iteration i): the job waits until its
    iteration is admissible and never blocks the admissible jobs ranked after it.
    Failed instances' unfinished jobs are moved to survivors (``on_instance_failed``),
    each exactly once; a job is finished exactly once (``on_finish``).

    ``steal=True`` (per-instance mode): an instance with nothing admissible of its own
    takes the next admissible job of the instance with the most queued predicted work, the
    job that instance would have started next. The schedule's placement becomes a plan
    that corrects itself when lengths are mispredicted; the lag rule is unchanged (the
    thief's own version decides admissibility).
    """

    def __init__(self, jobs: Iterable[Job], num_instances: int, admission: AdmissionController,
                 shared: bool = False, steal: bool = False):
        self.adm = admission
        self.shared = shared
        self.steal = steal and not shared
        self.stolen = 0
        self.alive = [True] * num_instances
        self.queues: list[_RankQueue] = [_RankQueue() for _ in range(1 if shared else num_instances)]
        # keyed by (epoch, prompt_id): a prompt recurs once per epoch
        self.running: dict[tuple[int, str], tuple[int, Job]] = {}  # -> (instance, job)
        self.finished: set[tuple[int, str]] = set()
        self.total = 0
        self.add(jobs)

    def add(self, jobs: Iterable[Job]) -> int:
        """Queue more jobs (the next epoch, re-planned from observed lengths); returns how many.

        A job planned for a failed instance goes to the live instance with the fewest queued
        jobs, as in ``on_instance_failed`` (a plan made before the failure is never stranded)."""
        n = 0
        for job in jobs:
            q = 0 if self.shared else job.instance
            if not 0 <= q < len(self.queues):
                raise ValueError(f"job {job.prompt_id}: instance {job.instance} out of range 0..{len(self.queues) - 1}")
            if not self.shared and not self.alive[q]:
                survivors = [i for i, a in enumerate(self.alive) if a]
                if not survivors:
                    raise RuntimeError("every rollout instance has failed")
                q = min(survivors, key=lambda i: (len(self.queues[i]), i))
            self.queues[q].push(job)
            self.total += 1
            n += 1
        return n

    # decisions -----------------------------------------------------------------
    def _queue(self, instance: int) -> _RankQueue:
        return self.queues[0 if self.shared else instance]

    def _limit(self, instance: int) -> int:
        return self.adm.instance_version[instance] + self.adm.k

    def peek(self, instance: int) -> Job | None:
        """The job ``instance`` would take next, or None (queue empty or lag-blocked)."""
        return self._pick(instance)[0]

    def _pick(self, instance: int) -> tuple[Job | None, _RankQueue | None]:
        if not self.alive[instance]:
            return None, None
        own = self._queue(instance)
        limit = self._limit(instance)
        job = own.best(limit)
        if job is not None or not self.steal:
            return job, own
        victims = sorted((i for i, q in enumerate(self.queues) if i != instance and self.alive[i] and len(q)),
                         key=lambda i: -self.queues[i].work)
        for v in victims:
            job = self.queues[v].best(limit)
            if job is not None:
                return job, self.queues[v]
        return None, None

    def blocked_by_lag(self, instance: int) -> bool:
        """True if ``instance`` has queued work but none of it is admissible yet."""
        q = self._queue(instance)
        first = q.first_iteration()
        return self.alive[instance] and first is not None and first > self._limit(instance)

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
        job, queue = self._pick(instance)
        if job is None:
            return None
        queue.pop(job)
        if queue is not self._queue(instance):
            self.stolen += 1
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
            moved.extend(self.queues[instance].drain())
        survivors = [i for i, a in enumerate(self.alive) if a]
        if not survivors:
            raise RuntimeError("every rollout instance has failed")
        for job in sorted(moved):
            if self.shared:
                self.queues[0].push(job)
            else:
                target = min(survivors, key=lambda i: (len(self.queues[i]), i))
                self.queues[target].push(job)
        return moved

    def on_instance_restarted(self, instance: int) -> None:
        """A restarted instance rejoins (it must be synced to the current version first)."""
        self.alive[instance] = True
        if not self.shared:
            while instance >= len(self.queues):
                self.queues.append(_RankQueue())
            while instance >= len(self.alive):
                self.alive.append(True)
