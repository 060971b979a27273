"""The tail mechanisms in an executor's loop (DESIGN 9): the scheduler's state machines fed by
the instances' reports, each decision written to the timeline.

The runtime's orchestrator and the simulator's engine each own one :class:`TailControl`, next
to their :class:`~asp_ascend.scheduler.execution.ExecutionPlan`. It holds the state machines
(scheduler/reestimate.py, scheduler/tail.py, scheduler/carryover.py; guided dispatch lives in
the plan's :class:`~asp_ascend.scheduler.admission.Dispatcher`) and turns executor events into
their ``on_*`` updates:

- every admission: the group's prediction into the :class:`GroupEstimator` (re-estimation),
  its planned room into the :class:`TailGovernor` (tail-aware concurrency);
- every instance poll: per running group, the lengths of its finished samples and the tokens
  so far of the others (``RolloutEngine.poll``'s ``progress``) -> the estimator, so guided
  dispatch steals from the instance with the most *re-estimated* remaining work;
- a finished group: the estimator learns from it; the governor releases its room;
- the trainer waiting on an iteration whose unfinished groups are all late (re-estimated
  remaining tokens past the iteration's budget): :class:`CarryOver` defers them and swaps in
  finished groups of the next iteration (``rollout.partial_rollout``).

Timeline events (metrics/timeline.py): ``steal`` (a job moved between instances), ``tail``
(an admission capped its instance), ``defer`` and ``swap`` (carry-over); the instances'
speculative-decoding acceptance arrives with each group (``speculative``, written by the
orchestrator). Nothing here calls Ray.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable

from .admission import Job
from .carryover import CarryOver, late_groups
from .execution import ExecutionPlan, Feeder
from .reestimate import GroupEstimator
from .tail import TailGovernor

Key = tuple[int, str]


@dataclass(frozen=True)
class TailOptions:
    """The tail keys as the loop uses them (``pipeline/run.py`` and ``sim/run.py`` fill them from the config)."""
    reestimate: bool = False             # scheduler.reestimate
    tail_concurrency: str = "off"        # rollout.tail_concurrency
    partial_rollout: bool = False        # rollout.partial_rollout
    max_split: int = 1                   # rollout.max_split
    rooms: dict = field(default_factory=dict)   # (epoch, prompt_id) -> planned room (0: no cap)


def key_of(job: Job) -> Key:
    return (job.epoch, job.prompt_id)


class TailControl:
    """Feeds the tail state machines from runtime events and records their decisions."""

    def __init__(self, plan: ExecutionPlan, options: TailOptions, *, max_tokens: int,
                 event: Callable[..., None], now: Callable[[], float]):
        s = plan.settings
        self.opts = options
        self.G, self.S = s.group_size, s.max_num_seqs
        self.k = s.lag_bound
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
        self.rooms = dict(options.rooms)
        self._reported: dict[Key, set] = {}     # samples whose finish the estimator has seen
        # partial rollout: every running group's samples so far (token ids, log-probs, version
        # segments, finished), so a group whose instance fails resumes from its prefix
        self.prefixes: dict[Key, dict[int, dict]] = {}
        self._steals_seen = len(self.disp.steals)
        self.iteration_lengths: dict[int, list[int]] = {}   # finished sample lengths per (current) iteration

    @staticmethod
    def _slots(iterations: dict) -> list[tuple[Key, int, int]]:
        return [(key, i, m) for i in sorted(iterations) for m in sorted(iterations[i]) for key in iterations[i][m]]

    def add_epoch(self, iterations: dict, first: int) -> None:
        """A re-planned epoch was added to the plan (iterations >= ``first``)."""
        if self.carry is not None:
            self.carry.add(self._slots({i: mbs for i, mbs in iterations.items() if i >= first}))

    # ------------------------------------------------------------------ admission
    def room_rule(self, feeder: Feeder) -> Callable[[int], bool] | None:
        """``Feeder.fill``'s room rule: a free group slot and, on an instance running a tail,
        room under its cap (a tail group itself needs only the slot)."""
        if self.governor is None:
            return None
        gov = self.governor

        def room(r: int) -> bool:
            if not feeder.has_room(r):
                return False
            job = self.disp.peek(r, True)
            return job is None or gov.admits(r, feeder.inflight[r] * self.G, self.rooms.get(key_of(job), 0))
        return room

    def on_admit(self, r: int, job: Job) -> None:
        key = key_of(job)
        if self.estimator is not None:
            self.estimator.groups.pop(key, None)      # a group re-admitted after its instance failed
            self.estimator.on_admit(key, job.predicted_length)
        self._reported[key] = set()
        if self.governor is not None:
            room = int(self.rooms.get(key, 0))
            self.governor.on_admit(r, key, room)
            if room:
                self._event("tail", t=self.now(), instance=r, epoch=job.epoch, prompt_id=job.prompt_id,
                            iteration=job.iteration, room=room, cap=self.governor.cap(r))

    def record_steals(self) -> None:
        """One ``steal`` event per job guided dispatch moved since the last call."""
        for job, src, dst in self.disp.steals[self._steals_seen:]:
            self._event("steal", t=self.now(), epoch=job.epoch, prompt_id=job.prompt_id, iteration=job.iteration,
                        from_instance=src, to_instance=dst, predicted_length=job.predicted_length,
                        victim_work=self.disp.remaining_work(src))
        self._steals_seen = len(self.disp.steals)

    # ------------------------------------------------------------------ progress
    def on_progress(self, reports: Iterable[dict]) -> None:
        """An instance's per-group progress: ``{"key": (epoch, prompt_id), "finished": {sample: length},
        "tokens": [tokens so far of each unfinished sample]}``."""
        est = self.estimator
        for rep in reports:
            key = tuple(rep["key"])
            if self.carry is not None and rep.get("new"):
                self._extend_prefix(key, rep["new"])
            if est is None or key not in est.groups:
                continue
            self._finish_samples(key, rep["finished"])
            est.on_progress(key, rep["tokens"][: self.G - len(est.groups[key].finished)])

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
        for s, length in sorted(finished.items(), key=lambda x: int(x[0])):
            if int(s) not in seen:
                seen.add(int(s))
                self.estimator.on_sample_finish(key, int(length))

    def on_finish(self, key: Key, lengths: list[int]) -> None:
        """A group came back complete (``lengths``: its samples' response lengths, by sample)."""
        if self.estimator is not None and key in self.estimator.groups:
            self._finish_samples(key, dict(enumerate(lengths)))
            self.estimator.on_group_finish(key)
        self._reported.pop(key, None)
        self.prefixes.pop(key, None)
        if self.governor is not None:
            self.governor.on_finish(key)
        if self.carry is not None:
            self.carry.on_finish(key)
            self.iteration_lengths.setdefault(self.carry.iteration_of(key), []).extend(lengths)

    def on_instance_failed(self, r: int, keys: Iterable[Key]) -> None:
        """Instance ``r`` died; ``keys``: the groups it was running (they start again elsewhere)."""
        for key in keys:
            if self.estimator is not None:
                self.estimator.groups.pop(key, None)
            self._reported.pop(key, None)
        if self.governor is not None:
            self.governor.on_instance_failed(r)

    # ------------------------------------------------------------------ carry-over
    def lag_bound(self, key: Key) -> int:
        """The largest lag ``key`` may be trained with: k, or k + its deferral (partial rollout)."""
        return self.k if self.carry is None else self.carry.lag_bound_of(key, self.k)

    def members(self, iteration: int, planned: dict) -> dict:
        """Mini-batch -> keys of ``iteration`` as it will be trained."""
        if self.carry is None:
            return planned
        return {m: list(self.carry.members.get((iteration, m), [])) for m in planned}

    def maybe_defer(self, iteration: int) -> list:
        """The trainer waits on ``iteration``: defer its late groups (all of its unfinished
        groups must be late) against finished groups of the next iteration. A group is late
        when its re-estimated remaining tokens exceed the iteration's budget: the mean
        length of the samples of the iteration that finished (no estimate: never late)."""
        if self.carry is None or self.estimator is None:
            return []
        done = self.iteration_lengths.get(iteration, [])
        waiting = self.carry.unfinished(iteration)
        if not done or not waiting:
            return []
        budget = sum(done) / len(done)
        est = self.estimator
        rem = {key: est.remaining(key) if key in est.groups else float("inf") for key in waiting}
        late = late_groups(rem, budget)
        swaps = self.carry.defer(iteration, late)
        for sw in swaps:
            self._event("defer", t=self.now(), epoch=sw.deferred[0], prompt_id=sw.deferred[1], iteration=sw.iteration,
                        to_iteration=sw.to_iteration, remaining=rem[sw.deferred], budget=budget)
            self._event("swap", t=self.now(), epoch=sw.swapped_in[0], prompt_id=sw.swapped_in[1],
                        iteration=sw.to_iteration, to_iteration=sw.iteration, mini_batch=sw.mini_batch,
                        replaces=[sw.deferred[0], sw.deferred[1]])
        return swaps

    def on_trained(self, iteration: int, mini_batch: int) -> None:
        if self.carry is not None:
            self.carry.on_trained(iteration, mini_batch)
