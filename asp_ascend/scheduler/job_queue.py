"""The jobs guided and static dispatch hand out, and one instance's queue of them
(:class:`~.admission.Dispatcher` holds one per instance, or one shared)."""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field


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


class RankQueue:
    """Jobs bucketed by iteration; each bucket a heap by (epoch, dispatch_rank, prompt_id).

    ``best(limit)`` returns the lowest-ranked job among iterations <= ``limit`` (the
    admissible ones). Only the few iterations at or below the limit are looked at.
    """

    def __init__(self):
        self.buckets: dict[int, list] = {}
        self.iters: list[int] = []  # sorted iterations with a non-empty bucket
        self.size = 0
        self.work = 0.0  # sum of queued jobs' predicted lengths (guided dispatch: remaining work)

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
