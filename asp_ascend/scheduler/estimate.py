"""Analytic estimate of a schedule: the figures the planner optimises.

Not an event simulation (that is ``asp simulate``): a recurrence over iterations, vectorised over
the groups of each dispatch window, fast enough for a million prompts, built on the cost model and
the metric functions. It has the terms that bound the simulator's iterations: the trainer, the
tail floor (an iteration's longest group, admitted no earlier than version i - k) and the
instances' decode capacity.

Rollout: a pool of R instances (guided dispatch and shared queues hand work to whichever instance
frees up). Window j (the groups dispatched with iteration j; ASP pulls long groups of j + 1
forward) starts at ``s_j = max(capacity free, V_{j-k})`` and frees the pool's capacity at
``s_j + W_j / R`` (W: instance-seconds, ``CostModel.work`` at the instances' concurrency: their
share of the k + 1 windows admissible together, at most S or what the KV cache holds). A group starts
at ``s_j`` when it fits the first wave (R x S sequences), else when the work dispatched before it
is done, never before its admission version ``V_{i-k}``. Its latency follows the decode-step model
``a + sum over running sequences of (c + b * context)`` exactly: the group pays every step it
runs, so

    latency = its solo latency + the (c + b * context) terms and prefill of the sequences its
              instance generates beside it,

at most a full instance's: ``(S - G) x (c + b x mean context)`` per step of its own, the prefill of
the ``S - G`` sequences admitted with it (when it starts with its window) and of each one's
replacement once per mean length; and at most the
instance's share of the work still to come: the rest of its window admitted by its start (less what
the pool ran of it before: the work dispatched before the group, or for a group pulled forward that
waits for its admission version, the earlier-admitted work done by then), plus the share of every
later part admitted while it runs (a window's groups of a later iteration, pulled forward, are
admitted at that iteration's version, not the window's), for the part done before the group ends
(a fixed point, three rounds; a group pulled forward is finished once its own admission version is
known, so the windows it outlives count too).
An instance's share of a window is 1/R, except from a shared queue (``shared_queue``): there the
window goes to the instances free when it is admitted, each up to S sequences (the simulator's
instances take a new version's work as they come back from the weight sync, the idle ones first),
so an instance holds ``min(S, seqs / R_free)`` of it (``_queue_share``).
A group's longest sample runs ``min(mean x group_max_factor, max_response_length)`` steps, and its
mean length is that of samples each cut at ``max_response_length`` (``capped_sample_mean``).

Trainer (as the simulator's and the runtime's): iteration i's optimizer steps in the order their
mini-batches are generated, each once its last group is done and the previous step has ended, on
the micro-batches the runtime cuts (``_trainer``); with ``pipeline.regroup`` the steps take the
groups in the order they are generated, with ``pipeline.stream_groups`` each group's
forward/backward runs once it is generated (``_train_groups``); ``V_{i+1}`` = the last step's end +
sync.

Bubbles: skew = instance time idle or in its own long tail while others still generate iteration
i, per (window, instance) cell of the placement as planned; lag-blocked = the rest of its idle;
sorting = trainer idle waiting for samples; padding = pad slots of the trainer's micro-batches
(none when packed, the default: see ``_trainer``).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..metrics.bubbles import (iteration_lower_bounds, iteration_time_stats, lower_bound_ratio, padding_bubble,
                               ratio)
from .cost import CostModel
from .group_max import spread_of_group_max_factor
from .microbatch import PACKED_TOKEN_COST, step_slots

FIXED_POINT_ROUNDS = 3


def _dense_codes(sorted_keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes 0..m-1 of an already sorted key array, and m."""
    if sorted_keys.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    change = np.empty(sorted_keys.size, dtype=np.int64)
    change[0] = 0
    change[1:] = sorted_keys[1:] != sorted_keys[:-1]
    codes = np.cumsum(change)
    return codes, int(codes[-1]) + 1


@dataclass
class _Rollout:
    """Per group in pooled dispatch order (window, rank, instance): what the recurrence needs."""
    order: np.ndarray       # group index of each position
    win_start: np.ndarray   # first position of each window (n_iter + 1 entries)
    first_wave: np.ndarray  # the group starts with its window (fits R x S sequences)
    before: np.ndarray      # work dispatched before the group in its window, instance-seconds
    solo: np.ndarray        # latency of the group alone on an instance
    steps: np.ndarray       # decode steps of the group (its longest sample)
    per_step: np.ndarray    # per window: what a full instance's other sequences add to each step
    pre_wave: np.ndarray    # per window: the prefill of a full instance's other sequences admitted at once
    beside: np.ndarray      # per group: the (c + b * context) terms and prefill of its own sequences
    W: np.ndarray           # per window: work at full concurrency, instance-seconds
    seqs: np.ndarray        # per window: its sequences
    cap: np.ndarray         # per window: the sequences an instance holds at most
    cells: np.ndarray       # (window, instance) work as placed (bubble figures)
    work: np.ndarray        # per group (input order)
    work_o: np.ndarray      # per group (pooled order)


def estimate(iteration, instance, mini_batch, dispatch_rank, lengths, prompt_lengths, *, group_size: int,
             num_instances: int, max_num_seqs: int, lag_bound: int, micro_batch_size: int,
             cost: CostModel, group_max_factor: float = 1.0, kv_cache_tokens: int = 0,
             micro_batching: str = "padded", max_tokens_per_micro_batch: int = 0,
             max_response_length: float | None = None, shared_queue: bool = False, regroup: bool = False,
             stream: bool = False, groups: bool = False) -> dict:
    """Predicted run figures for a schedule whose groups have mean lengths ``lengths``;
    ``micro_batching``/``max_tokens_per_micro_batch``: how the trainer cuts micro-batches (the
    runtime's mode, ``microbatch.resolve_mode(train.micro_batching)``); ``max_response_length``:
    no sample decodes further. ``regroup`` (``pipeline.regroup`` as resolved for the run): an
    iteration's optimizer steps take its groups in the order they are generated, each step as many
    as its planned mini-batch holds; ``stream`` (``pipeline.stream_groups``): the trainer runs each
    group's forward/backward as it is generated, a step's optimizer update after its last group
    (``_train_groups``). ``groups``: also ``"groups"``, each group's start, finish and
    latency alone (input order), and ``"versions"``, V_0..V_n (a breakdown's quantities)."""
    it = np.asarray(iteration, dtype=np.int64)
    it = it - it.min()
    rank = np.asarray(dispatch_rank, dtype=np.int64)
    rank = rank - rank.min()
    inst = np.asarray(instance, dtype=np.int64)
    L = np.asarray(lengths, dtype=np.float64)
    P = np.zeros_like(L) if prompt_lengths is None else np.asarray(prompt_lengths, dtype=np.float64)
    n_iter = int(it.max()) + 1
    max_len = np.inf if not max_response_length else float(max_response_length)
    L = np.minimum(L, max_len)
    longest = np.minimum(np.maximum(L * group_max_factor, L), max_len)
    # each sample is cut at the cap, so where the spread reaches it the samples' mean is below min(L, cap)
    L = capped_sample_mean(L, max_len, group_max_factor, group_size)
    ro = _rollout(it, inst, rank, L, longest, P, n_iter, G=group_size, R=num_instances, S=max_num_seqs, cost=cost,
                  kv_cache_tokens=kv_cache_tokens, k=lag_bound)
    tr = _trainer(it, np.asarray(mini_batch, dtype=np.int64), rank, P, L, n_iter, G=group_size,
                  micro_batch_size=micro_batch_size, micro_batching=micro_batching, max_tokens=max_tokens_per_micro_batch,
                  cost=cost, group_max_factor=group_max_factor)
    pipe = _pipeline(ro, it, inst, tr, n_iter, R=num_instances, k=lag_bound, sync_s=cost.sync_s,
                     shared_queue=shared_queue, regroup=regroup, stream=stream)
    lb = iteration_lower_bounds(np.bincount(it, weights=ro.work, minlength=n_iter) / num_instances,
                                tr["train_unpadded"], _longest_solo(it, P, longest, group_size, cost, n_iter), lag_bound)
    out = _figures(pipe, tr, ro.cells, lb, num_instances)
    if groups:
        per = {k: np.empty(ro.order.size) for k in ("start", "finish", "solo")}
        per["start"][ro.order], per["finish"][ro.order], per["solo"][ro.order] = pipe["start"], pipe["fin"], ro.solo
        out["groups"], out["versions"] = per, pipe["V"]
    return out


def _rollout(it, inst, rank, L, longest, P, n_iter, *, G, R, S, cost: CostModel, kv_cache_tokens, k=1) -> _Rollout:
    """Windows, per-window concurrency and each group's place, solo latency and step terms.

    Dispatch windows: a group ranked (on its instance) before jobs of an earlier iteration is
    dispatched in that earlier iteration's window (ASP starts long groups early); it still
    waits for its own admission version V[it - k]."""
    n = L.shape[0]
    win = dispatch_windows(it, inst, rank, R)
    order = np.lexsort((inst, rank, win))
    w = win[order]
    Lo, Po = L[order], P[order]
    ctx = np.bincount(w, weights=G * (Po + Lo / 2), minlength=n_iter)
    seqs = np.bincount(w, minlength=n_iter) * float(G)
    mean_ctx = ctx / np.maximum(seqs, 1.0)
    # concurrency: max_num_seqs, or fewer when the KV cache holds fewer sequences of the window's context
    cap = np.full(n_iter, float(S))
    if kv_cache_tokens > 0:
        cap = np.clip(np.floor(kv_cache_tokens / np.maximum(mean_ctx, 1.0)), 1.0, S)
    # an instance runs its share of the window and of the k windows admissible with it, up to cap
    conc = np.minimum(cap, (k + 1) * seqs / R)
    w_o = G * cost.work(Po, Lo, np.maximum(conc[w], 1.0), G)
    work = np.empty(n)
    work[order] = w_o
    win_start = np.searchsorted(w, np.arange(n_iter + 1))
    cw = np.cumsum(w_o)
    first = win_start[w]
    before = cw - w_o - np.where(first > 0, cw[np.maximum(first - 1, 0)], 0.0)
    first_wave = (np.arange(n) - first + 1) * G <= R * cap[w]
    Lg = longest[order]
    b, c = cost.decode_b, cost.decode_c
    # alone: G samples to the mean length, the longest one on to its end
    solo = (cost.group_prefill(Po, G) + cost.steps(Lo, G, G * Po) + cost.steps(Lg - Lo, 1, Po + Lo))
    # prefill: a sample's share of its group's (prefix caching: the prompt's cached blocks once)
    beside = G * (c * Lo + b * (Po * Lo + Lo * Lo / 2.0) + cost.prefill_per_token * cost.prefill_share(Po, G))
    per_step = np.maximum(0.0, conc - G) * (c + b * mean_ctx)
    # a full instance's prefill beside the group: the co-runners admitted with it (first wave), and
    # each co-runner's slot turning over once per mean length (the replacement's prefill)
    mean_p = np.bincount(w, weights=G * Po, minlength=n_iter) / np.maximum(seqs, 1.0)
    mean_l = np.bincount(w, weights=G * Lo, minlength=n_iter) / np.maximum(seqs, 1.0)
    pre_wave = np.maximum(0.0, conc - G) * cost.prefill_per_token * cost.prefill_share(mean_p, G)
    pre_step = pre_wave / np.maximum(mean_l, 1.0)
    cells = np.bincount(w * R + inst[order], weights=w_o, minlength=n_iter * R).reshape(n_iter, R)
    return _Rollout(order, win_start, first_wave, before, solo, Lg, per_step + pre_step, pre_wave, beside,
                    np.bincount(w, weights=w_o, minlength=n_iter), seqs, cap, cells, work, w_o)


def _trainer(it, mb, rank, P, L, n_iter, *, G, micro_batch_size, micro_batching, max_tokens, cost: CostModel,
             group_max_factor) -> dict:
    """Per optimizer step (mini-batch): its iteration and trainer time on the runtime's micro-batches
    (``scheduler.microbatch.step_slots``, the cut the simulator's and the runtime's trainers make);
    per group its step; per iteration trainer time, unpadded time, real tokens and slots.

    ``packed`` (what ``train.micro_batching: auto`` runs): no pad, PACKED_TOKEN_COST slots per real
    token. ``padded``/``sorted``: each group's G sequences in dispatch order within each mini-batch,
    every one as long as the group's longest (prompt + mean length x ``group_max_factor``), cut as
    plan_step cuts them; real tokens from the mean."""
    n = it.shape[0]
    M = int(rank.max()) + 1
    n_mb_max = int(mb.max()) + 1
    mb_key = it * n_mb_max + mb
    mb_order = np.argsort(mb_key * M + rank, kind="stable")
    mbcode, n_mbs = _dense_codes(mb_key[mb_order])
    step_of = np.empty(n, dtype=np.int64)
    step_of[mb_order] = mbcode
    mb_iter = np.zeros(n_mbs, dtype=np.int64)
    mb_iter[mbcode] = it[mb_order]
    real_mb = np.bincount(mbcode, weights=G * (P + L)[mb_order], minlength=n_mbs)
    if micro_batching == "packed":
        slots_mb = PACKED_TOKEN_COST * real_mb
    else:
        longest = np.repeat(np.ceil(P + L * group_max_factor)[mb_order], G)
        tok, pad = step_slots(np.repeat(mbcode, G), longest, mode=micro_batching, micro=micro_batch_size,
                              max_tokens=max_tokens)
        slots_mb = real_mb + np.maximum(0.0, tok + pad - real_mb)
    # per group on its own (regroup / streaming: ``_train_groups``): packed, or its G sequences each
    # as long as its longest, as the streaming trainer cuts a group alone; the optimizer step apart
    real_g = G * (P + L)
    slots_g = (PACKED_TOKEN_COST * real_g if micro_batching == "packed"
               else np.maximum(real_g, G * np.ceil(P + L * group_max_factor)))
    real_i = np.bincount(mb_iter, weights=real_mb, minlength=n_iter)
    n_steps = np.bincount(mb_iter, minlength=n_iter)
    # padding bubble counts pad slots only (a packed token's kernel overhead is not padding)
    pad_i = np.bincount(mb_iter, weights=(slots_mb - real_mb) if micro_batching != "packed" else np.zeros(n_mbs),
                        minlength=n_iter)
    return {"step_of": step_of, "step_iter": mb_iter, "step_s": cost.train_time(slots_mb, np.ones(n_mbs)),
            "group_s": cost.train_time(slots_g, np.zeros(n)), "per_step_s": float(cost.train_per_step),
            "step_groups": np.bincount(step_of, minlength=n_mbs),
            "train_unpadded": cost.train_time(real_i, n_steps), "real": real_i, "slots": real_i + pad_i}


def _pipeline(ro: _Rollout, it, inst, tr: dict, n_iter, *, R, k, sync_s, shared_queue=False, regroup=False,
              stream=False) -> dict:
    """The recurrence over windows: versions V, each group's finish, each step's readiness
    (``regroup``/``stream``: the trainer as ``_train_groups`` runs it).

    Window j needs V up to V_j (its groups' admission versions are <= j); V_j needs iteration
    j - 1 trained, whose groups were all dispatched in windows <= j - 1."""
    order, ws = ro.order, ro.win_start
    it_o, step_o = it[order], tr["step_of"][order]
    steps_of = _by_value(tr["step_iter"], n_iter)
    by_group = regroup or stream
    if by_group:
        groups_of = _by_value(it_o, n_iter)
        group_s_o = tr["group_s"][order]
    step_s = tr["step_s"]
    ready = np.zeros(step_s.size)
    V = np.zeros(n_iter + 1)
    gen = np.zeros(n_iter)
    wait = np.zeros(n_iter)
    free = 0.0                       # the pool's capacity frees up
    c_prev = np.zeros(R)             # per instance as placed (bubble figures)
    S_cell = np.zeros((n_iter, R))
    C_cell = np.zeros((n_iter, R))
    start_o = np.zeros(order.size)   # each group's start and finish, in pooled order
    fin_o = np.zeros(order.size)

    def train(i: int) -> float:
        """Iteration i's steps in the order they become ready, from V_i; the trainer's idle time."""
        if by_group:
            m = groups_of[i]
            t, wait[i] = _train_groups(V[i], fin_o[m], group_s_o[m], step_o[m], tr["step_groups"][steps_of[i]],
                                       tr["per_step_s"], regroup=regroup, stream=stream)
            return t + sync_s
        t, idle = V[i], 0.0
        xs = steps_of[i][np.argsort(ready[steps_of[i]], kind="stable")]
        for x in xs.tolist():
            idle += max(0.0, ready[x] - t)
            t = max(t, ready[x]) + step_s[x]
        wait[i] = idle
        return t + sync_s

    win_o = np.repeat(np.arange(n_iter), np.diff(ws))   # each position's window
    rest_o = np.zeros(order.size)
    full_o = np.zeros(order.size)
    later = np.flatnonzero(win_o < it_o)                 # groups pulled forward into an earlier window
    pulled = [later[x] for x in _by_value(it_o[later], n_iter)]
    # a window's parts by admission: its own iteration's groups and those pulled forward from later
    # ones, each admitted at V[iteration - k]: (window, iteration), 1/R of its beside terms and work
    span = int((it_o - win_o).max(initial=0)) + 1
    key = win_o * span + (it_o - win_o)
    pkey = np.flatnonzero(np.bincount(key, minlength=n_iter * span))   # (window, iteration), ascending
    part_win, part_adm = pkey // span, np.maximum(0, pkey // span + pkey % span - k)
    part_share = np.bincount(key, weights=ro.beside, minlength=n_iter * span)[pkey] / R
    part_len = np.maximum(np.bincount(key, weights=ro.work_o, minlength=n_iter * span)[pkey] / R, 1e-12)

    def finish(pos, fin, upto: int) -> np.ndarray:
        """The groups at ``pos``: their finish with the 1/R share of every part of a later window
        admitted at V_0..V_upto while they run (a fixed point from ``fin``)."""
        own = win_o[pos]
        # parts of windows own..upto + k (a later window's are admitted after V_upto)
        lo, hi = np.searchsorted(pkey, [int(own.min()) * span, (upto + k + 1) * span])
        parts = lo + np.flatnonzero(part_adm[lo:hi] <= upto)
        st = start_o[pos]
        # a later window's parts, and its own window's admitted after it started (parts x groups)
        adm = V[part_adm[parts]][:, None]
        pw = part_win[parts][:, None]
        share = np.where((pw > own) | ((pw == own) & (adm > st)), part_share[parts][:, None], 0.0)
        if not share.any():
            return fin
        begin = np.maximum(adm, st)
        base = st + ro.solo[pos]
        for _ in range(FIXED_POINT_ROUNDS):
            frac = np.clip((fin - begin) / part_len[parts][:, None], 0.0, 1.0)
            fin = base + np.minimum(full_o[pos], rest_o[pos] + (frac * share).sum(axis=0))
        return fin

    for j in range(n_iter):
        if j > 0:
            V[j] = train(j - 1)
        if k > 0 and pulled[j].size:
            # a group pulled forward runs beside every window admitted before its own iteration
            # is trained (up to j + k), not only the one after its window: once V_j is known
            pos = pulled[j]
            fin = finish(pos, fin_o[pos], j)
            fin_o[pos] = fin
            np.maximum.at(ready, step_o[pos], fin)
            np.maximum.at(gen, it_o[pos], fin)
        admit = V[max(0, j - k)]
        s = max(free, admit)
        free = s + ro.W[j] / R
        S_cell[j] = np.maximum(c_prev, admit)
        C_cell[j] = S_cell[j] + ro.cells[j]
        c_prev = C_cell[j]
        g = slice(ws[j], ws[j + 1])
        start = np.where(ro.first_wave[g], s, s + ro.before[g] / R)
        off = it_o[g] - j                     # >= 0: a window holds its own and later iterations
        adm_v = V[np.maximum(0, j + np.arange(int(off.max(initial=0)) + 1) - k)]   # non-decreasing
        adm = adm_v[off]
        start = np.maximum(start, adm)
        # the rest of its window beside it: the groups admitted by its start (those admitted later,
        # pulled forward, co-run from their admission: ``finish``), less what was done before it
        # starts: the work dispatched before it or, for a group that waits for its admission past
        # the window's start (pulled forward), what the pool ran by then of the groups admitted before
        cum_w = np.r_[0.0, np.cumsum(np.bincount(off, weights=ro.work_o[g], minlength=adm_v.size))]
        cum_b = np.r_[0.0, np.cumsum(np.bincount(off, weights=ro.beside[g], minlength=adm_v.size))]
        le = np.searchsorted(adm_v, start, side="right")
        done_before = np.clip(np.minimum((start - s) * R, cum_w[np.searchsorted(adm_v, start, side="left")])
                              / np.maximum(cum_w[le], 1e-12), 0.0, 1.0)
        share = 1.0 / R              # the instance's share of the window
        if shared_queue and ro.seqs[j] > 0:
            run = slice(ws[max(0, j - k)], ws[j])
            share = _queue_share(start_o[run], fin_o[run], admit, ro.seqs[j], ro.cap[j], R)
        rest = np.maximum(0.0, cum_b[le] * share * (1.0 - done_before) - ro.beside[g] * share)
        # a full instance beside every step of the group (and, starting with its window, its prefill)
        full = ro.per_step[j] * ro.steps[g] + np.where(ro.first_wave[g], ro.pre_wave[j], 0.0)
        start_o[g], rest_o[g], full_o[g] = start, rest, full
        pos = np.arange(ws[j], ws[j + 1])
        # the later windows' shares co-run once they are admitted (those admitted by V_j: up to j + k)
        fin = start + ro.solo[g] + np.minimum(full, rest)
        if pos.size and k > 0:
            fin = finish(pos, fin, j)
        fin_o[g] = fin
        np.maximum.at(ready, step_o[g], fin)
        np.maximum.at(gen, it_o[g], fin)
    V[n_iter] = train(n_iter - 1)
    return {"V": V, "C": C_cell, "S": S_cell, "gen": gen, "wait": wait, "start": start_o, "fin": fin_o}


def _by_value(x: np.ndarray, n: int) -> list[np.ndarray]:
    """For each value 0..n-1 the positions of ``x`` (integers in 0..n-1) holding it, ascending."""
    o = np.argsort(x, kind="stable")
    return np.split(o, np.searchsorted(x[o], np.arange(1, n)))


def _train_groups(t0: float, fin: np.ndarray, dur: np.ndarray, step: np.ndarray, sizes: np.ndarray,
                  per_step: float, *, regroup: bool, stream: bool) -> tuple[float, float]:
    """One iteration's trainer from ``t0`` (its version) under ``pipeline.regroup`` /
    ``stream_groups``: (the last optimizer step's end, the trainer's idle time). Per group: its
    finish ``fin``, its forward/backward seconds ``dur``, its planned step ``step``; ``sizes``:
    the groups of each planned step (in step order), ``per_step``: an optimizer update's seconds.

    With ``regroup`` step m holds the groups generated m-th (in ``sizes``' counts): the trainer
    fills a waiting mini-batch with generated groups of later ones (``scheduler/regroup.py``), so
    the steps follow the finish order; without it each step holds its planned groups and the steps
    run in the order they are generated. With ``stream`` each group's pass runs once it is
    generated and the trainer is free, the update after the step's last group; without it a step
    runs once its last group is generated."""
    if regroup:
        order = np.argsort(fin, kind="stable")
        cut = np.cumsum(sizes)[:-1]
    else:
        code = step - step.min()     # an iteration's steps have consecutive codes
        last = np.zeros(int(code.max()) + 1)
        np.maximum.at(last, code, fin)
        order = np.lexsort((fin, last[code]))
        cut = np.flatnonzero(np.diff(step[order])) + 1
    f, d = fin[order], dur[order].astype(np.float64)
    ends = np.r_[cut, order.size] - 1            # each step's last group
    d[ends] += per_step
    if not stream:   # one event per step: its last group's finish, all its seconds
        f, d = np.maximum.reduceat(f, np.r_[0, cut]), np.add.reduceat(d, np.r_[0, cut])
    # t_k = max(t_{k-1}, f_k) + d_k, as a scan: t_n = D_n + max(t0, max_k (f_k - D_{k-1}))
    D = np.cumsum(d)
    t = float(D[-1] + max(t0, float(np.max(f - (D - d)))))
    return t, t - t0 - float(D[-1])


def _queue_share(start: np.ndarray, fin: np.ndarray, admit: float, seqs: float, cap: float, R: int) -> float:
    """The share of a shared-queue window that one instance holding its groups runs: the window
    goes first to the instances free at its admission (``R_free``), each taking up to ``cap``
    sequences, so an instance holds ``min(cap, seqs / R_free)`` of it (at least ``seqs / R``). The
    earlier windows' groups started before ``admit`` and still running then occupy
    ``R (1 - (1 - 1/R)^n)`` instances (n groups landing independently on R instances); groups
    admitted at the same moment are spread with the window."""
    n_run = int(np.count_nonzero((start < admit) & (fin > admit)))
    busy = R * (1.0 - (1.0 - 1.0 / R) ** n_run)
    per_instance = max(seqs / R, min(cap, seqs / max(1.0, R - busy)))
    return per_instance / seqs


def _figures(pipe: dict, tr: dict, W, lb, R) -> dict:
    """Bubbles: after its share of iteration i, an instance runs below capacity until it
    starts iteration i+1: a skew bubble while iteration i is still generating elsewhere,
    lag-blocked after that (waiting for a newer version)."""
    V, C, gen = pipe["V"], pipe["C"], pipe["gen"]
    run_time = V[-1]
    nxt = np.vstack([pipe["S"][1:], np.full((1, R), run_time)])
    skew = float(np.maximum(0.0, np.minimum(nxt, gen[:, None]) - C).sum())
    lag_blocked = float(np.maximum(0.0, nxt - np.maximum(C, gen[:, None])).sum())
    real_tokens = float(tr["real"].sum())
    per_window = W.sum(axis=1)
    return {
        **iteration_time_stats(V[1:], 0.0),
        "padding_bubble": padding_bubble(real_tokens, float(tr["slots"].sum()) - real_tokens),
        "skew_bubble": ratio(skew, R * run_time),
        "lag_blocked": ratio(lag_blocked, R * run_time),
        "sorting_bubble": ratio(float(pipe["wait"].sum()), run_time),
        "lower_bound_ratio": lower_bound_ratio(run_time, lb),
        "run_time_s": float(run_time),
        "throughput": ratio(real_tokens, run_time),
        "iterations": int(V.size - 1),
        "rollout_work_cv": float(np.std(per_window) / max(np.mean(per_window), 1e-12)),
    }


def dispatch_windows(iteration: np.ndarray, instance: np.ndarray, rank: np.ndarray, R: int) -> np.ndarray:
    """Window of each group: the smallest iteration among it and the groups ranked after
    it on its instance (= its own iteration unless the schedule pulled it forward)."""
    M = int(rank.max()) + 1
    order = np.argsort(instance * M + rank)
    # segmented suffix minimum: offset each instance's iterations so that a later
    # instance's values never undercut an earlier one's when scanning backwards
    span = int(iteration.max()) + 1
    v = iteration[order] + instance[order] * span
    suffix = np.minimum.accumulate(v[::-1])[::-1] - instance[order] * span
    out = np.empty_like(iteration)
    out[order] = suffix
    return out


def capped_sample_mean(mean, cap: float, group_max_factor, group_size: int) -> np.ndarray:
    """Expected mean of a group's samples when each is ``mean x lognormal(0, sigma)`` (mean-one,
    the workloads' within-group spread) cut at ``cap`` (``lengths.max_response_length``):
    ``E[min(Y, cap)] = mean x Phi((ln(cap / mean) - sigma^2 / 2) / sigma) + cap x (1 - Phi((ln(cap /
    mean) + sigma^2 / 2) / sigma))``, below ``min(mean, cap)`` where the spread reaches the cap.
    ``sigma`` is the spread whose expected longest of ``group_size`` samples is ``group_max_factor``
    x the mean (``group_max.spread_of_group_max_factor``, the inverse of the planner's exact
    ``group_max.group_max_factor``); 1 (or no cap) leaves ``mean``."""
    mean = np.asarray(mean, dtype=np.float64)
    gmf = np.broadcast_to(np.asarray(group_max_factor, dtype=np.float64), mean.shape)
    if not np.isfinite(cap) or group_size <= 1:
        return mean.copy()
    sigma = spread_of_group_max_factor(gmf, group_size)
    out = mean.copy()
    near = (sigma > 0) & (mean > 0) & (mean * np.exp(4.0 * sigma) > cap)   # the cap cuts off > ~3e-5 of the mass
    if near.any():
        s, m = sigma[near], mean[near]
        u = np.log(cap / m) / s
        phi = np.vectorize(NormalDist().cdf, otypes=[float])
        out[near] = m * phi(u - s / 2.0) + cap * (1.0 - phi(u + s / 2.0))
    return np.minimum(out, mean)


def _longest_solo(it, P, L, G, cost: CostModel, n_iter: int) -> np.ndarray:
    lat = cost.group_latency(P, L, G)
    out = np.zeros(n_iter)
    np.maximum.at(out, it, lat)
    return out
