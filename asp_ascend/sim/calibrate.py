"""Fit the cost model's coefficients from a run's ``timeline.jsonl`` (``asp simulate --calibrate``).

Decode (per instance): while sequence s decodes, from its first token to its last, the
instance runs ``L_s - 1`` steps, each ``a + b*C(t) + c*n(t)``. With ``n(t)`` and ``C(t)``
reconstructed from the request events of that instance (a sequence runs from its first
token to its finish; its context grows linearly from prompt + 1 to prompt + L), the mean
step time over s's life is

    (t_finish - t_first_token) / (L_s - 1)  ~=  a + b * mean C  +  c * mean n

(time-averages over s's life, exact integrals of the piecewise-linear reconstruction):
one row per sequence, weighted by ``L_s - 1``, non-negative least squares on (a, b, c).
Prefill: the lower envelope (1st percentile) of ``(t_first_token - t_admit - one step) /
prompt length`` (queueing for a slot only adds to it). Trainer: least squares of step duration on
(token slots, 1). Sync: mean sync duration.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..metrics.timeline import Timeline


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


def decode_regressors(req: pd.DataFrame) -> pd.DataFrame:
    """Per sequence (L >= 2): y = mean step time, mean context C, mean running count n."""
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


def fit_timeline(tl: Timeline) -> dict:
    """Fitted coefficients (floats; None where the timeline has no data) and fit quality."""
    req = tl.frame("request")
    if req.empty:
        raise DataError("the timeline has no request events: nothing to calibrate from")
    d = decode_regressors(req)
    if len(d) < 3:
        raise DataError(f"only {len(d)} request(s) with 2+ tokens in the timeline: too few to fit the decode model")
    X = np.column_stack([np.ones(len(d)), d["C"].to_numpy(float), d["n"].to_numpy(float)])
    a, b, c = _nnls_small(X, d["y"].to_numpy(float), d["w"].to_numpy(float))
    pred = X @ np.array([a, b, c])
    y = d["y"].to_numpy(float)
    r2 = 1 - float(np.sum((y - pred) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-30)
    fit = {"decode_a": float(a), "decode_b": float(b), "decode_c": float(c), "decode_r2": r2,
           "decode_rows": int(len(d))}
    # prefill: lower envelope of first-token latency minus one step, per prompt token
    first = (req["t_first_token"] - req["t_admit"]).to_numpy(float)
    pl = req["prompt_length"].to_numpy(float)
    step1 = a + b * (pl + 1) + c
    pf = (first - step1) / np.maximum(pl, 1)
    pf = pf[np.isfinite(pf) & (req["t_first_token"].to_numpy(float) >= 0)]
    fit["prefill_per_token"] = float(max(0.0, np.percentile(pf, 1))) if pf.size else None
    steps = tl.frame("step")
    if not steps.empty and len(steps) >= 2:
        dur = (steps["t_end"] - steps["t_start"]).to_numpy(float)
        slots = (steps["tokens"] + steps["padded_tokens"]).to_numpy(float)
        coef = _nnls_small(np.column_stack([slots, np.ones_like(slots)]), dur, np.ones_like(dur))
        fit["train_per_token"], fit["train_per_step"] = float(coef[0]), float(coef[1])
    else:
        fit["train_per_token"] = fit["train_per_step"] = None
    syncs = tl.frame("sync")
    fit["sync_s"] = float((syncs["t_end"] - syncs["t_start"]).mean()) if not syncs.empty else None
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
