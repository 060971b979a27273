"""Fit the cost model's coefficients from a run's ``timeline.jsonl`` (``asp simulate --calibrate``).

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

fitted by non-negative least squares. Plain least squares on purpose: the simulator needs the
*mean* step time, and on a shared machine the noise is one-sided (other work only stretches steps),
so a robust fit (Huber, medians) describes the typical step and under-predicts the run (by 10-15 %
on the CPU quickstart). The structure, not the estimator, keeps queueing out of the fit. Intervals with nothing running through them (the engine may have been idle) and
intervals overlapping a weight sync (the engine is paused) are left out. Prefill is thus the
marginal cost of prompt tokens inside a step, not the first-token latency, which also holds the
wait for the running step to end. When fewer than 8 intervals can be reconstructed the fit falls
back to per-request mean step times (:func:`decode_regressors`).

**Trainer and sync.** Optimizer-step duration on (token slots, 1), non-negative least squares;
sync: mean duration.

**Runtime overheads.** A real runtime loses time between the events the cost model times; the
simulator models three of them (:class:`~asp_ascend.sim.engine.TrainerSpec`), each measured from
the timeline as the mean of its own gaps (the mean, since they add up into the mean iteration
time; their distributions are long-tailed on a loaded machine):

- ``step_latency_s``: an optimizer step starts this long after both its mini-batch is generated
  and the trainer is free (result collection, rewards, the call to the trainer), measured on the
  steps whose data arrived while the trainer was idle;
- ``publish_s``: the trainer's own time per iteration boundary (publishing the weights plus the
  driver's per-iteration bookkeeping; the instances may still be loading the weights when the
  trainer goes on): the gap between an iteration's last step and the next step when the data was
  already there, minus ``step_latency_s``;
- ``admit_latency_s``: from the end of an instance's sync to its first admission of an iteration
  that this version made admissible (lag-bound admissions), pooled with the gaps from a group's
  finish to the next admission on its instance while the instance held its most groups
  (slot-bound admissions).

:func:`replay` simulates the run's own jobs (its prompts, response lengths, iterations,
mini-batches, instances and admission order) with a fit, and :func:`compare_phases` sets the
measured and simulated per-iteration phases side by side.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..metrics.timeline import Timeline

MIN_INTERVALS = 8


def _nnls_small(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
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


def _fit_total(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, rescaled so that the fitted durations sum to the measured ones
    (a no-op when the fit is interior with a constant column; otherwise the clamp to >= 0 would
    bias the total, which is what the simulator has to reproduce)."""
    coef = _nnls_small(X, y, np.ones(len(y)))
    tot = float(np.sum(X @ coef))
    return coef * (float(np.sum(y)) / tot) if tot > 0 else coef


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    return 1 - float(np.sum((y - pred) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-30)


# --------------------------------------------------------------------------- decode: step reconstruction
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


def step_intervals(req: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Per instance, the intervals between consecutive observed step boundaries (module doc).

    Columns: instance, t0, t1, y (duration), k (steps, NaN when unknown), N (sum of running
    counts over the steps), C (sum of contexts), P (prompt tokens prefilled), n_through (sequences
    running through the interval). Returns (intervals, contradictory equations).
    """
    rows, conflicts = [], 0
    for inst, g in req.groupby("instance", sort=True):
        t1 = g["t_first_token"].to_numpy(float)
        t2 = g["t_finish"].to_numpy(float)
        ok = (t1 >= 0) & (t2 >= t1) & (g["response_length"].to_numpy() >= 1)
        t1, t2 = t1[ok], t2[ok]
        if t1.size == 0:
            continue
        L = g["response_length"].to_numpy(np.int64)[ok]
        p = g["prompt_length"].to_numpy(float)[ok]
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
        new_p = np.bincount(i1, weights=p, minlength=m)[j]
        qsum = (S[j - 1] + 1 + S[j]) * k / 2.0
        kk = np.where(known, k, np.nan)
        rows.append(pd.DataFrame({
            "instance": inst, "t0": b[j - 1], "t1": b[j], "y": b[j] - b[j - 1], "k": kk,
            "N": kk * n_thr + new_n, "C": kk * b_thr + n_thr * qsum + new_p + new_n, "P": new_p,
            "n_through": n_thr}))
    cols = ["instance", "t0", "t1", "y", "k", "N", "C", "P", "n_through"]
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


def _fit_decode_steps(req: pd.DataFrame, syncs: pd.DataFrame) -> dict | None:
    d, conflicts = step_intervals(req)
    if d.empty:
        return None
    use = d["k"].notna() & (d["n_through"] > 0)
    t0, t1 = d["t0"].to_numpy(float), d["t1"].to_numpy(float)
    for s0, s1 in zip(syncs.get("t_start", []), syncs.get("t_end", [])):
        use &= ~((t0 < s1) & (t1 > s0))
    u = d[use]
    if len(u) < MIN_INTERVALS:
        return None
    X = u[["k", "C", "N", "P"]].to_numpy(float)
    y = u["y"].to_numpy(float)
    a, b, c, pf = _fit_total(X, y)
    per_step = y / u["k"].to_numpy(float)
    pred = X @ np.array([a, b, c, pf]) / u["k"].to_numpy(float)
    return {"decode_a": float(a), "decode_b": float(b), "decode_c": float(c), "prefill_per_token": float(pf),
            "decode_r2": _r2(per_step, pred), "decode_rows": int(len(u)), "decode_method": "steps",
            "step_conflicts": int(conflicts), "step_intervals": int(len(d))}


def _fit_decode_requests(req: pd.DataFrame) -> dict:
    d = decode_regressors(req)
    if len(d) < 3:
        raise DataError(f"only {len(d)} request(s) with 2+ tokens in the timeline: too few to fit the decode model")
    X = np.column_stack([np.ones(len(d)), d["C"].to_numpy(float), d["n"].to_numpy(float)])
    a, b, c = _nnls_small(X, d["y"].to_numpy(float), d["w"].to_numpy(float))
    y = d["y"].to_numpy(float)
    fit = {"decode_a": float(a), "decode_b": float(b), "decode_c": float(c),
           "decode_r2": _r2(y, X @ np.array([a, b, c])), "decode_rows": int(len(d)), "decode_method": "requests"}
    # prefill: lower envelope of first-token latency minus one step, per prompt token
    first = (req["t_first_token"] - req["t_admit"]).to_numpy(float)
    pl = req["prompt_length"].to_numpy(float)
    pf = (first - (a + b * (pl + 1) + c)) / np.maximum(pl, 1)
    pf = pf[np.isfinite(pf) & (req["t_first_token"].to_numpy(float) >= 0)]
    fit["prefill_per_token"] = float(max(0.0, np.percentile(pf, 1))) if pf.size else None
    return fit


# --------------------------------------------------------------------------- overheads
def _group_ready(req: pd.DataFrame) -> pd.Series:
    return req.groupby(["epoch", "prompt_id"])["t_finish"].max()


def fit_overheads(tl: Timeline) -> dict:
    """``step_latency_s``, ``publish_s``, ``admit_latency_s`` (module doc); None where unmeasurable."""
    req, steps, syncs = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    out = {"step_latency_s": None, "publish_s": None, "admit_latency_s": None}
    if not steps.empty and "samples" in steps and len(steps) >= 2:
        fin = _group_ready(req)
        ready = []
        for smp in steps["samples"]:
            keys = {(int(e), str(p)) for e, p, _ in smp} if isinstance(smp, (list, tuple)) else set()
            vals = [fin.get(k, np.nan) for k in keys]
            ready.append(max(vals) if vals and not np.isnan(vals).all() else np.nan)
        st = steps.assign(ready=np.asarray(ready, float)).sort_values("t_start").reset_index(drop=True)
        prev_end = st["t_end"].shift(1).to_numpy(float)
        start, rdy = st["t_start"].to_numpy(float), st["ready"].to_numpy(float)
        first_of_it = (st["iteration"] != st["iteration"].shift(1)).to_numpy()
        data_bound = np.isfinite(rdy) & (rdy > prev_end) & (start >= rdy)
        # first step of the run: prev_end is NaN, count it as data-bound
        data_bound |= np.isfinite(rdy) & np.isnan(prev_end) & (start >= rdy)
        if data_bound.sum() >= 1:
            out["step_latency_s"] = float(np.mean(start[data_bound] - rdy[data_bound]))
        trainer_bound = np.isfinite(rdy) & np.isfinite(prev_end) & (rdy <= prev_end) & first_of_it & (start >= prev_end)
        if trainer_bound.sum() >= 1:
            gap = float(np.mean(start[trainer_bound] - prev_end[trainer_bound]))
            out["publish_s"] = float(max(0.0, gap - (out["step_latency_s"] or 0.0)))
    gaps = _admit_gaps(req, syncs)
    if gaps:
        out["admit_latency_s"] = float(np.mean(gaps))
    return out


def _admit_gaps(req: pd.DataFrame, syncs: pd.DataFrame) -> list:
    """Admission latencies, per instance: (1) group finish -> next admission, when the instance
    held its most groups ever (the finish freed the slot the admission waited for) and the
    admitted group was admissible with the version the instance held at the finish; (2) sync
    end -> first admission of the iteration that version made admissible, when the instance
    had a free slot at the sync end."""
    if req.empty:
        return []
    lag = int((req["iteration"] - req["admission_version"]).max())
    v0 = int(req["admission_version"].min())
    g = req.groupby(["epoch", "prompt_id"]).agg(inst=("instance", "first"), ta=("t_admit", "min"),
                                                tf=("t_finish", "max"), it=("iteration", "first"))
    if syncs.empty:
        ends, vers = np.zeros(0), np.zeros(0, dtype=np.int64)
    else:
        sy = syncs.sort_values("t_end")
        ends, vers = sy["t_end"].to_numpy(float), np.maximum.accumulate(sy["version"].to_numpy(np.int64))
    gaps = []
    for _, x in g.groupby("inst"):
        x = x.sort_values("ta")
        ta, it = x["ta"].to_numpy(float), x["it"].to_numpy(np.int64)
        tf = np.sort(x["tf"].to_numpy(float))

        def inflight(t):   # groups admitted before t and not finished before t
            return np.searchsorted(ta, t, side="left") - np.searchsorted(tf, t, side="left")

        most = int(inflight(tf).max())
        # (1) slot-bound admissions
        nxt = np.searchsorted(ta, tf, side="right")
        k_ver = np.searchsorted(ends, tf, side="right") - 1
        held = np.where(k_ver >= 0, vers[np.maximum(k_ver, 0)] if vers.size else v0, v0)
        for c, k, full, v in zip(tf, nxt, inflight(tf) == most, held):
            if full and k < ta.size and it[k] <= v + lag:
                gaps.append(float(ta[k] - c))
        # (2) version-bound admissions
        free = inflight(ends) < most
        for te, v, ok in zip(ends, vers, free):
            k = np.flatnonzero(it == v + lag)
            if ok and k.size and ta[k[0]] >= te:
                gaps.append(float(ta[k[0]] - te))
    return gaps


# --------------------------------------------------------------------------- the fit
def fit_timeline(tl: Timeline) -> dict:
    """Fitted coefficients (floats; None where the timeline has no data) and fit quality."""
    req = tl.frame("request")
    if req.empty:
        raise DataError("the timeline has no request events: nothing to calibrate from")
    syncs = tl.frame("sync")
    fit = _fit_decode_steps(req, syncs) or _fit_decode_requests(req)
    steps = tl.frame("step")
    if not steps.empty and len(steps) >= 2:
        dur = (steps["t_end"] - steps["t_start"]).to_numpy(float)
        slots = (steps["tokens"] + steps["padded_tokens"]).to_numpy(float)
        coef = _fit_total(np.column_stack([slots, np.ones_like(slots)]), dur)
        fit["train_per_token"], fit["train_per_step"] = float(coef[0]), float(coef[1])
    else:
        fit["train_per_token"] = fit["train_per_step"] = None
    fit["sync_s"] = float((syncs["t_end"] - syncs["t_start"]).mean()) if not syncs.empty else None
    fit.update(fit_overheads(tl))
    return fit


def calibrate_run(run_dir: str | Path) -> dict:
    """Read ``RUN_DIR/timeline.jsonl`` and fit the cost model."""
    path = Path(run_dir) / "timeline.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: --calibrate needs the run directory of a finished `asp train` "
                        "run (it writes timeline.jsonl)")
    fit = fit_timeline(Timeline.read_jsonl(path))
    fit["source"] = str(path)
    return fit


# --------------------------------------------------------------------------- replay + comparison
def replay_jobs(tl: Timeline):
    """The run's own jobs as :class:`~asp_ascend.sim.engine.SimJobs`: one row per prompt group with
    its iteration (from 0), mini-batch (from the step events), instance, response lengths, and
    the order the run admitted them in as ``dispatch_rank``."""
    from .engine import SimJobs

    req = tl.frame("request")
    steps = tl.frame("step")
    mb: dict = {}
    pos: dict = {}
    if not steps.empty and "samples" in steps:
        for m, smp in zip(steps["mini_batch"].astype(int), steps["samples"]):
            for e, p, _ in smp:
                mb[(int(e), str(p))] = m
                pos.setdefault((int(e), str(p)), len(pos))
    req = req.assign(prompt_id=req["prompt_id"].astype(str)).sort_values(["epoch", "prompt_id", "sample"])
    groups = req.groupby(["epoch", "prompt_id"], sort=False)
    sizes = groups.size()
    if sizes.nunique() != 1:
        raise DataError("the timeline's prompt groups have different sizes; replay needs complete groups")
    first = groups.first()
    resp = req["response_length"].to_numpy(np.int64).reshape(len(first), int(sizes.iloc[0]))
    keys = list(first.index)
    it = first["iteration"].to_numpy(np.int64).copy()
    it -= it.min()
    rank = first["t_admit"].rank(method="first").to_numpy(np.int64) - 1
    return SimJobs(epoch=np.array([k[0] for k in keys], np.int64),
                   prompt_id=np.array([k[1] for k in keys], dtype=object), iteration=it,
                   mini_batch=np.array([mb.get((int(k[0]), k[1]), 0) for k in keys], np.int64),
                   instance=first["instance"].to_numpy(np.int64), dispatch_rank=rank,
                   prompt_length=first["prompt_length"].to_numpy(np.int64), resp=resp,
                   train_rank=np.array([pos.get((int(k[0]), k[1]), len(pos) + x) for x, k in enumerate(keys)],
                                       np.int64))


def replay(tl: Timeline, fit: dict, *, max_num_seqs: int, lag_bound: int, sync_mode: bool = False,
           micro_batch_size: int = 8, micro_batching: str = "padded", num_instances: int | None = None,
           overheads: bool = True, kv_capacity: int = 0, group_slots: bool = True):
    """Simulate the run's own jobs (:func:`replay_jobs`) with the fitted coefficients, under the
    runtime's admission rule (``group_slots``: at most ``max_num_seqs // G`` groups in flight per
    instance, a group holding its slot until its last sample finishes)."""
    from ..scheduler.cost import CostModel
    from ..scheduler.execution import ExecutionSettings
    from .engine import Engine, TrainerSpec

    jobs = replay_jobs(tl)
    cm = CostModel(decode_a=fit["decode_a"], decode_b=fit["decode_b"], decode_c=fit["decode_c"],
                   prefill_per_token=fit.get("prefill_per_token") or 0.0)
    o = (lambda k: (fit.get(k) or 0.0) if overheads else 0.0)
    tr = TrainerSpec(fit.get("train_per_token") or 0.0, fit.get("train_per_step") or 0.0, fit.get("sync_s") or 0.0,
                     micro_batch_size, micro_batching,
                     publish_s=fit.get("publish_s") if overheads else None,
                     step_latency_s=o("step_latency_s"), admit_latency_s=o("admit_latency_s"))
    R = max(num_instances or 0, int(jobs.instance.max()) + 1)  # the configured count, or the timeline's if more
    # the run's own placement and admission order: per-instance queues
    settings = ExecutionSettings(policy="asp", lag_bound=0 if sync_mode else lag_bound, sync_mode=sync_mode,
                                 group_size=jobs.group_size, max_num_seqs=max_num_seqs, num_instances=R)
    eng = Engine(jobs, settings, cost=cm, kv_capacity=kv_capacity, trainer=tr, stream_train=not sync_mode,
                 group_slots=group_slots)
    return eng.run()


PHASES = {
    "iteration_time": "time between consecutive weight syncs",
    "generation": "first admission to last finish of the iteration's requests",
    "first_token": "mean first-token latency of a request",
    "train": "first step start to last step end of the iteration",
    "sync": "weight-sync duration",
    "wait": "previous sync end to the iteration's first step start",
}


def iteration_phases(tl: Timeline) -> pd.DataFrame:
    """Per iteration (from 0): the phases of :data:`PHASES`, seconds."""
    req, st, sy = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    it = req.groupby("iteration").agg(adm0=("t_admit", "min"), fin1=("t_finish", "max"))
    ftl = (req["t_first_token"] - req["t_admit"]).groupby(req["iteration"]).mean()
    base = int(it.index.min())
    stp = st.groupby("iteration").agg(s0=("t_start", "min"), s1=("t_end", "max"))
    syn = sy.assign(iteration=sy["version"] - 1).groupby("iteration").agg(y0=("t_start", "min"), y1=("t_end", "max"))
    df = it.join(stp).join(syn).join(ftl.rename("ftl"))
    df.index = df.index - base
    return pd.DataFrame({"iteration_time": df["y1"].diff(), "generation": df["fin1"] - df["adm0"],
                         "first_token": df["ftl"], "train": df["s1"] - df["s0"], "sync": df["y1"] - df["y0"],
                         "wait": df["s0"] - df["y1"].shift(1)})


def compare_phases(measured: Timeline, simulated: Timeline) -> pd.DataFrame:
    """Mean of each phase, measured vs simulated, with the error in % of the measured value.

    ``iteration_time`` is the mean time between consecutive syncs (the run's first iteration,
    which has no previous sync, is not part of it)."""
    m, s = iteration_phases(measured).mean(), iteration_phases(simulated).mean()
    out = pd.DataFrame({"measured_s": m, "simulated_s": s})
    out["error_pct"] = 100 * (out["simulated_s"] - out["measured_s"]) / out["measured_s"].where(out["measured_s"] != 0)
    return out.loc[list(PHASES)]


def run_settings(run_dir: str | Path) -> dict:
    """The replay settings of a run, from its resolved ``config.yaml`` through the schema (the
    schema's defaults when the file is absent; the instance count is then the timeline's)."""
    from ..config import lag_bound_of, run_config

    cfg = run_config(run_dir)
    has_file = (Path(run_dir) / "config.yaml").is_file()
    return {"max_num_seqs": cfg.rollout.max_num_seqs, "lag_bound": lag_bound_of(cfg),
            "sync_mode": cfg.pipeline.mode == "sync", "micro_batch_size": cfg.train.micro_batch_size,
            "num_instances": cfg.rollout.num_instances if has_file else None}


def replay_report(run_dir: str | Path, fit: dict | None = None) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(fit, phases with the overheads, phases without them) for a finished run directory."""
    tl = Timeline.read_jsonl(Path(run_dir) / "timeline.jsonl")
    fit = fit or fit_timeline(tl)
    kw = run_settings(run_dir)
    with_o = compare_phases(tl, replay(tl, fit, **kw))
    without = compare_phases(tl, replay(tl, fit, overheads=False, **kw))
    return fit, with_o, without


def format_phases(df: pd.DataFrame) -> list[str]:
    lines = [f"  {'phase (mean per iteration)':30s} {'measured':>10s} {'simulated':>10s} {'error':>8s}"]
    for name, r in df.iterrows():
        err = "" if pd.isna(r["error_pct"]) else f"{r['error_pct']:+7.1f}%"
        lines.append(f"  {name:30s} {r['measured_s']:9.4f}s {r['simulated_s']:9.4f}s {err:>8s}")
    return lines
