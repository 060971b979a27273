"""Response-length predictors: what the planner believes about each prompt.

A prediction is the expected per-sample response length of a prompt's group.

- ``mean``      mean of all of the prompt's history samples
- ``ema``       per-epoch means, exponentially weighted (newest epoch weight ``alpha``)
- ``quantile``  the ``q`` quantile of the prompt's history samples
- ``regression`` log(response) ~ a + b * log(prompt_length), fitted on the whole history
- prior for unseen prompts: ``global_mean`` (history-wide mean) or ``regression``

``evaluate`` gives MAE (tokens) and Spearman rank correlation against the truth; 
``holdout_report`` predicts the last epoch of a history from the earlier ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

METHODS = ("mean", "ema", "quantile", "regression")


def _fit_regression(history: pd.DataFrame) -> tuple[float, float] | None:
    h = history.dropna(subset=["prompt_length"])
    h = h[(h["prompt_length"] > 0) & (h["response_length"] > 0)]
    if len(h) < 2 or h["prompt_length"].nunique() < 2:
        return None
    x = np.log(h["prompt_length"].to_numpy(float))
    y = np.log(h["response_length"].to_numpy(float))
    b, a = np.polyfit(x, y, 1)
    # E[exp(y)] under log-normal residuals
    resid = y - (a + b * x)
    return float(a + resid.var() / 2), float(b)


def predict_lengths(history: pd.DataFrame | None, prompt_ids, prompt_lengths=None, method: str = "mean", *,
                    alpha: float = 0.5, q: float = 0.5, prior: str = "regression",
                    default: float = 256.0) -> np.ndarray:
    """Predicted mean response length for each of ``prompt_ids`` (float array)."""
    if method not in METHODS:
        raise ValueError(f"unknown predictor {method!r}; valid: {', '.join(METHODS)}")
    ids = np.asarray(prompt_ids)
    # integer ids against an integer-keyed history (positions, see history.restrict_to(encode=True))
    # are kept as they are; anything else is compared as text
    encoded = (ids.dtype.kind in "iu" and history is not None and "prompt_id" in history.columns
               and history["prompt_id"].dtype.kind in "iu")
    ids = pd.Index(ids if encoded else ids.astype(object).astype(str))
    n = len(ids)
    plen = None if prompt_lengths is None else np.asarray(prompt_lengths, dtype=float)
    if history is None or history.empty:
        return np.full(n, float(default))

    def regress():  # fitted only when needed (10^7-row histories: seconds)
        reg = _fit_regression(history) if (prior == "regression" or method == "regression") else None
        if reg is None or plen is None:
            return np.full(n, float(history["response_length"].mean()))
        return np.exp(reg[0] + reg[1] * np.log(np.maximum(plen, 1.0)))

    if method == "regression":
        return regress()
    g = history.groupby("prompt_id", sort=False)["response_length"]
    if method == "mean":
        per = g.mean()
    elif method == "quantile":
        per = g.quantile(q)
    else:  # ema over epochs, oldest first
        # ema_t = alpha * x_t + (1 - alpha) * ema_{t-1}, ema_0 = x_0: a weighted sum with
        # weight alpha (1-alpha)^(n-1-r) for epoch rank r > 0 and (1-alpha)^(n-1) for r = 0
        by_epoch = history.groupby(["prompt_id", "epoch"], sort=True)["response_length"].mean().reset_index()
        g_ep = by_epoch.groupby("prompt_id", sort=False)
        r = g_ep.cumcount().to_numpy()
        cnt = g_ep["epoch"].transform("size").to_numpy()
        wts = np.where(r == 0, (1 - alpha) ** (cnt - 1), alpha * (1 - alpha) ** (cnt - 1 - r))
        by_epoch["w"] = wts * by_epoch["response_length"].to_numpy(float)
        per = by_epoch.groupby("prompt_id", sort=False)["w"].sum()
    pred = per.reindex(ids).to_numpy(dtype=float, copy=True)
    unseen = np.isnan(pred)
    if unseen.any():
        fill = regress() if prior == "regression" else np.full(n, float(history["response_length"].mean()))
        pred[unseen] = fill[unseen]
    return pred


def spearman(a, b) -> float:
    a = pd.Series(np.asarray(a, dtype=float))
    b = pd.Series(np.asarray(b, dtype=float))
    if len(a) < 2 or a.nunique() < 2 or b.nunique() < 2:
        return 0.0
    return float(a.rank().corr(b.rank()))


def evaluate(pred, truth) -> dict[str, float]:
    pred = np.asarray(pred, dtype=float)
    truth = np.asarray(truth, dtype=float)
    return {"mae": float(np.mean(np.abs(pred - truth))), "spearman": spearman(pred, truth),
            "mean_truth": float(truth.mean()), "mean_pred": float(pred.mean())}


def holdout_report(history: pd.DataFrame, prompt_lengths: pd.Series | None = None, *,
                   alpha: float = 0.5, q: float = 0.5) -> dict[str, dict[str, float]]:
    """Predict the last epoch's per-prompt mean length from the earlier epochs, per method."""
    epochs = np.sort(history["epoch"].unique())
    if epochs.size < 2:
        return {}
    last = epochs[-1]
    train = history[history["epoch"] < last]
    test = history[history["epoch"] == last].groupby("prompt_id")["response_length"].mean()
    ids = test.index.to_numpy()
    if prompt_lengths is None:
        pl = history.groupby("prompt_id")["prompt_length"].first().reindex(ids).to_numpy(float)
    else:
        pl = prompt_lengths.reindex(ids).to_numpy(float)
    out = {}
    for m in METHODS:
        out[m] = evaluate(predict_lengths(train, ids, pl, m, alpha=alpha, q=q), test.to_numpy(float))
    return out


TOP_SHARE, TOP_SHARE_MIN = 0.1, 8     # prediction_quality's top: the tenth predicted longest, at least 8


@dataclass(frozen=True)
class ForecastRecord:
    """How ``method`` forecast the history's last epoch from the epochs before it, per prompt: the
    forecast, the outcome (that epoch's mean length) and ``prediction_quality`` of the two. The
    planner draws lengths from it (scheduler/concentrate.drawn_from_record): a group forecast at some
    rank of an epoch takes the outcome / forecast ratio of a history prompt forecast at a similar rank,
    so the draws carry what the history shows, e.g. the longest forecasts falling back towards the
    median, and the longest sample of a group against its forecast mean (what an iteration's floor
    is). ``exact`` (the oracle) reads forecast == outcome, longest unknown."""
    forecast: np.ndarray
    outcome: np.ndarray
    quality: float
    longest: np.ndarray | None = None   # that epoch's longest sample per prompt (None: unknown)

    @classmethod
    def exact(cls, lengths) -> "ForecastRecord":
        x = np.asarray(lengths, dtype=float)
        return cls(x, x, 1.0)


def forecast_record(history: pd.DataFrame | None, method: str = "mean", *, alpha: float = 0.5, q: float = 0.5,
                    prior: str = "regression") -> ForecastRecord | None:
    """``method``'s forecast of the history's last epoch from the epochs before it and that epoch's
    per-prompt means, with their ``prediction_quality``; None below two epochs (one epoch shows how a
    group's samples spread, not how a prompt's length persists to the next epoch)."""
    if history is None or history.empty:
        return None
    epochs = np.sort(history["epoch"].unique())
    if epochs.size < 2:
        return None
    last = history[history["epoch"] == epochs[-1]].groupby("prompt_id")["response_length"]
    test = last.mean()
    ids = test.index.to_numpy()
    pl = (history.groupby("prompt_id")["prompt_length"].first().reindex(ids).to_numpy(float)
          if "prompt_length" in history.columns else None)
    pred = predict_lengths(history[history["epoch"] < epochs[-1]], ids, pl, method, alpha=alpha, q=q, prior=prior)
    outcome = test.to_numpy(float)
    return ForecastRecord(pred, outcome, _quality(pred, outcome), last.max().reindex(ids).to_numpy(float))


def _quality(pred: np.ndarray, outcome: np.ndarray) -> float:
    a, b = np.log(np.maximum(pred, 1.0)), np.log(np.maximum(outcome, 1.0))
    if a.size < 2 or a.std() == 0 or b.std() == 0:
        return 0.0
    top = np.argsort(-a, kind="stable")[:max(TOP_SHARE_MIN, int(a.size * TOP_SHARE))]
    excess = a[top].mean() - a.mean()
    kept = (b[top].mean() - b.mean()) / excess if excess > 0 else 1.0
    return float(np.clip(min(np.corrcoef(a, b)[0, 1], kept), 0.0, 1.0))


def prediction_quality(history: pd.DataFrame | None, method: str = "mean", *, alpha: float = 0.5, q: float = 0.5,
                       prior: str = "regression") -> float | None:
    """How well ``method`` predicts a prompt's next epoch, measured on the history itself: the
    correlation of log per-prompt means between the history's last epoch and ``method``'s prediction
    of it from the epochs before, or, if lower, the share of its predicted excess (log length over
    the mean) that the tenth it predicts longest keeps in that epoch (an iteration's floor is its
    longest group, and a heavy tail regresses to the mean most at the top), clipped to [0, 1] (0:
    the predictions rank nothing). None when the
    history has fewer than two epochs: one epoch shows how its samples spread, not how a prompt's
    length persists to the next epoch. With one earlier epoch this measures a one-epoch predictor,
    which the full history's prediction is at least as good as (a pessimistic figure)."""
    rec = forecast_record(history, method, alpha=alpha, q=q, prior=prior)
    return None if rec is None else rec.quality
