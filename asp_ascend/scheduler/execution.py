"""A schedule becomes an executable plan: the one piece of glue between the planner and every executor.

Three executors run a schedule: the simulator (:mod:`asp_ascend.sim.engine`, simulated time), the
runtime (:mod:`asp_ascend.pipeline`, Ray actors) and the MindSpeed-RL sample source
(:mod:`asp_ascend.integrations.mindspeed_rl.sample_source`). Each of them

1. derives its settings once, :meth:`ExecutionSettings.from_config` (or builds them directly, as
   the simulator does for each system policy): the lag bound k after the sync rule, the
   admission rule (group slots or sequences per instance), whether instances share one queue, static or guided dispatch;
2. turns schedule rows into an :class:`ExecutionPlan`: the jobs, the iterations' mini-batches
   (what the trainer takes, in schedule order), the resume position and the
   :class:`~asp_ascend.scheduler.admission.Dispatcher` built with those settings;
3. admits work only through the plan's :class:`Feeder`, and reports every event that changes
   admission to it (a group finished, a version published or received, an instance failed or
   rejoined).

So a rule is written once, and the same events give the same admissions in all three
(``tests/core/test_execution_paths.py`` checks it). Nothing here knows about time, threads, Ray or vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ..config import lag_bound_of
from .admission import AdmissionController, Dispatcher, Job, RemainingWork
from .planner import SHARED_QUEUE

Key = tuple[int, str]   # (epoch, prompt_id): a prompt recurs once per epoch
ADMISSIONS = ("groups", "sequences")   # rollout.admission: the Feeder's room rule


@dataclass(frozen=True)
class ExecutionSettings:
    """The values an executor needs from the config, derived in one place."""
    policy: str = "asp"            # scheduler.policy (decides the shared queue)
    lag_bound: int = 1             # k after the sync rule
    sync_mode: bool = False        # generate the whole iteration, then train
    group_size: int = 8
    max_num_seqs: int = 64         # per-instance concurrency, in sequences
    num_instances: int = 1
    dispatch: str = "static"       # scheduler.dispatch: static | guided (per-instance queues only)
    adaptive: bool = False         # later epochs are planned during the run
    epochs: int = 1
    queue_capacity: int = 1        # the runtime's sample queue, in groups
    planned_max_num_seqs: int = 0  # the concurrency the plan assumed (0: max_num_seqs); guided dispatch's steal room
    admission: str = "groups"      # rollout.admission: groups (group slots) | sequences (unfinished samples)

    @property
    def shared_queue(self) -> bool:
        """fifo/random/sorted: instances pull from one queue; asp/balanced: each has its own."""
        return SHARED_QUEUE[self.policy]

    @property
    def group_slots(self) -> int:
        """Prompt groups in flight per instance: ``max_num_seqs // G`` (at least one)."""
        return max(1, self.max_num_seqs // self.group_size)

    @classmethod
    def from_config(cls, cfg) -> "ExecutionSettings":
        t = cfg.train
        k = lag_bound_of(cfg)
        return cls(policy=cfg.scheduler.policy, lag_bound=k, sync_mode=cfg.pipeline.mode == "sync",
                   group_size=t.group_size, max_num_seqs=cfg.rollout.max_num_seqs,
                   num_instances=cfg.rollout.num_instances, dispatch=cfg.scheduler.dispatch,
                   adaptive=cfg.scheduler.adaptive and t.epochs > 1, epochs=t.epochs,
                   queue_capacity=cfg.pipeline.queue_capacity or t.global_batch_size * (k + 1),
                   admission=cfg.rollout.admission)


def jobs_from_columns(iteration, dispatch_rank, prompt_id, epoch, instance, mini_batch,
                      predicted_length=None) -> list[Job]:
    """One :class:`Job` per schedule row, from its columns (array-likes of equal length)."""
    pl = [0.0] * len(iteration) if predicted_length is None else _pylist(predicted_length)
    return [Job(int(i), int(d), str(p), epoch=int(e), instance=int(r), mini_batch=int(m), predicted_length=float(x))
            for i, d, p, e, r, m, x in zip(_pylist(iteration), _pylist(dispatch_rank), _pylist(prompt_id),
                                           _pylist(epoch), _pylist(instance), _pylist(mini_batch), pl)]


def _pylist(col) -> list:
    return col.tolist() if hasattr(col, "tolist") else list(col)


def jobs_from_schedule(sched) -> list[Job]:
    """The jobs of a schedule table (DESIGN 6 columns), in row order."""
    return jobs_from_columns(*(sched[k] for k in ("iteration", "dispatch_rank", "prompt_id", "epoch", "instance",
                                                  "mini_batch", "predicted_length")))


class ExecutionPlan:
    """Schedule rows as work to execute, from a resume position on.

    ``iterations[i][m]`` lists the (epoch, prompt_id) keys of mini-batch m of iteration i in
    schedule row order: iteration i trains exactly these, one optimizer step per mini-batch.
    ``start`` is the first iteration to train (the version the trainer holds: 0, or a
    checkpoint's); every instance is taken to hold version ``start`` before the first
    admission. ``end`` is one past the last iteration to train. ``remaining``: guided
    dispatch's estimate of a running group's remaining work (see the Dispatcher).
    """

    def __init__(self, settings: ExecutionSettings, jobs: Iterable[Job], *, start: int = 0, end: int | None = None,
                 remaining: RemainingWork | None = None):
        self.settings = settings
        self.start = int(start)
        self.iterations: dict[int, dict[int, list[Key]]] = {}
        self.predicted: dict[int, float] = {}  # iteration -> sum of its prompts' predicted lengths
        self.carried: dict[Key, int] = {}  # resume with partial rollout: a deferred group's planned iteration
        self.predicted_length: dict[Key, float] = {}  # (epoch, prompt_id) -> its predicted length
        jobs = list(jobs)
        self._book(jobs)
        self.end = int(end) if end is not None else (max(self.iterations) + 1 if self.iterations else self.start)
        adm = AdmissionController(settings.lag_bound, settings.num_instances)
        if self.start:
            adm.on_publish(self.start)
            for r in range(settings.num_instances):
                adm.on_instance_synced(r, self.start)
        self.dispatcher = Dispatcher(jobs, settings.num_instances, adm, shared=settings.shared_queue,
                                     dispatch=settings.dispatch, remaining=remaining,
                                     steal_room=settings.planned_max_num_seqs or settings.max_num_seqs,
                                     group_size=settings.group_size)

    @classmethod
    def from_schedule(cls, sched, settings: ExecutionSettings, *, start: int | None = None,
                      max_iterations: int = 0) -> "ExecutionPlan":
        """The plan of schedule table ``sched`` from iteration ``start`` (default: its first).

        Adaptive runs plan one epoch at a time: ``end`` then counts the epochs still to plan
        (every epoch has the same number of iterations). ``max_iterations`` (> 0) stops that
        many iterations after the schedule's first."""
        it = sched["iteration"]
        first = int(it.min())
        end = int(it.max()) + 1
        if settings.adaptive:
            end = first + (end - first) // int(sched["epoch"].nunique()) * settings.epochs
        if max_iterations:
            end = min(end, first + int(max_iterations))
        start = first if start is None else int(start)
        rows = sched[(it >= start) & (it < end)]
        return cls(settings, jobs_from_schedule(rows), start=start, end=end)

    def _book(self, jobs: list[Job]) -> None:
        for j in jobs:
            self.iterations.setdefault(j.iteration, {}).setdefault(j.mini_batch, []).append((j.epoch, j.prompt_id))
            self.predicted[j.iteration] = self.predicted.get(j.iteration, 0.0) + float(j.predicted_length)
            self.predicted_length[(j.epoch, j.prompt_id)] = float(j.predicted_length)

    @property
    def total_iterations(self) -> int:
        return self.end - self.start

    @property
    def next_unplanned(self) -> int:
        """The first iteration no job is planned for yet (where a re-planned epoch starts)."""
        return max(self.iterations) + 1 if self.iterations else self.start

    @property
    def next_epoch(self) -> int:
        """The epoch after the last one with a job in the plan (what ``scheduler.adaptive`` plans next;
        a plan resumed mid-epoch e: e + 1)."""
        return 1 + max((e for mbs in self.iterations.values() for keys in mbs.values() for e, _ in keys), default=-1)

    def add_epoch(self, jobs: Iterable[Job]) -> int:
        """Queue a re-planned epoch (``scheduler.adaptive``), iterations past ``end`` left out;
        returns how many jobs were added."""
        jobs = [j for j in jobs if j.iteration < self.end]
        self._book(jobs)
        return self.dispatcher.add(jobs)

    def feeder(self, trace: list | None = None) -> "Feeder":
        st = self.settings
        if st.admission not in ADMISSIONS:
            raise ValueError(f"rollout.admission: {st.admission!r} is not one of {', '.join(ADMISSIONS)}")
        return Feeder(self.dispatcher, st.group_slots, trace, group_size=st.group_size,
                      max_seqs=st.max_num_seqs if st.admission == "sequences" else 0)


class Feeder:
    """Which instance takes which job next, and every event that changes it.

    The rule: a live instance may hold ``slots`` prompt groups in flight (``max_seqs`` > 0,
    ``rollout.admission: sequences``: it may admit while its unfinished samples are fewer than
    ``max_seqs``, vLLM queueing the rest - the simulator's default rule, which its event loop
    inlines); when several can admit at once they take one job at a time, the one holding the
    fewest sequences first (ties: lowest index), until none can, first each from its own jobs, then (guided
    dispatch) from others' jobs not yet started (:meth:`fill`). Which job comes from the
    :class:`Dispatcher` (schedule order, lag bound, shared queue, guided dispatch). An executor
    whose instances reach admission points one at a time (the simulator, at an instance's
    step boundary) uses :meth:`take` for that instance.

    ``trace`` (a list): every admission and event is appended as a tuple, so two executors fed
    the same events can be shown to admit the same jobs in the same order.

    Unfinished samples under the sequence rule: an admission adds ``group_size``; an executor
    that learns its instances' counts later than their finishes (the runtime's polls) reports
    each count with :meth:`unfinished`, which replaces the instance's count: the count it had,
    plus ``group_size`` per group admitted that it had not received yet. So the rule admits a
    group only while that sum is below ``max_seqs``: at most one group over it, never more.
    """

    def __init__(self, dispatcher: Dispatcher, slots: int, trace: list | None = None, *, group_size: int = 1,
                 max_seqs: int = 0):
        self.disp = dispatcher
        self.adm = dispatcher.adm
        self.slots = int(slots)
        self.G = int(group_size)
        self.max_seqs = int(max_seqs)          # > 0: the sequence rule
        self.inflight = [0] * len(dispatcher.alive)
        self.seqs = [0] * len(dispatcher.alive)  # the sequence rule only (else stays 0): unfinished samples per instance
        self.where: dict[Key, int] = {}
        self.trace = trace

    # decisions -----------------------------------------------------------------
    def alive(self, r: int) -> bool:
        return self.disp.alive[r]

    @property
    def by_sequences(self) -> bool:
        """``rollout.admission: sequences``: the instances' unfinished samples decide the room."""
        return self.max_seqs > 0

    def has_room(self, r: int) -> bool:
        if self.max_seqs:
            return self.seqs[r] < self.max_seqs
        return self.inflight[r] < self.slots

    def held(self, r: int) -> int:
        """Sequences instance ``r`` is taken to hold: its unfinished samples (the sequence
        rule), else G per group in flight."""
        return self.seqs[r] if self.max_seqs else self.inflight[r] * self.G

    def order(self) -> list[int]:
        """Live instances, fewest sequences held first."""
        return sorted((r for r in range(len(self.inflight)) if self.disp.alive[r]), key=self.held)

    def fill(self, gate: Callable[[Job], bool] | None = None,
             room: Callable[[int], bool] | None = None) -> Iterator[tuple[int, Job, int]]:
        """Admit while any live instance has room and an admissible job: yields
        (instance, job, admission version), lazily, so the caller's reaction to one admission
        (a queue reservation) is seen by ``gate`` before the next. ``gate(job)`` may hold a job
        back (backpressure, a barrier); ``room(r)`` replaces the slot rule. Every instance takes
        its own jobs first; only then (guided dispatch) do instances with room take others'."""
        room = room or self.has_room
        for steal in (False, True) if self.disp.guided else (False,):
            progress = True
            while progress:
                progress = False
                for r in self.order():
                    if not room(r):
                        continue
                    job = self.disp.peek(r, steal)
                    if job is None or (gate is not None and not gate(job)):
                        continue
                    yield (r, *self._admit(r, steal))
                    progress = True

    def take(self, r: int, room: Callable[[], bool], gate: Callable[[Job], bool] | None = None,
             steal: bool = True) -> Iterator[tuple[Job, int]]:
        """Admit onto instance ``r`` alone while ``room()``: yields (job, admission version).
        ``steal=False``: its own jobs only (guided dispatch's first pass)."""
        while room():
            if gate is not None:
                job = self.disp.peek(r, steal)
                if job is None or not gate(job):
                    return
            got = self._admit(r, steal)
            if got is None:
                return
            yield got

    def admit(self, r: int) -> tuple[Job, int] | None:
        """One admission onto instance ``r``, its room already checked by the caller: (job,
        admission version), or None when nothing is admissible (:meth:`take` without the room
        rule and the gate, for an executor whose instances have neither a cap nor a barrier)."""
        return self._admit(r)

    # events ----------------------------------------------------------------------
    def _admit(self, r: int, steal: bool = True) -> tuple[Job, int] | None:
        got = self.disp.next_for(r, steal)
        if got is None:
            return None
        job, version = got
        self.inflight[r] += 1
        if self.max_seqs:
            self.seqs[r] += self.G
        self.where[(job.epoch, job.prompt_id)] = r
        if self.trace is not None:
            self.trace.append(("admit", r, job.epoch, job.prompt_id, version))
        return got

    def finished(self, epoch: int, prompt_id: str, release: bool = True) -> tuple[Job, int]:
        """A group came back complete: (its job, the instance that ran it). ``release=False``
        keeps its slot taken until :meth:`release` (an executor that learns of the free slot later)."""
        job = self.disp.on_finish(prompt_id, epoch)
        r = self.where.pop((epoch, prompt_id))
        if release:
            self.release(r)
        if self.trace is not None:
            self.trace.append(("finish", r, epoch, prompt_id))
        return job, r

    def release(self, r: int) -> None:
        self.inflight[r] -= 1

    def unfinished(self, r: int, count: int) -> None:
        """Instance ``r`` reports ``count`` unfinished samples (the sequence rule's count:
        running and queued, plus G per admitted group it has not received yet); ignored under
        the group-slot rule."""
        if self.max_seqs:
            self.seqs[r] = max(0, int(count))
        if self.trace is not None:
            self.trace.append(("unfinished", r, int(count)))

    def published(self, version: int) -> None:
        """The trainer published ``version``."""
        self.adm.on_publish(version)
        if self.trace is not None:
            self.trace.append(("publish", version))

    def synced(self, r: int, version: int) -> None:
        """Instance ``r`` now holds ``version``."""
        self.adm.on_instance_synced(r, version)
        if self.trace is not None:
            self.trace.append(("synced", r, version))

    def failed(self, r: int) -> tuple[list[Job], int]:
        """Instance ``r`` is gone: (its jobs, now queued on survivors; the groups it had in flight)."""
        moved = self.disp.on_instance_failed(r)
        lost, self.inflight[r] = self.inflight[r], 0
        self.seqs[r] = 0
        for job in moved:
            self.where.pop((job.epoch, job.prompt_id), None)
        if self.trace is not None:
            self.trace.append(("failed", r))
        return moved, lost

    def restarted(self, r: int) -> None:
        """Instance ``r`` rejoins (it already holds the newest published version)."""
        self.disp.on_instance_restarted(r)
        while r >= len(self.inflight):
            self.inflight.append(0)
            self.seqs.append(0)
        self.inflight[r] = 0
        self.seqs[r] = 0
        if self.trace is not None:
            self.trace.append(("restarted", r))


STREAM_STARTS = ("half_generated", "fewest_left", "lowest_index")   # pipeline/sim.stream_groups_start


def stream_candidate(rule: str, todo: Iterable[int], size: Callable[[int], int],
                     generated: Callable[[int], int]) -> int | None:
    """Streaming groups into the trainer (``pipeline.stream_groups``, ``sim.stream_groups``): the
    partly generated mini-batch a free trainer starts when none of ``todo`` (the iteration's
    untrained mini-batches, lowest index first) is fully generated. ``size(m)``: its groups;
    ``generated(m)``: how many of them are generated. ``fewest_left``: any with a generated
    group; ``half_generated``: only those at least half generated; both take the one with the
    fewest groups still to generate, then the lowest index. ``lowest_index``: only the lowest-
    indexed one. None: none may start. The runtime's orchestrator and the simulated trainer
    both ask this."""
    if rule not in STREAM_STARTS:
        raise ValueError(f"stream_groups_start: {rule!r} is not one of {', '.join(STREAM_STARTS)}")
    best = None
    for m in todo:
        n, got = size(m), generated(m)
        if rule == "lowest_index":
            return m if got else None
        left = n - got
        if got and (rule != "half_generated" or 2 * left <= n) and (best is None or left < best[0]):
            best = (left, m)
    return None if best is None else best[1]
