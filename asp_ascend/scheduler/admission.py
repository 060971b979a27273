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
from collections import deque
from typing import Callable, Iterable, Protocol

from .job_queue import Job, RankQueue

# guided dispatch's record of its latest steals (Dispatcher.steals): far more than one admission
# pass of any fleet makes, which is how far the timeline writers (steal_events) may fall behind
STEAL_RECORD = 1 << 16


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


DISPATCH_MODES = ("static", "guided")


class RemainingWork(Protocol):
    """What guided dispatch asks about a running group (e.g. :class:`~.reestimate.GroupEstimator`)."""

    def remaining(self, key) -> float: ...


class Dispatcher:
    """Hands each instance its next admissible job, by the schedule.

    ``shared=False``: every job is planned for ``job.instance`` (asp, balanced).
    ``shared=True``: instances pull from one queue (fifo, random, sorted: a plain
    dataloader with least-loaded routing).

    Order: lowest ``(epoch, dispatch_rank)`` first among the *admissible* jobs (iteration
    <= instance version + k). So a schedule may interleave iterations (start a long
    group of iteration i+1 ahead of short ones of iteration i): the job waits until its
    iteration is admissible and never blocks the admissible jobs ranked after it.
    Failed instances' unfinished jobs are moved to survivors (``on_instance_failed``),
    each exactly once; a job is finished exactly once (``on_finish``).

    ``dispatch`` (per-instance mode; DESIGN 9 a):

    - ``static``: an instance runs exactly the jobs planned for it.
    - ``guided``: the plan fixes membership, mini-batches and priority; an instance that can
      admit takes its own highest-priority admissible job, else (``next_for(r, steal=True)``)
      the highest-priority admissible job not yet started of the instance with the most
      remaining work: its queued jobs' predicted lengths plus its running groups' work, which
      with a ``remaining`` estimator (:class:`~.reestimate.GroupEstimator`) is their
      re-estimated remaining tokens and without one their planned ``predicted_length`` (the
      whole group, however far it got). Running groups never move. The thief's own version decides
      admissibility, so the lag rule is unchanged. The steal is taken only if it lowers the later
      of the two instances' finishes: ``remaining_work(thief) + job.predicted_length <
      remaining_work(victim)`` (the victim's work includes the job; a tie is refused), else the
      thief takes nothing. Moving the job adds its length to the thief's work and takes it off
      the victim's; where the thief would then end at or past the victim's present finish, the
      later of the two finishes got no earlier, only moved. Without the test a thief whose queue
      ran dry took the victim's highest-priority (longest) group every time, victims stole in
      turn, and long groups piled up on whichever instance asked first (docs/scheduler.md, the
      64-device grid). Only the instance with the most remaining work is asked: when its best
      admissible job fails the test, the thief takes nothing this time. Without an estimator a
      running group counts its full prediction on either side until it finishes (counting
      nothing, the test would compare queued work alone and refuse almost no steal:
      docs/scheduler.md, the ablation's "+ guided dispatch" row). A thief steals only while it
      holds fewer sequences than the plan assumed an instance runs (``steal_room``, the planned
      ``max_num_seqs``): the plan balanced the instances' work at that concurrency, and every
      sequence past it slows each group the thief already runs (its earlier iteration's long
      groups), which no plan priced. Where an instance can really hold more than planned (vLLM's
      KV memory decides), stealing into that extra room took others' next-iteration groups and
      made the run behave like a shared queue (docs/scheduler.md, the robustness grid). Where
      an instance holds at most the planned concurrency, as the runtime's group slots ensure,
      this never refuses a steal.

    Callers that serve several instances at once should let every instance take its own
    jobs first (``steal=False``) and only then steal: a job taken from an instance that was
    about to start it helps no one, and an instance the plan keeps light on purpose (the
    host of a long tail) must not fill up with others' work; tail-aware concurrency caps
    such an instance's room, so it does not ask.
    """

    def __init__(self, jobs: Iterable[Job], num_instances: int, admission: AdmissionController,
                 shared: bool = False, dispatch: str = "static", remaining: RemainingWork | None = None,
                 steal_room: int = 0, group_size: int = 1, held: Callable[[int], int] | None = None):
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {', '.join(DISPATCH_MODES)}, got {dispatch!r}")
        self.adm = admission
        self.shared = shared
        self.guided = dispatch == "guided" and not shared
        self.estimator = remaining
        # guided dispatch: a thief holding steal_room sequences or more steals nothing (0: no limit);
        # held(r) = sequences instance r holds (default: its groups in flight x group_size; the
        # simulator sets its instances' exact count)
        self.steal_room = int(steal_room)
        self.group_size = int(group_size)
        self.held = held
        self.stolen = 0    # steals over the run; the latest STEAL_RECORD of them, in order:
        self.steals: deque[tuple[Job, int, int]] = deque(maxlen=STEAL_RECORD)   # (job, from, to instance)
        self.alive = [True] * num_instances
        self.queues: list[RankQueue] = [RankQueue() for _ in range(1 if shared else num_instances)]
        # the first (lowest) iteration of every non-empty queue, sorted: guided dispatch's steal pass
        # looks at the other queues only when one of them holds an admissible job (first <= limit)
        self._firsts: list[int] = []
        # keyed by (epoch, prompt_id): a prompt recurs once per epoch
        self.running: dict[tuple[int, str], tuple[int, Job]] = {}  # -> (instance, job)
        self.running_on: list[set] = [set() for _ in range(num_instances)]
        # per instance, the sum of its running jobs' predicted lengths (remaining work without an estimator)
        self.running_work: list[float] = [0.0] * num_instances
        # re-estimated remaining work of each instance's running groups, memoised while a caller
        # holds the instances' state still (``memo_running``); None: always asked afresh
        self._run_memo: dict[int, float] | None = None
        # with it, per admission limit: the instances with an admissible queued job, most remaining
        # work first (guided dispatch's victims), until any queue, running set or progress moves
        self._victims_memo: dict[int, list[int]] = {}
        # with it, per instance whose running work was only bounded (``_no_gain``): the largest
        # lower bound of it seen, until its progress moves
        self._low_memo: dict[int, float] = {}
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
            self._push(q, job)
            self.total += 1
            n += 1
        return n

    def _push(self, q: int, job: Job) -> None:
        queue = self.queues[q]
        before = queue.first_iteration()
        queue.push(job)
        self._first_moved(before, queue.first_iteration())
        self._victims_memo.clear()

    def _pop(self, q: int, job: Job) -> None:
        queue = self.queues[q]
        before = queue.first_iteration()
        queue.pop(job)
        self._first_moved(before, queue.first_iteration())
        self._victims_memo.clear()

    def _first_moved(self, before: int | None, after: int | None) -> None:
        if before == after:
            return
        if before is not None:
            del self._firsts[bisect.bisect_left(self._firsts, before)]
        if after is not None:
            bisect.insort(self._firsts, after)

    # decisions -----------------------------------------------------------------
    def _queue(self, instance: int) -> RankQueue:
        return self.queues[0 if self.shared else instance]

    def _limit(self, instance: int) -> int:
        return self.adm.instance_version[instance] + self.adm.k

    def peek(self, instance: int, steal: bool = True) -> Job | None:
        """The job ``instance`` would take next, or None (queue empty or lag-blocked)."""
        return self._pick(instance, steal)[0]

    def _pick(self, instance: int, steal: bool = True) -> tuple[Job | None, int | None]:
        if not self.alive[instance]:
            return None, None
        own = 0 if self.shared else instance
        adm = self.adm
        limit = adm.instance_version[instance] + adm.k      # _limit, inlined (hot)
        q = self.queues[own]
        job = q.best(limit) if q.iters and q.iters[0] <= limit else None
        if job is not None or not (self.guided and steal):
            return job, own
        # the victims with an admissible job, then the one with the most remaining work among them
        # (remaining work is asked only of those: with re-estimation it is the costly part). The own
        # queue has none, so no queue's first iteration <= limit means no victim (the usual case)
        if not self._firsts or self._firsts[0] > limit or not self.may_steal(instance):
            return None, None
        if self._run_memo is None:
            cand = [i for i, q in enumerate(self.queues)
                    if i != instance and self.alive[i] and q.iters and q.iters[0] <= limit]
            if not cand:
                return None, None
            work = {i: self.remaining_work(i) for i in cand}
            v = min(cand, key=lambda i: (-work[i], i))
            work_v = work[v]
            job = self.queues[v].best(limit)
        else:   # memoised: every thief of this limit until something moves asks the same victims
            victims = self._victims_memo.get(limit)
            if victims is None:
                victims = self._victims_memo[limit] = self._top_victims(limit)
            v, work_v, job = victims[0] if victims[0][0] != instance else victims[1]
            if v is None:
                return None, None
        # a steal must lower the later of the two instances' finishes (see the class doc): the
        # thief's remaining work plus the job stays below the victim's (which includes the job)
        if job is None or self._no_gain(instance, job.predicted_length, work_v):
            return None, None
        return job, v

    def _no_gain(self, instance: int, predicted: float, work_v: float) -> bool:
        """``remaining_work(instance) + predicted >= work_v`` (a steal refused). When the thief's
        running work is not memoised, an estimator with ``remaining_reaches(keys, enough)``
        (``enough(remaining_sum(keys))`` for a monotone test, with the same side effects, which
        may decide it without every term) is asked that."""
        memo = self._run_memo
        if memo is not None and instance not in memo:
            reaches = getattr(self.estimator, "remaining_reaches", None)
            if reaches is not None:
                work = self.queues[instance].work
                low = self._low_memo.get(instance)
                if low is not None and work + low + predicted >= work_v:
                    return True     # a lower bound seen since its progress last moved decides it
                seen: list[float] = []

                def enough(run: float) -> bool:
                    seen.append(run)
                    return work + run + predicted >= work_v

                refused = reaches(self.running_on[instance], enough)
                if refused:         # every value tested is a lower bound of the running work
                    self._low_memo[instance] = max(seen) if low is None else max(low, *seen)
                else:               # only the exact sum, tested last, refuses nothing
                    memo[instance] = seen[-1]
                return refused
        return self.remaining_work(instance) + predicted >= work_v

    def _top_victims(self, limit: int) -> tuple[tuple, tuple]:
        """The two instances with an admissible job for ``limit`` and the most remaining work (ties:
        the lower index), each as (instance, remaining work, its best admissible job); (None, 0.0,
        None) where there are fewer. A thief takes the first that is not itself, as the whole list
        sorted by (-work, index) would give it. Every candidate is asked, in index order."""
        alive, memo, fresh = self.alive, self._run_memo, self.estimator is None or self._run_memo is None
        v1 = v2 = None
        w1 = w2 = 0.0
        for i, q in enumerate(self.queues):
            if not (alive[i] and q.iters and q.iters[0] <= limit):
                continue
            if fresh:
                w = self.remaining_work(i)
            else:           # remaining_work(i), inlined: the memoised running work, else asked now
                run = memo.get(i)
                if run is None:
                    run = memo[i] = self._running_remaining(i)
                w = q.work + run
            if v1 is None or w > w1:
                v1, w1, v2, w2 = i, w, v1, w1
            elif v2 is None or w > w2:
                v2, w2 = i, w
        return tuple((v, w, None if v is None else self.queues[v].best(limit)) for v, w in ((v1, w1), (v2, w2)))

    def may_take(self, instance: int, steal: bool = True) -> bool:
        """False when ``peek``/``next_for`` would give ``instance`` nothing: a cheap test (no
        estimator asked) that callers scanning many instances run first. True does not promise
        a job: ``peek`` decides."""
        if not self.alive[instance]:
            return False
        limit = self.adm.instance_version[instance] + self.adm.k
        own = self.queues[0 if self.shared else instance].iters
        if own and own[0] <= limit:
            return True
        return (self.guided and steal and bool(self._firsts) and self._firsts[0] <= limit
                and self.may_steal(instance))

    def may_steal(self, instance: int) -> bool:
        """Guided dispatch: ``instance`` holds fewer sequences than the plan's concurrency."""
        if self.steal_room <= 0:
            return True
        held = self.held(instance) if self.held is not None else len(self.running_on[instance]) * self.group_size
        return held < self.steal_room

    def remaining_work(self, instance: int) -> float:
        """Tokens per sample left on ``instance``: its queued jobs' predictions plus its running
        groups' re-estimated remaining lengths (with an estimator) or, without one, their
        predictions (``Job.predicted_length``, counted in full until the group finishes)."""
        work = self.queues[0 if self.shared else instance].work
        if self.estimator is None:
            return work + self.running_work[instance]
        memo = self._run_memo
        if memo is None:
            return work + self._running_remaining(instance)
        run = memo.get(instance)
        if run is None:
            run = memo[instance] = self._running_remaining(instance)
        return work + run

    def _running_remaining(self, instance: int) -> float:
        """The sum of the estimator's ``remaining`` over ``instance``'s running groups, in the set's
        order; an estimator with ``remaining_sum(keys)`` (the same sum in one call) is asked that."""
        est = self.estimator
        total = getattr(est, "remaining_sum", None)
        if total is not None:
            return total(self.running_on[instance])
        return sum(est.remaining(key) for key in self.running_on[instance])

    def memo_running(self, on: bool) -> None:
        """Memoise (``on``) or stop memoising each instance's running remaining work.

        Guided dispatch asks every candidate victim's remaining work on every steal attempt; a
        caller that knows when each instance's progress moves (the simulator, whose instances
        report every advance) memoises it: an instance's entry is dropped when a group starts or
        finishes on it or it fails (here) and when the caller says it progressed (:meth:`forget`).
        The answers are the ones asked afresh would give, as long as only those change them."""
        self._run_memo = {} if on else None
        self._victims_memo.clear()
        self._low_memo.clear()

    def forget(self, instance: int) -> None:
        """``instance``'s progress moved: its memoised running remaining work is stale."""
        if self._run_memo is not None:
            self._run_memo.pop(instance, None)
            self._low_memo.pop(instance, None)
            self._victims_memo.clear()

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

    def steals_since(self, seen: int) -> list[tuple[Job, int, int]]:
        """The steals after the run's first ``seen``, in order (read from the latest STEAL_RECORD)."""
        new = self.stolen - int(seen)
        if new > len(self.steals):
            raise RuntimeError(f"{new} steals since steal {seen}, more than the {len(self.steals)} the dispatcher "
                               f"keeps: read them after every admission pass")
        return [self.steals[-i] for i in range(new, 0, -1)]

    # state updates ---------------------------------------------------------------
    def next_for(self, instance: int, steal: bool = True) -> tuple[Job, int] | None:
        """Pop the next admissible job for ``instance``: (job, admission_version) or None.
        ``steal=False``: only the instance's own jobs (guided dispatch's first pass)."""
        job, q = self._pick(instance, steal)
        if job is None:
            return None
        self._pop(q, job)
        if not self.shared and q != instance:
            self.stolen += 1
            self.steals.append((job, q, instance))
        version = self.adm.on_admit(instance, job.iteration)
        key = (job.epoch, job.prompt_id)
        self.running[key] = (instance, job)
        self.running_on[instance].add(key)
        self.running_work[instance] += job.predicted_length
        self.forget(instance)
        return job, version

    def on_finish(self, prompt_id: str, epoch: int = 0) -> Job:
        key = (epoch, prompt_id)
        if key in self.finished:
            raise ValueError(f"prompt {prompt_id} of epoch {epoch} finished twice")
        instance, job = self.running.pop(key)
        self.running_on[instance].discard(key)
        self.forget(instance)
        # an instance running nothing has none left (no float residue from the running sum)
        left = self.running_work[instance] - job.predicted_length
        self.running_work[instance] = left if self.running_on[instance] else 0.0
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
        self.running_on[instance].clear()
        self.running_work[instance] = 0.0
        self.forget(instance)
        if not self.shared:
            self._first_moved(self.queues[instance].first_iteration(), None)
            moved.extend(self.queues[instance].drain())
        survivors = [i for i, a in enumerate(self.alive) if a]
        if not survivors:
            raise RuntimeError("every rollout instance has failed")
        for job in sorted(moved):
            if self.shared:
                self._push(0, job)
            else:
                target = min(survivors, key=lambda i: (len(self.queues[i]), i))
                self._push(target, job)
        return moved

    def on_instance_restarted(self, instance: int) -> None:
        """A restarted instance rejoins, or a new one (an index past the last) joins; either must be
        synced to the current version first (:meth:`AdmissionController.on_instance_synced`)."""
        if not self.shared:
            while instance >= len(self.queues):
                self.queues.append(RankQueue())
        while instance >= len(self.alive):
            self.alive.append(False)
        while instance >= len(self.adm.instance_version):
            self.adm.instance_version.append(0)
        self.alive[instance] = True
        self._victims_memo.clear()
        while instance >= len(self.running_on):
            self.running_on.append(set())
        while instance >= len(self.running_work):
            self.running_work.append(0.0)
