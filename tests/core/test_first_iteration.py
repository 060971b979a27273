"""scheduler.relieve_first (scheduler/first_iteration.py): iteration 0 gives its predicted-longest
groups to later iterations for groups of the next strata, within a KS margin, where that lowers its
predicted floor."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.metrics.floor import publish_floor
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.first_iteration import relieve_first
from asp_ascend.scheduler.planner import plan

# 12 groups, ranks 0..11 by descending predicted length, in B = 4 strata of 3 (ranks 3t .. 3t + 2);
# the stratified membership gives each of the 3 iterations one group per stratum: rank r -> r mod 3
BY_LEN = np.arange(12)
STRATIFIED = BY_LEN % 3


def _members(iteration):
    return [sorted(np.flatnonzero(iteration == i).tolist()) for i in range(3)]


def test_hand_made_relief_and_its_publish_floor():
    """Each group's predicted longest sample alone is 12 - its rank. Iteration 0 holds ranks 0, 3, 6,
    9 (floor 12). m = 1 swaps rank 0 for iteration 1's stratum-1 group (rank 4): floor max(9, 8) = 9;
    m = 2 (margin 0.5 x B = 4) swaps ranks 0 and 3 for iteration 1's stratum-2 group (rank 7) and
    iteration 2's stratum-3 group (rank 11): floor max(6, 3, 5, 1) = 6, the lowest, so m = 2."""
    lat = 12.0 - BY_LEN
    out = relieve_first(STRATIFIED, BY_LEN, lat, B=4, margin=0.5, n_iter=3, partial_last=False)
    assert _members(out) == [[6, 7, 9, 11], [0, 1, 4, 10], [2, 3, 5, 8]]
    assert (np.bincount(out) == 4).all()
    # m = 1 only within a margin of 1 / B
    one = relieve_first(STRATIFIED, BY_LEN, lat, B=4, margin=0.25, n_iter=3, partial_last=False)
    assert _members(one) == [[3, 4, 6, 9], [0, 1, 7, 10], [2, 5, 8, 11]]
    # the publish floor (k = 1, the trainer busy 5 s per iteration, no sync or fill) with these
    # latencies as the true ones: before V = 12, max(12 + 5, 11) = 17, max(17 + 5, 12 + 10) = 22;
    # after (floors 6, 12, 10): V = 6, max(6 + 5, 12) = 12, max(12 + 5, 6 + 10) = 17
    def floors(it):
        f = np.zeros(3)
        np.maximum.at(f, it, lat)
        return f
    busy = np.full(3, 5.0)
    assert floors(STRATIFIED).tolist() == [12, 11, 10] and floors(out).tolist() == [6, 12, 10]
    np.testing.assert_allclose(publish_floor(busy, floors(STRATIFIED), 1), [12, 17, 22])
    np.testing.assert_allclose(publish_floor(busy, floors(out), 1), [6, 12, 17])


def test_nothing_moves_where_the_upper_strata_are_predicted_alike():
    """The three upper strata at the response cap (floor 12 each): no relief within m = 2 lowers
    iteration 0's predicted floor (its stratum-2 group stays), so the membership is unchanged; with
    a margin of 0 nothing is tried."""
    lat = np.array([12.0] * 9 + [3.0, 2.0, 1.0])
    for margin in (0.0, 0.5):
        out = relieve_first(STRATIFIED, BY_LEN, lat, B=4, margin=margin, n_iter=3, partial_last=False)
        np.testing.assert_array_equal(out, STRATIFIED)


def test_a_partial_last_iteration_neither_gives_nor_takes():
    """Iteration 2 partial (ranks 2 and 8): the movers' partners come from iteration 1 only."""
    by_len = np.arange(10)
    iteration = np.array([0, 1, 2, 0, 1, 0, 1, 2, 0, 1])   # 4 + 4 + 2
    lat = 10.0 - by_len
    out = relieve_first(iteration, by_len, lat, B=4, margin=0.5, n_iter=3, partial_last=True)
    assert (np.bincount(out) == [4, 4, 2]).all()
    np.testing.assert_array_equal(out[[2, 7]], [2, 2])
    # m = 2: ranks 0 and 3 go to iteration 1, whose 3rd and 4th longest (ranks 6 and 9) come back
    assert _members(out)[0] == [5, 6, 8, 9]


def test_plan_relieves_the_first_iteration_within_the_margin():
    """On a heavy-tailed epoch (B = 256, 16 iterations): with asp's default margin (0.02: m <= 5)
    iteration 0 holds none of the epoch's 5 x 16 predicted-longest groups (it held one per stratum
    before), every iteration keeps B groups, iteration 0's predicted-length CDF moves by at most the
    margin from the stratified plan's, iterations other than 0 and the m receiving ones are
    unchanged, and relieve_first=0 is the stratified plan."""
    n, B = 4096, 256
    rng = np.random.default_rng(3)
    pred = np.where(rng.random(n) < 0.1, 1500 * (1 - rng.random(n)) ** (-1 / 1.5), rng.lognormal(6.2, 0.6, n))
    plen = rng.lognormal(5.3, 0.5, n)
    ids = np.arange(n).astype(str)
    kw = dict(global_batch_size=B, mini_batch_size=64, num_instances=8, lag_bound=1, cost=CostModel())
    top = np.argsort(-pred, kind="stable")[:5 * n // B]
    for seed in range(3):
        off = plan(ids, pred, plen, policy="asp", seed=seed, relieve_first=0.0, **kw)
        on = plan(ids, pred, plen, policy="asp", seed=seed, **kw)
        it0, it1 = off["iteration"].to_numpy(), on["iteration"].to_numpy()
        assert (np.bincount(it1) == B).all()
        assert (it0[top] == 0).sum() == 5 and (it1[top] == 0).sum() == 0, seed
        changed = np.unique(np.concatenate([it0[it0 != it1], it1[it0 != it1]]))
        assert changed.tolist() == [0, 1, 2, 3, 4, 5], (seed, changed)
        x = np.sort(pred[it0 == 0])
        y = np.sort(pred[it1 == 0])
        grid = np.concatenate([x, y])
        ks = np.abs(np.searchsorted(x, grid, side="right") - np.searchsorted(y, grid, side="right")).max() / B
        assert ks <= 0.02 + 1e-12, (seed, ks)
        pd.testing.assert_frame_equal(on, plan(ids, pred, plen, policy="asp", seed=seed, **kw))
        # a later epoch's first iteration (iteration_offset > 0) follows the previous epoch's last one:
        # only the run's first iteration is relieved
        later = plan(ids, pred, plen, policy="asp", seed=seed, iteration_offset=16, **kw)
        np.testing.assert_array_equal(later["iteration"].to_numpy() - 16, it0)


@pytest.mark.parametrize("value", ["-0.01", "0.5"])
def test_relieve_first_range(tmp_path, value):
    from asp_ascend.config import load_config
    from asp_ascend.errors import ConfigError

    empty = tmp_path / "c.yaml"
    empty.write_text("{}\n")
    with pytest.raises(ConfigError, match=r"scheduler.relieve_first: .* must be in \[0, 0.5\)"):
        load_config(empty, [f"scheduler.relieve_first={value}"])
    assert load_config(empty, ["scheduler.relieve_first=0.01"]).scheduler.relieve_first == 0.01
