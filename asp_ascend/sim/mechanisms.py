"""The tail mechanisms (DESIGN 9) in the simulator: the same :class:`TailControl` the runtime
uses, fed from the simulated instances instead of vLLM's progress reports.

- guided dispatch (``scheduler.dispatch: guided``) lives in the plan's Dispatcher; with
  re-estimation its "remaining work" of a running group asks :class:`SimProgress`, which first
  reports the group's simulated progress (finished samples' lengths, tokens so far of the
  others at the instance's last step boundary) to the estimator, exactly what an instance's
  poll reports at run time;
- tail-aware concurrency: the engine's room rule asks the governor (``TailGovernor.admits``);
- speculative decoding: the instances time a step with the speculating coefficients while
  they hold at most ``max_batch`` sequences (:class:`~asp_ascend.scheduler.speculative.Speculation`);
- regroup (``pipeline.regroup``): when the trainer is ready for an iteration and
  no mini-batch of it is generated, the engine asks ``TailControl.regroup`` (first) and moves the
  groups between the iteration's mini-batches (``Trainer.swap``, re-costed);
- carry-over (``rollout.partial_rollout``): when the trainer waits on an iteration, the
  engine asks ``TailControl.maybe_defer`` and moves the swapped groups between mini-batches.

:func:`tail_summary` adds what the mechanisms did to a run's summary: groups stolen, capped,
deferred (distinct groups), regrouped; the lag of deferred samples (by admission version and by
the version of their last token) and the per-iteration length mix (Kolmogorov-Smirnov distance of
each iteration's trained response lengths to the whole run's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ..metrics import deferred_lags
from ..scheduler.tail_control import TailOptions


@dataclass(frozen=True)
class SimMechanisms:
    """The tail keys of one simulated system (all off by default: the plain engine)."""
    reestimate: bool = False              # scheduler.reestimate
    tail_concurrency: str = "off"         # rollout.tail_concurrency (rooms come with the jobs)
    partial_rollout: bool = False         # rollout.partial_rollout
    max_split: int = 1                    # rollout.max_split
    speculation: object = None            # a scheduler.speculative.Speculation, or None
    max_tokens: int = 1 << 30             # lengths.max_response_length (caps re-estimates)
    defer_share: float = 0.125            # ask for a deferral once at most this share of the iteration is unfinished
    regroup: bool = False                 # pipeline.regroup (resolved for the system: config.regroup_of)
    regroup_heavy: bool = False           # pipeline.regroup_heavy (with regroup only: config.regroup_heavy_of)

    @property
    def any_control(self) -> bool:
        return self.reestimate or str(self.tail_concurrency) != "off" or self.partial_rollout or self.regroup

    def options(self, jobs) -> TailOptions:
        rooms = {}
        if jobs.room is not None and str(self.tail_concurrency) != "off":
            for x in np.flatnonzero(jobs.room > 0).tolist():
                rooms[(int(jobs.epoch[x]), str(jobs.prompt_id[x]))] = int(jobs.room[x])
        return TailOptions(reestimate=self.reestimate, tail_concurrency=str(self.tail_concurrency),
                           partial_rollout=self.partial_rollout, max_split=int(self.max_split), rooms=rooms,
                           regroup=self.regroup, regroup_heavy=self.regroup and self.regroup_heavy)


class SimProgress:
    """Guided dispatch's :class:`~asp_ascend.scheduler.admission.RemainingWork`: the estimator's
    remaining tokens of a running group, after reporting its simulated progress.

    Like the runtime's periodic polls, a group's progress is re-reported only when a sample
    finished or its tokens grew by an eighth (at least 64) since the last report; between two
    reports the answer is the one of the last report. A report is kept with the estimator's
    :meth:`~asp_ascend.scheduler.reestimate.GroupEstimator.remaining_later` and answered when first
    needed, so an answer never needed is never computed and every answer is the one its report
    gives. Guided dispatch's steal test asks :meth:`remaining_reaches`, which often decides
    without answering every report (its side effects, the reports, are those of an exact sum)."""

    def __init__(self, control, inst, job_of: dict):
        self.tc, self.inst, self.job_of = control, inst, job_of
        # key -> [first sample, instance step, samples left, remaining or None, its pending answer,
        # the answer of the report before] at the last report
        self._cache: dict = {}

    def remaining_sum(self, keys) -> float:
        """``sum(self.remaining(k) for k in keys)`` (the same terms in the same order), with the
        cached answers read in the loop (hot: guided dispatch sums an instance's running groups)."""
        inst = self.inst
        cache, S, seq_inst, job_left, s0, G = self._cache, inst.S, inst.seq_inst, inst.job_left, inst.s0, inst.G
        vals = []
        for key in keys:
            hit = cache.get(key)
            if hit is not None:
                b, step0, left, rem, later, _ = hit       # remaining()'s cache test, inlined
                step = S[seq_inst[b]]
                if job_left[b // G] == left:
                    grown = (step - s0[b]) // 8
                    if step - step0 < (grown if grown > 64 else 64):
                        if rem is None:
                            rem = hit[3] = later()
                            hit[4] = None
                        vals.append(rem)
                        continue
            vals.append(self.remaining(key))
        return sum(vals)

    def remaining_reaches(self, keys, enough: Callable[[float], bool]) -> bool:
        """``enough(remaining_sum(keys))`` for a test ``enough`` monotone in the sum, reporting what
        :meth:`remaining_sum` reports but answering reports only while the sum with the unanswered
        ones counted 0 (a lower bound: every answer is >= 0 and a float sum is monotone in its
        terms) does not decide it; the largest answers of the reports before them first."""
        inst = self.inst
        cache, S, seq_inst, job_left, s0, G = self._cache, inst.S, inst.seq_inst, inst.job_left, inst.s0, inst.G
        vals, pending = [], []
        for key in keys:
            hit = cache.get(key)
            if hit is None or job_left[hit[0] // G] != hit[2] or not (
                    S[seq_inst[hit[0]]] - hit[1] < max((S[seq_inst[hit[0]]] - s0[hit[0]]) // 8, 64)):
                prev = 0.0 if hit is None else hit[5] if hit[3] is None else hit[3]
                hit = self._report(key)
                if hit is None:
                    vals.append(0.0)
                    continue
                hit[5] = prev
            if hit[3] is None:
                pending.append((hit[5], len(vals), hit))
                vals.append(0.0)
            else:
                vals.append(hit[3])
        low = sum(vals)
        if not pending:
            return enough(low)
        if enough(low):
            return True
        pending.sort(key=lambda p: -p[0])
        last = len(pending) - 1
        for n, (_, i, hit) in enumerate(pending):
            vals[i] = x = hit[3] = hit[4]()
            hit[4] = None
            low += x
            # the running sum, shrunk by far more than the rounding of any float sum of these
            # terms, stays below the exact sum in order; the last test is on the exact sum
            if n < last and enough(low * (1.0 - 1e-9)):
                return True
        return enough(sum(vals))

    def remaining(self, key) -> float:
        inst = self.inst
        hit = self._cache.get(key)
        if hit is not None:
            # (hot: guided dispatch asks for every running group of every candidate victim) a cached
            # group is running: once it finishes its job_left (0) differs from the cached count (>= 1)
            b, step0, left, rem, later, _ = hit
            step = inst.S[inst.seq_inst[b]]
            if inst.job_left[b // inst.G] == left:
                grown = (step - inst.s0[b]) // 8
                if step - step0 < (grown if grown > 64 else 64):
                    if rem is None:
                        rem = hit[3] = later()
                        hit[4] = None
                    return rem
        hit = self._report(key)
        if hit is None:
            return 0.0
        rem = hit[3] = hit[4]()
        hit[4] = None
        return rem

    def _report(self, key) -> list | None:
        """Report ``key``'s progress now; its cache entry, the answer pending (None: not running)."""
        est = self.tc.estimator
        if key not in est.groups:
            return None
        inst = self.inst
        G = inst.G
        j = self.job_of[key]
        b = j * G
        S, seq_inst, in_run, t_fin, g0, s0 = inst.S, inst.seq_inst, inst.in_run, inst.t_fin, inst.g0, inst.s0
        step, left = S[seq_inst[b]], inst.job_left[j]
        finished, tokens = {}, []
        for s in range(b, b + G):      # inst.sample_tokens(s), inlined
            if in_run[s]:
                tokens.append(g0[s] + S[seq_inst[s]] - s0[s])
            elif t_fin[s] > 0.0:
                finished[s - b] = inst.resp[s]
            else:
                tokens.append(g0[s])
        self.tc.progress(key, finished, tokens)
        hit = self._cache[key] = [b, step, left, None, est.remaining_later(key), 0.0]
        return hit


@dataclass
class MechanismLog:
    """What the mechanisms did: the timeline's steal/tail/defer/swap/regroup events, counted (an
    event with a ``rule``, regroup's ``heavy_first``, under ``KIND_RULE`` as well), the distinct
    groups deferred (a group carry-over defers twice, S >= 2, is one deferred group), and, when
    ``events`` is a dict (the timeline is recorded), the events themselves: kind -> [fields], as
    the runtime writes them (``TailControl``'s ``event`` callback)."""
    counts: dict = field(default_factory=dict)
    deferred: set = field(default_factory=set)     # (epoch, prompt_id) of every group deferred
    events: dict | None = None

    def __call__(self, kind: str, **ev):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        rule = ev.get("rule")
        if rule:
            self.counts[f"{kind}_{rule}"] = self.counts.get(f"{kind}_{rule}", 0) + 1
        if kind == "defer":
            self.deferred.add((ev.get("epoch"), ev.get("prompt_id")))
        if self.events is not None:
            self.events.setdefault(kind, []).append(ev)


def ks_distance(x: np.ndarray, ref_sorted: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance between the empirical distribution of ``x`` and that of the
    sorted array ``ref_sorted`` (the supremum is reached at a jump of x's distribution, from one
    side or the other, so x's points suffice: O(len(x) log len(ref)))."""
    xs = np.sort(x)
    n, N = xs.size, ref_sorted.size
    right = np.abs(np.searchsorted(xs, xs, "right") / n - np.searchsorted(ref_sorted, xs, "right") / N)
    left = np.abs(np.searchsorted(xs, xs, "left") / n - np.searchsorted(ref_sorted, xs, "left") / N)
    return float(max(right.max(), left.max()))


def tail_summary(req: pd.DataFrame, planned_iteration: np.ndarray, version_at_finish, lag_bound: int,
                 log: MechanismLog | None) -> dict:
    """Mechanism counters (``deferred_groups``: the distinct groups deferred, not the defer events:
    with S >= 2 a group may be deferred twice), the deferred samples' lag histograms
    (``metrics.deferred_lags``: a sample trained after its planned iteration; a group swapped in
    early is not deferred) and the per-iteration length mix. ``req``: the request frame (its
    ``iteration`` = the iteration that trained the sample); ``planned_iteration``: per sample, the plan's."""
    it = req["iteration"].to_numpy()
    out = {"tail_capped_groups": (log.counts.get("tail", 0) if log else 0),
           "deferred_groups": (len(log.deferred) if log else 0),
           "regrouped_groups": (log.counts.get("regroup", 0) if log else 0),
           "regrouped_heavy_first": (log.counts.get("regroup_heavy_first", 0) if log else 0),
           **deferred_lags(it, planned_iteration, req["admission_version"].to_numpy(), version_at_finish)}
    L = req["response_length"].to_numpy()
    order = np.argsort(it, kind="stable")
    cuts = np.flatnonzero(np.diff(it[order])) + 1
    ref = np.sort(L)
    ks = [ks_distance(L[g], ref) for g in np.split(order, cuts)]
    out["length_mix_ks_mean"] = float(np.mean(ks))
    out["length_mix_ks_max"] = float(np.max(ks))
    return out

