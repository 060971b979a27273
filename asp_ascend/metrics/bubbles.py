"""Metric definitions over the event timeline (DESIGN 5; formulas in docs/metrics.md).

Every metric is a ratio of sums over the run window W = [first admission, last sync end].
The simulator, real runs and the planner's analytic estimate all call these functions.

- throughput           = sum(step.tokens) / |W|                      [tokens/s, all devices]
- iteration_time       = diff of sync end times (first from W start)  [s]: mean, p50, p99
- padding_bubble       = sum(padded_tokens) / sum(padded_tokens + tokens)   [token-slots]
- rollout breakdown    : for instance r at time t with n_r(t) running sequences and S = max_num_seqs,
    useful       if n_r(t) >= S/2
    skew_bubble  elif another instance has n > 0 (unfinished work elsewhere)
    lag_blocked  elif some request is admitted later (work remains; waiting for a version)
    other        otherwise (sync, shutdown, no work)
  each summed over instances and divided by R * |W|  (they sum to 1)
- trainer breakdown    : useful = step time * tokens/(tokens+padded), padding = step time * padded/(...),
    sorting_bubble = trainer idle (no step, no sync) while any instance is generating,
    other = the rest (syncs, idle while nothing generates); divided by |W| (they sum to 1)
- queue_occupancy_cv   = time-weighted std / mean of the sample-queue length over W
- policy_lag           = iteration - admission_version per trained sample: max and histogram
- deferred lags        : the same over the samples trained after their planned iteration (carry-over),
                         by admission version and by the version of their newest token
- instance split       : per rollout instance over a window [t0, t1]: samples finished in it, response
                         tokens generated (response_length - resumed_at), token share, busy = time with
                         >= 1 running sequence / (t1 - t0) (and optionally the time with 1 .. few - 1);
                         in the summary over [first sync end, last sync end]
- lower_bound_ratio    = |W| / sum_i LB_i,  LB_i = max(decode work_i / (R * peak),
                          trainer time_i, solo latency of i's longest group / (k + 1))
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


# ----------------------------------------------------------------- primitives

def ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else 0.0


def padding_bubble(tokens: float, padded_tokens: float) -> float:
    """Pad share of micro-batch token slots: padded / (padded + real)."""
    return ratio(padded_tokens, padded_tokens + tokens)


def iteration_time_stats(sync_end_times: Sequence[float], window_start: float = 0.0) -> dict[str, float]:
    t = np.sort(np.asarray(sync_end_times, dtype=float))
    if t.size == 0:
        return {"iteration_time_mean": 0.0, "iteration_time_p50": 0.0, "iteration_time_p99": 0.0}
    d = np.diff(np.concatenate([[window_start], t]))
    return {"iteration_time_mean": float(d.mean()), "iteration_time_p50": float(np.percentile(d, 50)),
            "iteration_time_p99": float(np.percentile(d, 99))}


def time_weighted_cv(times: Sequence[float], values: Sequence[float], t0: float, t1: float) -> float:
    """CV of a step function that takes ``values[j]`` from ``times[j]`` on, over [t0, t1]."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.size == 0 or t1 <= t0:
        return 0.0
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    keep = t < t1
    t, v = t[keep], v[keep]
    if t.size == 0:
        return 0.0
    start = np.clip(t, t0, t1)
    end = np.clip(np.append(t[1:], t1), t0, t1)
    dur = end - start
    total = dur.sum()
    if total <= 0:
        return 0.0
    mean = (v * dur).sum() / total
    var = ((v - mean) ** 2 * dur).sum() / total
    return float(np.sqrt(var) / mean) if mean > 0 else 0.0


def lag_histogram(lags: Sequence[int]) -> dict[str, int]:
    lags = np.asarray(lags, dtype=int)
    if lags.size == 0:
        return {}
    vals, counts = np.unique(lags, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(vals, counts)}


def sum_histograms(hists: Sequence[dict[str, int]]) -> dict[str, int]:
    """The histograms of several runs added bin by bin, bins in ascending numeric order."""
    out: dict[int, int] = {}
    for h in hists:
        for k, n in (h or {}).items():
            out[int(k)] = out.get(int(k), 0) + int(n)
    return {str(k): out[k] for k in sorted(out)}


def deferred_lags(trained_iteration, planned_iteration, admission_version, last_version) -> dict[str, Any]:
    """Carry-over's lag keys (DESIGN 9 e), one entry per trained sample.

    A sample is *deferred* when the iteration that trained it is after its planned one
    (carry-over moved its group later). A group swapped in to fill a deferred group's slot is
    trained *before* its planned iteration: it is not deferred (its lag only shrank) and counts
    under the lossless bound with every other sample.

    - ``deferred_samples``: how many samples are deferred;
    - ``policy_lag_max_lossless``: the largest lag (trained iteration - admission version) of
      the samples not deferred (never above k);
    - ``deferred_lag_hist``: the deferred samples' lag by admission version (<= k + S);
    - ``deferred_token_lag_hist``: their lag by the version behind their newest token
      (trained iteration - ``last_version``).
    """
    it = np.asarray(trained_iteration, dtype=np.int64)
    deferred = it > np.asarray(planned_iteration, dtype=np.int64)
    lag_adm = it - np.asarray(admission_version, dtype=np.int64)
    lag_tok = it - np.asarray(last_version, dtype=np.int64)
    return {"deferred_samples": int(deferred.sum()),
            "policy_lag_max_lossless": int(lag_adm[~deferred].max(initial=0)),
            "deferred_lag_hist": lag_histogram(lag_adm[deferred]),
            "deferred_token_lag_hist": lag_histogram(lag_tok[deferred])}


def iteration_lower_bounds(decode_work_s: Sequence[float], train_time_s: Sequence[float],
                           longest_group_latency_s: Sequence[float], lag_bound: int) -> np.ndarray:
    """LB_i = max(decode work_i / (R * peak) [given in s], trainer time_i, latency_i / (k+1))."""
    a = np.asarray(decode_work_s, dtype=float)
    b = np.asarray(train_time_s, dtype=float)
    c = np.asarray(longest_group_latency_s, dtype=float) / (lag_bound + 1)
    return np.maximum(np.maximum(a, b), c)


def lower_bound_ratio(run_time: float, lower_bounds: Sequence[float]) -> float:
    return ratio(run_time, float(np.sum(lower_bounds)))


# ----------------------------------------------------------------- intervals

def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where s exceeds the running max end of all previous intervals
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    block_id = np.cumsum(new) - 1
    block_start = s[new]
    block_end = np.zeros(block_start.size)
    np.maximum.at(block_end, block_id, e)
    return float((block_end - block_start).sum())


def rollout_breakdown(instance: np.ndarray, t_admit: np.ndarray, t_finish: np.ndarray, num_instances: int,
                      max_num_seqs: int, t0: float, t1: float) -> dict[str, float]:
    """Classify every instance-second of [t0, t1] (see module doc). Fractions sum to 1."""
    out = {"useful": 0.0, "skew_bubble": 0.0, "lag_blocked": 0.0, "other": 0.0}
    total = num_instances * (t1 - t0)
    if total <= 0 or t_admit.size == 0:
        out["other"] = 1.0
        return out
    grid = np.unique(np.clip(np.concatenate([t_admit, t_finish, [t0, t1]]), t0, t1))
    dur = np.diff(grid)  # segment j = [grid[j], grid[j+1])
    ia = np.searchsorted(grid, np.clip(t_admit, t0, t1))
    iff = np.searchsorted(grid, np.clip(t_finish, t0, t1))
    m = grid.size

    def occupancy(mask):
        delta = np.bincount(ia[mask], minlength=m + 1)[:m].astype(np.int64)
        delta -= np.bincount(iff[mask], minlength=m + 1)[:m]
        return np.cumsum(delta)[:-1]  # per segment

    busy_count = np.zeros(m - 1, dtype=np.int64)
    per_inst = []
    for r in range(num_instances):
        mask = instance == r
        occ = occupancy(mask)
        per_inst.append(mask)
        busy_count += occ > 0
    # work remains (some admission at or after the segment start)
    last_admit = np.max(t_admit)
    work_remains = grid[:-1] < last_admit
    half = max_num_seqs / 2.0
    for r in range(num_instances):
        occ = occupancy(per_inst[r])
        full = occ >= half
        others = (busy_count - (occ > 0)) > 0
        skew = ~full & others
        lag = ~full & ~others & work_remains
        out["useful"] += float(dur[full].sum())
        out["skew_bubble"] += float(dur[skew].sum())
        out["lag_blocked"] += float(dur[lag].sum())
    out["other"] = total - out["useful"] - out["skew_bubble"] - out["lag_blocked"]
    return {k: max(0.0, v / total) for k, v in out.items()}


def trainer_breakdown(step_start: np.ndarray, step_end: np.ndarray, step_tokens: np.ndarray,
                      step_padded: np.ndarray, sync_start: np.ndarray, sync_end: np.ndarray,
                      gen_start: np.ndarray, gen_end: np.ndarray, t0: float, t1: float) -> dict[str, float]:
    """Classify trainer time of [t0, t1]: useful, padding, sorting_bubble, other (sum to 1)."""
    W = t1 - t0
    if W <= 0:
        return {"useful": 0.0, "padding": 0.0, "sorting_bubble": 0.0, "other": 1.0}
    dur = np.clip(step_end, t0, t1) - np.clip(step_start, t0, t1)
    slots = step_tokens + step_padded
    pad_frac = np.divide(step_padded, slots, out=np.zeros_like(dur, dtype=float), where=slots > 0)
    padding = float((dur * pad_frac).sum())
    useful = float(dur.sum()) - padding
    # busy = union of steps and syncs; generating = union of request intervals
    bs = np.concatenate([step_start, sync_start]).astype(float)
    be = np.concatenate([step_end, sync_end]).astype(float)
    gs, ge = np.clip(gen_start, t0, t1), np.clip(gen_end, t0, t1)
    gen_union = _union_length(gs, ge)
    # idle-while-generating = |gen| - |gen ∩ busy| ; |A ∩ B| = |A| + |B| - |A ∪ B|
    bs_c, be_c = np.clip(bs, t0, t1), np.clip(be, t0, t1)
    busy_union = _union_length(bs_c, be_c)
    both = _union_length(np.concatenate([gs, bs_c]), np.concatenate([ge, be_c]))
    inter = gen_union + busy_union - both
    sorting = max(0.0, gen_union - inter)
    other = max(0.0, W - useful - padding - sorting)
    return {"useful": useful / W, "padding": padding / W, "sorting_bubble": sorting / W, "other": other / W}


def instance_split(timeline, *, num_instances: int, t0: float | None = None, t1: float | None = None,
                   few: int | None = None) -> dict[str, Any]:
    """Per rollout instance over [t0, t1] (default: the run window W of :func:`summarize`): whether
    the instances shared the work evenly.

    A request occupies its instance from ``t_admit`` to ``t_finish``. Per instance r (0 ..
    ``num_instances`` - 1, plus any other instance the requests name):

    - ``samples``: requests on r finishing in [t0, t1];
    - ``tokens``: their response tokens generated on r (``response_length - resumed_at``: a sample
      resumed from a failed instance's tokens counts only those drawn here); ``token_share`` =
      tokens / all instances' tokens;
    - ``busy_s``: seconds of [t0, t1] with at least one request on r; ``busy`` = busy_s / (t1 - t0);
    - with ``few``: ``few_s`` / ``few``, the seconds (share) with 1 .. few - 1 requests on r (at a tie
      a finish counts before an admission).

    Returns ``{"window_s": t1 - t0, "instances": [per-instance dicts, by instance]}``; the sums
    (samples, tokens, busy_s, few_s, window_s) add over runs (:func:`combine_instance_splits`).
    """
    req = timeline.frame("request")
    if req.empty:
        raise ValueError("timeline has no request events: nothing was generated")
    ta, tf = req["t_admit"].to_numpy(float), req["t_finish"].to_numpy(float)
    if t0 is None or t1 is None:
        syncs = timeline.frame("sync")
        t0 = float(ta.min()) if t0 is None else t0
        t1 = (float(syncs["t_end"].max()) if not syncs.empty else float(tf.max())) if t1 is None else t1
    if t1 < t0:
        raise ValueError(f"instance_split: window end t1={t1} is before its start t0={t0}; pass t0 <= t1")
    inst = req["instance"].to_numpy(int)
    resumed = req["resumed_at"].fillna(0).to_numpy(float) if "resumed_at" in req else np.zeros(len(req))
    gen = req["response_length"].to_numpy(float) - resumed
    done = (tf >= t0) & (tf <= t1)
    by_inst = np.argsort(inst, kind="stable")     # one sort, then each instance's requests are a slice
    names, first = np.unique(inst[by_inst], return_index=True)
    bounds = dict(zip(names.tolist(), zip(first.tolist(), [*first[1:].tolist(), inst.size])))
    rows = []
    for r in sorted(set(range(num_instances)) | set(bounds)):
        lo, hi = bounds.get(r, (0, 0))
        m = by_inst[lo:hi]
        row = {"instance": r, "samples": int(done[m].sum()), "tokens": int(gen[m][done[m]].sum())}
        ts = np.concatenate([ta[m], tf[m], [t0, t1]])
        dn = np.concatenate([np.ones(m.size), -np.ones(m.size), [0, 0]])
        order = np.lexsort((dn, ts))                  # at a tie, a finish before an admission
        ts, n = ts[order], np.cumsum(dn[order])[:-1]  # n: requests running over [ts[j], ts[j + 1])
        inside = (ts[:-1] >= t0) & (ts[1:] <= t1)
        seg = np.where(inside, np.diff(ts), 0.0)
        row["busy_s"] = float(seg[n > 0].sum())
        if few is not None:
            row["few_s"] = float(seg[(n > 0) & (n < few)].sum())
        rows.append(row)
    return _instance_fractions({"window_s": float(t1 - t0), "instances": rows})


def instance_split_entry(timeline, *, num_instances: int) -> dict[str, Any] | None:
    """summary.json's ``instance_split``: :func:`instance_split` from the first weight sync's end to the
    last's (iteration 0, the pipeline fill, left out, as the benchmarks print it), per instance only
    ``tokens``, ``token_share`` and ``busy``; None with fewer than two syncs (no such window)."""
    syncs = timeline.frame("sync")
    if len(syncs) < 2:
        return None
    t_end = np.sort(syncs["t_end"].to_numpy(float))
    s = instance_split(timeline, num_instances=num_instances, t0=float(t_end[0]), t1=float(t_end[-1]))
    return {"window_s": s["window_s"],
            "instances": [{k: r[k] for k in ("instance", "tokens", "token_share", "busy")} for r in s["instances"]]}


def combine_instance_splits(splits: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' :func:`instance_split` as one: samples, tokens and seconds summed per instance
    (windows too), the shares and fractions recomputed from the sums."""
    if not splits:
        raise ValueError("combine_instance_splits: no split to combine")
    keys = ("samples", "tokens", "busy_s", "few_s")
    rows: dict[int, dict[str, Any]] = {}
    for s in splits:
        for row in s["instances"]:
            acc = rows.setdefault(row["instance"], {"instance": row["instance"]})
            for k in keys:
                if k in row:
                    acc[k] = acc.get(k, 0) + row[k]
    return _instance_fractions({"window_s": float(sum(s["window_s"] for s in splits)),
                                "instances": [rows[r] for r in sorted(rows)]})


def _instance_fractions(split: dict[str, Any]) -> dict[str, Any]:
    total = sum(r["tokens"] for r in split["instances"])
    for r in split["instances"]:
        r["token_share"] = ratio(r["tokens"], total)
        r["busy"] = ratio(r["busy_s"], split["window_s"])
        if "few_s" in r:
            r["few"] = ratio(r["few_s"], split["window_s"])
    return split


# ----------------------------------------------------------------- one call

def summarize(timeline, *, num_instances: int, max_num_seqs: int, lag_bound: int,
              lower_bounds: Sequence[float] | None = None) -> dict[str, Any]:
    """The DESIGN 6 summary entry of one run from its timeline (simulated or real)."""
    req = timeline.frame("request")
    steps = timeline.frame("step")
    syncs = timeline.frame("sync")
    queue = timeline.frame("queue")
    if req.empty:
        raise ValueError("timeline has no request events: nothing was generated")
    t0 = float(req["t_admit"].min())
    t1 = float(syncs["t_end"].max()) if not syncs.empty else float(
        max(req["t_finish"].max(), steps["t_end"].max() if not steps.empty else 0.0))
    W = max(t1 - t0, 1e-12)
    tokens = float(steps["tokens"].sum()) if not steps.empty else 0.0
    padded = float(steps["padded_tokens"].sum()) if not steps.empty else 0.0
    it = iteration_time_stats(syncs["t_end"].to_numpy() if not syncs.empty else [], t0)
    rb = rollout_breakdown(req["instance"].to_numpy(), req["t_admit"].to_numpy(float), req["t_finish"].to_numpy(float),
                           num_instances, max_num_seqs, t0, t1)
    empty = np.zeros(0)
    tb = trainer_breakdown(
        steps["t_start"].to_numpy(float) if not steps.empty else empty,
        steps["t_end"].to_numpy(float) if not steps.empty else empty,
        steps["tokens"].to_numpy(float) if not steps.empty else empty,
        steps["padded_tokens"].to_numpy(float) if not steps.empty else empty,
        syncs["t_start"].to_numpy(float) if not syncs.empty else empty,
        syncs["t_end"].to_numpy(float) if not syncs.empty else empty,
        req["t_admit"].to_numpy(float), req["t_finish"].to_numpy(float), t0, t1)
    lags = (req["iteration"] - req["admission_version"]).to_numpy()
    qcv = time_weighted_cv(queue["t"], queue["size"], t0, t1) if not queue.empty else 0.0
    out = {
        "throughput": tokens / W,
        **it,
        "padding_bubble": padding_bubble(tokens, padded),
        "skew_bubble": rb["skew_bubble"],
        "sorting_bubble": tb["sorting_bubble"],
        "lower_bound_ratio": lower_bound_ratio(W, lower_bounds) if lower_bounds is not None else None,
        "policy_lag_max": int(lags.max()) if lags.size else 0,
        "queue_occupancy_cv": qcv,
        "policy_lag_hist": lag_histogram(lags),
        "rollout_breakdown": rb,
        "trainer_breakdown": tb,
        "run_time_s": W,
        "iterations": int(len(syncs)),
        "samples": int(len(req)),
        "lag_bound": lag_bound,
        "instance_split": instance_split_entry(timeline, num_instances=num_instances),
    }
    return out
