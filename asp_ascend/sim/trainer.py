"""The simulated trainer: one optimizer step per scheduled mini-batch, then a weight sync.

Iteration i is trained by a trainer holding version i, one optimizer step per mini-batch, as
soon as that mini-batch's groups are all generated (``stream``) or once the whole iteration is
generated; then a weight sync publishes version i + 1. The trainer's sample queue (groups
generated, not yet trained) is recorded for the queue-occupancy metric.

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

from .costs import trainer_slots
from .jobs import SimJobs, minibatch_tokens

PUBLISH, TRAIN = 0, 1     # event kinds (see engine.py)


@dataclass
class TrainerSpec:
    """How the trainer times its work (see :class:`~asp_ascend.sim.costs.SimCosts`)."""
    train_per_token: float
    train_per_step: float
    sync_s: float
    micro_batch_size: int = 8
    micro_batching: str = "padded"   # padded | sorted | packed
    switch_s: float = 0.0            # colocated: train<->infer switch per iteration
    # runtime overheads (calibrated from a real run; 0/None = an ideal runtime):
    publish_s: float | None = None   # trainer busy after an iteration's last step (None: the whole sync);
    #                                  less than sync_s: it trains on while instances load the weights
    step_latency_s: float = 0.0      # an optimizer step starts this long after its data and the trainer are ready
    admit_latency_s: float = 0.0     # an instance admits work of a new version this long after its sync
    #                                  (and, with group_slots, a new group this long after a slot frees)


def resolve_micro_batching(sim_mode: str, train_mode: str) -> str:
    """The micro-batching the simulator prices: ``sim.micro_batching``, or for ``auto`` what the
    run's ``train.micro_batching`` resolves to. The runtime's ``auto`` packs wherever the loaded
    model's attention keeps packed sequences apart (every platform has a varlen attention,
    platforms/attention.py), so ``auto`` is ``packed`` here; ``padded``/``sorted`` stay as set."""
    if sim_mode != "auto":
        return sim_mode
    return "packed" if train_mode in ("auto", "packed") else train_mode


class Trainer:
    """The trainer's state. ``push(t, kind, x)`` queues an event; ``start_sync(t, version)``
    is called when an iteration is trained (the engine pauses instances if it must)."""

    def __init__(self, jobs: SimJobs, spec: TrainerSpec, stream: bool, push: Callable,
                 start_sync: Callable[[float, int], None], waiting: Callable[[int, float], None] | None = None):
        self.spec, self.stream, self.push, self.start_sync = spec, stream, push, start_sync
        self.waiting = waiting         # called when the trainer waits on an iteration (carry-over)
        self.jobs = jobs
        self.members: dict | None = None   # (iteration, mini_batch) -> job indices, once groups were swapped
        self.mbt = mbt = minibatch_tokens(jobs, spec.micro_batch_size, spec.micro_batching)
        self.mb_iter = mbt["iteration"].to_numpy().tolist()
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
        if self.mb_left[x] == 0:
            heapq.heappush(self.ready[self.mb_iter[x]], x)
        self.it_gen_left[self.job_it[j]] -= 1

    def try_step(self, t: float) -> None:
        """Start the next optimizer step (or the colocated switch) if the trainer can."""
        if self.busy:
            return
        i = self.cur_it
        if i >= self.n_it:
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
        self.qsize -= self.mb_groups[x]
        self._q_event(t, "get")
        self.busy = True
        t0 = t + self.spec.step_latency_s
        self.push(t0 + self.mb_dur[x], TRAIN, x, 0)
        self.step_rows.append((t0, t0 + self.mb_dur[x], x))

    def on_train_end(self, x: int, t: float) -> None:
        """A TRAIN event: a step ended (``x`` >= 0), a switch ended (-1), or the trainer's
        part of a sync ended (``x`` = -version - 2)."""
        self.busy = False
        if x <= -2:                    # published: the trainer holds version -x - 2, the sync goes on
            self.cur_it = -x - 2
            self.try_step(t)
            return
        if x < 0:                      # end of a colocated switch
            self.try_step(t)
            return
        i = self.mb_iter[x]
        self.steps_done[i] += 1
        if self.steps_done[i] < len(self.it_mbs[i]):
            self.try_step(t)
            return
        # iteration i trained: weight sync publishes version i + 1
        sync = self.spec.sync_s
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
    def swap(self, deferred: int, swapped_in: int) -> None:
        """Jobs ``deferred`` (unfinished) and ``swapped_in`` (generated, untrained) trade mini-batch
        slots (DESIGN 9 e); both mini-batches are re-costed from their new members."""
        if self.members is None:
            jobs = self.jobs
            rank = jobs.dispatch_rank if jobs.train_rank is None else jobs.train_rank
            self.members = {}
            for j in np.lexsort((rank, jobs.mini_batch, jobs.iteration)).tolist():
                self.members.setdefault((self.job_it[j], int(jobs.mini_batch[j])), []).append(j)
        xd, xs = self.job_mb[deferred], self.job_mb[swapped_in]
        kd, ks = (self.mb_iter[xd], int(self.mbt["mini_batch"].iat[xd])), (self.mb_iter[xs], int(self.mbt["mini_batch"].iat[xs]))
        md, ms = self.members[kd], self.members[ks]
        md[md.index(deferred)] = swapped_in
        ms[ms.index(swapped_in)] = deferred
        self.job_mb[deferred], self.job_mb[swapped_in] = xs, xd
        self.job_it[deferred], self.job_it[swapped_in] = self.mb_iter[xs], self.mb_iter[xd]
        self.it_gen_left[self.mb_iter[xd]] -= 1
        self.it_gen_left[self.mb_iter[xs]] += 1
        self.mb_left[xs] += 1
        if self.mb_left[xs] == 1 and xs in self.ready[self.mb_iter[xs]]:
            self.ready[self.mb_iter[xs]].remove(xs)
            heapq.heapify(self.ready[self.mb_iter[xs]])
        self.mb_left[xd] -= 1
        if self.mb_left[xd] == 0:
            heapq.heappush(self.ready[self.mb_iter[xd]], xd)
        for x, key in ((xd, kd), (xs, ks)):
            self._recost(x, self.members[key])

    def _recost(self, x: int, js: list[int]) -> None:
        """Mini-batch ``x``'s tokens, pad and duration from its members ``js``."""
        jobs, spec = self.jobs, self.spec
        sub = SimJobs(epoch=jobs.epoch[js], prompt_id=jobs.prompt_id[js], iteration=np.zeros(len(js), np.int64),
                      mini_batch=np.zeros(len(js), np.int64), instance=jobs.instance[js],
                      dispatch_rank=np.arange(len(js), dtype=np.int64), prompt_length=jobs.prompt_length[js],
                      resp=jobs.resp[js])
        row = minibatch_tokens(sub, spec.micro_batch_size, spec.micro_batching).iloc[0]
        self.mbt.iat[x, self.mbt.columns.get_loc("tokens")] = row["tokens"]
        self.mbt.iat[x, self.mbt.columns.get_loc("padded_tokens")] = row["padded_tokens"]
        self.mb_dur[x] = (spec.train_per_token * float(trainer_slots(row["tokens"], row["padded_tokens"],
                                                                      spec.micro_batching)) + spec.train_per_step)
