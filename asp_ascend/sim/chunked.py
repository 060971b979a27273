"""vLLM V1's chunked prefill in the simulated instances (``rollout.max_num_batched_tokens`` > 0).

vLLM V1 always schedules with chunked prefill (``vllm/v1/core/sched/scheduler.py``): every engine
step has a token budget ``max_num_batched_tokens``; the running sequences are scheduled first, one
decode token each, and what is left of the budget goes to prompt tokens: first the remaining
prompt of a sequence whose prefill an earlier step began, then waiting sequences in order (while
a slot is free and the KV cache holds them), each taking at most what is left. A sequence whose
prompt is not done when the budget runs out is prefilled further in the next step; it samples its
first token in the step that computes its prompt's last token. So at most one sequence is partly
prefilled at a time, and a step costs its decode step plus ``prefill_per_token`` per prompt token
it computes.

:class:`ChunkedInstances` models exactly that on :class:`~.instances.Instances`:

- the step starting at a boundary pays its prompt tokens at the boundary (as the stall model
  pays a whole prefill there); a sequence whose prompt is done in that step joins the running set
  at that boundary and gets its first token at the end of the step (the step's decode part counts
  it, as the stall model's first step does);
- a boundary where the budget ran out with prompt tokens still to compute is an event (the
  next step's chunk is decided there); between such boundaries the running set is fixed, so the
  closed-form jump of :mod:`.instances` still holds;
- an instance that runs nothing computes prompt tokens alone: such a step costs its prompt tokens
  only (the stall model's prefill);
- the partly prefilled sequence stays at the head of the instance's queue (it counts as held, as
  in vLLM's running list) and holds the KV of what it prefills from its first chunk; when the next
  decode step would overflow the KV cache it is the first preempted (it was admitted last, vLLM's
  victim): its chunks are recomputed. Prefix caching: it prefills only what its group's running
  siblings do not hold (decided at its first chunk) and shares the prompt once it runs.

With a budget no prompt burst reaches, this is the stall model event for event. Budget below the
running sequences' decode tokens (vLLM refuses ``max_num_batched_tokens < max_num_seqs``, but a
simulated engine may run more sequences than planned): every running sequence still decodes each
step and no prompt token is computed until some finish. Speculative decoding's draft tokens are
not counted against the budget.
"""
from __future__ import annotations

from .instances import INST, Instances


class ChunkedInstances(Instances):
    """:class:`~.instances.Instances` whose engine steps have a token budget (module doc)."""

    def __init__(self, *args, batched_tokens: int, **kw):
        super().__init__(*args, **kw)
        if int(batched_tokens) < 1:
            raise ValueError(f"batched_tokens must be >= 1 (vLLM's max_num_batched_tokens), got {batched_tokens}")
        self.budget = int(batched_tokens)
        R = self.R
        self.bud = [0] * R          # prompt tokens the step starting at S[r] may still take
        self.bud_step = [-1] * R    # the step (S[r] at its start) that bud[r] belongs to
        self.pf_left = [0] * R      # prompt tokens the partly prefilled sequence (queue head) still needs
        self.pf_kv = [0] * R        # KV tokens it holds
        self.chunk_steps = [0] * R  # steps that computed prompt tokens beside or instead of decoding

    def _startable(self, r: int, s: int) -> bool:
        """Could waiting sequence ``s`` (not partly prefilled) start on ``r`` now, budget aside?"""
        if self.n[r] >= self.mns or (self.each and self.ready[s] > self.T[r] + 1e-12):
            return False
        return self._head_tokens(r, s, s // self.G) >= 0

    def _pending(self, r: int) -> bool:
        """Prompt tokens wait on the budget alone: the next step boundary must be an event."""
        w = self.waiting[r]
        if not w or self.budget - self.n[r] <= 0:
            return False        # nothing waits, or decode tokens fill the next step's budget too
        if self.pf_left[r]:
            return True
        if self.bud_step[r] == self.S[r] and self.bud[r] <= 0:
            return self._startable(r, w[0])
        return False            # the step had budget left: what waits waits on a slot, KV or a hand-over

    def start_waiting(self, r: int) -> None:
        """Give the step starting at boundary T[r] its prompt tokens (module doc), paid at T[r]."""
        w = self.waiting[r]
        if not w:
            return
        n, G, mns, Sr = self.n, self.G, self.mns, self.S[r]
        if self.bud_step[r] != Sr:          # a new step: decode tokens first
            self.bud_step[r] = Sr
            bud = self.budget - n[r]
        else:                               # called again at the same boundary: what is left
            bud = self.bud[r]
        each, ready, Tr = self.each, self.ready, self.T[r] + 1e-12
        chunk, stall, fresh = 0, 0.0, []
        while w and bud > 0:
            s = w[0]
            j = s // G
            left = self.pf_left[r]
            if not left:                    # a new sequence: a slot, its hand-over, KV space
                if n[r] >= mns or (each and ready[s] > Tr):
                    break
                left = self._head_tokens(r, s, j)
                if left < 0:
                    break
                if self.adm_cost and self.unpaid[j]:
                    stall += self._engine_stall(r, j)
                self.pf_kv[r] = left
            if left > bud:                  # the budget runs out inside this prompt
                chunk += bud
                self.pf_left[r] = left - bud
                bud = 0
                break
            chunk += left
            bud -= left
            self.pf_left[r] = self.pf_kv[r] = 0
            self._run_head(r, s, j, fresh)     # its prompt is done: it runs from this step on
        self.bud[r] = bud
        if chunk:
            self.chunk_steps[r] += 1
        if chunk or stall:
            self.T[r] += self.cm.prefill_per_token * chunk + stall
        if fresh:
            self._first_tokens(r, fresh)

    def _unstart(self, r: int) -> None:
        """Preempt the partly prefilled sequence: its chunks are lost, it waits at the head."""
        self.pf_left[r] = self.pf_kv[r] = 0
        self.preemptions[r] += 1

    def schedule(self, r: int) -> None:
        """Queue instance ``r``'s next event: a finish, a KV overflow, a hand-over's end, or the
        next step boundary when prompt tokens wait on the budget."""
        self.ev_tok[r] += 1
        self._clean(r)
        h, kv, Sr = self.heaps[r], self.kv, self.S[r]
        if kv:      # the next step would overflow: the partly prefilled sequence goes first
            while True:
                nn = self.n[r]
                if self.K[r] + nn * Sr - self.saved[r] + self.pf_kv[r] + nn <= kv:
                    break
                if self.pf_left[r] and nn > 0:
                    self._unstart(r)
                elif nn > 1:
                    self._preempt_one(r)
                    self._clean(r)
                else:
                    break
        nn = self.n[r]
        w = self.waiting[r]
        pending = self._pending(r)
        due = (self.ready[w[0]] if self.each and w and not pending and nn < self.mns
               and self.ready[w[0]] > self.T[r] + 1e-12 else None)
        if nn == 0:
            if pending:                 # a step of prompt tokens alone (paid at T[r]) ends at T[r]
                t, self.ev_step[r] = self.T[r], Sr + 1
            elif due is not None:       # an idle instance takes the hand-over when it ends
                t, self.ev_step[r] = due, Sr
            else:
                self.ev_time[r] = None
                return
            self.ev_time[r] = t
            self.push(t, INST, r, self.ev_tok[r])
            return
        C0 = self.K[r] + nn * Sr
        m = h[0][0] - Sr
        if kv:
            mk = (kv - C0 + self.saved[r] - self.pf_kv[r]) // nn
            if 1 <= mk < m:
                m = mk
        # one step when prompt tokens wait on the budget (due is then None)
        self._queue_jump(r, nn, C0, 1 if pending else m, due)
