"""scheduler.gather_top (scheduler/membership.py) and the history's forecast record it reads
(lengths/predictors.forecast_record, scheduler/concentrate.drawn_from_record)."""
import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.lengths.predictors import ForecastRecord, forecast_record, prediction_quality
from asp_ascend.scheduler.concentrate import drawn_from_record, publish_chain
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.planner import plan

N, B = 256, 16                                 # 16 iterations of 16 groups
KW = dict(global_batch_size=B, mini_batch_size=4, num_instances=4, max_num_seqs=64, lag_bound=1, relieve_first=0.0)
STEP_BOUND = CostModel(decode_a=0.2)           # a decode step costs far more than the trainer's work


def _workload():
    """16 long groups (4,000 tokens, distinct) among 240 short ones (100-339): one long group per
    iteration when stratified."""
    pred = 100.0 + np.arange(N)[::-1] % 240
    pred[:16] = 4000.0 - np.arange(16)
    return np.arange(N).astype(str), pred, np.full(N, 50.0)


def _top_strata_counts(it, pred, s):
    top = np.argsort(-pred, kind="stable")[:s * (N // B)]
    return np.bincount(it[top], minlength=N // B)


def test_gather_top_deals_the_top_strata_in_order_where_the_record_shows_forecasts_come_true():
    """Where the longest groups bound the publish chain and the history's forecasts came true (the exact
    record), gather_top = 4 / 16 deals the 4 top strata in predicted-length order: the 16 long groups go to
    4 iterations instead of 16, every iteration keeps 16 groups and 4 of the top strata (its predicted
    CDF moves by at most 4 / 16), and the chain on the true lengths is far lower. Without a record (one
    epoch of history), with one whose forecasts ranked nothing, with gather_top under two strata, or where
    the trainer binds, the plan is the stratified one."""
    ids, pred, plen = _workload()
    exact = ForecastRecord.exact(pred)
    strat = plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, **KW)
    dealt = plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, gather_top=0.25, forecasts=exact, **KW)
    it0, it1 = strat["iteration"].to_numpy(), dealt["iteration"].to_numpy()
    assert np.unique(it0[:16]).size == 16
    assert np.unique(it1[:16]).size == 4 and 0 not in set(it1[:16])      # the lightest floor still first
    assert (np.bincount(it1) == B).all()
    assert (_top_strata_counts(it1, pred, 4) == 4).all()
    lat = STEP_BOUND.group_latency(plen, pred, 8)
    n_mb = np.full(N // B, B // 4)
    chains = [publish_chain(it, lat, 8 * (plen + pred), n_mb, STEP_BOUND, 1, N // B) for it in (it1, it0)]
    assert chains[0] < 0.6 * chains[1]
    # nothing known, nothing ranked, under two strata, or trainer-bound: stratified
    rng = np.random.default_rng(0)
    blind = ForecastRecord(pred, rng.permutation(pred), 0.0)
    for kw in (dict(gather_top=0.25, forecasts=None), dict(gather_top=0.25, forecasts=blind),
               dict(gather_top=0.1, forecasts=exact), dict(gather_top=0.0, forecasts=exact)):
        pd.testing.assert_frame_equal(plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, **kw, **KW), strat)
    trainer_bound = CostModel(decode_a=0.2, train_per_token=0.1)
    pd.testing.assert_frame_equal(
        plan(ids, pred, plen, policy="asp", cost=trainer_bound, gather_top=0.25, forecasts=exact, **KW),
        plan(ids, pred, plen, policy="asp", cost=trainer_bound, **KW))


def test_gather_top_keeps_stratified_where_the_records_longest_forecasts_fell_back():
    """A record whose long forecasts all came out as short as the rest: the drawn lengths put the
    predicted-longest groups back among the short ones, gathering them gains nothing in the draws, and the
    plan stays stratified, though the predictions alone promise the gain the exact record takes."""
    ids, _, plen = _workload()
    pred = np.full(N, 100.0)
    pred[:16] = 4000.0 - np.arange(16)
    # the history: a quarter of its prompts forecast long, every one of them as short as the rest in the
    # outcome (a quality given: only the draws decide)
    history_forecast = np.where(np.arange(N) < N // 4, 4000.0, 100.0)
    fell_back = ForecastRecord(history_forecast, np.full(N, 100.0), 0.5)
    strat = plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, **KW)
    pd.testing.assert_frame_equal(
        plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, gather_top=0.25, forecasts=fell_back, **KW), strat)
    came_true = plan(ids, pred, plen, policy="asp", cost=STEP_BOUND, gather_top=0.25,
                     forecasts=ForecastRecord(pred, pred, 0.5), **KW)
    assert np.unique(came_true["iteration"].to_numpy()[:16]).size == 4


def test_drawn_from_record_carries_the_regression_at_the_top():
    """Each group takes the outcome / forecast ratio (and longest sample / forecast) of a history prompt of
    a similar forecast rank: the exact record gives the predictions back; where the history's top tenth
    fell back to the median, the predicted-longest groups' draws do too, the middle's stay; the longest
    samples scale the same way."""
    f = np.exp(np.linspace(np.log(50), np.log(5000), 1000))
    outcome = f.copy()
    outcome[-100:] = np.median(f)                          # the top tenth fell back to the median
    rec = ForecastRecord(f, outcome, 0.5, longest=3.0 * outcome)
    pred = np.exp(np.linspace(np.log(60), np.log(6000), 500))[::-1]       # longest first, another scale
    means, longest = drawn_from_record(pred, rec, draws=32)
    assert means.shape == longest.shape == (32, 500)
    np.testing.assert_allclose(longest, 3.0 * means)
    assert np.median(means[:, :40]) < 0.15 * pred[:40].min()            # the top: near the history's median
    mid = slice(200, 300)
    np.testing.assert_allclose(means[:, mid], np.broadcast_to(pred[mid], (32, 100)), rtol=0.05)
    m2, l2 = drawn_from_record(pred, ForecastRecord.exact(f), draws=4)
    np.testing.assert_allclose(m2, np.broadcast_to(pred, (4, 500)))
    assert l2 is None


def test_forecast_record_of_a_history():
    """The record forecasts the history's last epoch from the epochs before it: per prompt the forecast,
    that epoch's mean and longest sample, and prediction_quality of the two; None below two epochs."""
    h = pd.DataFrame({"prompt_id": ["a", "a", "b", "b", "a", "a", "b", "b"],
                      "epoch": [0, 0, 0, 0, 1, 1, 1, 1],
                      "response_length": [100, 300, 1000, 3000, 150, 250, 2000, 6000]})
    rec = forecast_record(h, "mean")
    np.testing.assert_allclose(rec.forecast, [200, 2000])
    np.testing.assert_allclose(rec.outcome, [200, 4000])
    np.testing.assert_allclose(rec.longest, [250, 6000])
    assert rec.quality == prediction_quality(h, "mean")
    assert forecast_record(h[h.epoch == 0], "mean") is None


def test_gather_top_config():
    assert load_config(None, []).scheduler.gather_top == pytest.approx(0.02)
    with pytest.raises(ConfigError, match="scheduler.gather_top"):
        load_config(None, ["scheduler.gather_top=0.7"])


def test_membership_auto_draws_from_the_record():
    """scheduler.membership auto with the history's record: the dataset order holds all 8 long groups in one
    iteration; where the record shows the forecasts came true it takes that order, where the record's long
    forecasts all came out as short as the rest (its quality given, 0.5: only the draws decide) it keeps the
    stratified plan."""
    n, B = 64, 8
    pred = np.full(n, 100.0)
    pred[8:16] = 4000.0
    plen = np.full(n, 50.0)
    ids = np.arange(n).astype(str)
    kw = dict(global_batch_size=B, mini_batch_size=4, num_instances=2, max_num_seqs=64, lag_bound=1,
              relieve_first=0.0, cost=STEP_BOUND, policy="asp")
    strat = plan(ids, pred, plen, **kw)
    came_true = plan(ids, pred, plen, membership="auto", forecasts=ForecastRecord(pred, pred, 0.5), **kw)
    assert np.unique(came_true["iteration"].to_numpy()[8:16]).size == 1
    history_forecast = np.where(np.arange(n) < n // 2, 4000.0, 100.0)
    fell_back = ForecastRecord(history_forecast, np.full(n, 100.0), 0.5)
    pd.testing.assert_frame_equal(plan(ids, pred, plen, membership="auto", forecasts=fell_back, **kw), strat)
