"""The simulated rollout instances: vLLM-like continuous batching, jumping from event to event.

- at most ``max_num_seqs`` running sequences (or a lower cap, :attr:`Instances.cap`); a group's
  sequences wait in the instance's queue until a slot and KV space are free;
- KV cache of ``kv_capacity`` tokens (0 = unlimited): a sequence holds prompt + generated
  tokens; when the next decode step would overflow, the most recently admitted sequence is
  preempted (its KV freed, re-queued first, recomputed by prefill on re-admission, as vLLM does);
- admitted sequences cost ``prefill_per_token`` per prompt (+ already generated) token, a stall of
  the instance (``rollout.max_num_batched_tokens`` > 0: prefill in chunks within each step's token
  budget instead, as vLLM V1 does, :class:`~.chunked.ChunkedInstances`);
- prefix caching (the cost model's ``prefix_block`` > 0, ``rollout.prefix_caching``; vLLM V1's
  default): a sequence started while a sibling of its group runs on the instance (or started
  before it in the same pass) finds the prompt's full blocks before its last token cached and
  prefills only the rest (and, after a preemption, its generated tokens); the prompt's KV is held
  once while siblings share it (``saved``: the shared tokens counted once per extra holder; the
  decode step still reads every sequence's whole context). Cached while any sibling holding it
  runs there, as vLLM's reference-counted blocks are (a block freed to the cache's LRU pool is
  not counted on);
- ``admit_each_s`` (0 = none; calibrated from a real run): an admission reaches the engine this
  long after its hand-over starts, and an instance hands admissions over one at a time (the
  runtime's ``submit`` calls run one after another), so the k-th of a burst decided at ``t`` is
  stamped ``t + k * admit_each_s`` and its sequences may start at the first step boundary at or
  after ``t + (k + 1) * admit_each_s``; the instance decodes on meanwhile;
- ``admit_engine_s`` (0 = none; calibrated): what an admission costs the instance's engine (the
  hand-over runs on the instance's own core): a group whose sequences start while the instance
  runs others stalls it this long, paid with the prefill at that boundary (an admission to an idle
  instance costs no engine time: nothing is slowed);
- one decode step gives every running sequence one token and costs the cost model's
  :func:`~asp_ascend.scheduler.cost.step_time`.

Time is not advanced token by token: between events (a sequence finishing, a KV overflow, an
admission at a step boundary) the running set is fixed, so ``m`` steps take the closed form
:func:`~asp_ascend.scheduler.cost.steps_time` and an instance jumps straight to its next
event. Cost is O(log n) per sequence finish. Sequence ``s`` is sample ``s % G`` of job ``s // G``.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable

from ..scheduler.cost import CostModel, shared_prompt_tokens

INST = 4        # the event kind of an instance's next boundary (see engine.py)


class Instances:
    """R instances and the sequences they run. ``push(t, kind, x, tok)`` queues an event;
    ``on_group_done(job, t)`` is called when a job's last sample finishes."""

    def __init__(self, jobs, R: int, cost: CostModel, max_num_seqs: int, kv_capacity: int,
                 push: Callable, on_group_done: Callable[[int, float], None], speculation=None,
                 version_of: Callable[[int], int] | None = None, admit_each_s: float = 0.0,
                 admit_engine_s: float = 0.0):
        J, G = jobs.resp.shape
        self.G, self.R = G, R
        self.cm = cost
        # speculative decoding: a step of n <= max_batch sequences is timed per expected token
        self.spec_cm = None if speculation is None else cost.with_decode(*speculation.coefficients(cost))
        self.spec_max = 0 if speculation is None else int(speculation.max_batch)
        self.version_of = version_of or (lambda r: 0)
        self.mns, self.kv = int(max_num_seqs), int(kv_capacity)
        if admit_each_s < 0:
            raise ValueError(f"admit_each_s must be >= 0, got {admit_each_s}")
        self.each = float(admit_each_s)
        if admit_engine_s < 0:
            raise ValueError(f"admit_engine_s must be >= 0, got {admit_engine_s}")
        self.adm_cost = float(admit_engine_s)
        B = int(getattr(cost, "prefix_block", 0) or 0)
        self.pc = B > 0                 # prefix caching (module doc)
        self.push, self.on_group_done = push, on_group_done
        N = J * G
        # sequences
        self.plen_j = jobs.prompt_length.astype("int64").tolist()
        # prefix caching: the prompt tokens a sibling finds cached; running sequences per job
        self.sh_j = shared_prompt_tokens(jobs.prompt_length, B).astype("int64").tolist() if self.pc else None
        self.hold = [0] * J if self.pc else None
        self.resp = jobs.resp.reshape(-1).astype("int64").tolist()
        self.g0 = [0] * N               # tokens generated before the current admission
        self.s0 = [0] * N               # instance step at the current admission
        self.fin_step = [0] * N
        self.in_run = [False] * N
        self.t_admit = [0.0] * N
        self.t_first = [-1.0] * N
        self.t_fin = [0.0] * N
        self.adm_ver = [0] * N
        self.ready = [0.0] * N          # admit_each_s: the sequence may start at a boundary at or after this
        self.seq_inst = [0] * N
        self.ver_fin = [0] * N          # the instance's version when the sample finished (its newest tokens')
        self.job_left = [G] * J
        self.unpaid = [False] * J       # admit_engine_s: admitted, its engine cost not charged yet
        # instances
        self.preemptions = [0] * R
        self.S = [0] * R                # decode steps done
        self.moved: Callable[[int], None] | None = None   # told when an instance's sequences progressed
        self.T = [0.0] * R              # time of the last boundary
        self.n = [0] * R                # running sequences
        self.K = [0] * R                # sum over running of (prompt + g0 - s0): context = K + n * S
        self.saved = [0] * R            # prefix caching: KV tokens shared (held = K + n * S - saved)
        self.heaps: list[list] = [[] for _ in range(R)]          # (finish step, seq)
        self.waiting: list[deque] = [deque() for _ in range(R)]
        self.order: list[list] = [[] for _ in range(R)]          # running seqs in admission order (lazy)
        self.ev_tok = [0] * R
        self.ev_time: list = [None] * R
        self.ev_step = [0] * R
        self.paused = [False] * R
        self.resume_version = [0] * R
        self.cap = [self.mns] * R       # sequences an instance may hold (tail-aware concurrency lowers it)
        self.handover = [0.0] * R       # admit_each_s: when the instance's last hand-over ends

    # ------------------------------------------------------------------ decisions
    def cost_at(self, n: int) -> CostModel:
        """The decode model of an instance running ``n`` sequences (speculating or not)."""
        if self.spec_cm is not None and (self.spec_max <= 0 or n <= self.spec_max):
            return self.spec_cm
        return self.cm

    def held(self, r: int) -> int:
        """Sequences instance ``r`` runs or has waiting."""
        return self.n[r] + len(self.waiting[r])

    def has_room(self, r: int) -> bool:
        return self.n[r] + len(self.waiting[r]) < self.cap[r]

    def sample_tokens(self, s: int) -> tuple[bool, int]:
        """(finished, tokens generated so far) of sample ``s``: its whole response once finished;
        running, what it had before this admission plus the steps since; waiting or preempted,
        what it had (kept)."""
        if self.in_run[s]:
            return False, self.g0[s] + self.S[self.seq_inst[s]] - self.s0[s]
        if self.t_fin[s] > 0.0:
            return True, self.resp[s]
        return False, self.g0[s]

    # ------------------------------------------------------------------ admissions
    def enqueue(self, r: int, job: int, version: int) -> None:
        """Job ``job`` admitted on instance ``r`` (at its boundary T[r]): its sequences wait for a slot."""
        w, t, G = self.waiting[r], self.T[r], self.G
        if self.each:                   # hand-overs one after another (module doc)
            t = max(t, self.handover[r])
            self.handover[r] = ready = t + self.each
            for s in range(job * G, job * G + G):
                self.ready[s] = ready
        if self.adm_cost:
            self.unpaid[job] = True
        for s in range(job * G, job * G + G):
            w.append(s)
            self.t_admit[s] = t
            self.adm_ver[s] = version
            self.seq_inst[s] = r

    def start_waiting(self, r: int) -> None:
        """Start waiting sequences while there is a slot and KV space (prefill is paid at T[r])."""
        w = self.waiting[r]
        if not w:
            return
        n, G, mns = self.n, self.G, self.mns
        each, ready, Tr = self.each, self.ready, self.T[r] + 1e-12
        newtok, stall, fresh = 0, 0.0, []   # stall: admit_engine_s of groups starting beside running ones
        while w and n[r] < mns:
            s = w[0]
            if each and ready[s] > Tr:  # not handed over yet (schedule wakes the instance then)
                break
            j = s // G
            new = self._head_tokens(r, s, j)
            if new < 0:
                break
            if self.adm_cost and self.unpaid[j]:
                stall += self._engine_stall(r, j)
            self._run_head(r, s, j, fresh)
            newtok += new
        if newtok or stall:
            self.T[r] += self.cm.prefill_per_token * newtok + stall
        if fresh:
            self._first_tokens(r, fresh)

    def _head_tokens(self, r: int, s: int, j: int) -> int:
        """The KV tokens waiting sequence ``s`` (of group ``j``) would prefill and hold anew on
        ``r`` (prefix caching: less its group's prompt that running siblings hold), or -1 when the
        KV cache would not hold them beside the running sequences' next tokens."""
        need = self.plen_j[j] + self.g0[s]
        new = need - self.sh_j[j] if self.pc and self.hold[j] else need
        kv, n = self.kv, self.n[r]
        if kv and n > 0 and self.K[r] + n * self.S[r] - self.saved[r] + new + n + 1 > kv:
            return -1
        return new

    def _engine_stall(self, r: int, j: int) -> float:
        """Group ``j``'s admit_engine_s, charged once (its first sequence to start on ``r``), and
        only beside running sequences (an idle engine admits it for free)."""
        self.unpaid[j] = False
        return self.adm_cost if self.n[r] > 0 else 0.0

    def _run_head(self, r: int, s: int, j: int, fresh: list) -> None:
        """Waiting sequence ``s`` (the head of ``r``'s queue, of group ``j``), prefilled, runs from
        boundary S[r]: it leaves the queue, takes a slot and its KV, its finish step goes on the
        heap; prefix caching: it shares its group's prompt with running siblings. ``s`` joins
        ``fresh`` (its first token is still to come: _first_tokens) unless it resumes a preempted
        or partial sequence."""
        self.waiting[r].popleft()
        if self.pc:
            hold = self.hold
            if hold[j]:
                self.saved[r] += self.sh_j[j]
            hold[j] += 1
        Sr, g = self.S[r], self.g0[s]
        self.n[r] += 1
        self.K[r] += self.plen_j[j] + g - Sr
        self.s0[s] = Sr
        self.in_run[s] = True
        self.fin_step[s] = fs = Sr + self.resp[s] - g
        heapq.heappush(self.heaps[r], (fs, s))
        self.order[r].append(s)
        if g == 0:
            fresh.append(s)

    def _first_tokens(self, r: int, fresh: list) -> None:
        """The sequences of ``fresh`` started on ``r`` at T[r]: their first token comes at the end
        of the step starting there (the running set's, them included)."""
        nn = self.n[r]
        tf = self.T[r] + self.cost_at(nn).steps(1, nn, self.K[r] + nn * self.S[r])
        t_first = self.t_first
        for s in fresh:
            t_first[s] = tf

    # ------------------------------------------------------------------ time
    def _clean(self, r: int) -> None:
        h, in_run, fin_step = self.heaps[r], self.in_run, self.fin_step
        while h and (not in_run[h[0][1]] or fin_step[h[0][1]] != h[0][0]):
            heapq.heappop(h)

    def schedule(self, r: int) -> None:
        """Queue instance ``r``'s next event (a finish or a KV overflow) from its boundary T[r]."""
        self.ev_tok[r] += 1
        h, in_run, fin_step = self.heaps[r], self.in_run, self.fin_step
        while h and (not in_run[h[0][1]] or fin_step[h[0][1]] != h[0][0]):     # _clean, inlined (hot)
            heapq.heappop(h)
        nn = self.n[r]
        w = self.waiting[r]
        due = self.ready[w[0]] if self.each and w and nn < self.mns and self.ready[w[0]] > self.T[r] + 1e-12 else None
        if nn == 0:
            if due is None:
                self.ev_time[r] = None
                return
            self.ev_time[r] = due       # an idle instance takes the hand-over when it ends
            self.ev_step[r] = self.S[r]
            self.push(due, INST, r, self.ev_tok[r])
            return
        kv, Sr = self.kv, self.S[r]
        C0 = self.K[r] + nn * Sr
        m = h[0][0] - Sr
        if kv:
            sv = self.saved
            while nn > 1 and C0 - sv[r] + nn > kv:      # the next step would overflow: preempt
                self._preempt_one(r)
                nn = self.n[r]
                C0 = self.K[r] + nn * Sr
                self._clean(r)
                m = h[0][0] - Sr
            mk = (kv - C0 + sv[r]) // nn if nn else m
            if 1 <= mk < m:
                m = mk
        self._queue_jump(r, nn, C0, m, due)

    def _queue_jump(self, r: int, nn: int, C0: int, m: int, due: float | None) -> None:
        """Queue instance ``r``'s next boundary: ``m`` decode steps of its ``nn`` running sequences
        (holding ``C0`` tokens) from T[r], or the first boundary at or after ``due`` (a hand-over's
        end) if that comes sooner. The event rule of :meth:`schedule` and the chunked instances'."""
        spec = self.spec_cm         # cost_at(nn), inlined (hot)
        cm = spec if spec is not None and (self.spec_max <= 0 or nn <= self.spec_max) else self.cm
        if due is not None:
            m = min(m, cm.steps_to_reach(due - self.T[r], nn, C0))
        a, b, c = cm.decode_a, cm.decode_b, cm.decode_c
        dt = m * (a + c * nn) + b * (m * C0 + nn * m * (m + 1) / 2.0)     # cm.steps(m, nn, C0), inlined
        self.ev_time[r] = t = self.T[r] + dt
        self.ev_step[r] = self.S[r] + m
        self.push(t, INST, r, self.ev_tok[r])

    def at_event(self, r: int) -> None:
        """Instance ``r`` reached its scheduled boundary: its sequences due by then finish."""
        self.T[r] = self.ev_time[r]
        self.S[r] = Sr = self.ev_step[r]
        self.ev_time[r] = None
        h, in_run, fin_step = self.heaps[r], self.in_run, self.fin_step
        if h and h[0][0] <= Sr:
            t = self.T[r]
            G, n, K, plen_j, g0, s0 = self.G, self.n, self.K, self.plen_j, self.g0, self.s0
            t_fin, ver_fin, job_left, version_of = self.t_fin, self.ver_fin, self.job_left, self.version_of
            while h and h[0][0] <= Sr:
                fs, s = heapq.heappop(h)
                if in_run[s] and fin_step[s] == fs:
                    j = s // G                  # sample s finishes (hot: once per sample)
                    n[r] -= 1
                    K[r] -= plen_j[j] + g0[s] - s0[s]
                    if self.pc:
                        self._release(r, j)
                    in_run[s] = False
                    t_fin[s] = t
                    ver_fin[s] = version_of(r)
                    job_left[j] -= 1
                    if job_left[j] == 0:
                        self.on_group_done(j, t)
        if self.moved is not None:
            self.moved(r)

    def advance(self, r: int, t: float) -> None:
        """Bring instance ``r`` to its first step boundary at or after ``t`` (the caller reschedules)."""
        self.ev_tok[r] += 1
        if self.ev_time[r] is None or (self.n[r] == 0 and t < self.ev_time[r]):
            # idle (an idle instance's event is a hand-over's end, admit_each_s: not reached yet)
            self.T[r] = max(self.T[r], t)
            self.ev_time[r] = None
            return
        if t >= self.ev_time[r]:
            self.at_event(r)
            return
        nn = self.n[r]
        C0 = self.K[r] + nn * self.S[r]
        cm = self.cost_at(nn)
        m = cm.steps_to_reach(t - self.T[r], nn, C0)
        if self.S[r] + m >= self.ev_step[r]:
            self.at_event(r)
            return
        self.T[r] += cm.steps(m, nn, C0)
        self.S[r] += m
        self.ev_time[r] = None
        if self.moved is not None:
            self.moved(r)

    def pause(self, r: int, t: float, dur: float, version: int) -> None:
        """Instance ``r`` stops at its boundary after ``t`` for ``dur`` (a weight sync); it
        resumes (an INST event) holding ``version``."""
        self.advance(r, t)
        self.ev_tok[r] += 1          # drop any scheduled event
        self.ev_time[r] = None
        self.paused[r] = True
        self.T[r] = max(self.T[r], t) + dur
        self.resume_version[r] = version
        self.push(self.T[r], INST, r, self.ev_tok[r])

    def resume(self, r: int, t: float) -> int:
        """End of instance ``r``'s pause at ``t``; returns the version it now holds."""
        self.paused[r] = False
        self.ev_time[r] = None
        self.T[r] = t
        return self.resume_version[r]

    # ------------------------------------------------------------------ state
    def _preempt_one(self, r: int) -> None:
        od = self.order[r]
        while od and not self.in_run[od[-1]]:
            od.pop()
        s = od.pop()
        gen = self.S[r] - self.s0[s]
        self.n[r] -= 1
        self.K[r] -= self.plen_j[s // self.G] + self.g0[s] - self.s0[s]
        if self.pc:
            self._release(r, s // self.G)
        self.g0[s] += gen
        self.in_run[s] = False
        self.waiting[r].appendleft(s)
        self.preemptions[r] += 1

    def _release(self, r: int, j: int) -> None:
        """A running sequence of job ``j`` left instance ``r`` (prefix caching): its siblings still
        running there keep the prompt's shared blocks."""
        self.hold[j] -= 1
        if self.hold[j]:
            self.saved[r] -= self.sh_j[j]
