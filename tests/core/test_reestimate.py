"""Online re-estimation of a group's length (scheduler/reestimate.py)."""
import math

import numpy as np
import pytest

from asp_ascend.scheduler.group_max import group_max_factor
from asp_ascend.scheduler.reestimate import GroupEstimator, within_group_spread


def test_without_evidence_the_estimate_is_the_prediction():
    e = GroupEstimator(1, learn=False)
    e.on_admit("g", 800)
    # one sample, nothing seen: expected length and expected remaining are the prediction
    assert e.mean("g") == pytest.approx(800, rel=1e-9)
    assert e.remaining("g") == pytest.approx(800, rel=1e-6)
    assert e.predict(800) == pytest.approx(800)


def test_before_any_token_the_remaining_is_the_planners_expected_longest_sample():
    # no sibling finished, no token: the predictive of each sample is the prediction (bias 0)
    # with spread sqrt(sigma^2 + tau^2) in the location; the exact expected largest of G is
    # the prediction x group_max_factor(sigma, G) (the location's uncertainty shifts all alike)
    for G in (2, 8, 16):
        e = GroupEstimator(G, spread=0.3, prior_spread=0.5, learn=False)
        e.on_admit("g", 800)
        assert e.remaining("g") == pytest.approx(800 * group_max_factor(0.3, G), rel=1e-12)
        e.on_progress("g", [0] * G)
        assert e.remaining("g") == pytest.approx(800 * group_max_factor(0.3, G), rel=1e-12)


def test_remaining_is_the_monte_carlo_largest_of_the_unfinished_samples_tokens_left():
    """The estimator's model, sampled: the group's location drawn from its posterior (normal,
    the posterior mean and variance), each unfinished sample's length lognormal around it and
    longer than its tokens so far; the estimator takes the location's uncertainty as a scale
    exp(v / 2) on the lengths above the posterior mean's conditional, so the check is on that:
    E[max_j (exp(v / 2) L_j - t_j)], L_j drawn by rejection above t_j."""
    rng = np.random.default_rng(3)
    e = GroupEstimator(8, spread=0.4, learn=False)
    e.on_admit("g", 1000)
    for x in (700, 900, 1300):
        e.on_sample_finish("g", x)
    e.on_progress("g", [600, 600, 600, 800, 0])
    m, v = e._posterior(e.groups["g"])
    n_draws, out = 200_000, []
    for t, k in ((600, 3), (800, 1), (0, 1)):
        z = rng.standard_normal((n_draws * 4, k))
        L = np.exp(m + 0.4 * z)
        ok = (L > t).all(axis=1)
        L = L[ok][:n_draws]
        out.append((math.exp(0.5 * v) * L - t).max(axis=1))
    best = np.max(np.stack(out), axis=0)
    se = best.std() / math.sqrt(best.size)
    assert abs(e.remaining("g") - best.mean()) < 4 * se


def test_finished_siblings_move_the_estimate_toward_them():
    e = GroupEstimator(8, learn=False)
    for key in ("long", "short", "none"):
        e.on_admit(key, 1000)
    for _ in range(4):
        e.on_sample_finish("long", 4000)
        e.on_sample_finish("short", 250)
    assert e.mean("short") < 1000 < e.mean("long")
    # four siblings outweigh the prior: the estimate is closer to them than to the prediction
    assert abs(math.log(e.mean("long") / 4000)) < abs(math.log(e.mean("long") / 1000))
    assert e.remaining("short") < e.remaining("none") < e.remaining("long")


def test_a_misprediction_is_corrected_by_the_tokens_so_far():
    """A group predicted at 500 tokens whose samples all passed 3000: the estimate follows the
    evidence (each unfinished sample is known to be longer than 3000)."""
    e = GroupEstimator(8, max_length=16384, learn=False)
    e.on_admit("g", 500)
    e.on_progress("g", [100] * 8)
    early = e.mean("g")
    e.on_progress("g", [3000] * 8)
    assert e.mean("g") > 3000 > early
    assert 0 < e.remaining("g") <= 16384 - 3000
    # nothing left past the cap: at the cap minus one token, at most one token remains
    e.on_progress("g", [16383] * 8)
    assert e.remaining("g") <= 1.0


def test_remaining_shrinks_as_siblings_finish_and_is_zero_when_done():
    e = GroupEstimator(4, learn=False)
    e.on_admit("g", 1000)
    before = e.remaining("g")
    e.on_progress("g", [900] * 4)
    for L in (950, 1000, 1050):
        e.on_sample_finish("g", L)
    e.on_progress("g", [1060])
    assert 0 < e.remaining("g") < before
    e.on_sample_finish("g", 1100)
    assert e.remaining("g") == 0.0
    with pytest.raises(ValueError):
        e.on_sample_finish("g", 10)
    e.on_group_finish("g")
    with pytest.raises(KeyError):
        e.mean("g")


def test_learns_bias_and_spread_from_finished_groups():
    """Lengths are twice the predictions with a within-group spread of 0.5: the estimator
    learns both from finished groups (its defaults say 1x and 0.3)."""
    rng = np.random.default_rng(1)
    e = GroupEstimator(8, spread=0.3, prior_spread=0.5)
    for g in range(400):
        pred = float(rng.lognormal(6.5, 0.8))
        e.on_admit(g, pred)
        for L in 2 * pred * rng.lognormal(-0.125, 0.5, 8):
            e.on_sample_finish(g, int(L))
        e.on_group_finish(g)
    assert e.predict(1000) == pytest.approx(2000, rel=0.1)
    assert e.sigma == pytest.approx(0.5, rel=0.1)
    assert e.tau < 0.2          # predictions were exact up to the factor 2


def test_bad_events_are_errors():
    e = GroupEstimator(2)
    e.on_admit("g", 10)
    with pytest.raises(ValueError):
        e.on_admit("g", 10)
    with pytest.raises(ValueError):
        e.on_progress("g", [1, 2, 3])
    with pytest.raises(ValueError):
        GroupEstimator(0)


def test_spread_from_a_history():
    rng = np.random.default_rng(2)
    n, G = 3000, 8
    means = rng.lognormal(6, 1, n)
    L = means[:, None] * rng.lognormal(0, 0.3, (n, G))
    spread = within_group_spread(np.repeat(np.arange(n), G), np.zeros(n * G), L.reshape(-1))
    assert spread == pytest.approx(0.3, rel=0.03)


def test_a_groups_last_samples_in_one_call_match_one_by_one():
    import random

    rng = random.Random(3)
    for _ in range(200):
        a, b = GroupEstimator(8, max_length=4096.0), GroupEstimator(8, max_length=4096.0)
        for e in (a, b):
            e.on_admit("g", 500.0)
        toks = [rng.randint(0, 900) for _ in range(8)]
        first = [rng.randint(1, 900) for _ in range(rng.randint(0, 3))]
        for e in (a, b):
            e.on_progress("g", toks)
            for x in first:
                e.on_sample_finish("g", x)
        rest = [rng.randint(1, 2000) for _ in range(8 - len(first) - rng.randint(0, 3))]
        for x in rest:
            a.on_sample_finish("g", x)
        b.on_samples_finish("g", rest)
        ga, gb = a.groups["g"], b.groups["g"]
        assert (ga.finished, ga.tokens) == (gb.finished, gb.tokens)
        assert a.remaining("g") == b.remaining("g")
    with pytest.raises(ValueError, match="more than 8 samples"):
        b.on_samples_finish("g", [1] * 9)


def test_remaining_later_answers_what_remaining_answered_when_asked():
    est = GroupEstimator(4, max_length=8000)
    est.on_admit("a", 500)
    est.on_sample_finish("a", 900)
    est.on_progress("a", [700, 700, 650])
    now = est.remaining("a")
    est.groups["a"].memo = None                  # not read from remaining()'s memo
    later = est.remaining_later("a")
    # another group finishes: the learnt parameters move, so remaining() moves too
    est.on_admit("b", 100)
    est.on_samples_finish("b", [3000, 3500, 2800, 4000])
    est.on_group_finish("b")
    assert est.remaining("a") != now
    assert later() == now
