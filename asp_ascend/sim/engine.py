"""The discrete-event engine: R rollout instances with continuous batching, one trainer.

Rollout instance (vLLM-like continuous batching):

- at most ``max_num_seqs`` running sequences; a prompt group (G sequences) is taken from the
  :class:`~asp_ascend.scheduler.admission.Dispatcher` whenever running + waiting < max_num_seqs,
  its sequences wait in the instance's queue until a slot and KV space are free;
- KV cache of ``kv_capacity`` tokens (0 = unlimited): a sequence holds prompt + generated
  tokens; when the next decode step would overflow, the most recently admitted sequence is
  preempted (its KV freed, re-queued first, recomputed by prefill on re-admission, as vLLM does);
- admitted sequences cost ``prefill_per_token`` per prompt (+ already generated) token;
- one decode step gives every running sequence one token and takes ``a + b*C + c*n``
  (``C`` = context tokens incl. the new one, ``n`` = running sequences).

Time is not advanced token by token: between events (a sequence finishing, a KV overflow,
an admission at a step boundary) the running set is fixed, so the time of ``m`` steps is
closed-form, ``m*(a + c*n) + b*(m*C0 + n*m*(m+1)/2)``, and an instance jumps straight to its
next event. Cost is O(log n) per sequence finish.

Trainer: trains iteration i (holding version i) one optimizer step per scheduled mini-batch,
as soon as that mini-batch's groups are all generated (``stream_train``) or once the whole
iteration is generated; then a weight sync publishes version i+1. Admission/lag control is
the shared :class:`~asp_ascend.scheduler.admission.AdmissionController`; instances take the
new version at the end of the sync (pausing during it when ``sync_pause``), or, with
``barrier`` (verl's one-step-off), only between generation batches.

Runtime overheads (``TrainerSpec``; zero by default, fitted by ``asp simulate --calibrate``): an
optimizer step starts ``step_latency_s`` after its mini-batch is generated and the trainer is
free; after an iteration's last step the trainer is busy for ``publish_s`` (its share of the sync
plus per-iteration bookkeeping; it may train on while the instances finish the sync); an instance admits work that its new version made admissible ``admit_latency_s``
after its sync (with ``group_slots``, also a new group that long after a group frees its slot).

Output: a :class:`SimTimeline` (the DESIGN 5 events, columnar) for :func:`metrics.summarize`.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..metrics.timeline import KINDS, Timeline
from ..scheduler.cost import CostModel
from ..scheduler.execution import ExecutionPlan, ExecutionSettings, jobs_from_columns

# event kinds, in processing priority at equal times
_PUBLISH, _TRAIN, _VERSION, _SLOT, _INST, _STEAL = 0, 1, 2, 3, 4, 5


@dataclass
class SimJobs:
    """One row per prompt group to generate and train (all simulated epochs).

    ``iteration`` is global over epochs; ``resp`` is (J, G) response lengths.
    """
    epoch: np.ndarray
    prompt_id: np.ndarray
    iteration: np.ndarray
    mini_batch: np.ndarray
    instance: np.ndarray
    dispatch_rank: np.ndarray
    prompt_length: np.ndarray
    resp: np.ndarray
    predicted_length: np.ndarray | None = None
    train_rank: np.ndarray | None = None   # order of groups within a mini-batch (default: dispatch_rank)

    def __len__(self) -> int:
        return int(self.epoch.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.resp.shape[1])


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


class SimTimeline(Timeline):
    """A :class:`Timeline` whose events are held as pandas frames (fast for 10^6 requests)."""

    def __init__(self, frames: dict[str, pd.DataFrame]):
        super().__init__()
        self.frames = {k: frames.get(k, pd.DataFrame()) for k in KINDS}

    def frame(self, kind: str) -> pd.DataFrame:
        if kind not in self.frames:
            raise ValueError(f"unknown timeline event kind {kind!r}; valid: {', '.join(KINDS)}")
        return self.frames[kind]

    def write_jsonl(self, path) -> None:
        from ..io import atomic_path
        from .timeline_io import write_frames_jsonl

        with atomic_path(path) as tmp:
            write_frames_jsonl(self.frames, tmp)


def minibatch_tokens(jobs: SimJobs, micro_batch_size: int, mode: str) -> pd.DataFrame:
    """Per (iteration, mini_batch): groups, real tokens, padded token slots.

    The mini-batch's sequences (its prompts in dispatch order, samples in order; or sorted
    by length for ``sorted``) are cut into micro-batches of ``micro_batch_size`` sequences,
    each padded to its longest sequence (prompt + response). ``packed`` has no padding.
    """
    J, G = jobs.resp.shape
    rank = jobs.dispatch_rank if jobs.train_rank is None else jobs.train_rank
    order = np.lexsort((rank, jobs.mini_batch, jobs.iteration))
    it = np.repeat(jobs.iteration[order], G)
    mb = np.repeat(jobs.mini_batch[order], G)
    seq_len = (jobs.resp[order] + jobs.prompt_length[order, None]).reshape(-1).astype(np.int64)
    key = it.astype(np.int64) * (int(mb.max(initial=0)) + 1) + mb
    if mode == "sorted":
        o2 = np.lexsort((seq_len, key))
        key, seq_len, it, mb = key[o2], seq_len[o2], it[o2], mb[o2]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    pos = np.arange(key.size) - np.repeat(starts, np.diff(np.r_[starts, key.size]))
    micro = np.r_[True, (key[1:] != key[:-1]) | (pos[1:] % micro_batch_size == 0)]
    mstart = np.flatnonzero(micro)
    mmax = np.maximum.reduceat(seq_len, mstart)
    msum = np.add.reduceat(seq_len, mstart)
    mcnt = np.diff(np.r_[mstart, key.size])
    mpad = mmax * mcnt - msum if mode != "packed" else np.zeros_like(msum)
    mkey = key[mstart]
    df = pd.DataFrame({"key": mkey, "tokens": msum, "padded_tokens": mpad})
    agg = df.groupby("key", sort=True).sum()
    first = pd.DataFrame({"key": key[starts], "iteration": it[starts], "mini_batch": mb[starts]}).set_index("key")
    groups = pd.Series(np.repeat(1, J), index=(jobs.iteration.astype(np.int64) * (int(mb.max(initial=0)) + 1)
                                               + jobs.mini_batch)).groupby(level=0).sum()
    out = first.join(agg)
    out["groups"] = groups.reindex(out.index).to_numpy()
    return out.reset_index(drop=True)


class Engine:
    """One simulated run. Build, then :meth:`run` (returns a :class:`SimTimeline`)."""

    def __init__(self, jobs: SimJobs, settings: ExecutionSettings, *, cost: CostModel,
                 kv_capacity: int, trainer: TrainerSpec,
                 stream_train: bool = True, barrier: bool = False, sync_pause: bool = True,
                 record_samples: bool = True, group_slots: bool = False, trace: list | None = None):
        self.jobs = jobs
        self.settings = settings   # instances, concurrency, k, shared queue, stealing
        self.R = int(settings.num_instances)
        self.cm = cost
        self.mns = int(settings.max_num_seqs)
        self.kv = int(kv_capacity)
        self.tr = trainer
        self.k = int(settings.lag_bound)
        self.stream = stream_train
        self.barrier = barrier
        self.sync_pause = sync_pause and not barrier
        self.record_samples = record_samples
        # group_slots: the runtime's admission rule (scheduler.execution.Feeder): an instance holds
        # at most max_num_seqs // G prompt groups, a group keeps its slot until its last sample
        # finishes, and instances admitting at the same moment take one job at a time, fewest groups
        # first; default: a new group whenever running + waiting sequences < max_num_seqs (vLLM's own
        # queue), each instance filling up in turn
        self.group_slots = group_slots
        self.trace = trace         # a list: every admission and admission event (Feeder.trace)
        J, G = jobs.resp.shape
        self.J, self.G = J, G
        if J == 0:
            raise ValueError("nothing to simulate: the schedule has no prompts")
        if G != settings.group_size:
            raise ValueError(f"the jobs have groups of {G} samples, the settings {settings.group_size}")
        if not settings.shared_queue and (jobs.instance.min() < 0 or jobs.instance.max() >= self.R):
            raise ValueError(f"schedule places prompts on instances {jobs.instance.min()}..{jobs.instance.max()} "
                             f"but the simulated system has {self.R}")

    # ------------------------------------------------------------------ run
    def run(self) -> SimTimeline:
        jobs, J, G, R = self.jobs, self.J, self.G, self.R
        cm = self.cm
        a, b, c, pf = cm.decode_a, cm.decode_b, cm.decode_c, cm.prefill_per_token
        mns, kv = self.mns, self.kv

        # ---- mini-batches
        mbt = minibatch_tokens(jobs, self.tr.micro_batch_size, self.tr.micro_batching)
        n_mb = len(mbt)
        mb_iter = mbt["iteration"].to_numpy().tolist()
        mb_groups = mbt["groups"].to_numpy().tolist()
        mb_dur = (self.tr.train_per_token * (mbt["tokens"] + mbt["padded_tokens"]).to_numpy(float)
                  + self.tr.train_per_step).tolist()
        mb_index = {(int(i), int(m)): x for x, (i, m) in enumerate(zip(mbt["iteration"], mbt["mini_batch"]))}
        job_mb = [mb_index[(int(i), int(m))] for i, m in zip(jobs.iteration.tolist(), jobs.mini_batch.tolist())]
        iters = sorted(set(mb_iter))
        if iters != list(range(len(iters))):
            raise ValueError(f"iterations must be 0..{len(iters) - 1} without gaps; got {iters[:5]}...")
        n_it = len(iters)
        it_mbs: list[list[int]] = [[] for _ in range(n_it)]
        for x, i in enumerate(mb_iter):
            it_mbs[i].append(x)
        mb_left = list(mb_groups)
        it_groups_left = [0] * n_it
        for i in jobs.iteration.tolist():
            it_groups_left[i] += 1
        it_gen_left = list(it_groups_left)

        # ---- the schedule as an execution plan; admission through its Feeder (shared with the runtime)
        pids = [str(p) for p in jobs.prompt_id.tolist()]
        eps = jobs.epoch.tolist()
        job_it = jobs.iteration.tolist()
        job_objs = jobs_from_columns(job_it, jobs.dispatch_rank, pids, eps, jobs.instance, jobs.mini_batch,
                                     jobs.predicted_length)
        job_of = {(j.epoch, j.prompt_id): x for x, j in enumerate(job_objs)}
        plan = ExecutionPlan(self.settings, job_objs)
        disp = plan.dispatcher
        adm = disp.adm
        feeder = plan.feeder(self.trace)
        self.dispatcher = disp

        # ---- sequences (seq s = job * G + sample)
        N = J * G
        plen_j = jobs.prompt_length.astype(np.int64).tolist()
        resp = jobs.resp.reshape(-1).astype(np.int64).tolist()
        g0 = [0] * N               # tokens generated before the current admission
        s0 = [0] * N               # instance step at the current admission
        fin_step = [0] * N
        in_run = [False] * N
        t_admit = [0.0] * N
        t_first = [-1.0] * N
        t_fin = [0.0] * N
        adm_ver = [0] * N
        seq_inst = [0] * N
        preemptions = [0] * R
        job_left = [G] * J

        # ---- instance state
        S = [0] * R
        T = [0.0] * R
        n = [0] * R
        K = [0] * R                # sum over running of (prompt + g0 - s0): C = K + n*S
        heaps: list[list] = [[] for _ in range(R)]
        waiting: list[deque] = [deque() for _ in range(R)]
        order: list[list] = [[] for _ in range(R)]     # running seqs in admission order (lazy)
        ev_tok = [0] * R
        ev_time: list = [None] * R
        ev_step = [0] * R
        paused = [False] * R
        resume_version = [0] * R

        events: list = []
        seqno = [0]

        def push(t, kind, x, tok=0):
            seqno[0] += 1
            heapq.heappush(events, (t, kind, seqno[0], x, tok))

        # ---- trainer state
        cur_it = [0]
        tr_busy = [False]
        steps_done = [0] * n_it
        ready: list[list] = [[] for _ in range(n_it)]
        switched = [False] * n_it
        qsize = [0]
        q_t, q_op, q_size = [], [], []
        st_rows = []
        sync_rows = []
        released = [0]             # barrier mode: highest iteration released for generation
        gslots = feeder.slots
        held = feeder.inflight     # groups admitted whose slot is not yet released
        early_free = self.tr.publish_s is not None   # the trainer's own time per sync, not the sync's
        dirty = [False]            # a group finished: trainer/barrier must react (see react)

        def steps_time(m, nn, C0):
            return m * (a + c * nn) + b * (m * C0 + nn * m * (m + 1) / 2.0)

        def steps_to_reach(delta, nn, C0):
            """Smallest m >= 0 with steps_time(m) >= delta."""
            if delta <= 0:
                return 0
            qa = b * nn / 2.0
            qb = a + c * nn + b * C0 + b * nn / 2.0
            if qa > 0:
                m = (-qb + math.sqrt(qb * qb + 4 * qa * delta)) / (2 * qa)
            else:
                m = delta / qb
            m = max(1, int(math.ceil(m - 1e-9)))
            while steps_time(m, nn, C0) < delta:
                m += 1
            while m > 1 and steps_time(m - 1, nn, C0) >= delta:
                m -= 1
            return m

        # ---------------------------------------------------------- instance ops
        def finish(s, r, t):
            n[r] -= 1
            K[r] -= plen_j[s // G] + g0[s] - s0[s]
            in_run[s] = False
            t_fin[s] = t
            j = s // G
            job_left[j] -= 1
            if job_left[j] == 0:
                group_done(j, t)

        def preempt_one(r):
            od = order[r]
            while od and not in_run[od[-1]]:
                od.pop()
            s = od.pop()
            gen = S[r] - s0[s]
            n[r] -= 1
            K[r] -= plen_j[s // G] + g0[s] - s0[s]
            g0[s] += gen
            in_run[s] = False
            waiting[r].appendleft(s)
            preemptions[r] += 1

        def gate(job):
            return job.iteration <= released[0]

        def enqueue(r, job, ver):
            """Job admitted on instance r (at its boundary T[r]): its sequences wait for a slot."""
            w, t = waiting[r], T[r]
            base = job_of[(job.epoch, job.prompt_id)] * G
            for s in range(base, base + G):
                w.append(s)
                t_admit[s] = t
                adm_ver[s] = ver
                seq_inst[s] = r

        def fill(r, steal=True):
            """Take jobs through the feeder and admit waiting sequences (at boundary T[r])."""
            for job, ver in feeder.take(r, lambda: has_room(r), gate if self.barrier else None, steal):
                enqueue(r, job, ver)
            start_waiting(r)

        def start_waiting(r):
            w = waiting[r]
            if not w:
                return
            newtok = 0
            fresh = []
            h, od = heaps[r], order[r]
            Sr = S[r]
            while w and n[r] < mns:
                s = w[0]
                need = plen_j[s // G] + g0[s]
                if kv and n[r] > 0 and K[r] + n[r] * Sr + need + n[r] + 1 > kv:
                    break
                w.popleft()
                n[r] += 1
                K[r] += need - Sr
                s0[s] = Sr
                in_run[s] = True
                fs = Sr + resp[s] - g0[s]
                fin_step[s] = fs
                heapq.heappush(h, (fs, s))
                od.append(s)
                newtok += need
                if g0[s] == 0:
                    fresh.append(s)
            if newtok:
                T[r] += pf * newtok
            if fresh:
                nn = n[r]
                tf = T[r] + a + c * nn + b * (K[r] + nn * Sr + nn)
                for s in fresh:
                    t_first[s] = tf

        def schedule(r):
            ev_tok[r] += 1
            h = heaps[r]
            while h and (not in_run[h[0][1]] or fin_step[h[0][1]] != h[0][0]):
                heapq.heappop(h)
            if n[r] == 0:
                ev_time[r] = None
                return
            nn, Sr = n[r], S[r]
            C0 = K[r] + nn * Sr
            m = h[0][0] - Sr
            if kv:
                while nn > 1 and C0 + nn > kv:      # the next step would overflow: preempt
                    preempt_one(r)
                    nn = n[r]
                    C0 = K[r] + nn * Sr
                    while h and (not in_run[h[0][1]] or fin_step[h[0][1]] != h[0][0]):
                        heapq.heappop(h)
                    m = h[0][0] - Sr
                mk = (kv - C0) // nn if nn else m
                if 1 <= mk < m:
                    m = mk
            dt = steps_time(m, nn, C0)
            ev_time[r] = T[r] + dt
            ev_step[r] = Sr + m
            push(T[r] + dt, _INST, r, ev_tok[r])

        def at_event(r):
            """Instance r reached its scheduled boundary: finishes, then fill + schedule."""
            T[r] = ev_time[r]
            S[r] = ev_step[r]
            ev_time[r] = None
            h = heaps[r]
            Sr = S[r]
            while h and h[0][0] <= Sr:
                fs, s = heapq.heappop(h)
                if in_run[s] and fin_step[s] == fs:
                    finish(s, r, T[r])

        def advance(r, t):
            """Bring instance r to its first step boundary at or after t (caller reschedules)."""
            ev_tok[r] += 1
            if ev_time[r] is None:
                T[r] = max(T[r], t)
                return
            if t >= ev_time[r]:
                at_event(r)
                return
            nn = n[r]
            C0 = K[r] + nn * S[r]
            m = steps_to_reach(t - T[r], nn, C0)
            if S[r] + m >= ev_step[r]:
                at_event(r)
                return
            T[r] += steps_time(m, nn, C0)
            S[r] += m
            ev_time[r] = None

        def wake(t):
            """Admissible work may have appeared: let instances with room take it, their own
            jobs first, then (guided dispatch) others' jobs not yet started."""
            if self.group_slots:
                return wake_together(t)
            for steal in (False, True):
                for r in sorted(range(R), key=lambda x: n[x] + len(waiting[x])):
                    if paused[r] or not has_room(r):
                        continue
                    head = disp.peek(r, steal)
                    if head is None or (self.barrier and head.iteration > released[0]):
                        continue
                    advance(r, t)
                    fill(r, steal)
                    schedule(r)

        def wake_together(t):
            """The runtime's rule: the instances that can admit now take one job at a time (Feeder.fill)."""
            g = gate if self.barrier else None
            ready = [r for r in feeder.order() if not paused[r] and has_room(r)
                     and (head := disp.peek(r, True)) is not None and (g is None or g(head))]
            for r in ready:
                advance(r, t)
            for r, job, ver in feeder.fill(g, room=lambda x: x in ready and not paused[x] and has_room(x)):
                enqueue(r, job, ver)
            for r in ready:
                start_waiting(r)
                schedule(r)

        def pause_all(t, dur, version):
            for r in range(R):
                advance(r, t)
                ev_tok[r] += 1          # drop any scheduled event
                ev_time[r] = None
                paused[r] = True
                T[r] = max(T[r], t) + dur
                resume_version[r] = version
                push(T[r], _INST, r, ev_tok[r])

        # ---------------------------------------------------------- trainer ops
        def q_event(t, op):
            q_t.append(t)
            q_op.append(op)
            q_size.append(qsize[0])

        def has_room(r):
            return held[r] < gslots if self.group_slots else n[r] + len(waiting[r]) < mns

        def group_done(j, t):
            e, p = eps[j], pids[j]
            r = seq_inst[j * G]
            late = self.tr.admit_latency_s > 0
            if late:                            # the runtime learns of the free slot this much later
                push(t + self.tr.admit_latency_s, _SLOT, r)
            feeder.finished(e, p, release=not late)
            qsize[0] += 1
            q_event(t, "put")
            x = job_mb[j]
            mb_left[x] -= 1
            if mb_left[x] == 0:
                heapq.heappush(ready[mb_iter[x]], x)
            it_gen_left[job_it[j]] -= 1
            dirty[0] = True

        def react(t):
            # reactions to finished groups run at top level (never inside an instance update)
            while dirty[0]:
                dirty[0] = False
                if self.barrier:
                    try_release(t)
                trainer_try(t)

        def trainer_try(t):
            if tr_busy[0]:
                return
            i = cur_it[0]
            if i >= n_it or not ready[i]:
                return
            if not self.stream and it_gen_left[i] > 0:
                return
            if self.tr.switch_s > 0 and not switched[i]:
                switched[i] = True
                tr_busy[0] = True
                push(t + self.tr.switch_s, _TRAIN, -1)
                return
            x = heapq.heappop(ready[i])
            qsize[0] -= mb_groups[x]
            q_event(t, "get")
            tr_busy[0] = True
            t0 = t + self.tr.step_latency_s
            push(t0 + mb_dur[x], _TRAIN, x, 0)
            st_rows.append((t0, t0 + mb_dur[x], x))

        def on_train_end(x, t):
            tr_busy[0] = False
            if x <= -2:                    # published: the trainer holds version -x - 2, the sync goes on
                cur_it[0] = -x - 2
                trainer_try(t)
                return
            if x < 0:                      # end of a colocated switch
                trainer_try(t)
                return
            i = mb_iter[x]
            steps_done[i] += 1
            if steps_done[i] < len(it_mbs[i]):
                trainer_try(t)
                return
            # iteration i trained: weight sync publishes version i + 1
            tr_busy[0] = True
            sync_rows.append((t, t + self.tr.sync_s, i + 1))
            if self.sync_pause:
                pause_all(t, self.tr.sync_s, i + 1)
            push(t + self.tr.sync_s, _PUBLISH, i + 1)
            if early_free:
                push(t + self.tr.publish_s, _TRAIN, -(i + 1) - 2)

        def on_publish(v, t):
            feeder.published(v)
            if not early_free:
                cur_it[0] = v
                tr_busy[0] = False
            if self.barrier:
                try_release(t)
            elif not self.sync_pause:
                for r in range(R):
                    version_arrives(r, v, t)
                wake(t)
            trainer_try(t)

        def version_arrives(r, v, t):
            """Instance r holds version v: new work becomes admissible after the admission latency."""
            if self.tr.admit_latency_s > 0:
                push(t + self.tr.admit_latency_s, _VERSION, r, v)
            else:
                feeder.synced(r, v)

        def try_release(t):
            # generation of iteration i+1 starts once iteration i is generated and version i exists;
            # instances then take version i (lag exactly 1) while iteration i+1 generates
            changed = False
            while (released[0] + 1 < n_it and it_gen_left[released[0]] == 0
                   and adm.published >= released[0]):
                released[0] += 1
                changed = True
            if changed:
                v = released[0] - 1
                if v > adm.instance_version[0]:
                    pause_all(t, self.tr.sync_s, v)
                else:
                    wake(t)

        # ---------------------------------------------------------- main loop
        if self.group_slots:
            wake_together(0.0)
        else:
            for r in range(R):
                fill(r)
                schedule(r)
        while events:
            t, kind, _, x, tok = heapq.heappop(events)
            if kind == _INST:
                if tok != ev_tok[x]:
                    continue
                if paused[x]:
                    paused[x] = False
                    ev_time[x] = None
                    version_arrives(x, resume_version[x], t)
                    T[x] = t
                    fill(x, steal=False)
                    schedule(x)
                    push(t, _STEAL, -1)     # others' jobs only once every instance took its own
                    # newly admissible work may now fit on the other (already resumed) instances
                    continue
                at_event(x)
                fill(x)
                schedule(x)
            elif kind == _TRAIN:
                on_train_end(x, t)
            elif kind == _VERSION:
                feeder.synced(x, tok)
                wake(t)
            elif kind == _STEAL:
                wake(t)
            elif kind == _SLOT:
                feeder.release(x)
                if self.group_slots:
                    wake(t)
            else:
                on_publish(x, t)
            react(t)

        if not disp.done:
            stuck = disp.pending()
            raise RuntimeError(f"simulation deadlocked with {stuck} prompt groups never admitted "
                               f"(lag bound {self.k}); this is a bug")
        if cur_it[0] != n_it:
            raise RuntimeError(f"trainer stopped at iteration {cur_it[0]} of {n_it}; this is a bug")
        self.preemptions = preemptions
        return self._timeline(jobs, mbt, resp, t_admit, t_first, t_fin, adm_ver, seq_inst,
                              (q_t, q_op, q_size), st_rows, sync_rows)

    # ------------------------------------------------------------------ output
    def _timeline(self, jobs, mbt, resp, t_admit, t_first, t_fin, adm_ver, seq_inst, q, st_rows, sync_rows):
        G = self.G
        req = pd.DataFrame({
            "epoch": np.repeat(jobs.epoch, G).astype(np.int64),
            "iteration": np.repeat(jobs.iteration, G).astype(np.int64),
            "instance": np.asarray(seq_inst, dtype=np.int64),
            "prompt_id": np.repeat(jobs.prompt_id, G),
            "sample": np.tile(np.arange(G), self.J),
            "admission_version": np.asarray(adm_ver, dtype=np.int64),
            "t_admit": np.asarray(t_admit),
            "t_first_token": np.asarray(t_first),
            "t_finish": np.asarray(t_fin),
            "prompt_length": np.repeat(jobs.prompt_length, G).astype(np.int64),
            "response_length": np.asarray(resp, dtype=np.int64),
        })
        st = np.asarray(st_rows, dtype=float).reshape(-1, 3)
        x = st[:, 2].astype(np.int64)
        steps = pd.DataFrame({
            "t_start": st[:, 0], "t_end": st[:, 1],
            "iteration": mbt["iteration"].to_numpy()[x], "mini_batch": mbt["mini_batch"].to_numpy()[x],
            "version": mbt["iteration"].to_numpy()[x],
            "tokens": mbt["tokens"].to_numpy()[x], "padded_tokens": mbt["padded_tokens"].to_numpy()[x]})
        if self.record_samples:
            key = list(zip(jobs.iteration.tolist(), jobs.mini_batch.tolist()))
            members: dict = {}
            order = np.lexsort((jobs.dispatch_rank, jobs.mini_batch, jobs.iteration))
            for j in order.tolist():
                members.setdefault(key[j], []).extend(
                    [int(jobs.epoch[j]), str(jobs.prompt_id[j]), smp] for smp in range(G))
            steps["samples"] = [members[(i, m)] for i, m in zip(steps["iteration"], steps["mini_batch"])]
        sy = np.asarray(sync_rows, dtype=float).reshape(-1, 3)
        syncs = pd.DataFrame({"t_start": sy[:, 0], "t_end": sy[:, 1], "version": sy[:, 2].astype(np.int64)})
        queue = pd.DataFrame({"t": np.asarray(q[0], dtype=float), "op": q[1], "size": np.asarray(q[2], dtype=np.int64)})
        return SimTimeline({"request": req, "step": steps, "sync": syncs, "queue": queue,
                            "instance": pd.DataFrame(columns=["t", "instance", "state"])})
