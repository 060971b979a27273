"""``scheduler.relieve_first``: the first iteration gives its predicted-longest groups to later ones.

With lag bound k, iteration i's longest group must finish between version i - k and version i + 1
(``metrics/floor.publish_floor``): k + 1 trainer periods for i > k, but only i + 1 from the start of
the run for i <= k, and iteration 0's longest group is paid in full, since no training overlaps the
generation before the first step (the trainer can start no earlier than its first groups finish).
The stratified membership (:mod:`.planner`) gives iteration 0 one group of every length stratum, so
its floor is a top-stratum group's, and previous-epoch predictions tell which group of the upper
strata will really be long only roughly. :func:`relieve_first` swaps iteration 0's m
predicted-longest groups with groups of the next strata of other iterations: iteration 0 keeps B
groups and holds none of the epoch's top m strata, each receiving iteration one more top-stratum
group, which its k + 1 periods hide. The fewer upper-strata groups iteration 0 holds, the fewer
chances a misprediction has to set its floor. m / B is what iteration 0's predicted-length CDF moves
(KS), bounded by ``margin``; m is the smallest that reaches the shortest predicted longest sample of
iteration 0 within it, so where the upper strata are predicted alike (groups at the response cap)
nothing moves. The planner relieves the run's first iteration only (a later epoch's first iteration
follows the previous epoch's last one). docs/scheduler.md, "The first iteration's floor".
"""
from __future__ import annotations

import numpy as np


def _swaps(iteration: np.ndarray, by_len: np.ndarray, m: int, n_full: int) -> tuple[np.ndarray, np.ndarray]:
    """(movers, partners) of a relief by m: iteration 0's m predicted-longest groups, and for the
    q-th of them (longest first) the (m + q)-th longest group of full iteration 1 + q mod (n_full - 1)
    (with one group per stratum per iteration: its group of stratum m + q)."""
    it_sorted = iteration[by_len]                      # iterations of the groups, longest first
    first = by_len[it_sorted == 0]
    movers = first[:m]
    q = np.arange(movers.size)
    target = 1 + q % (n_full - 1)
    partners = np.empty(movers.size, dtype=by_len.dtype)
    for j in np.unique(target):
        own = by_len[it_sorted == j]                   # iteration j's groups, longest first
        pos = m + q[target == j]
        if pos.max() >= own.size:
            return movers[:0], partners[:0]
        partners[target == j] = own[pos]
    return movers, partners


def relieve_first(iteration: np.ndarray, by_len: np.ndarray, longest: np.ndarray, *, B: int, margin: float,
                  n_iter: int, partial_last: bool) -> np.ndarray:
    """``iteration`` with iteration 0's m predicted-longest groups swapped with groups of the next
    strata of iterations 1, 2, ... (module docstring), every iteration keeping its count. m <=
    ``margin`` x B is the smallest reaching the shortest predicted longest sample of iteration 0 (the
    largest ``longest`` among its groups: each group's predicted longest sample, its mean x
    group_max_factor capped at the response cap); 0 (the membership unchanged) where no relief
    shortens it. ``by_len``: the groups by descending predicted length (the stratification's order);
    a partial last iteration neither gives nor takes groups."""
    n_full = n_iter - (1 if partial_last else 0)
    M = int(margin * B + 1e-9)
    if n_full < 2 or M < 1:
        return iteration
    # the swaps touch iterations 0..M only: keep their groups (in by_len's order), O(n) once
    by_len = by_len[iteration[by_len] <= M]
    members = by_len[iteration[by_len] == 0]
    best_m, best = 0, float(longest[members].max())
    for m in range(1, min(M, members.size - 1) + 1):
        movers, partners = _swaps(iteration, by_len, m, n_full)
        if movers.size < m:
            break
        fl = max(float(longest[members[m:]].max()), float(longest[partners].max()))
        if fl < best * (1.0 - 1e-9):
            best_m, best = m, fl
    if best_m == 0:
        return iteration
    movers, partners = _swaps(iteration, by_len, best_m, n_full)
    out = iteration.copy()
    out[partners] = 0
    out[movers] = iteration[partners]
    return out
