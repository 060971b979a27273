"""Analytic estimate of a schedule: the figures the planner optimises.

Not an event simulation (that is ``asp simulate``): a per-(iteration, instance) model
fast enough for a million prompts, built on the cost model and the metric functions.

For each iteration i and instance r, with the groups of (i, r) in dispatch order:
  w_g    = G * work(prompt, length, S)             instance-seconds at full concurrency
  lat_g  = length_g * step_full  (>= solo latency) latency of a group under load, where
           step_full = a + c*S + b*S*mean context of the instance's share
  start_g = 0 for groups of the first wave (<= S sequences), else the work dispatched before
  a group runs at the loaded step time while its instance has admissible work (its share
  W_ir = sum w_g of this window, and the next window's share when that one is already
  admissible), then at its solo step time (the instance drains to its long tail)
Pipeline with lag bound k (versions published at V_0 = 0 < V_1 < ...):
  s_ir = max(c_{i-1,r}, V_{max(0,i-k)}),  c_ir = s_ir + W_ir  (capacity free again),
  Gen_i = max over groups of their finish (tails may overlap the next iteration's work)
  D_i  = max(V_i + train_i, Gen_i + train_i / n_minibatches_i),  V_{i+1} = D_i + sync
Bubbles: skew = instance time idle or in its own long tail while others still generate
iteration i; lag-blocked = the rest of its idle; sorting = trainer idle waiting for
samples (V_i + train_i < Gen_i + tail); padding = pad slots of padded micro-batches
(groups in dispatch order within each mini-batch, ``micro_batch_size`` sequences each).
"""
from __future__ import annotations

import numpy as np

from ..metrics.bubbles import (iteration_lower_bounds, iteration_time_stats, lower_bound_ratio, padding_bubble,
                               ratio)
from .cost import CostModel


def _dense_codes(sorted_keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes 0..m-1 of an already sorted key array, and m."""
    if sorted_keys.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    change = np.empty(sorted_keys.size, dtype=np.int64)
    change[0] = 0
    change[1:] = sorted_keys[1:] != sorted_keys[:-1]
    codes = np.cumsum(change)
    return codes, int(codes[-1]) + 1


def estimate(iteration, instance, mini_batch, dispatch_rank, lengths, prompt_lengths, *, group_size: int,
             num_instances: int, max_num_seqs: int, lag_bound: int, micro_batch_size: int,
             cost: CostModel, group_max_factor: float = 1.0, kv_cache_tokens: int = 0) -> dict:
    """Predicted run figures for a schedule whose groups have mean lengths ``lengths``."""
    it = np.asarray(iteration, dtype=np.int64)
    it = it - it.min()
    inst = np.asarray(instance, dtype=np.int64)
    mb = np.asarray(mini_batch, dtype=np.int64)
    rank = np.asarray(dispatch_rank, dtype=np.int64)
    L = np.asarray(lengths, dtype=np.float64)
    P = np.zeros_like(L) if prompt_lengths is None else np.asarray(prompt_lengths, dtype=np.float64)
    G, R, S, k = group_size, num_instances, max_num_seqs, lag_bound
    n = L.shape[0]
    n_iter = int(it.max()) + 1

    # ---- dispatch windows: a group ranked (on its instance) before jobs of an earlier
    # iteration is dispatched in that earlier iteration's window (ASP starts long groups
    # early); it still waits for its own admission version V[it - k].
    rank = rank - rank.min()
    M = int(rank.max()) + 1
    win = dispatch_windows(it, inst, rank, R)
    order = np.argsort((win * R + inst) * M + rank)
    cell = win[order] * R + inst[order]
    ncell = n_iter * R
    cell_start = np.searchsorted(cell, np.arange(ncell))
    # concurrency of a cell: max_num_seqs, or fewer when the KV cache holds fewer sequences
    ctx_sum = np.bincount(cell, weights=G * (P[order] + L[order] / 2), minlength=ncell)
    seqs = np.bincount(cell, weights=np.full(n, float(G)), minlength=ncell)
    mean_ctx = np.divide(ctx_sum, seqs, out=np.zeros(ncell), where=seqs > 0)
    cap = np.full(ncell, float(S))
    if kv_cache_tokens > 0:
        cap = np.clip(np.floor(kv_cache_tokens / np.maximum(mean_ctx, 1.0)), 1.0, S)
    conc = np.minimum(seqs, cap)
    w_o = G * cost.work(P[order], L[order], cap[cell])
    w = np.empty(n)
    w[order] = w_o
    cw = np.cumsum(w_o)
    before = cw - w_o - np.where(cell_start[cell] > 0, cw[cell_start[cell] - 1], 0.0)
    samples_before = (np.arange(n) - cell_start[cell]) * G
    offset = np.where(samples_before + G <= cap[cell], 0.0, before)
    step_full = cost.decode_a + cost.decode_c * conc + cost.decode_b * conc * mean_ctx
    work_cell = np.bincount(cell, weights=w_o, minlength=ncell)
    W_ir = work_cell.reshape(n_iter, R)
    # A group runs at the loaded step time until its instance's share of work is done,
    # then at its own (solo) step time: the instance drains to its long tail.
    Lg = L[order] * group_max_factor
    Pg = P[order]
    solo_step = cost.decode_a + cost.decode_c * G + cost.decode_b * G * (Pg + Lg / 2)
    loaded = np.maximum(step_full[cell], solo_step)
    prefill = cost.prefill_per_token * Pg * G
    it_o, inst_o, work_o = it[order], inst[order], work_cell[cell]
    win_start = np.searchsorted(cell, np.arange(n_iter + 1) * R)

    # ---- trainer: padded micro-batches (groups in dispatch order inside each mini-batch)
    tok = P + L
    n_mb_max = int(mb.max()) + 1
    mb_key = it * n_mb_max + mb
    mb_order = np.argsort(mb_key * M + rank)
    key_it = it[mb_order]
    mbcode, n_mbs = _dense_codes(mb_key[mb_order])
    first = np.searchsorted(mbcode, np.arange(n_mbs))
    seq_before = (np.arange(n) - first[mbcode]) * G
    micro = mbcode.astype(np.int64) * (1 + (G * n) // max(1, micro_batch_size)) + seq_before // micro_batch_size
    n_micro, mcode = _dense_codes(micro)
    tok_o = tok[mb_order] * group_max_factor
    mmax = np.zeros(mcode)
    np.maximum.at(mmax, n_micro, tok_o)
    mseqs = np.bincount(n_micro, weights=np.full(n, float(G)), minlength=mcode)
    real_tok_micro = np.bincount(n_micro, weights=G * tok[mb_order], minlength=mcode)
    slots_micro = mmax * mseqs
    micro_iter = np.zeros(mcode, dtype=np.int64)
    micro_iter[n_micro] = key_it
    real_i = np.bincount(micro_iter, weights=real_tok_micro, minlength=n_iter)
    slots_i = np.bincount(micro_iter, weights=slots_micro, minlength=n_iter)
    mb_iter = np.zeros(n_mbs, dtype=np.int64)
    mb_iter[mbcode] = key_it
    n_steps = np.bincount(mb_iter, minlength=n_iter)
    train = cost.train_time(slots_i, n_steps)
    train_unpadded = cost.train_time(real_i, n_steps)
    tail = train / np.maximum(n_steps, 1)

    # ---- pipeline recurrence over windows/iterations
    # c: when an instance's capacity frees up (its share of the window's work done);
    # a group's tail may overlap the next window's work. Gen_i: last finish of iteration i.
    V = np.zeros(n_iter + 1)
    c_prev = np.zeros(R)
    C = np.zeros((n_iter, R))
    S_ir = np.zeros((n_iter, R))
    gen = np.zeros(n_iter)
    trainer_wait = np.zeros(n_iter)
    for j in range(n_iter):
        s = np.maximum(c_prev, V[max(0, j - k)])
        S_ir[j], C[j] = s, s + W_ir[j]
        g = slice(win_start[j], win_start[j + 1])
        base = s[inst_o[g]]
        start = np.maximum(base + offset[g], V[np.maximum(0, it_o[g] - k)])
        # the instance stays loaded while it has admissible work: through this window, and
        # through the next one too when that one is already admissible (not lag-blocked)
        busy_until = s + W_ir[j]
        if k > 0 and j + 1 < n_iter:
            nxt_open = V[j + 1 - k] <= busy_until
            busy_until = np.where(nxt_open, busy_until + W_ir[j + 1], busy_until)
        x = np.clip((busy_until[inst_o[g]] - start) / loaded[g], 0.0, Lg[g])
        fin = start + prefill[g] + x * loaded[g] + (Lg[g] - x) * solo_step[g]
        np.maximum.at(gen, it_o[g], fin)
        gen[j] = max(gen[j], C[j].max())
        ready = V[j] + train[j]
        arrive = gen[j] + tail[j]
        trainer_wait[j] = max(0.0, arrive - ready)
        V[j + 1] = max(ready, arrive) + cost.sync_s
        c_prev = C[j]
    run_time = V[-1]
    # after its share of iteration i, an instance runs below capacity until it starts
    # iteration i+1: a skew bubble while iteration i is still generating elsewhere,
    # lag-blocked after that (waiting for a newer version)
    nxt = np.vstack([S_ir[1:], np.full((1, R), run_time)])
    skew = float(np.maximum(0.0, np.minimum(nxt, gen[:, None]) - C).sum())
    lag_blocked = float(np.maximum(0.0, nxt - np.maximum(C, gen[:, None])).sum())
    lb = iteration_lower_bounds(np.bincount(it, weights=w, minlength=n_iter) / R, train_unpadded,
                                _longest_solo(it, P, L * group_max_factor, G, cost, n_iter), k)
    real_tokens = float(real_i.sum())
    stats = iteration_time_stats(V[1:], 0.0)
    return {
        **stats,
        "padding_bubble": padding_bubble(real_tokens, float(slots_i.sum()) - real_tokens),
        "skew_bubble": ratio(skew, R * run_time),
        "lag_blocked": ratio(lag_blocked, R * run_time),
        "sorting_bubble": ratio(float(trainer_wait.sum()), run_time),
        "lower_bound_ratio": lower_bound_ratio(run_time, lb),
        "run_time_s": float(run_time),
        "throughput": ratio(real_tokens, run_time),
        "iterations": n_iter,
        "rollout_work_cv": float(np.std(W_ir.sum(axis=1)) / max(np.mean(W_ir.sum(axis=1)), 1e-12)),
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


def _longest_solo(it, P, L, G, cost: CostModel, n_iter: int) -> np.ndarray:
    lat = cost.group_latency(P, L, G)
    out = np.zeros(n_iter)
    np.maximum.at(out, it, lat)
    return out
