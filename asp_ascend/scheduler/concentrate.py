"""``scheduler.concentrate_tail`` (opt-in): gather an epoch's predicted-longest groups into every
P-th iteration where that lowers the predicted publish chain (``metrics/floor.publish_floor``'s,
on predicted figures); the planner (:mod:`.planner`) calls :func:`concentrate_tail` on its
stratified membership. docs/scheduler.md, "Gathering the longest groups"."""
from __future__ import annotations

import numpy as np

from .cost import CostModel


def publish_chain(iteration, lat, busy_tokens, n_mb, cost: CostModel, k: int, n_iter: int) -> float:
    """The last publish ``metrics/floor.publish_floor``'s chain allows on predicted figures: the
    trainer's busy time per iteration (``train_time`` of its predicted tokens and steps, plus the
    sync) and each iteration's predicted-longest group alone plus the sync."""
    busy = cost.train_time(np.bincount(iteration, weights=busy_tokens, minlength=n_iter), n_mb) + cost.sync_s
    floor = np.zeros(n_iter)
    np.maximum.at(floor, iteration, lat)
    V = np.zeros(n_iter + 1)
    for i in range(n_iter):
        V[i + 1] = max(V[i] + busy[i], (V[i - k] if i - k > 0 else 0.0) + floor[i] + cost.sync_s)
    return float(V[-1])


def _rank_within(keys: np.ndarray) -> np.ndarray:
    """Each element's rank among the elements of ``keys`` with its key, in the given order."""
    o = np.argsort(keys, kind="stable")
    ks = keys[o]
    r = np.empty(keys.shape[0], dtype=np.int64)
    r[o] = np.arange(keys.shape[0]) - np.searchsorted(ks, ks, side="left")
    return r


def _round_robin(iters: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``counts[j]`` slots of each ``iters[j]``, ordered round-robin (first slots of all, then the
    second ones, ...)."""
    slot_of = np.repeat(iters, counts)
    within = np.arange(slot_of.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return slot_of[np.lexsort((slot_of, within))]


def _concentrated(iteration, by_len, len_rank, m: int, long_iters: np.ndarray, n_full: int, excess: int):
    """``iteration`` with the m x n_full predicted-longest groups of the full iterations moved into
    ``long_iters`` (as evenly as they divide), each moved group's place taken by the longest group
    not among them of the long iteration it went to; every iteration keeps its count. None when a
    long iteration would have to give up groups it lacks or hold more than ``excess`` of them above
    its m. ``by_len``: groups longest first; ``len_rank``: its inverse."""
    full = by_len[iteration[by_len] < n_full]
    top = full[:m * n_full]
    is_long = np.zeros(n_full, dtype=bool)
    is_long[long_iters] = True
    L = long_iters.size
    have = np.bincount(iteration[top], minlength=n_full)[long_iters]
    want = np.full(L, (m * n_full) // L) + (np.arange(L) < (m * n_full) % L)
    need = want - have
    if (need < 0).any() or want.max() - m > excess:
        return None
    movers = top[~is_long[iteration[top]]]                  # longest first
    # compensators: each long iteration's `need` longest groups outside the top set
    need_of = np.zeros(n_full, dtype=np.int64)
    need_of[long_iters] = need
    rest = full[m * n_full:]
    rest = rest[is_long[iteration[rest]]]
    comp = rest[_rank_within(iteration[rest]) < need_of[iteration[rest]]]
    if comp.size != movers.size:
        return None
    comp = comp[np.argsort(len_rank[comp], kind="stable")]   # longest first
    # the movers go round-robin over the long iterations (the longest spread over them); the
    # iterations they leave, round-robin the same way, take the compensators
    gcount = np.bincount(iteration[movers], minlength=n_full)
    donors = np.flatnonzero(gcount)
    out = iteration.copy()
    out[movers] = _round_robin(long_iters, need)
    out[comp] = _round_robin(donors, gcount[donors])
    return out


MIN_CONCENTRATE_GAIN = 0.01


def concentrate_tail(iteration, by_len, lat, busy_tokens, *, B: int, m_mb: int, k: int, margin: float,
                      cost: CostModel, n_iter: int, partial_last: bool) -> np.ndarray:
    """``scheduler.concentrate_tail``: gather the predicted-longest groups into every P-th iteration
    when that lowers the predicted publish chain (``publish_chain``). With lag bound k, iteration i's
    longest group ties V_{i+1} to V_{i-k}; with one top-stratum group in every iteration each chain
    of k + 1 periods pays a longest group, while with them gathered into every P-th iteration
    (P > k + 1) the chains through the others pay only the next stratum's. m strata (about m x P
    groups per long iteration) move a long iteration's predicted-length CDF by its groups above m,
    / B, kept <= ``margin`` (a short one's by m / B). Tries every (m, P, offset) within the margin, iteration 0 never long, and keeps
    the lowest predicted chain; today's membership unless that is at least ``MIN_CONCENTRATE_GAIN``
    lower. ``lat``: each group's predicted longest sample alone (the floor it sets)."""
    n_full = n_iter - (1 if partial_last else 0)
    counts = np.bincount(iteration, minlength=n_iter)
    n_mb = -(-counts // m_mb)
    today = publish_chain(iteration, lat, busy_tokens, n_mb, cost, k, n_iter)
    best, best_v = iteration, today
    len_rank = np.empty_like(by_len)
    len_rank[by_len] = np.arange(by_len.shape[0])
    for m in range(1, int(margin * B) + 1):
        for P in range(2, n_full + 1):
            if m * (P - 1) > margin * B:
                break
            for o in range(1, min(P, n_full)):
                cand = _concentrated(iteration, by_len, len_rank, m, np.arange(o, n_full, P), n_full,
                                     int(margin * B))
                if cand is None:
                    continue
                v = publish_chain(cand, lat, busy_tokens, n_mb, cost, k, n_iter)
                if v < best_v * (1.0 - 1e-9):
                    best, best_v = cand, v
    # a predicted gain under MIN_CONCENTRATE_GAIN is noise: where many groups reach the response cap
    # the predicted floors are flat and the true longest groups are not the predicted ones
    return best if best_v <= today * (1.0 - MIN_CONCENTRATE_GAIN) else iteration


def drawn_lengths(pred: np.ndarray, quality: float | None, draws: int = 64, seed: int = 0) -> np.ndarray:
    """(draws, groups) lengths drawn around the predictions as good as ``quality`` says: log lengths
    jointly Gaussian with the predicted ones, correlation ``quality`` (None, unknown, counts as 0) and the
    same spread, so each group's draw has mean log ``mu + quality (x - mu)`` and spread
    ``sd sqrt(1 - quality^2)``. 1 gives the predictions back; 0 draws every group alike."""
    x = np.log(np.maximum(np.asarray(pred, dtype=float), 1.0))
    r = min(max(quality or 0.0, 0.0), 1.0)
    eps = np.random.default_rng(seed).standard_normal((draws, x.size))
    return np.exp(x.mean() + r * (x - x.mean()) + np.sqrt(1.0 - r * r) * x.std() * eps)


RECORD_NEIGHBOURS, RECORD_NEIGHBOURS_MIN = 0.02, 8   # drawn_from_record: the history prompts of a similar forecast rank


def iter_drawn_from_record(pred: np.ndarray, record, draws: int = 64, seed: int = 0):
    """``drawn_from_record``'s draws one at a time, (means, longest) each of one draw's groups: a pass
    over the epoch per draw, never (draws, groups) at once (an epoch of a million groups)."""
    x = np.asarray(pred, dtype=float)
    f = np.maximum(np.asarray(record.forecast, dtype=float), 1.0)
    by_f = np.argsort(f, kind="stable")                           # the record by ascending forecast
    ratio = (np.maximum(np.asarray(record.outcome, dtype=float), 1.0) / f)[by_f]
    top = None if record.longest is None else (np.maximum(np.asarray(record.longest, dtype=float), 1.0) / f)[by_f]
    n_h = ratio.size
    K = min(n_h, max(RECORD_NEIGHBOURS_MIN, int(round(RECORD_NEIGHBOURS * n_h))))
    # each group's rank quantile, equal forecasts at their mean rank (an order among them, e.g. the dataset's,
    # would draw their outcomes in that order)
    vals, inv = np.unique(x, return_inverse=True)
    counts = np.bincount(inv)
    mid = (np.cumsum(counts) - counts + (counts - 1) / 2.0) / max(x.size - 1, 1)
    u = mid[inv]
    lo = np.clip(np.round(u * (n_h - 1)).astype(np.int64) - K // 2, 0, n_h - K)
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        pick = lo + rng.integers(0, K, size=x.size)
        yield x * ratio[pick], (None if top is None else x * top[pick])


def drawn_from_record(pred: np.ndarray, record, draws: int = 64, seed: int = 0):
    """(means, longest), each (draws, groups): lengths drawn from the history's own forecasts and
    outcomes (``record``, a ``lengths.predictors.ForecastRecord``). Each group, forecast at rank quantile
    u of ``pred``, takes a history prompt drawn among the ``RECORD_NEIGHBOURS`` (at least
    ``RECORD_NEIGHBOURS_MIN``) whose forecasts rank nearest u in the record: its mean is its forecast x
    that prompt's outcome / forecast, its longest sample its forecast x that prompt's longest sample /
    forecast (None where the record has no longest samples: the caller prices the mean's). Where the
    history's longest forecasts fell back towards the median, the drawn top does too; where it ranked
    well, the draws stay near the predictions; the exact record (the oracle) gives them back."""
    pairs = list(iter_drawn_from_record(pred, record, draws, seed))
    means = np.stack([m for m, _ in pairs])
    return means, (None if record.longest is None else np.stack([L for _, L in pairs]))


def lower_chain(today, other, views, *, m_mb: int, k: int, cost: CostModel, n_iter: int) -> np.ndarray:
    """``other`` (a membership of the same groups, e.g. the dataset order's) where its publish chain
    (``publish_chain``) is at least ``MIN_CONCENTRATE_GAIN`` below ``today``'s in every one of ``views``,
    else ``today`` (``scheduler.membership: auto``, opt-in). A view is a list of (lat, busy_tokens)
    draws (each group's longest sample alone and its tokens): on the predictions (one draw), or lengths
    drawn around them as good as the history says they are (``drawn_lengths``), where the mean gain over
    the draws less two standard errors must reach the margin (a pessimistic view). A stratified membership puts one
    group of the top predicted-length stratum in every iteration: where those groups, not the trainer,
    bound the chain and the predictions rank them well, that is the highest sum of iteration floors any
    membership has, and consecutive prompts, whose iterations gather long groups by chance, publish
    earlier. Where the predictions rank poorly the draws are near random, both memberships alike, and
    ``today`` stays."""
    n_a = -(-np.bincount(today, minlength=n_iter) // m_mb)
    n_b = -(-np.bincount(other, minlength=n_iter) // m_mb)
    for view in views:
        gain = np.array([1.0 - publish_chain(other, lat, busy, n_b, cost, k, n_iter)
                         / publish_chain(today, lat, busy, n_a, cost, k, n_iter) for lat, busy in view])
        se = gain.std(ddof=1) / np.sqrt(gain.size) if gain.size > 1 else 0.0
        if gain.mean() - 2.0 * se < MIN_CONCENTRATE_GAIN:     # the gain's low end must reach the margin
            return today
    return other
