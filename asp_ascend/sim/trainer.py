"""The simulated trainer: one optimizer step per scheduled mini-batch, then a weight sync.

Iteration i is trained by a trainer holding version i, one optimizer step per mini-batch, as
soon as that mini-batch's groups are all generated (``stream``) or once the whole iteration is
generated; then a weight sync publishes version i + 1. The trainer's sample queue (groups
generated, not yet trained) is recorded for the queue-occupancy metric.

Micro-batches (:func:`micro_batch_table`): each optimizer step is cut as the runtime's trainer
cuts it (``scheduler.microbatch.plan_step`` with ``train.max_tokens_per_micro_batch``, or
``micro_batch_size`` x the step's longest sequence when 0); packed micro-batches carry no pad.
``padded_to_dispatch`` is the MindSpeed-RL baseline as it ships (``use_remove_padding: false``).

Runtime overheads (:class:`TrainerSpec`; zero by default, fitted by ``asp simulate --calibrate``):
an optimizer step starts ``step_latency_s`` after its mini-batch is generated and the trainer is
free; after an iteration's last step the trainer is busy for ``publish_s`` (its share of the
sync plus per-iteration bookkeeping; it may train on while the instances finish the sync).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from ..scheduler.execution import STREAM_STARTS, stream_candidate
from ..scheduler.microbatch import step_slots
from .costs import trainer_slots, trainer_slots_one
from .jobs import SimJobs

PUBLISH, TRAIN = 0, 1     # event kinds (see engine.py)


@dataclass
class TrainerSpec:
    """How the trainer times its work (see :class:`~asp_ascend.sim.costs.SimCosts`)."""
    train_per_token: float
    train_per_step: float
    sync_s: float
    micro_batch_size: int = 8
    micro_batching: str = "padded"   # padded | sorted | packed | padded_to_dispatch (see micro_batch_table)
    switch_s: float = 0.0            # colocated: train<->infer switch per iteration
    # runtime overheads (calibrated from a real run; 0/None = an ideal runtime):
    publish_s: float | None = None   # trainer busy after an iteration's last step (None: the whole sync);
    #                                  less than sync_s: it trains on while instances load the weights
    step_latency_s: float = 0.0      # an optimizer step starts this long after its data and the trainer are ready
    admit_latency_s: float = 0.0     # an instance admits work of a new version this long after its sync
    #                                  (and, with group_slots, a new group this long after a slot frees)
    max_tokens_per_micro_batch: int = 0   # train.max_tokens_per_micro_batch: the token budget (0 = micro x longest)
    sync_busy_s: float = 0.0         # a sync that starts while an instance decodes takes this much longer
    #                                  (the weights land between engine steps of a busy instance)
    admit_each_s: float = 0.0        # each admission reaches its instance's engine this long after its hand-over
    #                                  starts, one hand-over at a time per instance (sim/instances.py)
    admit_engine_s: float = 0.0      # engine time an admission costs its instance when it starts beside running
    #                                  sequences (the hand-over runs on the instance's core; sim/instances.py)
    stream_groups: bool = False      # sim.stream_groups: a streaming trainer runs each group's forward/backward
    #                                  as it is generated, the optimizer step after the mini-batch's last group
    stream_start: str = "half_generated"  # sim.stream_groups_start: which partly generated mini-batch it starts
    #                                       (scheduler/execution.py stream_candidate)


def resolve_micro_batching(sim_mode: str, train_mode: str) -> str:
    """The micro-batching the simulator prices: ``sim.micro_batching``, or for ``auto`` what the
    run's ``train.micro_batching`` resolves to. The runtime's ``auto`` packs wherever the loaded
    model's attention keeps packed sequences apart (every platform has a varlen attention,
    platforms/attention.py), so ``auto`` is ``packed`` here; ``padded``/``sorted`` stay as set."""
    if sim_mode != "auto":
        return sim_mode
    return "packed" if train_mode in ("auto", "packed") else train_mode


SIM_MODES = ("padded", "sorted", "packed", "padded_to_dispatch")


def group_pads(jobs: SimJobs, micro_batch_size: int, mode: str, max_tokens: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, pad slots) of every job's group cut on its own as :func:`micro_batch_table` cuts one
    step (``sim.stream_groups``: a group's forward/backward runs alone, as soon as it is generated;
    its padded/sorted micro-batches hold only its own sequences)."""
    if mode == "padded_to_dispatch":
        raise ValueError("sim.stream_groups: padded_to_dispatch (sim.colocated_micro_batching) pads a rank's "
                         "whole dispatched share; it has no per-group cut")
    J, G = jobs.resp.shape
    seq = (jobs.resp + jobs.prompt_length[:, None]).reshape(-1).astype(np.int64)
    return step_slots(np.repeat(np.arange(J), G), seq, mode=mode, micro=micro_batch_size, max_tokens=max_tokens)


def micro_batch_table(jobs: SimJobs, micro_batch_size: int, mode: str, max_tokens: int = 0,
                      per_group: bool = False, group_pad: np.ndarray | None = None) -> pd.DataFrame:
    """Per optimizer step (iteration, mini_batch): ``groups``, real ``tokens`` (prompt + response
    of its sequences) and ``padded_tokens`` (pad slots the trainer computes on).

    ``padded``/``sorted``/``packed``: the micro-batches ``scheduler.microbatch.plan_step`` makes of
    the step's sequences, as the runtime's trainer does (``scheduler/microbatch.plan_micro_batches``):
    token budget ``max_tokens``, or when 0 ``micro_batch_size`` x the step's longest sequence, at
    most ``micro_batch_size`` sequences per padded/sorted micro-batch. Sequences in schedule order
    (a mini-batch's prompts by ``train_rank``/``dispatch_rank``, samples in order); ``sorted`` takes
    them longest first. ``packed`` has no pad whatever the cut. With the default budget the cut is
    exactly every ``micro_batch_size`` sequences (no smaller count reaches micro x longest), which
    is computed vectorised (``scheduler.microbatch.step_slots``, shared with the analytic
    estimate); an explicit budget calls ``plan_step`` per step.

    ``padded_to_dispatch``: MindSpeed-RL as it ships (``use_remove_padding: false``): each
    data-parallel rank takes its share of the iteration in one dispatch (``actor_update_dispatch_size``
    = global batch x G / DP) from the TransferDock, padded to that share's longest sequence, and
    splits it into fixed micro-batches of that width; the ranks meet at every optimizer step, so
    the rank holding the iteration's longest sequence sets the pace: every sequence of the
    iteration costs the iteration's longest.

    ``per_group`` (``sim.stream_groups``): each group is cut on its own (:func:`group_pads`, or
    ``group_pad`` where the caller has them already); a step's ``padded_tokens`` is the sum of its
    groups' pad.
    """
    if mode not in SIM_MODES:
        raise ValueError(f"sim micro-batching: {mode!r} is not one of {', '.join(SIM_MODES)}")
    if micro_batch_size < 1:
        raise ValueError(f"train.micro_batch_size: must be >= 1, got {micro_batch_size}")
    J, G = jobs.resp.shape
    rank = jobs.dispatch_rank if jobs.train_rank is None else jobs.train_rank
    order = np.lexsort((rank, jobs.mini_batch, jobs.iteration))
    n_mb = int(jobs.mini_batch.max(initial=0)) + 1
    jkey = jobs.iteration.astype(np.int64)[order] * n_mb + jobs.mini_batch.astype(np.int64)[order]
    key = np.repeat(jkey, G)
    seq_len = (jobs.resp[order] + jobs.prompt_length[order, None]).reshape(-1).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.r_[starts, key.size])
    tokens = np.add.reduceat(seq_len, starts)
    skey = key[starts]
    mb_starts = np.flatnonzero(np.r_[True, jkey[1:] != jkey[:-1]])     # per step, its first group
    if per_group:
        if group_pad is None:
            group_pad = group_pads(jobs, micro_batch_size, mode, max_tokens)[1]
        pad = np.add.reduceat(group_pad[order], mb_starts)
    elif mode == "padded_to_dispatch":
        it_of = skey // n_mb
        longest = np.zeros(int(it_of.max()) + 1, dtype=np.int64)
        np.maximum.at(longest, it_of, np.maximum.reduceat(seq_len, starts))
        pad = counts * longest[it_of] - tokens
    else:
        _, pad = step_slots(np.repeat(np.arange(starts.size), counts), seq_len, mode=mode, micro=micro_batch_size,
                            max_tokens=max_tokens)
    groups = np.diff(np.r_[mb_starts, J])
    return pd.DataFrame({"iteration": skey // n_mb, "mini_batch": skey % n_mb, "tokens": tokens,
                         "padded_tokens": pad, "groups": groups})


class Trainer:
    """The trainer's state. ``push(t, kind, x)`` queues an event; ``start_sync(t, version)``
    is called when an iteration is trained (the engine pauses instances if it must)."""

    def __init__(self, jobs: SimJobs, spec: TrainerSpec, stream: bool, push: Callable,
                 start_sync: Callable[[float, int], None], waiting: Callable[..., None] | None = None,
                 decoding: Callable[[], bool] | None = None, trained: Callable[[int, int], None] | None = None,
                 choosing: Callable[[int, int], None] | None = None):
        self.spec, self.stream, self.push, self.start_sync = spec, stream, push, start_sync
        self.decoding = decoding       # is any instance decoding now (spec.sync_busy_s)
        self.sync_dur = spec.sync_s    # the duration of the sync started last
        self.waiting = waiting         # called when the trainer waits on an iteration (regroup, carry-over);
        #                                with a third argument, the mini-batch being streamed waits
        self.trained = trained         # called with (iteration, mini_batch) when its step ends (carry-over)
        self.choosing = choosing       # called with (iteration, x) before mini-batch x's step (regroup_heavy)
        self.jobs = jobs
        self.members: dict | None = None   # (iteration, mini_batch) -> job indices, once groups were swapped
        # sim.stream_groups: only a streaming trainer (stream_train) can take groups before the iteration is
        # generated; a trainer that waits for the whole iteration (sync_colocated, one_step_off) is unaffected
        self.by_group = spec.stream_groups and stream
        if self.by_group:   # per group: its tokens and pad cut on its own (group_pads), once for both uses
            g_tok, self.g_pad = group_pads(jobs, spec.micro_batch_size, spec.micro_batching,
                                           spec.max_tokens_per_micro_batch)
        self.mbt = mbt = micro_batch_table(jobs, spec.micro_batch_size, spec.micro_batching,
                                           spec.max_tokens_per_micro_batch, per_group=self.by_group,
                                           group_pad=self.g_pad if self.by_group else None)
        self._recosted: dict[int, tuple[int, int]] = {}   # swapped mini-batch -> (tokens, pad); see table()
        self._group_tok: list[int] | None = None    # per job: its sequences' tokens (made at the first _recost)
        self._group_pad: list[int] | None = None    # per job: its pad cut on its own (sim.stream_groups)
        self.mb_iter = mbt["iteration"].to_numpy().tolist()
        self.mb_mini = mbt["mini_batch"].to_numpy().tolist()
        self.mb_groups = mbt["groups"].to_numpy().tolist()
        self.mb_dur = (spec.train_per_token * trainer_slots(mbt["tokens"], mbt["padded_tokens"], spec.micro_batching)
                       + spec.train_per_step).tolist()
        index = {(int(i), int(m)): x for x, (i, m) in enumerate(zip(mbt["iteration"], mbt["mini_batch"]))}
        self.job_mb = [index[(int(i), int(m))] for i, m in zip(jobs.iteration.tolist(), jobs.mini_batch.tolist())]
        self.job_it = jobs.iteration.tolist()
        iters = sorted(set(self.mb_iter))
        if iters != list(range(len(iters))):
            raise ValueError(f"iterations must be 0..{len(iters) - 1} without gaps; got {iters[:5]}...")
        self.n_it = n_it = len(iters)
        self.it_mbs: list[list[int]] = [[] for _ in range(n_it)]
        for x, i in enumerate(self.mb_iter):
            self.it_mbs[i].append(x)
        self.mb_left = list(self.mb_groups)
        self.it_gen_left = [0] * n_it          # groups of the iteration not yet generated
        for i in self.job_it:
            self.it_gen_left[i] += 1
        self.cur_it = 0                        # the version the trainer holds = iteration it trains
        self.busy = False
        self.steps_done = [0] * n_it
        self.ready: list[list] = [[] for _ in range(n_it)]   # generated mini-batches per iteration (heap)
        self.switched = [False] * n_it
        self.qsize = 0
        self.queue: tuple[list, list, list] = ([], [], [])    # t, op, size
        self.step_rows: list = []
        self.sync_rows: list = []
        self.early_free = spec.publish_s is not None   # the trainer's own time per sync, not the sync's
        self.n_mb = len(self.mb_iter)
        if self.by_group and spec.switch_s > 0:
            raise ValueError("sim.stream_groups: a colocated trainer (train<->infer switch, sim.colocated_switch_s) "
                             "waits for the whole iteration; streaming groups applies to decoupled trainers only")
        if self.by_group and spec.stream_start not in STREAM_STARTS:
            raise ValueError(f"sim.stream_groups_start: {spec.stream_start!r} is not one of {', '.join(STREAM_STARTS)}")
        if self.by_group:
            # per group: its forward/backward's seconds (its own micro-batches)
            self.g_dur = (spec.train_per_token * trainer_slots(g_tok, self.g_pad, spec.micro_batching)).tolist()
            self.avail: list[list[int]] = [[] for _ in range(self.n_mb)]   # generated, not consumed, per mini-batch
            self.mb_trained = [False] * self.n_mb   # its optimizer step ran
            self.consumed = [0] * self.n_mb    # groups of the mini-batch whose forward/backward ran
            self.active = -1                   # the mini-batch being streamed (its step not yet run)
            self.active_busy = 0.0             # the trainer's seconds on it so far
            # as the runtime records a streamed step: when its first group began, and its parts (runs of
            # group passes back to back; a part ends where the trainer waits for the next group)
            self.active_first, self.active_parts, self.active_waited = 0.0, 0, False

    def _q_event(self, t: float, op: str) -> None:
        self.queue[0].append(t)
        self.queue[1].append(op)
        self.queue[2].append(self.qsize)

    # ------------------------------------------------------------------ events
    def on_group(self, j: int, t: float) -> None:
        """Job ``j``'s group is generated: into the queue, its mini-batch perhaps ready."""
        self.qsize += 1
        self._q_event(t, "put")
        x = self.job_mb[j]
        self.mb_left[x] -= 1
        if self.mb_left[x] == 0 and not (self.by_group and x == self.active):
            heapq.heappush(self.ready[self.mb_iter[x]], x)
        self.it_gen_left[self.job_it[j]] -= 1
        if self.by_group:
            self.avail[x].append(j)

    def try_step(self, t: float) -> None:
        """Start the next optimizer step (or the colocated switch) if the trainer can."""
        if self.busy:
            return
        i = self.cur_it
        if i >= self.n_it:
            return
        if self.by_group:
            self._try_group(i, t)
            return
        if not self.ready[i] and self.waiting is not None:
            self.waiting(i, t)
        if not self.ready[i]:
            return
        if not self.stream and self.it_gen_left[i] > 0:
            return
        if self.spec.switch_s > 0 and not self.switched[i]:
            self.switched[i] = True
            self.busy = True
            self.push(t + self.spec.switch_s, TRAIN, -1)
            return
        x = heapq.heappop(self.ready[i])
        if self.choosing is not None:
            self.choosing(i, x)
        self.qsize -= self.mb_groups[x]
        self._q_event(t, "get")
        self.busy = True
        t0 = t + self.spec.step_latency_s
        self.push(t0 + self.mb_dur[x], TRAIN, x, 0)
        self.step_rows.append((t0, t0 + self.mb_dur[x], x, t0, 1))

    def _try_group(self, i: int, t: float) -> None:
        """``sim.stream_groups``: run the forward/backward of the next generated group of the mini-batch
        being streamed. With none under way the trainer takes a fully generated mini-batch of
        iteration ``i`` (lowest index first, as without streaming), else of the partly generated ones
        :func:`~asp_ascend.scheduler.execution.stream_candidate` allows the one with the fewest groups
        still to generate (then the lowest index), and once it has taken a group of a mini-batch it trains that
        mini-batch to its optimizer step before it takes another (the others' groups need the step's
        weights)."""
        x = self.active
        latency = 0.0
        if x < 0:
            if not self.ready[i] and self.waiting is not None:
                self.waiting(i, t)     # carry-over may swap generated groups in (swap keeps avail current)
            if self.ready[i]:
                x = heapq.heappop(self.ready[i])
                if self.choosing is not None:
                    self.choosing(i, x)
            else:
                x = stream_candidate(self.spec.stream_start, (y for y in self.it_mbs[i] if not self.mb_trained[y]),
                                     lambda y: self.mb_groups[y], lambda y: len(self.avail[y]))
                if x is None:
                    return
            self.active, self.active_busy = x, 0.0
            latency = self.spec.step_latency_s    # once per optimizer step, before its first group
            self.active_first, self.active_parts, self.active_waited = t + latency, 0, True
        elif not self.avail[x] and self.waiting is not None:
            self.waiting(i, t, x)      # regroup may fill the streamed mini-batch; carry-over may swap
        if not self.avail[x]:
            self.active_waited = True
            return
        if self.active_waited:
            self.active_parts += 1
            self.active_waited = False
        j = self.avail[x].pop(0)
        self.consumed[x] += 1
        self.qsize -= 1
        self._q_event(t, "get")
        self.busy = True
        self.active_busy += self.g_dur[j]
        self.push(t + latency + self.g_dur[j], TRAIN, self.n_mb + j)

    def on_train_end(self, x: int, t: float) -> None:
        """A TRAIN event: a step ended (``x`` >= 0), a switch ended (-1), or the trainer's
        part of a sync ended (``x`` = -version - 2); with ``sim.stream_groups`` a group's
        forward/backward ended (``x`` = number of mini-batches + job)."""
        self.busy = False
        if x >= self.n_mb:             # a group's forward/backward ended
            a = self.active
            if self.consumed[a] < self.mb_groups[a]:
                self.try_step(t)
                return
            dur = self.spec.train_per_step       # the mini-batch's last group: its optimizer step
            self.active_busy += dur
            self.busy = True
            self.push(t + dur, TRAIN, a)
            # one row per optimizer step, as long as the trainer was busy on it (so the trainer
            # breakdown counts busy time): it ends with the step, its groups may have started earlier
            self.step_rows.append((t + dur - self.active_busy, t + dur, a, self.active_first, self.active_parts))
            return
        if x >= 0 and self.by_group:
            self.active = -1
            self.mb_trained[x] = True
        if x <= -2:                    # published: the trainer holds version -x - 2, the sync goes on
            self.cur_it = -x - 2
            self.try_step(t)
            return
        if x < 0:                      # end of a colocated switch
            self.try_step(t)
            return
        i = self.mb_iter[x]
        self.steps_done[i] += 1
        if self.trained is not None:
            self.trained(i, self.mb_mini[x])
        if self.steps_done[i] < len(self.it_mbs[i]):
            self.try_step(t)
            return
        # iteration i trained: weight sync publishes version i + 1
        sync = self.spec.sync_s
        if self.spec.sync_busy_s and self.decoding is not None and self.decoding():
            sync += self.spec.sync_busy_s
        self.sync_dur = sync
        self.busy = True
        self.sync_rows.append((t, t + sync, i + 1))
        self.start_sync(t, i + 1)
        self.push(t + sync, PUBLISH, i + 1)
        if self.early_free:
            self.push(t + self.spec.publish_s, TRAIN, -(i + 1) - 2)

    def on_publish(self, v: int) -> None:
        """Version ``v`` published (the end of the sync)."""
        if not self.early_free:
            self.cur_it = v
            self.busy = False

    # ------------------------------------------------------------------ carry-over
    def swap_init(self) -> None:
        """The members of every mini-batch, in trainer order, before the first swap or exchange."""
        jobs = self.jobs
        rank = jobs.dispatch_rank if jobs.train_rank is None else jobs.train_rank
        self.members = {}
        for j in np.lexsort((rank, jobs.mini_batch, jobs.iteration)).tolist():
            self.members.setdefault((self.job_it[j], int(jobs.mini_batch[j])), []).append(j)

    def swap(self, deferred: int, swapped_in: int) -> None:
        """Jobs ``deferred`` (unfinished) and ``swapped_in`` (generated, untrained) trade mini-batch
        slots: carry-over (DESIGN 9 e, across iterations) or regroup (within one); both mini-batches
        are re-costed from their new members."""
        xd, xs = self._trade_slots(deferred, swapped_in)
        if self.by_group:
            # deferred is not generated (in no avail list); swapped_in is generated and, being of a
            # later iteration than the trainer's, not consumed yet: it moves to deferred's mini-batch
            if swapped_in not in self.avail[xs] or xs == self.active:
                raise RuntimeError(f"sim.stream_groups: swapped-in group {swapped_in} was already trained; this is a bug")
            self.avail[xs].remove(swapped_in)
            self.avail[xd].append(swapped_in)
        self.job_it[deferred], self.job_it[swapped_in] = self.mb_iter[xs], self.mb_iter[xd]
        self.it_gen_left[self.mb_iter[xd]] -= 1
        self.it_gen_left[self.mb_iter[xs]] += 1
        self.mb_left[xs] += 1
        if self.mb_left[xs] == 1 and xs in self.ready[self.mb_iter[xs]]:
            self.ready[self.mb_iter[xs]].remove(xs)
            heapq.heapify(self.ready[self.mb_iter[xs]])
        self.mb_left[xd] -= 1
        if self.mb_left[xd] == 0 and not (self.by_group and xd == self.active):
            heapq.heappush(self.ready[self.mb_iter[xd]], xd)
        self._recost_members(xd, xs)

    def exchange(self, pairs) -> None:
        """Each pair ``(a, b)`` of generated, untrained jobs of one iteration trades mini-batch
        slots (``pipeline.regroup_heavy``), in order; every mini-batch touched is re-costed once,
        after the last trade (its cost depends only on its final members). Neither mini-batch's
        count of groups left to generate changes."""
        touched = {}
        for a, b in pairs:
            xa, xb = self._trade_slots(a, b)
            touched.update(dict.fromkeys((xa, xb)))
            if self.by_group:
                for j, src, dst in ((a, xa, xb), (b, xb, xa)):
                    if j not in self.avail[src]:
                        raise RuntimeError(f"regroup_heavy: group {j} is not generated and untrained; this is a bug")
                    self.avail[src].remove(j)
                    self.avail[dst].append(j)
        self._recost_members(*touched)

    def _trade_slots(self, a: int, b: int) -> tuple[int, int]:
        """Jobs ``a`` and ``b`` trade places in their mini-batches' member lists (``job_mb`` follows);
        returns their mini-batches before the trade."""
        if self.members is None:
            self.swap_init()
        xa, xb = self.job_mb[a], self.job_mb[b]
        ma, mb = self.members[(self.mb_iter[xa], self.mb_mini[xa])], self.members[(self.mb_iter[xb], self.mb_mini[xb])]
        ma[ma.index(a)] = b
        mb[mb.index(b)] = a
        self.job_mb[a], self.job_mb[b] = xb, xa
        return xa, xb

    def _recost_members(self, *xs: int) -> None:
        for x in xs:
            self._recost(x, self.members[(self.mb_iter[x], self.mb_mini[x])])

    def table(self) -> pd.DataFrame:
        """The micro-batch table as trained: swapped mini-batches carry their new members' tokens
        and pad (written once at the end: a pandas write per swap cost more than the swap)."""
        if self._recosted:
            rows = sorted(self._recosted)
            mbt = self.mbt
            mbt.iloc[rows, mbt.columns.get_loc("tokens")] = [self._recosted[x][0] for x in rows]
            mbt.iloc[rows, mbt.columns.get_loc("padded_tokens")] = [self._recosted[x][1] for x in rows]
            self._recosted = {}
        return self.mbt

    def _recost(self, x: int, js: list[int]) -> None:
        """Mini-batch ``x``'s tokens, pad and duration from its members ``js`` (in order), cut as
        :func:`micro_batch_table` cuts one step (on arrays: a table per swap cost more than the rest)."""
        jobs, spec = self.jobs, self.spec
        if self.by_group or spec.micro_batching == "packed":
            # the pad needs no sequence: sums of per-group integers, kept as lists (no arrays per swap)
            if self._group_tok is None:
                self._group_tok = (jobs.resp + jobs.prompt_length[:, None]).astype(np.int64).sum(axis=1).tolist()
                self._group_pad = self.g_pad.tolist() if self.by_group else None
            tokens = sum(map(self._group_tok.__getitem__, js))
            # each group cut on its own (group_pads); packed micro-batches carry no pad (step_slots' answer)
            pad = sum(map(self._group_pad.__getitem__, js)) if self.by_group else 0
            self._recosted[x] = (tokens, pad)
            self.mb_dur[x] = (spec.train_per_token * trainer_slots_one(tokens, pad, spec.micro_batching)
                              + spec.train_per_step)
            return
        seq = (jobs.resp[js] + jobs.prompt_length[js, None]).reshape(-1).astype(np.int64)
        tokens = int(seq.sum())
        if spec.micro_batching == "padded_to_dispatch":
            # colocated only, never swaps; here it would pad to this mini-batch's longest
            pad = int(seq.size * seq.max()) - tokens
        else:
            pad = int(step_slots(np.zeros(seq.size, np.int64), seq, mode=spec.micro_batching,
                                 micro=spec.micro_batch_size, max_tokens=spec.max_tokens_per_micro_batch)[1][0])
        self._recosted[x] = (tokens, pad)
        self.mb_dur[x] = (spec.train_per_token * float(trainer_slots(tokens, pad, spec.micro_batching))
                          + spec.train_per_step)
