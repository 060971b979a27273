"""Tail-aware concurrency (DESIGN 9 c): which groups set their iteration's floor, how much
room their instances get.

With lag bound k, iteration i cannot end before its longest group, admitted no earlier than
version i - k, has finished: that group's latency is spread over at most k + 1 iterations.
Its latency depends on what else its instance runs: a decode step costs
``a + b * sum(context) + c * n`` for all ``n`` sequences together, so a group sharing a busy
instance decodes slower than alone. Capping the instance's other admissions while such a group
runs makes it faster, at the price of that instance's throughput.

:class:`TailModel` decides, per iteration, from the plan's predicted loads:

- an uncapped instance runs the sequences its share of the work keeps busy, not
  ``max_num_seqs`` (:meth:`TailModel.batch`: the fewest whose throughput carries
  ``work_i / R`` full-concurrency seconds in the period): where the work fills a small share of
  the period a long group runs beside few others, hardly slower than alone, and a cap would only
  idle slots;
- the best period its longest group (by latency) allows: that group's room ``n`` (sequences, a
  multiple of G from G up to ``max_num_seqs``; a room above the instance's batch binds nothing)
  minimises ``max((work_i + lost_i(n)) / R, train_i, latency(n) / (k + 1))``, where
  ``lost_i(n)`` is the capacity the iteration's tail hosts give up
  (``latency(n) * (1 - thr(n) / thr(S))`` each, in full: a tail spans k + 1 periods, but every
  iteration brings its own, so each period pays for one iteration's tails whole). The
  uncapped period (room ``max_num_seqs``) is among the choices, so a room is taken only where the
  model prices it faster. ``k + 1`` such periods are the iteration's *target* latency; the tail
  hosts it prices are the fewest that leave no more groups missing the target
  (:func:`paid_tails`), each priced beside the batch an instance runs then (the capacity the caps
  give up is carried by the others too);
- a group is a *tail* if its latency uncapped (beside that batch) misses the target; its room is
  the largest with which it still meets the target (G when none does).

:class:`TailGovernor` is the run-time state: rooms of the groups running on each instance,
and the resulting cap (``rollout.tail_concurrency``: ``auto`` = the planned rooms, ``off`` =
no cap, ``N`` = N sequences on any instance running a tail). The simulator and the runtime
call the same ``on_*`` updates; nothing here knows about time, threads, Ray or vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from ..config import parse_tail_concurrency
from .cost import CostModel


@dataclass(frozen=True)
class IterationLoads:
    """Per-iteration figures of a plan (arrays indexed by iteration - first)."""
    work: np.ndarray       # decode work at full concurrency, instance-seconds
    train: np.ndarray      # trainer seconds incl. the weight sync
    context: np.ndarray    # mean context tokens of a running sequence
    tails: np.ndarray      # groups that miss the iteration's target on a full instance
    first: int = 0         # iteration number of index 0
    longest: np.ndarray | None = None         # the iteration's longest group: expected longest sample
    longest_prompt: np.ndarray | None = None  # and its prompt length


class TailModel:
    """Tail detection and room sizing from a cost model and a plan's per-iteration loads."""

    def __init__(self, cost: CostModel, *, group_size: int, max_num_seqs: int, lag_bound: int,
                 num_instances: int, loads: IterationLoads | None = None, speculation=None,
                 planned_batch: bool = True):
        self.cm = cost
        self.spec = speculation          # a speculative.Speculation, or None
        self.G, self.S, self.k, self.R = int(group_size), int(max_num_seqs), int(lag_bound), int(num_instances)
        self.loads = loads
        # an uncapped instance runs the sequences its share of the work keeps busy (:meth:`batch`);
        # False: ``max_num_seqs`` is already that (RoomSizer passes the measured mean batch)
        self.planned_batch = bool(planned_batch)
        self._targets: dict[int, tuple[float, float]] = {}    # iteration -> (target, batch at its period)
        self._grid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.rooms = np.arange(self.G, max(self.S, self.G) + 1, self.G, dtype=float)

    # latency and throughput --------------------------------------------------------------
    def latency(self, length, prompt_length, n, context):
        """Seconds a group of G samples of ``length`` tokens takes on an instance holding
        ``n`` sequences in all (the other ``n - G`` with ``context`` tokens each)."""
        G = self.G
        L = np.asarray(length, dtype=float)
        p = np.asarray(prompt_length, dtype=float)
        n = np.asarray(n, dtype=float)
        a, b, c = self._coefficients(n)
        step = a + b * (G * (p + L / 2.0) + np.maximum(n - G, 0.0) * context) + c * n
        return self.cm.group_prefill(p, G) + L * step

    def _coefficients(self, n):
        """Decode coefficients per token at ``n`` running sequences (speculating where it is on)."""
        cm = self.cm
        if self.spec is None:
            return cm.decode_a, cm.decode_b, cm.decode_c
        a1, b1, c1 = self.spec.coefficients(cm)
        on = (n <= self.spec.max_batch) if self.spec.max_batch > 0 else np.ones_like(n, dtype=bool)
        return np.where(on, a1, cm.decode_a), np.where(on, b1, cm.decode_b), np.where(on, c1, cm.decode_c)

    def throughput(self, n, context):
        """Tokens per second of an instance holding ``n`` sequences of ``context`` tokens."""
        n = np.asarray(n, dtype=float)
        a, b, c = self._coefficients(n)
        return n / (a + b * n * context + c * n)

    # decisions ------------------------------------------------------------------------
    def period(self, i: int) -> float:
        """Iteration ``i``'s predicted period without tails: max(work / R, trainer time)."""
        x = i - self.loads.first
        return float(max(self.loads.work[x] / self.R, self.loads.train[x]))

    def batch(self, i: int, period, lost=0.0):
        """Sequences an uncapped instance runs on average while iteration ``i`` takes ``period``
        seconds (array-like): the fewest whose throughput carries the instance's share of the
        iteration's decode work in that time, ``thr(n) >= (work / R) / period x thr(S)`` (``work``
        is instance-seconds at ``max_num_seqs``), between G and ``max_num_seqs``. An instance holds
        ``max_num_seqs`` sequences only while it has that much work: where the work fills a small
        share of the period, a long group runs beside few others and is hardly slower than alone,
        and a cap on its instance buys no speed (it only idles slots). ``lost``: the capacity caps
        give up (instance-seconds, :meth:`best_period`), carried by the instances too: where caps
        take the slack, every uncapped group runs beside more sequences."""
        per = np.asarray(period, dtype=float)
        if not self.planned_batch:
            return np.full(per.shape, float(self.S))
        x = i - self.loads.first
        if x not in self._grid:
            n = np.arange(self.G, max(self.S, self.G) + 1, dtype=float)
            self._grid[x] = (n, self.throughput(n, float(self.loads.context[x])))
        n, thr = self._grid[x]
        load = (self.loads.work[x] + np.asarray(lost, dtype=float)) / self.R
        need = (np.minimum(1.0, load / np.maximum(per, 1e-12)) * thr[-1]).reshape(-1)
        ok = thr[None, :] >= need[:, None] * (1.0 - 1e-12)
        return n[np.argmax(ok, axis=1)].reshape(np.broadcast(per, np.asarray(lost)).shape)

    def best_period(self, i: int, length: float, prompt_length: float, tails: float) -> tuple[float, int]:
        per, room, _ = self.best(i, length, prompt_length, tails)
        return per, room

    def best(self, i: int, length: float, prompt_length: float, tails: float) -> tuple[float, int, float]:
        """(period, room) minimising iteration ``i``'s period when its floor-setting group
        (``length``) gets ``room`` and ``tails`` groups in all are capped like it. With room
        ``n`` the group runs beside ``min(n, batch)`` sequences in all (:meth:`batch` at that
        period: a cap above what the instance would run binds nothing), so each room's period
        is the fixed point of ``max((work + lost) / R, train, latency / (k + 1))`` (found by
        bisection: the right side does not grow with the period). Ties: the largest room."""
        x = i - self.loads.first
        ctx = float(self.loads.context[x])
        n = self.rooms
        share = 1.0 - self.throughput(n, ctx) / float(self.throughput(self.S, ctx))
        lost = max(1.0, tails) * self.latency(length, prompt_length, n, ctx) * share
        lo = np.maximum((self.loads.work[x] + lost) / self.R, self.loads.train[x])

        def floor(per):
            return self.latency(length, prompt_length, np.minimum(n, self.batch(i, per, lost)), ctx) / (self.k + 1)

        hi = np.maximum(lo, self.latency(length, prompt_length, n, ctx) / (self.k + 1))
        if self.planned_batch:
            a, b = lo.copy(), hi.copy()
            for _ in range(60):          # a <= fixed point <= b
                mid = 0.5 * (a + b)
                up = mid >= np.maximum(lo, floor(mid))
                b, a = np.where(up, mid, b), np.where(up, a, mid)
            per = b
        else:
            per = hi
        best = per.min()
        b = int(np.flatnonzero(per <= best * (1.0 + 1e-9))[-1])
        return float(per[b]), int(n[b]), float(lost[b])

    def _target(self, i: int) -> tuple[float, float]:
        if i not in self._targets:
            x = i - self.loads.first
            per, _, lost = self.best(i, float(self.loads.longest[x]), float(self.loads.longest_prompt[x]),
                                     float(self.loads.tails[x]))
            self._targets[i] = ((self.k + 1) * per, float(self.batch(i, per, lost)))
        return self._targets[i]

    def target(self, i: int) -> float:
        """Latency within which a group of iteration ``i`` must finish not to set its floor:
        k + 1 periods of the best the iteration's longest group allows."""
        return self._target(i)[0]

    def target_batch(self, i: int) -> float:
        """Sequences an uncapped instance runs at the target's period (:meth:`batch`)."""
        return self._target(i)[1]

    def is_tail(self, i: int, length: float, prompt_length: float) -> bool:
        x = i - self.loads.first
        lat = float(self.latency(length, prompt_length, self.target_batch(i), self.loads.context[x]))
        return lat > self.target(i) * (1.0 + 1e-9)

    def room(self, i: int, length: float, prompt_length: float) -> int:
        """Sequences the instance of a group of iteration ``i`` (expected longest sample
        ``length``) may hold while it runs: the most with which the group still finishes within
        the iteration's target (``max_num_seqs``: no tail; G: it needs its instance alone)."""
        if self.loads is None:
            return self.S
        x = i - self.loads.first
        n = np.minimum(self.rooms, self.target_batch(i))
        lat = self.latency(length, prompt_length, n, float(self.loads.context[x]))
        ok = np.flatnonzero(lat <= self.target(i) * (1.0 + 1e-9))
        return int(self.rooms[ok[-1]]) if ok.size else self.G


def iteration_loads(iteration, prompt_length, length, work, train, *, tail_model: TailModel) -> IterationLoads:
    """Per-iteration loads of a plan: ``work`` = each group's decode work at full
    concurrency (instance-seconds), ``train`` = each iteration's trainer time (indexed by
    iteration - first), ``length`` = each group's expected longest sample.

    ``tails``: the capped groups the iteration's target pays for (:func:`paid_tails`): the target
    prices the capacity ``tails`` capped groups give up, and at most that many groups miss it."""
    it = np.asarray(iteration, dtype=np.int64)
    first = int(it.min())
    x = it - first
    n_it = int(x.max()) + 1
    W = np.bincount(x, weights=work, minlength=n_it)
    p = np.asarray(prompt_length, dtype=float)
    L = np.asarray(length, dtype=float)
    ctx = np.bincount(x, weights=p + L / 2.0, minlength=n_it) / np.maximum(np.bincount(x, minlength=n_it), 1)
    tm = tail_model
    # the floor-setting group: the longest latency (a long prompt adds to it; at the length clip many tie)
    top = np.full(n_it, -1, dtype=np.int64)
    order = np.lexsort((L, tm.latency(L, p, tm.S, ctx[x]), x))    # by iteration, slowest last
    top[x[order]] = order
    loads = IterationLoads(W, np.asarray(train, dtype=float), ctx, np.ones(n_it), first, L[top], p[top])
    model = TailModel(tm.cm, group_size=tm.G, max_num_seqs=tm.S, lag_bound=tm.k, num_instances=tm.R,
                      loads=loads, speculation=tm.spec)
    by_it = np.argsort(x, kind="stable")
    bounds = np.searchsorted(x[by_it], np.arange(n_it + 1))
    tails = np.array([paid_tails(model, i + first, L[by_it[bounds[i]:bounds[i + 1]]], p[by_it[bounds[i]:bounds[i + 1]]])
                      for i in range(n_it)], dtype=float)
    return IterationLoads(W, loads.train, ctx, tails, first, loads.longest, loads.longest_prompt)


def paid_tails(model: TailModel, i: int, length: np.ndarray, prompt_length: np.ndarray) -> int:
    """The fewest capped groups ``t`` (at least 1) whose target leaves at most ``t`` groups of
    iteration ``i`` missing it. ``length``, ``prompt_length``: the iteration's groups' expected
    longest samples and prompts; each misses the target when its latency uncapped (beside the
    sequences an instance runs at the target's period, :meth:`TailModel.batch`) exceeds it. The
    target is k + 1 times the best period of the iteration's longest group when ``t`` groups are
    capped like it (:meth:`TailModel.best_period`): it grows with ``t`` (more capacity given up),
    and the groups missing it (the tails, each capped) shrink. An iteration whose top is a crowd,
    no one group far longer than the next, has many groups missing the target its longest group
    alone would allow; a target priced on fewer capped groups than it makes tails understated the
    capacity its caps give up."""
    n, x = length.size, i - model.loads.first
    longest, prompt = float(model.loads.longest[x]), float(model.loads.longest_prompt[x])
    ctx = float(model.loads.context[x])

    def missing(t: int) -> int:
        per, _, lost = model.best(i, longest, prompt, float(t))
        lat = model.latency(length, prompt_length, model.batch(i, per, lost), ctx)
        return int(np.count_nonzero(lat > (model.k + 1) * per * (1.0 + 1e-9)))

    lo, hi = 1, max(1, n)              # missing(n) <= n always; the predicate is monotone in t
    while lo < hi:
        mid = (lo + hi) // 2
        if missing(mid) <= mid:
            hi = mid
        else:
            lo = mid + 1
    return lo


class TailGovernor:
    """Run-time caps: an instance running a tail group holds at most that group's room."""

    def __init__(self, max_num_seqs: int, mode="auto"):
        self.S = int(max_num_seqs)
        self.mode = parse_tail_concurrency(mode)
        self.room: dict[Hashable, int] = {}           # running tail groups -> room
        self.where: dict[Hashable, int] = {}          # -> instance
        self.caps: dict[int, dict[Hashable, int]] = {}

    def _effective(self, room: int) -> int:
        if self.mode == "off" or room <= 0 or room >= self.S:     # room 0: no tail
            return self.S
        return min(self.S, self.mode) if isinstance(self.mode, int) else room

    # state updates ---------------------------------------------------------------------
    def on_admit(self, instance: int, key: Hashable, room: int) -> None:
        self.where[key] = instance
        self.on_update(key, room)

    def on_update(self, key: Hashable, room: int) -> None:
        """The group's room changed (re-estimation made it a tail, or no longer one)."""
        r = self.where[key]
        eff = self._effective(int(room))
        caps = self.caps.setdefault(r, {})
        if eff < self.S:
            caps[key] = eff
        else:
            caps.pop(key, None)

    def on_finish(self, key: Hashable) -> None:
        r = self.where.pop(key, None)
        if r is not None:
            self.caps.get(r, {}).pop(key, None)

    def on_instance_failed(self, instance: int) -> None:
        for key in list(self.caps.pop(instance, {})):
            self.where.pop(key, None)
        for key in [k for k, r in self.where.items() if r == instance]:
            del self.where[key]

    # decisions -------------------------------------------------------------------------
    def cap(self, instance: int) -> int:
        """Sequences ``instance`` may hold now (``max_num_seqs`` when it runs no tail)."""
        caps = self.caps.get(instance)
        return min(caps.values()) if caps else self.S

    def admits(self, instance: int, held: int, room: int = 0) -> bool:
        """May ``instance``, holding ``held`` sequences, admit a group with ``room`` (0: no
        tail)? A tail itself needs only a free slot; any other group also stays under the cap."""
        if held >= self.S:
            return False
        return self._effective(int(room)) < self.S or held < self.cap(instance)

    def tail_hosts(self) -> list[int]:
        return sorted(r for r, c in self.caps.items() if c)
