"""The tail mechanisms in an executor's loop (DESIGN 9): the scheduler's state machines fed by
the instances' reports, each decision written to the timeline.

The runtime's orchestrator and the simulator's engine each own one :class:`TailControl`, next
to their :class:`~asp_ascend.scheduler.execution.ExecutionPlan`. It holds the state machines
(scheduler/reestimate.py, scheduler/tail.py, scheduler/carryover.py; guided dispatch lives in
the plan's :class:`~asp_ascend.scheduler.admission.Dispatcher`) and turns executor events into
their ``on_*`` updates:

- every admission: the group's prediction into the :class:`GroupEstimator` (re-estimation),
  its room into the :class:`TailGovernor` (tail-aware concurrency): the plan's room, or with
  ``TailOptions.measure_costs`` the room the run's *measured* costs give (below);
- every instance poll: per running group, the lengths of its finished samples and the tokens
  so far of the others (``RolloutEngine.poll``'s ``progress``) -> the estimator, so guided
  dispatch steals from the instance with the most *re-estimated* remaining work, and only where
  the steal lowers the later of the two instances' re-estimated finishes (the Dispatcher); with
  measured costs, a running group that re-estimation now finds to be a tail gets a room (and
  one that no longer is loses it);
- a finished group: the estimator learns from it; the governor releases its room;
- the trainer ready for an iteration none of whose untrained mini-batches is generated:
  ``pipeline.regroup`` completes one from generated groups of the others (scheduler/regroup.py:
  lossless, within the iteration), asked first;
- the trainer waiting on an iteration whose unfinished groups are all late (re-estimated
  remaining tokens past the iteration's budget): :class:`CarryOver` defers them and swaps in
  finished groups of the next iteration (``rollout.partial_rollout``).

Run-time rooms (``measure_costs``: the runtime's choice; the simulator and MindSpeed-RL keep the
plan's rooms): a :class:`~asp_ascend.scheduler.cost_meter.CostMeter` measures the decode step and
the trainer's time whenever ``measure_costs`` is set (every real run writes ``costs`` events); with
tail-aware concurrency a :class:`~asp_ascend.scheduler.room_sizing.RoomSizer` sizes the rooms
from it (scheduler/room_sizing.py says how, and when nothing is capped).

Timeline events (metrics/timeline.py): ``steal`` (a job moved between instances), ``tail``
(an admission capped its instance, or re-estimation changed a running group's room:
``reason`` ``plan`` | ``measured`` | ``reestimate``), ``defer`` and ``swap`` (carry-over), ``regroup``
(a group moved between mini-batches of its iteration: ``pipeline.regroup``); the
instances' speculative-decoding acceptance arrives with each group (``speculative``, written by
the orchestrator). Nothing here calls Ray.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable

from .admission import Job
from .carryover import CarryOver, late_groups
from .cost_meter import CostMeter
from .execution import ExecutionPlan, Feeder
from .group_max import group_max_factor
from .reestimate import GroupEstimator
from .room_sizing import RoomSizer
from .tail import TailGovernor
from .tail_reactive import ReactiveCaps, passes_cap

Key = tuple[int, str]
RESIZE_CHANGE = 0.2    # a running group is re-sized when its remaining estimate moved by this share


@dataclass(frozen=True)
class TailOptions:
    """The tail keys as the loop uses them (``pipeline/run.py`` and ``sim/run.py`` fill them from the config)."""
    reestimate: bool = False             # scheduler.reestimate
    tail_concurrency: str = "off"        # rollout.tail_concurrency
    partial_rollout: bool = False        # rollout.partial_rollout
    max_split: int = 1                   # rollout.max_split
    rooms: dict = field(default_factory=dict)   # (epoch, prompt_id) -> planned room (0: no cap)
    measure_costs: bool = False          # size rooms at run time from the run's measured costs
    dedicated: bool = True               # each instance owns its device (False: instances share CPU cores)
    regroup: bool = False                # pipeline.regroup: fill a mini-batch within its iteration at run time
    regroup_heavy: bool = False          # pipeline.regroup_heavy: a step takes the heaviest generated groups


def key_of(job: Job) -> Key:
    return (job.epoch, job.prompt_id)


def steal_events(disp, seen: int, event: Callable[..., None], t: float) -> int:
    """One ``steal`` event at time ``t`` per job that guided dispatch (``disp``, the plan's
    Dispatcher) moved after its first ``seen`` steals; returns how many it has moved (the next
    ``seen``). The runtime's :meth:`TailControl.record_steals` and the simulator's engine write them."""
    for job, src, dst in disp.steals_since(seen):
        event("steal", t=t, epoch=job.epoch, prompt_id=job.prompt_id, iteration=job.iteration,
              from_instance=src, to_instance=dst, predicted_length=job.predicted_length,
              victim_work=disp.remaining_work(src))
    return disp.stolen


class TailControl:
    """Feeds the tail state machines from runtime events and records their decisions."""

    def __init__(self, plan: ExecutionPlan, options: TailOptions, *, max_tokens: int,
                 event: Callable[..., None], now: Callable[[], float],
                 prompt_length: Callable[[str], float] | None = None):
        s = plan.settings
        self.opts = options
        self.plan = plan
        self.G, self.S = s.group_size, s.max_num_seqs
        self.R = s.num_instances
        self.k = s.lag_bound
        self.plen = prompt_length or (lambda prompt_id: 0.0)
        self._event, self.now = event, now
        self.disp = plan.dispatcher
        self.estimator = GroupEstimator(s.group_size, max_length=max_tokens) if options.reestimate else None
        if self.estimator is not None:
            self.disp.estimator = self.estimator   # guided dispatch reads the re-estimated remaining work
        self.governor = (TailGovernor(s.max_num_seqs, options.tail_concurrency)
                         if str(options.tail_concurrency) != "off" else None)
        self.carry = CarryOver(self._slots(plan.iterations), options.max_split) if options.partial_rollout else None
        if self.carry is not None and plan.carried:  # a resume: groups deferred before the checkpoint
            self.carry.restore_planned(plan.carried)
        # who is trained in which mini-batch now: carry-over's membership, or with regroup alone one
        # of its own (``self.carry`` stays None then: no deferral, nothing for a checkpoint to keep)
        self.membership = self.carry
        if self.membership is None and options.regroup:
            self.membership = CarryOver(self._slots(plan.iterations), 1)
        self.rooms = dict(options.rooms)
        self.max_tokens = float(max_tokens)
        # the run's measured costs (``costs`` events, whatever the mechanisms: calibration fits any
        # run); with tail-aware concurrency they also size the run-time rooms (``sizing``)
        self.meter = CostMeter() if options.measure_costs else None
        self.reactive = self.governor is not None and self.governor.mode == "reactive"
        self.sizing = self.meter is not None and self.governor is not None and not self.reactive
        self.sizer = (RoomSizer(plan, self.meter, self.estimator, max_tokens=max_tokens, prompt_length=self.plen,
                                dedicated=options.dedicated) if self.sizing else None)
        self._jobs: dict[Key, Job] = {}                 # running groups
        self._sized: dict[Key, tuple[float, int, int]] = {}   # key -> (remaining, meter revision, room)
        self._reported: dict[Key, set] = {}     # samples whose finish the estimator has seen
        # partial rollout: every running group's samples so far (token ids, log-probs, version
        # segments, finished), so a group whose instance fails resumes from its prefix
        self.prefixes: dict[Key, dict[int, dict]] = {}
        self._steals_seen = self.disp.stolen
        self._lengths: dict[Key, list[int]] = {}    # finished, untrained groups' sample lengths (a swap moves them)
        self._done: dict[int, list[int]] = {}       # iteration -> [sum, count] of its finished members' samples (the budget)
        self._ready: dict[int, int] = {}            # iteration -> its finished, untrained members (swap donors)
        self._witness: dict[int, Key] = {}          # iteration -> a group found not late at the last ask
        # reactive tail caps (scheduler/tail_reactive.py)
        self.caps = ReactiveCaps(self.G, self.S, self.R) if self.reactive else None
        if self.caps is not None:
            self.caps.track(plan.iterations)

    @staticmethod
    def _slots(iterations: dict) -> list[tuple[Key, int, int]]:
        return [(key, i, m) for i in sorted(iterations) for m in sorted(iterations[i]) for key in iterations[i][m]]

    def add_epoch(self, iterations: dict, first: int) -> None:
        """A re-planned epoch was added to the plan (iterations >= ``first``)."""
        if self.membership is not None:
            self.membership.add(self._slots({i: mbs for i, mbs in iterations.items() if i >= first}))
        if self.caps is not None:
            self.caps.track({i: mbs for i, mbs in iterations.items() if i >= first})

    # ------------------------------------------------------------------ admission
    def room_rule(self, feeder: Feeder) -> Callable[[int], bool] | None:
        """``Feeder.fill``'s room rule: room by the feeder's own rule (a free group slot, or
        unfinished samples under ``max_num_seqs``) and, on an instance running a tail, room under
        its cap for the sequences the feeder counts there (a tail group itself needs only the
        feeder's room)."""
        if self.governor is None:
            return None
        gov = self.governor

        def room(r: int) -> bool:
            if not feeder.has_room(r):
                return False
            if gov.cap(r) >= self.S:         # no tail runs there: a free slot is room (no peek)
                return True
            if not self.rooms and self.sizer is None:   # no job has a room of its own (reactive)
                return gov.admits(r, feeder.held(r), 0) or self.passes_cap(r)
            job = self.disp.peek(r, True)
            return job is None or gov.admits(r, feeder.held(r), self._room_of(job))
        return room

    def on_admit(self, r: int, job: Job) -> None:
        key = key_of(job)
        room = self._room_of(job) if self.governor is not None else 0
        if self.estimator is not None:
            self.estimator.groups.pop(key, None)      # a group re-admitted after its instance failed
            self.estimator.on_admit(key, job.predicted_length)
        self._reported[key] = set()
        self._jobs[key] = job
        if self.governor is not None:
            self.governor.on_admit(r, key, room)
            if self.sizing:
                self._sized[key] = (-1.0, -1, room)    # re-sized at its first progress report
            if room:
                self._event("tail", t=self.now(), instance=r, epoch=job.epoch, prompt_id=job.prompt_id,
                            iteration=job.iteration, room=room, cap=self.governor.cap(r),
                            reason="measured" if self.sizing else "plan")
            if self.reactive:
                self._react(job.iteration, force=True)

    # ------------------------------------------------------------------ run-time rooms
    def on_costs(self, instance: int, meter: dict | None) -> None:
        """An instance's decode-step counters (``RolloutEngine.poll``'s ``meter``)."""
        if self.meter is not None:
            rev = self.meter.revision
            self.meter.on_poll(instance, meter)
            cm = self.meter.cost()
            if cm is not None and self.meter.revision != rev:
                tot = self.meter.totals()
                self._event("costs", t=self.now(), decode_a=cm.decode_a, decode_b=cm.decode_b, decode_c=cm.decode_c,
                            steps=self.meter.steps, seq_steps=tot["seq_steps"], busy_s=tot["busy_s"],
                            train_s=self.meter.train_time())

    def on_iteration_time(self, seconds: float) -> None:
        """An iteration's trainer time, its first optimizer step to the end of its weight sync."""
        if self.meter is not None:
            self.meter.on_iteration(seconds)

    def _room_of(self, job: Job) -> int:
        """The room ``job`` gets when admitted now (0: no cap): the plan's, or with run-time
        sizing the measured costs' (scheduler/room_sizing.py)."""
        if self.sizer is None:
            return int(self.rooms.get(key_of(job), 0))
        return self.sizer.room_of(job)

    def _resize(self, key: Key) -> None:
        """Re-size running group ``key`` from its re-estimated remaining tokens (measured costs)."""
        job = self._jobs.get(key)
        if job is None or key not in self.governor.where:
            return
        rem = self.estimator.remaining(key)
        last = self._sized.get(key)
        rev = self.meter.revision
        if last is not None and last[1] == rev and abs(rem - last[0]) <= RESIZE_CHANGE * max(last[0], 1.0):
            return
        room = self.sizer.size_room(job.iteration, rem, self.plen(job.prompt_id))
        old = last[2] if last is not None else 0
        self._sized[key] = (rem, rev, room)
        if room != old:
            self.governor.on_update(key, room)
            r = self.governor.where[key]
            self._event("tail", t=self.now(), instance=r, epoch=job.epoch, prompt_id=job.prompt_id,
                        iteration=job.iteration, room=room, cap=self.governor.cap(r), reason="reestimate",
                        remaining=rem)

    # ------------------------------------------------------------------ reactive tail caps
    def _iteration_of(self, key: Key) -> int:
        return self.carry.iteration_of(key) if self.carry is not None else self.caps.it_of.get(key, -1)

    def _react(self, iteration: int, force: bool = False) -> None:
        """``rollout.tail_concurrency: reactive``: apply :meth:`ReactiveCaps.decide` to the governor
        (a capped group's instance holds at most ``caps.room`` sequences while it runs)."""
        gov, est = self.governor, self.disp.estimator
        d = self.caps.decide(iteration, force, gov.where,
                             est.remaining if est is not None else (lambda k: self._jobs[k].predicted_length))
        if d is None:
            return
        drop, add = d
        for k in drop:
            if k in gov.where:
                gov.on_update(k, 0)
        room = self.caps.room
        for k, rem in add.items():
            gov.on_update(k, room)
            job = self._jobs[k]
            r = gov.where[k]
            self._event("tail", t=self.now(), instance=r, epoch=job.epoch, prompt_id=job.prompt_id,
                        iteration=iteration, room=room, cap=gov.cap(r), reason="reactive", remaining=rem)

    def passes_cap(self, r: int) -> bool:
        """Reactive caps: :func:`~.tail_reactive.passes_cap` for the group ``r`` would take next
        (its expected longest sample; the capped groups' remaining tokens; else predictions)."""
        job, protected = self.disp.peek(r, True), self.governor.caps.get(r, ())
        if job is None:
            return False
        if self.estimator is not None:
            est = self.disp.estimator
            return passes_cap(self._expected_longest(key_of(job)), [est.remaining(k) for k in protected])
        return passes_cap(job.predicted_length, [self._jobs[k].predicted_length for k in protected])

    def record_steals(self) -> None:
        """One ``steal`` event per job guided dispatch moved since the last call."""
        self._steals_seen = steal_events(self.disp, self._steals_seen, self._event, self.now())

    # ------------------------------------------------------------------ progress
    def on_progress(self, reports: Iterable[dict]) -> None:
        """An instance's per-group progress: ``{"key": (epoch, prompt_id), "finished": {sample: length},
        "tokens": [tokens so far of each unfinished sample]}``."""
        for rep in reports:
            key = tuple(rep["key"])
            if self.carry is not None and rep.get("new"):
                self._extend_prefix(key, rep["new"])
            self.progress(key, rep["finished"], rep["tokens"])

    def progress(self, key: Key, finished: dict, tokens: list) -> None:
        """One group's progress (:meth:`on_progress`'s report without ``new``): ``finished``:
        {sample: length}, ``tokens``: tokens so far of each unfinished sample."""
        est = self.estimator
        if est is None or key not in est.groups:
            return
        self._finish_samples(key, finished)
        est.on_progress(key, tokens[: self.G - len(est.groups[key].finished)])
        if self.sizing and self.opts.dedicated:
            self._resize(key)

    def _extend_prefix(self, key: Key, new: dict) -> None:
        pre = self.prefixes.setdefault(key, {})
        for s, (tokens, logprobs, segments, finished) in new.items():
            p = pre.setdefault(int(s), {"token_ids": [], "logprobs": [], "segments": [], "finished": False})
            p["token_ids"].extend(tokens)
            p["logprobs"].extend(logprobs)
            p["segments"], p["finished"] = [list(x) for x in segments], bool(finished)
            if finished:
                p["finish_reason"] = str(finished)

    def prefix(self, key: Key) -> list[dict] | None:
        """The samples of ``key`` generated so far on an instance that failed (None: none kept)."""
        pre = self.prefixes.get(key)
        if not pre or not any(p["token_ids"] for p in pre.values()):
            return None
        return [pre.get(s, {"token_ids": [], "logprobs": [], "segments": [], "finished": False})
                for s in range(self.G)]

    def _finish_samples(self, key: Key, finished: dict) -> None:
        seen = self._reported.setdefault(key, set())
        for s in sorted(finished, key=int):
            if int(s) not in seen:
                seen.add(int(s))
                self.estimator.on_sample_finish(key, int(finished[s]))

    def on_finish(self, key: Key, lengths: list[int], prompt_length: float | None = None) -> None:
        """A group came back complete (``lengths``: its samples' response lengths, by sample;
        ``prompt_length``: its prompt's tokens, else the ``prompt_length`` given at construction)."""
        est = self.estimator
        if est is not None and key in est.groups:
            # _finish_samples(key, dict(enumerate(lengths))), without the sort: samples in order
            seen = self._reported.get(key, ())
            est.on_samples_finish(key, [int(x) for s, x in enumerate(lengths) if s not in seen] if seen
                                  else [int(x) for x in lengths])
            est.on_group_finish(key)
        self._reported.pop(key, None)
        self.prefixes.pop(key, None)
        self._jobs.pop(key, None)
        self._sized.pop(key, None)
        if self.governor is not None:
            self.governor.on_finish(key)
        if self.caps is not None:
            i = self._iteration_of(key)
            self._react(i, force=self.caps.finished(key, i))
        if self.membership is not None:   # carry-over's, or regroup's own; weight: the group's tokens
            p = self.plen(key[1]) if prompt_length is None else prompt_length
            self.membership.on_finish(key, sum(lengths) + len(lengths) * float(p))
        if self.carry is not None:
            self._lengths[key] = [int(x) for x in lengths]
            i = self.carry.iteration_of(key)
            self._count_done(i, self._lengths[key], +1)
            self._ready[i] = self._ready.get(i, 0) + 1

    def on_instance_failed(self, r: int, keys: Iterable[Key]) -> None:
        """Instance ``r`` died; ``keys``: the groups it was running (they start again elsewhere)."""
        for key in keys:
            if self.estimator is not None:
                self.estimator.groups.pop(key, None)
            self._reported.pop(key, None)
            self._jobs.pop(key, None)
            self._sized.pop(key, None)
        if self.governor is not None:
            self.governor.on_instance_failed(r)
        if self.meter is not None:
            self.meter.forget_instance(r)

    # ------------------------------------------------------------------ carry-over
    def lag_bound(self, key: Key) -> int:
        """The largest lag ``key`` may be trained with: k, or k + its deferral (partial rollout)."""
        return self.k if self.carry is None else self.carry.lag_bound_of(key, self.k)

    def members(self, iteration: int, planned: dict) -> dict:
        """Mini-batch -> keys of ``iteration`` as it will be trained."""
        if self.membership is None:
            return planned
        return {m: list(self.membership.members.get((iteration, m), [])) for m in planned}

    def regroup(self, iteration: int, target: int | None = None) -> list:
        """``pipeline.regroup``: the trainer is ready for ``iteration`` and none of its untrained
        mini-batches is generated (or, ``target``, the mini-batch it streams waits for a group):
        move groups within the iteration (scheduler/regroup.py), one ``regroup`` event each."""
        if not self.opts.regroup:
            return []
        moves = self.membership.regroup(iteration, target)
        for sw in moves:
            self._event("regroup", t=self.now(), epoch=sw.swapped_in[0], prompt_id=sw.swapped_in[1],
                        iteration=iteration, mini_batch=sw.mini_batch, from_mini_batch=sw.to_mini_batch,
                        replaces=[sw.deferred[0], sw.deferred[1]])
        return moves

    def heavy_first(self, iteration: int, mini_batch: int) -> list:
        """``pipeline.regroup_heavy``: the trainer is about to train ``mini_batch`` of ``iteration``
        (all of its groups generated): while a group of the iteration's untrained mini-batches is
        not generated, its lightest groups trade slots with the heaviest generated groups of the
        others (scheduler/regroup.py), one ``regroup`` event each (``rule: heavy_first``)."""
        if not (self.opts.regroup and self.opts.regroup_heavy):
            return []
        moves = self.membership.heavy_first(iteration, mini_batch)
        for sw in moves:
            self._event("regroup", t=self.now(), epoch=sw.swapped_in[0], prompt_id=sw.swapped_in[1],
                        iteration=iteration, mini_batch=sw.mini_batch, from_mini_batch=sw.to_mini_batch,
                        replaces=[sw.deferred[0], sw.deferred[1]], rule="heavy_first")
        return moves

    def late(self, iteration: int) -> tuple[list[Key], dict[Key, float], float | None]:
        """(the late groups of ``iteration``, latest first; every unfinished group's remaining
        tokens; the budget B_i, None when none of the iteration's samples has finished).

        Definition (docs/runtime.md, "late"). B_i is the mean response length of the samples of
        the finished groups that are members of iteration i now (after earlier swaps), trained
        or not: the test does not depend on how many groups a mini-batch holds. An
        unfinished group g of i has R_g remaining tokens: the estimator's ``remaining`` (expected
        tokens until its last unfinished sample finishes, from its finished siblings and the
        tokens so far of the others); a group not admitted yet, its expected longest sample
        (prediction, bias-corrected, times the expected largest-of-G factor). g is late when
        R_g > B_i: waiting for it costs more than an average sample of the iteration takes from
        scratch. With no finished sample in i (no B_i) or no estimator, no group is late."""
        if self.carry is None or self.estimator is None:
            return [], {}, None
        return self._late(iteration, every=False)

    def _late(self, iteration: int, every: bool) -> tuple[list[Key], dict[Key, float], float | None]:
        """:meth:`late`; ``every``: stop at the first unfinished group that is not late and return
        no late group (what :meth:`maybe_defer` needs: it defers only when all of them are late).
        The budget's sum and count are kept per iteration (:meth:`_count_done`), not re-summed."""
        total, count = self._done.get(iteration, (0, 0))
        budget = total / count if count else None
        fin = self.carry.finished
        if every and budget is not None:
            # the group that was not late at the last ask usually still is not: try it first
            w = self._witness.get(iteration)
            if (w is not None and w not in fin and self.carry.iteration_of(w) == iteration
                    and self._remaining_of(w) <= budget):
                return [], {}, budget
        waiting = self.carry.unfinished(iteration)
        if budget is None or not waiting:
            return [], {}, budget
        if every:
            # maybe_defer defers only groups that may still move (CarryOver.defer: at most S
            # iterations after the planned one): when none may, its answer is no swap whatever
            # is late, so nothing is estimated (the usual case once a deferred tail is all that is left)
            nxt, planned, S = iteration + 1, self.carry.planned, self.carry.S
            if not any(nxt <= planned[k] + S for k in waiting):
                return [], {}, budget
        rem = {}
        for key in waiting:
            rem[key] = x = self._remaining_of(key)
            if every and x <= budget:
                self._witness[iteration] = key
                return [], rem, budget
        return late_groups(rem, budget), rem, budget

    def _remaining_of(self, key: Key) -> float:
        """R_g of :meth:`late`: re-estimated if admitted, else the expected longest sample."""
        est = self.estimator
        return est.remaining(key) if key in est.groups else self._expected_longest(key)

    def _count_done(self, iteration: int, lengths: list[int] | None, sign: int) -> None:
        """Add (+1) or take away (-1) a finished group's sample lengths to/from ``iteration``'s
        budget (a group finishes, or a swap moves it; training it changes nothing)."""
        if lengths:
            d = self._done.setdefault(iteration, [0, 0])
            d[0] += sign * sum(lengths)
            d[1] += sign * len(lengths)

    def _expected_longest(self, key: Key) -> float:
        """Expected longest sample of a group not admitted yet (its plan prediction)."""
        est = self.estimator
        pred = self.plan.predicted_length.get(key, 0.0)
        return min(est.predict(pred) * group_max_factor(est.sigma, self.G), self.max_tokens)

    def maybe_defer(self, iteration: int) -> list:
        """The trainer waits on ``iteration``: defer its late groups (:meth:`late`; all of its
        unfinished groups must be late) against finished groups of the next iteration."""
        if self.carry is None or self.estimator is None:
            return []
        if not self._ready.get(iteration + 1):
            return []     # no finished, untrained group of the next iteration to swap in: no deferral
        late, rem, budget = self._late(iteration, every=True)
        if not late:
            return []
        swaps = self.carry.defer(iteration, late)
        for sw in swaps:
            moved = self._lengths.get(sw.swapped_in)      # finished: its lengths move to the deferred's iteration
            self._count_done(sw.to_iteration, moved, -1)
            self._count_done(sw.iteration, moved, +1)
            self._ready[sw.to_iteration] -= 1
            self._ready[sw.iteration] = self._ready.get(sw.iteration, 0) + 1
            self._event("defer", t=self.now(), epoch=sw.deferred[0], prompt_id=sw.deferred[1], iteration=sw.iteration,
                        to_iteration=sw.to_iteration, remaining=rem[sw.deferred], budget=budget)
            self._event("swap", t=self.now(), epoch=sw.swapped_in[0], prompt_id=sw.swapped_in[1],
                        iteration=sw.to_iteration, to_iteration=sw.iteration, mini_batch=sw.mini_batch,
                        replaces=[sw.deferred[0], sw.deferred[1]])
        return swaps

    def on_trained(self, iteration: int, mini_batch: int) -> None:
        """Mini-batch (iteration, mini_batch) was trained: its groups can no longer be swapped;
        their samples stay in the iteration's budget (a trained group never moves)."""
        if self.carry is None and self.membership is not None:
            self.membership.on_trained(iteration, mini_batch)
        if self.carry is not None:
            for key in self.carry.on_trained(iteration, mini_batch):
                self._lengths.pop(key, None)
                self._ready[iteration] -= 1
