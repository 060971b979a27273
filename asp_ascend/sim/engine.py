"""The discrete-event loop: R rollout instances (:mod:`.instances`), one trainer (:mod:`.trainer`).

Admission goes through the schedule's :class:`~asp_ascend.scheduler.execution.ExecutionPlan`
and its :class:`~asp_ascend.scheduler.execution.Feeder` (shared with the runtime): a prompt group
is taken whenever an instance has room (default: running + waiting sequences < max_num_seqs,
vLLM's own queue; own queues fill up in turn, a shared queue is spread one group at a time
over the instances that can admit, least-loaded first; ``group_slots``: the runtime's rule, at most
``max_num_seqs // G`` groups per instance, instances that can admit at the same moment taking
one job at a time). Lag control is the shared admission state machine: instances take the new
version at the end of each weight sync (pausing during it when ``sync_pause``), or, with
``barrier`` (verl's one-step-off), only between generation batches. An instance admits work
that its new version made admissible ``admit_latency_s`` after its sync (with ``group_slots``,
also a new group that long after a group frees its slot); each admission then reaches the
instance's engine ``admit_each_s`` later, one after another, and costs a busy instance's engine
``admit_engine_s`` (``Instances``). ``batched_tokens`` > 0 (``rollout.max_num_batched_tokens``): the
instances prefill in chunks within each step's token budget, as vLLM V1 does (``ChunkedInstances``,
sim/chunked.py); 0: an admitted sequence's prefill stalls its instance.

Events, in processing order at equal times: a publish (end of a weight sync), the end of a
trainer step, a version reaching an instance, a freed slot, an instance boundary, a steal pass.
Output: a :class:`~asp_ascend.sim.output.SimTimeline` (the DESIGN 5 events) for
:func:`asp_ascend.metrics.summarize`.
"""
from __future__ import annotations

import heapq

from ..scheduler.cost import CostModel
from ..scheduler.execution import ExecutionPlan, ExecutionSettings, jobs_from_columns
from .chunked import ChunkedInstances
from .instances import INST, Instances
from .jobs import SimJobs
from .mechanisms import MechanismLog, SimMechanisms, SimProgress
from .output import SimTimeline, build_timeline
from .trainer import PUBLISH, TRAIN, Trainer, TrainerSpec

VERSION, SLOT, STEAL = 2, 3, 5       # the other event kinds (PUBLISH 0, TRAIN 1, INST 4)

__all__ = ["Engine", "SimJobs", "SimTimeline", "TrainerSpec"]


class Engine:
    """One simulated run. Build, then :meth:`run` (returns a :class:`SimTimeline`)."""

    def __init__(self, jobs: SimJobs, settings: ExecutionSettings, *, cost: CostModel,
                 kv_capacity: int, trainer: TrainerSpec,
                 stream_train: bool = True, barrier: bool = False, sync_pause: bool = True,
                 record_samples: bool = True, group_slots: bool = False, trace: list | None = None,
                 mechanisms: SimMechanisms | None = None, fast_path: bool = True, batched_tokens: int = 0):
        self.jobs = jobs
        self.mech = mechanisms or SimMechanisms()   # the tail mechanisms (DESIGN 9; sim/mechanisms.py)
        self.settings = settings   # instances, concurrency, k, shared queue, guided dispatch
        self.R = int(settings.num_instances)
        self.cm = cost
        self.mns = int(settings.max_num_seqs)
        self.kv = int(kv_capacity)
        self.batched_tokens = int(batched_tokens or 0)   # chunked prefill's step budget (0: prefill stalls)
        self.tr = trainer
        self.k = int(settings.lag_bound)
        self.stream = stream_train
        self.barrier = barrier
        self.sync_pause = sync_pause and not barrier
        self.record_samples = record_samples
        self.group_slots = group_slots
        self.trace = trace         # a list: every admission and admission event (Feeder.trace)
        self.fast_path = fast_path   # plain systems admit without the mechanism glue (see _build)
        J, G = jobs.resp.shape
        self.J, self.G = J, G
        if J == 0:
            raise ValueError("nothing to simulate: the schedule has no prompts")
        if G != settings.group_size:
            raise ValueError(f"the jobs have groups of {G} samples, the settings {settings.group_size}")
        if not settings.shared_queue and (jobs.instance.min() < 0 or jobs.instance.max() >= self.R):
            raise ValueError(f"schedule places prompts on instances {jobs.instance.min()}..{jobs.instance.max()} "
                             f"but the simulated system has {self.R}")

    # ------------------------------------------------------------------ setup
    def _push(self, t, kind, x, tok=0):
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, x, tok))

    def _build(self) -> None:
        jobs = self.jobs
        self._events: list = []
        self._seq = 0
        moves = self.mech.partial_rollout or self.mech.regroup    # the membership may change at run time
        self.trainer = Trainer(jobs, self.tr, self.stream, self._push, self._start_sync,
                               self._trainer_waits if moves else None, decoding=lambda: any(self.inst.n),
                               trained=self._trained if moves else None,
                               choosing=self._trainer_takes if self.mech.regroup_heavy else None)
        job_objs = jobs_from_columns(jobs.iteration, jobs.dispatch_rank, [str(p) for p in jobs.prompt_id.tolist()],
                                     jobs.epoch, jobs.instance, jobs.mini_batch, jobs.predicted_length)
        self.job_of = {(j.epoch, j.prompt_id): x for x, j in enumerate(job_objs)}
        self.key_of = [(j.epoch, j.prompt_id) for j in job_objs]    # job index -> (epoch, prompt_id)
        self.plan = ExecutionPlan(self.settings, job_objs)
        self.dispatcher = self.plan.dispatcher
        self.adm = self.dispatcher.adm
        self.feeder = self.plan.feeder(self.trace)
        chunked = {"batched_tokens": self.batched_tokens} if self.batched_tokens else {}
        self.inst = (ChunkedInstances if chunked else Instances)(
            jobs, self.R, self.cm, self.mns, self.kv, self._push, self._group_done,
            speculation=self.mech.speculation, version_of=self.adm.instance_version.__getitem__,
            admit_each_s=self.tr.admit_each_s, admit_engine_s=self.tr.admit_engine_s, **chunked)
        self.dispatcher.held = self.inst.held       # guided dispatch's steal room, in sequences exactly
        # the mechanisms' events, counted; kept (at the engine's event time ``self.t``) only when
        # the timeline is recorded (``record_samples``: it will be written)
        self.log = MechanismLog(events={} if self.record_samples else None)
        self.t = 0.0
        self._steals = 0           # guided dispatch's steals already in the timeline
        self.tc = None             # the tail glue shared with the runtime (scheduler/tail_control.py)
        if self.mech.any_control:
            from ..scheduler.tail_control import TailControl

            self.tc = TailControl(self.plan, self.mech.options(jobs), max_tokens=self.mech.max_tokens,
                                  event=self.log, now=lambda: self.t)
            # per job, its samples' lengths and its prompt's, as TailControl.on_finish takes them
            self._resp_rows, self._plen = jobs.resp.tolist(), jobs.prompt_length.astype(float).tolist()
            if self.tc.estimator is not None:
                self.dispatcher.estimator = SimProgress(self.tc, self.inst, self.job_of)
        self.gov = None if self.tc is None else self.tc.governor    # tail-aware concurrency's caps
        # the fast path: a system that uses no tail mechanism (no estimator, no caps, no carry-over,
        # no guided dispatch), no group slots and no barrier admits while an instance holds fewer
        # than its max_num_seqs sequences, straight from the feeder (the same admissions as the
        # general path: tests/sim/test_sim_fast_path.py)
        self.plain = (self.fast_path and self.tc is None and not self.dispatcher.guided and not self.group_slots
                      and not self.barrier)
        self.resumed: list[int] = []   # shared queue: instances back from a sync pause, not yet stepping
        self.released = 0          # barrier mode: highest iteration released for generation
        self.dirty = False         # a group finished: trainer/barrier must react (see _react)
        self._sizes: dict[int, float] = {}   # carry-over: iteration -> defer_share x its groups

    # ------------------------------------------------------------------ admission
    def _has_room(self, r: int) -> bool:
        if self.group_slots:
            if self.feeder.inflight[r] >= self.feeder.slots:
                return False
            held = self.feeder.inflight[r] * self.G
        else:
            inst = self.inst
            held = inst.n[r] + len(inst.waiting[r])      # Instances.held / has_room, inlined (hot)
            if held >= inst.cap[r]:
                return False
        gov = self.gov
        if gov is None or gov.cap(r) >= self.mns:
            return True
        if not self.tc.rooms:      # no planned room (reactive caps): no job is a tail itself
            return held < gov.cap(r) or self.tc.passes_cap(r)
        job = self.dispatcher.peek(r, True)     # tail-aware concurrency: under the cap unless a tail itself
        return job is None or gov.admits(r, held, self.tc.rooms.get((job.epoch, job.prompt_id), 0))

    def _admit(self, r: int, job, ver: int) -> None:
        self.inst.enqueue(r, self.job_of[(job.epoch, job.prompt_id)], ver)
        if self.tc is not None:
            self.tc.on_admit(r, job)
        if self.log.events is not None and self.dispatcher.stolen != self._steals:   # a steal, recorded
            from ..scheduler.tail_control import steal_events

            self._steals = steal_events(self.dispatcher, self._steals, self.log, self.t)

    def _gate(self, job) -> bool:
        return job.iteration <= self.released

    def _fill(self, r: int, steal: bool = True) -> None:
        """Take jobs through the feeder and admit waiting sequences (at boundary T[r])."""
        inst = self.inst
        if self.plain:
            n, waiting, cap, admit, job_of = inst.n, inst.waiting, inst.cap, self.feeder.admit, self.job_of
            while n[r] + len(waiting[r]) < cap[r] and self.dispatcher.may_take(r):
                got = admit(r)
                if got is None:
                    break
                job, ver = got
                inst.enqueue(r, job_of[(job.epoch, job.prompt_id)], ver)
            inst.start_waiting(r)
            return
        # a full instance (most boundaries: one sequence of many finished) or one with nothing it
        # could take, even by stealing (most of the others: lag-blocked) skips the feeder: its room
        # rule and next_for would say no without asking the estimator (Dispatcher.may_take)
        if ((self.group_slots or inst.n[r] + len(inst.waiting[r]) < inst.cap[r])
                and self.dispatcher.may_take(r, True)):
            for job, ver in self.feeder.take(r, lambda: self._has_room(r), self._gate if self.barrier else None,
                                             steal):
                self._admit(r, job, ver)
        inst.start_waiting(r)

    def _wake(self, t: float) -> None:
        """Admissible work may have appeared: let instances with room take it, their own
        jobs first, then (guided dispatch) others' jobs not yet started."""
        if self.group_slots:
            return self._wake_together(t)
        if self.dispatcher.shared:
            return self._wake_spread(t)
        inst, disp = self.inst, self.dispatcher
        # without guided dispatch a second pass admits nothing: the queues only shrank, and an
        # instance the first pass skipped (paused, full, nothing admissible) is still so
        n, waiting, cap, paused = inst.n, inst.waiting, inst.cap, inst.paused
        for steal in (False, True) if disp.guided else (False,):
            # an instance's held count changes only when it is itself advanced or filled (once a pass)
            held = [n[r] + len(waiting[r]) for r in range(self.R)]
            # paused or full instances are left out first (neither changes during a pass); the
            # stable sort keeps the others in the order the full sort gives them
            for r in sorted([r for r in range(self.R) if not paused[r] and held[r] < cap[r]], key=held.__getitem__):
                # may_take first (cheap, asks no estimator); with tail caps the room rule itself
                # peeks with stealing, so then only may_take(r, True) may skip it. Where may_take says
                # no, peek says no too without asking the estimator: the steal pass peeks at once
                if self.gov is not None:
                    if not disp.may_take(r, True) or not self._has_room(r):    # (else: held < cap is room)
                        continue
                elif not steal and not disp.may_take(r, False):
                    continue
                head = disp.peek(r, steal)
                if head is None or (self.barrier and head.iteration > self.released):
                    continue
                inst.advance(r, t)
                self._fill(r, steal)
                inst.schedule(r)

    def _wake_spread(self, t: float) -> None:
        """A shared queue: the instances that can admit now take one prompt group at a time, the
        one holding the fewest sequences first (ties: lowest index), as verl's and vLLM's routers
        send each request to the least-loaded replica and MindSpeed-RL splits a batch evenly over
        its rollout ranks; filling one instance up before the next would leave the others idle
        whenever a burst is smaller than the instances' total room. Only the instances that can
        admit at ``t`` share: after a weight sync an idle instance can at the sync's end, a busy
        one at its next step boundary, so a new version's work fills the idle ones first (up to
        their room), which the analytic estimate models too (``scheduler/estimate.py``)."""
        inst, disp = self.inst, self.dispatcher
        n, waiting, cap, paused = inst.n, inst.waiting, inst.cap, inst.paused
        heap = [(n[r] + len(waiting[r]), r) for r in range(self.R)
                if not paused[r] and n[r] + len(waiting[r]) < cap[r] and disp.may_take(r)]
        heapq.heapify(heap)
        touched: list[int] = []      # instances advanced to t, in the order they first admitted
        seen = [False] * self.R
        while heap:
            _, r = heapq.heappop(heap)
            if not self._has_room(r):
                continue
            head = disp.peek(r, False)
            if head is None or (self.barrier and head.iteration > self.released):
                continue            # not admissible on this instance (its version); others may differ
            if not seen[r]:
                inst.advance(r, t)
                seen[r] = True
                touched.append(r)
            job, ver = self.feeder.admit(r)
            self._admit(r, job, ver)
            if n[r] + len(waiting[r]) < cap[r]:
                heapq.heappush(heap, (n[r] + len(waiting[r]), r))
        for r in touched:
            inst.start_waiting(r)
            inst.schedule(r)
        for r in self.resumed:
            if not seen[r]:
                inst.schedule(r)
        self.resumed.clear()

    def _wake_together(self, t: float) -> None:
        """The runtime's rule: the instances that can admit now take one job at a time (Feeder.fill)."""
        inst, disp, g = self.inst, self.dispatcher, (self._gate if self.barrier else None)
        ready = [r for r in self.feeder.order() if not inst.paused[r] and self._has_room(r)
                 and (head := disp.peek(r, True)) is not None and (g is None or g(head))]
        for r in ready:
            inst.advance(r, t)
        room = (lambda x: x in ready and not inst.paused[x] and self._has_room(x))
        for r, job, ver in self.feeder.fill(g, room=room):
            self._admit(r, job, ver)
        for r in ready:
            inst.start_waiting(r)
            inst.schedule(r)

    # ------------------------------------------------------------------ reactions
    def _group_done(self, j: int, t: float) -> None:
        jobs = self.jobs
        r = self.inst.seq_inst[j * self.G]
        late = self.tr.admit_latency_s > 0
        if late:                            # the runtime learns of the free slot this much later
            self._push(t + self.tr.admit_latency_s, SLOT, r)
        key = self.key_of[j]
        self.feeder.finished(key[0], key[1], release=not late)
        if self.tc is not None:
            self.tc.on_finish(key, self._resp_rows[j], self._plen[j])
        self.trainer.on_group(j, t)
        self.dirty = True

    def _react(self, t: float) -> None:
        """Reactions to finished groups run at top level (never inside an instance update)."""
        while self.dirty:
            self.dirty = False
            if self.barrier:
                self._try_release(t)
            self.trainer.try_step(t)

    def _trainer_waits(self, i: int, t: float, streaming: int = -1) -> None:
        """The trainer waits on iteration ``i`` (``streaming`` >= 0: the mini-batch it streams waits
        for a group). Regroup first (lossless: groups move within the iteration); then, if still
        nothing is ready and few of its groups are left, carry-over defers the late ones against
        generated groups of iteration i + 1."""
        tr = self.trainer
        if self.mech.regroup:
            target = None if streaming < 0 else tr.mb_mini[streaming]
            moves = self.tc.regroup(i, target)
            for sw in moves:
                tr.swap(self.job_of[sw.deferred], self.job_of[sw.swapped_in])
            if moves:
                return
        if not self.mech.partial_rollout:
            return
        left = tr.it_gen_left[i]
        if left == 0 or left > max(1.0, self._size(i)):
            return
        for sw in self.tc.maybe_defer(i):
            tr.swap(self.job_of[sw.deferred], self.job_of[sw.swapped_in])

    def _trainer_takes(self, i: int, x: int) -> None:
        """``pipeline.regroup_heavy``: the trainer is about to train mini-batch ``x`` (all generated) of
        iteration ``i``: it takes the heaviest generated groups of i's untrained mini-batches."""
        self.trainer.exchange([(self.job_of[sw.deferred], self.job_of[sw.swapped_in])
                               for sw in self.tc.heavy_first(i, self.trainer.mb_mini[x])])

    def _trained(self, i: int, m: int) -> None:
        """Carry-over or regroup: mini-batch (i, m) was trained. As the runtime's orchestrator does at the end
        of an optimizer step, its groups stop being swap donors (``TailControl.on_trained``; they
        stay in iteration i's budget)."""
        self.tc.on_trained(i, m)

    def _size(self, i: int) -> float:
        size = self._sizes.get(i)
        if size is None:
            size = self._sizes[i] = self.mech.defer_share * sum(len(v) for v in self.plan.iterations.get(i, {}).values())
        return size

    def _start_sync(self, t: float, version: int) -> None:
        if self.sync_pause:
            self._pause_all(t, self.trainer.sync_dur, version)

    def _pause_all(self, t: float, dur: float, version: int) -> None:
        for r in range(self.R):
            self.inst.pause(r, t, dur, version)

    def _on_publish(self, v: int, t: float) -> None:
        self.feeder.published(v)
        self.trainer.on_publish(v)
        if self.barrier:
            self._try_release(t)
        elif not self.sync_pause:
            for r in range(self.R):
                self._version_arrives(r, v, t)
            self._wake(t)
        self.trainer.try_step(t)

    def _version_arrives(self, r: int, v: int, t: float) -> None:
        """Instance r holds version v: new work becomes admissible after the admission latency."""
        if self.tr.admit_latency_s > 0:
            self._push(t + self.tr.admit_latency_s, VERSION, r, v)
        else:
            self.feeder.synced(r, v)

    def _try_release(self, t: float) -> None:
        """Barrier: generation of iteration i+1 starts once iteration i is generated and version i
        exists; instances then take version i (lag exactly 1) while iteration i+1 generates."""
        tr, changed = self.trainer, False
        while (self.released + 1 < tr.n_it and tr.it_gen_left[self.released] == 0
               and self.adm.published >= self.released):
            self.released += 1
            changed = True
        if changed:
            v = self.released - 1
            if v > self.adm.instance_version[0]:
                self._pause_all(t, self.tr.sync_s, v)
            else:
                self._wake(t)

    # ------------------------------------------------------------------ loop
    def _on_instance(self, r: int, t: float) -> None:
        inst = self.inst
        if inst.paused[r]:
            self._version_arrives(r, inst.resume(r, t), t)
            if self.dispatcher.shared and not self.group_slots:
                # a shared queue is spread over every instance that resumed at t (_wake_spread,
                # at the steal pass below) instead of filling this one first; it steps from then
                self.resumed.append(r)
            else:
                self._fill(r, steal=False)
                inst.schedule(r)
            self._push(t, STEAL, -1)     # others' jobs only once every instance took its own
            return
        inst.at_event(r)
        self._fill(r)
        inst.schedule(r)

    def run(self) -> SimTimeline:
        self._build()
        inst, tr, feeder = self.inst, self.trainer, self.feeder
        disp = self.dispatcher
        # guided dispatch asks every candidate victim's remaining work on each steal attempt, and a
        # refused thief asks again at its next event: the dispatcher memoises the answers for the
        # whole run, told by the instances whenever one's sequences progress (advanced or at an
        # event; starts, finishes and failures it sees itself), so each answer is the fresh one
        memo = disp.guided and not disp.shared and not self.group_slots and disp.estimator is not None
        if memo:
            inst.moved = disp.forget
            disp.memo_running(True)
        try:
            self._loop()
        finally:
            if memo:
                disp.memo_running(False)
                inst.moved = None
        self._check_done()
        self.preemptions = inst.preemptions
        return build_timeline(self.jobs, tr.table(), inst, tr.queue, tr.step_rows, tr.sync_rows, self.record_samples,
                              members=tr.members, trained_iteration=tr.job_it, streamed=tr.by_group,
                              events=self.log.events)

    def _loop(self) -> None:
        inst, tr, feeder = self.inst, self.trainer, self.feeder
        if self.group_slots:
            self._wake_together(0.0)
        elif self.dispatcher.shared:
            self._wake_spread(0.0)
        else:
            for r in range(self.R):
                self._fill(r)
                inst.schedule(r)
        events = self._events
        while events:
            t, kind, _, x, tok = heapq.heappop(events)
            self.t = t
            if kind == INST:
                if tok == inst.ev_tok[x]:
                    self._on_instance(x, t)
            elif kind == TRAIN:
                tr.on_train_end(x, t)
            elif kind == VERSION:
                feeder.synced(x, tok)
                self._wake(t)
            elif kind == STEAL:
                self._wake(t)
            elif kind == SLOT:
                feeder.release(x)
                if self.group_slots:
                    self._wake(t)
            else:
                self._on_publish(x, t)
            if self.dirty:
                self._react(t)

    def _check_done(self) -> None:
        if not self.dispatcher.done:
            raise RuntimeError(f"simulation deadlocked with {self.dispatcher.pending()} prompt groups never "
                               f"admitted (lag bound {self.k}); this is a bug")
        if self.trainer.cur_it != self.trainer.n_it:
            raise RuntimeError(f"trainer stopped at iteration {self.trainer.cur_it} of {self.trainer.n_it}; "
                               "this is a bug")
