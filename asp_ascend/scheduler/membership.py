"""asp's iteration membership (DESIGN 4, 1): which iteration each group of an epoch trains in.

Prompts sorted by predicted length are cut into ``B`` strata (B = global batch) of consecutive
lengths, and every iteration takes one prompt of each stratum, so each iteration's length
distribution is the epoch's quantiles (no curriculum); within a stratum the longest prompt goes to
the iteration with the least predicted work so far, so iterations carry equal work.

The top strata are the exception (``gather_top``, ``scheduler.gather_top``): with lag bound k an
iteration cannot publish before its longest group has finished, and the longest groups of
iterations more than k apart add up (``metrics/floor.publish_floor``). One group of the top stratum
in every iteration gives every iteration a floor from the top of the epoch; the better the
predictions rank the long groups, the more truly long floors that spreads. So the s = gather_top x B
top strata are dealt in predicted-length order instead: the s predicted-longest groups to one
iteration, the next s to another, and so on; each iteration still holds s groups of those strata
(its predicted-length CDF moves by at most s / B against the epoch's) and the strata below
rebalance the work. With predictions that rank the long groups, their floors gather into few
iterations; with predictions that rank nothing, the deal is as good as any other random
membership. docs/scheduler.md, "Two epochs of history: the top strata dealt in order".
"""
from __future__ import annotations

import copy

import numpy as np

from .concentrate import lower_chain


def iteration_sizes(n: int, global_batch: int) -> np.ndarray:
    """Sizes of the iterations of an epoch of ``n`` prompts: all ``global_batch`` except a
    smaller last one holding the remainder (never dropped)."""
    full, rem = divmod(n, global_batch)
    return np.array([global_batch] * full + ([rem] if rem else []), dtype=np.int64)


def gathered_strata(gather_top: float, B: int) -> int:
    """How many top strata ``gather_top`` (the KS an iteration's predicted lengths may move) deals in
    order: floor(gather_top x B); fewer than 2 moves nothing (one stratum is one group an iteration)."""
    s = int(gather_top * B + 1e-9)
    return s if s >= 2 else 0


def stratified_iterations(order: np.ndarray, work: np.ndarray, B: int, rng: np.random.Generator,
                          gather_top: float = 0.0) -> np.ndarray:
    """Iteration of each prompt: one prompt per length stratum per iteration, equal work; the top
    ``gathered_strata(gather_top, B)`` strata dealt in predicted-length order (module docstring).
    ``order``: prompts by descending predicted length."""
    n = order.shape[0]
    n_iter = iteration_sizes(n, B).size
    rem = n % B
    # strata: B groups of consecutive lengths (longest first); the partial last iteration
    # takes `rem` strata spread evenly over the length range.
    takes_last = np.zeros(B, dtype=bool)
    if rem:
        takes_last[np.floor((np.arange(rem) + 0.5) * B / rem).astype(np.int64)] = True
    stratum_size = np.where(takes_last, n_iter, n_iter - (1 if rem else 0))
    if not rem:
        stratum_size[:] = n_iter
    bounds = np.concatenate([[0], np.cumsum(stratum_size)])
    iteration = np.empty(n, dtype=np.int64)
    load = rng.random(n_iter) * 1e-9  # seeded tie-break between equal loads
    full_iters = np.arange(n_iter - (1 if rem else 0))
    all_iters = np.arange(n_iter)
    s = gathered_strata(gather_top, B) if full_iters.size > 1 else 0
    if s:
        # each iteration's count of the top s strata, its slots consecutive in predicted length
        # (full iterations in a seeded order, a partial last one at the end)
        quota = np.full(n_iter, s, dtype=np.int64)
        if rem:
            quota[-1] = int(takes_last[:s].sum())
        dealt = np.concatenate([rng.permutation(full_iters), all_iters[full_iters.size:]])
        top = order[:bounds[s]]
        iteration[top] = np.repeat(dealt, quota[dealt])
        np.add.at(load, iteration[top], work[top])
    for t in range(s, B):
        members = order[bounds[t]:bounds[t + 1]]  # longest first
        eligible = all_iters if takes_last[t] or not rem else full_iters
        target = eligible[np.argsort(load[eligible], kind="stable")]
        iteration[members] = target
        load[target] += work[members]
    if rem:
        # keep the partial iteration last; shuffle the order of the full ones
        perm = np.concatenate([rng.permutation(n_iter - 1), [n_iter - 1]])
    else:
        perm = rng.permutation(n_iter)
    return perm[iteration]


def lightest_floor_first(iteration: np.ndarray, latency: np.ndarray, n_iter: int, partial_last: bool) -> np.ndarray:
    """Swap the iteration whose longest group has the shortest predicted latency into the first
    place (a partial last iteration stays last). The first iteration fills the pipeline: no
    earlier iteration's training overlaps its generation, so its longest group is paid in full,
    while later iterations hide theirs behind the trainer (the stratified iterations all carry
    one group of the top length stratum; which one comes first is otherwise a seeded draw)."""
    full = n_iter - (1 if partial_last else 0)
    if full < 2:
        return iteration
    floor = np.zeros(n_iter)
    np.maximum.at(floor, iteration, latency)
    j = int(np.argmin(floor[:full]))
    if j == 0:
        return iteration
    out = iteration.copy()
    out[iteration == 0], out[iteration == j] = j, 0
    return out


def asp_iterations(by_len, work, B: int, rng: np.random.Generator, *, latency, views, m_mb: int, k: int, cost,
                   n_iter: int, gather_top: float = 0.0) -> np.ndarray:
    """asp's membership before the first iteration's relief: the stratified iterations (the lightest floor
    first), or, with ``gather_top``, the ones whose top strata are dealt in order where their publish
    chain is at least ``MIN_CONCENTRATE_GAIN`` lower in every one of ``views``
    (``concentrate.lower_chain``: on the predictions, and on lengths drawn as the history shows its
    forecasts come true); ``views`` None (nothing known of how the forecasts come true) keeps the
    stratified ones. The chain prices what the deal moves, the iterations' floors: no gain where the
    trainer binds, and none in the draws where the history's longest forecasts were not its longest
    outcomes (gathered, they would only run side by side). ``latency``: each group's predicted mean
    latency alone (which iteration goes first)."""
    partial = by_len.shape[0] % B != 0
    seeded = copy.deepcopy(rng) if gathered_strata(gather_top, B) and views else None
    today = lightest_floor_first(stratified_iterations(by_len, work, B, rng), latency, n_iter, partial)
    if seeded is None:
        return today
    dealt = lightest_floor_first(stratified_iterations(by_len, work, B, seeded, gather_top), latency, n_iter, partial)
    return lower_chain(today, dealt, views, m_mb=m_mb, k=k, cost=cost, n_iter=n_iter)

