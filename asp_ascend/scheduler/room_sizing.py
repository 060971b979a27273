"""Run-time rooms of tail-aware concurrency (DESIGN 9 c), sized from the run's measured costs.

Run-time rooms (``measure_costs``: the runtime's choice; the simulator and MindSpeed-RL keep the
plan's rooms). A :class:`~asp_ascend.scheduler.cost_meter.CostMeter` fits the decode step
``a + b * context + c * n`` to the instances' own step times and averages the trainer's time
per iteration; it measures whenever ``measure_costs`` is set, with or without tail-aware
concurrency (every real run writes ``costs`` events, so calibration can fit any run), and sizes
rooms only with it. A group g of iteration i with expected longest remaining sample L (at admission
the bias-corrected prediction times the expected largest-of-G factor; later the estimator's
``remaining``) is then sized (:class:`RoomSizer`) by :class:`~asp_ascend.scheduler.tail.TailModel` over one
iteration's loads: work = the decode work of i's groups (their predictions bias-corrected by the
estimator, as g's own length is) at the instances' *measured* concurrency (the meter's mean
batch, ``full_batch``: an instance whose slots are held by finished samples runs fewer
sequences than ``max_num_seqs``), train = the measured trainer time, the floor = g's latency /
(k + 1). A room is given only when the best period a room allows is at least
``TAIL_GAIN_MIN`` (10 %) below the uncapped period
``max(work / R, train, latency at the measured batch / (k + 1))``: where the step cost hardly depends
on the batch or the trainer sets the period, nothing is capped. Until the meter has
``min_steps`` decode steps and one iteration's trainer time, nothing is capped either. Instances
that share CPU cores (``dedicated=False``: unpinned on the CPU) get no room at all: an
instance's step time there is set by the load of every process on the cores, not by its own
batch (the fitted ``c`` mixes the two), and a cap only splits the same work into more steps,
each paying the fixed cost ``a`` in CPU time the others need (the meter still measures).

:class:`~asp_ascend.scheduler.tail_control.TailControl` owns one :class:`RoomSizer` when it
sizes rooms at run time (``measure_costs`` with tail-aware concurrency on) and asks it for the
room of every admission and of every running group that re-estimation moved.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .admission import Job
from .cost_meter import CostMeter
from .execution import ExecutionPlan
from .group_max import group_max_factor
from .reestimate import GroupEstimator
from .tail import IterationLoads, TailModel

TAIL_GAIN_MIN = 0.10   # a run-time room must shorten the predicted period by this share at least


class RoomSizer:
    """Rooms from the measured costs (``meter``) over one iteration's loads of ``plan``."""

    def __init__(self, plan: ExecutionPlan, meter: CostMeter, estimator: GroupEstimator | None, *,
                 max_tokens: int, prompt_length: Callable[[str], float], dedicated: bool = True):
        s = plan.settings
        self.plan, self.meter, self.estimator = plan, meter, estimator
        self.G, self.S, self.R, self.k = s.group_size, s.max_num_seqs, s.num_instances, s.lag_bound
        self.max_tokens = float(max_tokens)
        self.plen = prompt_length
        self.dedicated = dedicated
        self._work: dict[tuple, tuple[float, float, float]] = {}   # (iteration, revision, learnt, full) -> loads

    def room_of(self, job: Job) -> int:
        """The room ``job`` gets when admitted now (0: no cap): its expected longest sample (the
        bias-corrected prediction times the expected largest-of-G factor), sized."""
        est = self.estimator
        mean = est.predict(job.predicted_length) if est is not None else max(1.0, job.predicted_length)
        longest = min(mean * group_max_factor(est.sigma if est is not None else 0.3, self.G), self.max_tokens)
        return self.size_room(job.iteration, longest, self.plen(job.prompt_id))

    def _loads(self, iteration: int, cm, full: int) -> tuple[float, float, float]:
        """(decode work at ``full`` concurrency, instance-seconds; mean context of a running
        sequence; mean prompt length) of ``iteration``'s groups under the measured costs. Each
        group's length is its prediction as re-estimation corrects it (``GroupEstimator.predict``:
        the learnt bias), the same expectation a group's own room is sized from (:meth:`room_of`):
        with predictions that run short of the lengths drawn, the raw ones made every iteration's
        work look small beside its bias-corrected longest group, so every long group looked like
        it set the period and got a room."""
        est = self.estimator
        learnt = est.learnt if est is not None else 0
        ck = (iteration, self.meter.revision, learnt, full)
        if ck not in self._work:
            keys = [k for mb in self.plan.iterations.get(iteration, {}).values() for k in mb]
            n = max(1, len(keys))
            if est is not None:
                pred = sum(est.predict(self.plan.predicted_length.get(k, 0.0)) for k in keys) / n
            else:
                pred = self.plan.predicted.get(iteration, 0.0) / n
            plen = sum(self.plen(p) for _, p in keys) / n if keys else 0.0
            work = self.G * n * float(cm.work(plen, pred, full, self.G))
            self._work = {k: v for k, v in self._work.items() if k[1:] == ck[1:]}
            self._work[ck] = (work, plen + pred / 2.0, plen)
        return self._work[ck]

    def size_room(self, iteration: int, longest: float, prompt_length: float) -> int:
        """Run-time room of a group of ``iteration`` whose longest sample has ``longest`` tokens
        (left) to generate, from the measured costs (0: no cap; see the module docstring)."""
        if not self.dedicated:
            return 0
        cm, train = self.meter.cost(), self.meter.train_time()
        if cm is None or train is None or longest <= 0:
            return 0
        full = self.full_batch()
        work, ctx, _ = self._loads(iteration, cm, full)
        k1 = self.k + 1
        base = max(work / self.R, train)
        # uncapped floor: the group among ``full`` sequences (cheap check first: most groups are no tail)
        lat_full = longest * float(cm.step(full, self.G * (prompt_length + longest / 2.0) + (full - self.G) * ctx))
        if lat_full / k1 <= base * (1.0 + TAIL_GAIN_MIN):
            return 0
        loads = IterationLoads(np.array([work]), np.array([train]), np.array([ctx]), np.array([1.0]), iteration,
                               np.array([float(longest)]), np.array([float(prompt_length)]))
        tm = TailModel(cm, group_size=self.G, max_num_seqs=full, lag_bound=self.k, num_instances=self.R,
                       loads=loads, planned_batch=False)      # ``full`` is the measured batch already
        uncapped = max(base, float(tm.latency(longest, prompt_length, full, ctx)) / k1)
        best, _ = tm.best_period(iteration, float(longest), float(prompt_length), 1.0)
        if best > uncapped * (1.0 - TAIL_GAIN_MIN):
            return 0     # the cap is not predicted to pay
        room = tm.room(iteration, float(longest), float(prompt_length))
        return room if room < full else 0

    def full_batch(self) -> int:
        """Sequences an uncapped instance runs at once, as measured: the meter's mean batch
        (sequence-steps over engine steps so far), rounded up to a multiple of G, between G and
        ``max_num_seqs``. An instance does not run ``max_num_seqs`` sequences just because it may:
        the Feeder's slots are groups, and a group keeps its slot until its last sample
        finishes, so the finished samples of the groups still running, and the waits for the
        next version (lag bound), leave part of the slots without a running sequence (the
        dedicated-core runs of docs/runtime.md: a mean batch of 50-60 with 128 slots). Priced at
        ``max_num_seqs``, an uncapped tail looked slower, and a room more useful, than they are."""
        tot = self.meter.totals()
        if tot["steps"] <= 0:
            return self.S
        n = self.G * math.ceil(tot["seq_steps"] / tot["steps"] / self.G - 1e-9)
        return int(min(self.S, max(self.G, n)))
