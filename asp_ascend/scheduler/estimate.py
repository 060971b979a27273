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
samples (V_i + train_i < Gen_i + tail); padding = pad slots of the trainer's micro-batches as the
runtime cuts them (none when packed, the default: see ``_trainer``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics.bubbles import (iteration_lower_bounds, iteration_time_stats, lower_bound_ratio, padding_bubble,
                               ratio)
from .cost import CostModel
from .microbatch import PACKED_TOKEN_COST, step_slots


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
    """Per group, in cell order (window, instance, dispatch rank): what the recurrence needs."""
    order: np.ndarray       # group index of each position
    inst: np.ndarray        # instance of each position
    cell_start: np.ndarray  # first position of each cell (window * R + instance)
    offset: np.ndarray      # work dispatched before the group on its instance (0 in the first wave)
    loaded: np.ndarray      # step time while the instance is loaded (>= solo)
    solo: np.ndarray        # step time of the group alone
    prefill: np.ndarray
    length: np.ndarray      # decode steps of the group (its longest sample)
    W: np.ndarray           # (window, instance) work at full concurrency
    work: np.ndarray        # per group (input order)


def estimate(iteration, instance, mini_batch, dispatch_rank, lengths, prompt_lengths, *, group_size: int,
             num_instances: int, max_num_seqs: int, lag_bound: int, micro_batch_size: int,
             cost: CostModel, group_max_factor: float = 1.0, kv_cache_tokens: int = 0,
             micro_batching: str = "padded", max_tokens_per_micro_batch: int = 0) -> dict:
    """Predicted run figures for a schedule whose groups have mean lengths ``lengths``;
    ``micro_batching``/``max_tokens_per_micro_batch``: how the trainer cuts micro-batches (the
    runtime's mode, ``microbatch.resolve_mode(train.micro_batching)``)."""
    it = np.asarray(iteration, dtype=np.int64)
    it = it - it.min()
    rank = np.asarray(dispatch_rank, dtype=np.int64)
    rank = rank - rank.min()
    L = np.asarray(lengths, dtype=np.float64)
    P = np.zeros_like(L) if prompt_lengths is None else np.asarray(prompt_lengths, dtype=np.float64)
    n_iter = int(it.max()) + 1
    ro = _rollout(it, np.asarray(instance, dtype=np.int64), rank, L, P, n_iter, G=group_size, R=num_instances,
                  S=max_num_seqs, cost=cost, group_max_factor=group_max_factor, kv_cache_tokens=kv_cache_tokens)
    tr = _trainer(it, np.asarray(mini_batch, dtype=np.int64), rank, P, L, n_iter, G=group_size,
                  micro_batch_size=micro_batch_size, micro_batching=micro_batching, max_tokens=max_tokens_per_micro_batch,
                  cost=cost, group_max_factor=group_max_factor)
    pipe = _pipeline(ro, it[ro.order], tr["train"], tr["tail"], n_iter, k=lag_bound, sync_s=cost.sync_s)
    lb = iteration_lower_bounds(np.bincount(it, weights=ro.work, minlength=n_iter) / num_instances,
                                tr["train_unpadded"], _longest_solo(it, P, L * group_max_factor, group_size, cost,
                                                                   n_iter), lag_bound)
    return _figures(pipe, tr, ro.W, lb, num_instances)


def _rollout(it, inst, rank, L, P, n_iter, *, G, R, S, cost: CostModel, group_max_factor, kv_cache_tokens) -> _Rollout:
    """Cells, per-cell concurrency and each group's offset and step times.

    Dispatch windows: a group ranked (on its instance) before jobs of an earlier iteration is
    dispatched in that earlier iteration's window (ASP starts long groups early); it still
    waits for its own admission version V[it - k]."""
    n = L.shape[0]
    M = int(rank.max()) + 1
    win = dispatch_windows(it, inst, rank, R)
    order = np.argsort((win * R + inst) * M + rank)
    cell = win[order] * R + inst[order]
    ncell = n_iter * R
    cell_start = np.searchsorted(cell, np.arange(ncell))
    Lo, Po = L[order], P[order]
    # concurrency of a cell: max_num_seqs, or fewer when the KV cache holds fewer sequences
    ctx_sum = np.bincount(cell, weights=G * (Po + Lo / 2), minlength=ncell)
    seqs = np.bincount(cell, weights=np.full(n, float(G)), minlength=ncell)
    mean_ctx = np.divide(ctx_sum, seqs, out=np.zeros(ncell), where=seqs > 0)
    cap = np.full(ncell, float(S))
    if kv_cache_tokens > 0:
        cap = np.clip(np.floor(kv_cache_tokens / np.maximum(mean_ctx, 1.0)), 1.0, S)
    conc = np.minimum(seqs, cap)
    w_o = G * cost.work(Po, Lo, cap[cell])
    work = np.empty(n)
    work[order] = w_o
    cw = np.cumsum(w_o)
    before = cw - w_o - np.where(cell_start[cell] > 0, cw[cell_start[cell] - 1], 0.0)
    samples_before = (np.arange(n) - cell_start[cell]) * G
    offset = np.where(samples_before + G <= cap[cell], 0.0, before)
    step_full = cost.decode_a + cost.decode_c * conc + cost.decode_b * conc * mean_ctx
    # A group runs at the loaded step time until its instance's share of work is done,
    # then at its own (solo) step time: the instance drains to its long tail.
    Lg = Lo * group_max_factor
    solo = cost.decode_a + cost.decode_c * G + cost.decode_b * G * (Po + Lg / 2)
    W = np.bincount(cell, weights=w_o, minlength=ncell).reshape(n_iter, R)
    return _Rollout(order, inst[order], cell_start, offset, np.maximum(step_full[cell], solo), solo,
                    cost.prefill_per_token * Po * G, Lg, W, work)


def _trainer(it, mb, rank, P, L, n_iter, *, G, micro_batch_size, micro_batching, max_tokens, cost: CostModel,
             group_max_factor) -> dict:
    """Per iteration: trainer time on the runtime's micro-batches (``scheduler.microbatch.step_slots``,
    the cut the simulator's and the runtime's trainers make), unpadded, real tokens, slots.

    ``packed`` (what ``train.micro_batching: auto`` runs): no pad, PACKED_TOKEN_COST slots per real
    token. ``padded``/``sorted``: each group's G sequences in dispatch order within each mini-batch,
    every one as long as the group's longest (prompt + mean length x ``group_max_factor``), cut as
    plan_step cuts them; real tokens from the mean."""
    n = it.shape[0]
    M = int(rank.max()) + 1
    n_mb_max = int(mb.max()) + 1
    mb_key = it * n_mb_max + mb
    mb_order = np.argsort(mb_key * M + rank)
    mbcode, n_mbs = _dense_codes(mb_key[mb_order])
    mb_iter = np.zeros(n_mbs, dtype=np.int64)
    mb_iter[mbcode] = it[mb_order]
    real_g = G * (P + L)[mb_order]
    real_mb = np.bincount(mbcode, weights=real_g, minlength=n_mbs)
    if micro_batching == "packed":
        slots_mb = PACKED_TOKEN_COST * real_mb
    else:
        longest = np.repeat(np.ceil(P + L * group_max_factor)[mb_order], G)
        tok, pad = step_slots(np.repeat(mbcode, G), longest, mode=micro_batching, micro=micro_batch_size,
                              max_tokens=max_tokens)
        slots_mb = real_mb + np.maximum(0.0, tok + pad - real_mb)
    real_i = np.bincount(mb_iter, weights=real_mb, minlength=n_iter)
    slots_i = np.bincount(mb_iter, weights=slots_mb, minlength=n_iter)
    n_steps = np.bincount(mb_iter, minlength=n_iter)
    train = cost.train_time(slots_i, n_steps)
    # padding bubble counts pad slots only (a packed token's kernel overhead is not padding)
    pad_i = np.bincount(mb_iter, weights=(slots_mb - real_mb) if micro_batching != "packed" else np.zeros(n_mbs),
                        minlength=n_iter)
    return {"train": train, "train_unpadded": cost.train_time(real_i, n_steps),
            "tail": train / np.maximum(n_steps, 1), "real": real_i, "slots": real_i + pad_i}


def _pipeline(ro: _Rollout, it_o, train, tail, n_iter, *, k, sync_s) -> dict:
    """The recurrence over windows/iterations (versions V, instance capacity free times C).

    c: when an instance's capacity frees up (its share of the window's work done); a group's
    tail may overlap the next window's work. Gen_i: last finish of iteration i."""
    R = ro.W.shape[1]
    W = ro.W
    inst_o = ro.inst
    win_start = ro.cell_start[::R].tolist() + [it_o.size]
    V = np.zeros(n_iter + 1)
    c_prev = np.zeros(R)
    C = np.zeros((n_iter, R))
    S_ir = np.zeros((n_iter, R))
    gen = np.zeros(n_iter)
    wait = np.zeros(n_iter)
    for j in range(n_iter):
        s = np.maximum(c_prev, V[max(0, j - k)])
        S_ir[j], C[j] = s, s + W[j]
        g = slice(win_start[j], win_start[j + 1])
        start = np.maximum(s[inst_o[g]] + ro.offset[g], V[np.maximum(0, it_o[g] - k)])
        # the instance stays loaded while it has admissible work: through this window, and
        # through the next one too when that one is already admissible (not lag-blocked)
        busy_until = s + W[j]
        if k > 0 and j + 1 < n_iter:
            busy_until = np.where(V[j + 1 - k] <= busy_until, busy_until + W[j + 1], busy_until)
        loaded, Lg = ro.loaded[g], ro.length[g]
        x = np.clip((busy_until[inst_o[g]] - start) / loaded, 0.0, Lg)
        fin = start + ro.prefill[g] + x * loaded + (Lg - x) * ro.solo[g]
        np.maximum.at(gen, it_o[g], fin)
        gen[j] = max(gen[j], C[j].max())
        ready = V[j] + train[j]
        arrive = gen[j] + tail[j]
        wait[j] = max(0.0, arrive - ready)
        V[j + 1] = max(ready, arrive) + sync_s
        c_prev = C[j]
    return {"V": V, "C": C, "S": S_ir, "gen": gen, "wait": wait}


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


def _longest_solo(it, P, L, G, cost: CostModel, n_iter: int) -> np.ndarray:
    lat = cost.group_latency(P, L, G)
    out = np.zeros(n_iter)
    np.maximum.at(out, it, lat)
    return out
