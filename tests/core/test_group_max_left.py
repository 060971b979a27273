"""The expected longest of a running group's unfinished samples, each conditioned on its tokens so
far (scheduler/group_max.py ``expected_longest_left``; GroupEstimator.remaining reads it)."""
import math

import numpy as np
import pytest

from asp_ascend.scheduler.group_max import expected_longest_left, group_max_factor

_erfc = np.vectorize(math.erfc)


def _truncated_mean(m, s, t):
    """E[L | L > t] for log L ~ N(m, s^2), in closed form: exp(m + s^2/2) P(Z > z - s) / P(Z > z)."""
    z = (math.log(t) - m) / s
    return math.exp(m + 0.5 * s * s) * math.erfc((z - s) / math.sqrt(2)) / math.erfc(z / math.sqrt(2))


def _fine_grid(m, s, tokens, scale=1.0, points=400_000):
    """integral of 1 - prod_k F_k(y)^n_k dy by the trapezoid rule on a fine grid in log(y) (an
    independent check of the quadrature: no cut-offs, no panels)."""
    u = np.linspace(math.log(1e-6 * math.exp(m)), m + 14 * s + math.log(scale) + 2, points)
    y = np.exp(u)
    h = np.ones_like(y)
    for t, n in tokens.items():
        p0 = 0.5 * math.erfc((math.log(t) - m) / s / math.sqrt(2)) if t >= 1 else 1.0
        z = (np.log(y + t) - m - math.log(scale)) / s
        left = np.minimum(0.5 * _erfc(z / math.sqrt(2)) / p0, 1.0)
        h *= (1.0 - left) ** n
    f = (1.0 - h) * y
    return y[0] + float(np.sum(0.5 * (f[1:] + f[:-1]) * np.diff(u)))


@pytest.mark.parametrize("s", [0.1, 0.3, 0.8, 1.5])
@pytest.mark.parametrize("t", [1, 100, 403, 2000, 8000])
def test_one_sample_is_the_truncated_mean(s, t):
    m = 6.0     # t up to 30 spreads beyond the location (the closed form's erfc holds there)
    assert expected_longest_left(m, s, {t: 1}) == pytest.approx(_truncated_mean(m, s, t) - t, rel=1e-8)
    # a scale c on the lengths: E[c L | L > t] - t
    assert expected_longest_left(m, s, {t: 1}, 1.2) == pytest.approx(1.2 * _truncated_mean(m, s, t) - t, rel=1e-8)


@pytest.mark.parametrize("s,n", [(0.05, 2), (0.3, 8), (0.8, 4), (1.5, 64)])
def test_no_token_yet_is_the_planners_group_max_factor(s, n):
    m = 5.5
    want = math.exp(m + 0.5 * s * s) * group_max_factor(s, n)
    assert expected_longest_left(m, s, {0: n}) == pytest.approx(want, rel=1e-12)
    assert expected_longest_left(m, s, {0: n}, 1.3) == pytest.approx(1.3 * want, rel=1e-12)
    # a token count far below the location (8 spreads: P(L < t) ~ 1e-15) conditions on nothing
    # that matters: the same, less t (the general quadrature, not the t = 0 shortcut)
    m = 8 * s + 2.0
    t = math.ceil(math.exp(m - 8 * s))
    want = math.exp(m + 0.5 * s * s) * group_max_factor(s, n)
    assert expected_longest_left(m, s, {t: n}) == pytest.approx(want - t, rel=1e-8)


@pytest.mark.parametrize("s,tokens", [(0.3, {600: 8}), (0.3, {0: 3, 500: 5}), (0.8, {200: 1, 900: 7}),
                                      (0.1, {300: 4, 310: 4}), (1.0, {1: 2, 5000: 2, 403: 4}), (0.3, {2000: 64})])
def test_against_a_fine_grid(s, tokens):
    for scale in (1.0, 1.15):
        assert expected_longest_left(6.0, s, tokens, scale) == pytest.approx(_fine_grid(6.0, s, tokens, scale),
                                                                             rel=1e-6)


@pytest.mark.parametrize("s,n,t", [(0.3, 8, 400), (0.3, 4, 700), (0.8, 8, 1500), (0.5, 2, 200), (0.3, 16, 300)])
def test_against_monte_carlo(s, n, t):
    rng = np.random.default_rng(n * 1000 + t)
    m, draws = 6.0, 400_000
    z0 = (math.log(t) - m) / s
    # truncated normals by inversion: Z = -isf(U P(Z > z0)), U uniform
    from statistics import NormalDist
    p0 = 0.5 * math.erfc(z0 / math.sqrt(2))
    u = rng.uniform(size=(draws, n)) * p0
    inv = np.vectorize(NormalDist().inv_cdf)
    z = -inv(u)
    best = np.exp(m + s * z).max(axis=1) - t
    se = best.std() / math.sqrt(draws)
    assert abs(expected_longest_left(m, s, {t: n}) - best.mean()) < 4 * se


def test_samples_with_equal_tokens_are_one_or_many_entries_alike():
    # the same samples, the equal-token ones named once or through a neighbour count
    a = expected_longest_left(6.0, 0.3, {500: 8})
    assert expected_longest_left(6.0, 0.3, {500: 5, 501: 3}) == pytest.approx(a, rel=2e-3)
    # one more sample can only add
    assert expected_longest_left(6.0, 0.3, {500: 9}) > a
    assert expected_longest_left(6.0, 0.3, {500: 8, 0: 1}) > a


def test_far_in_the_tail_the_excess_is_small_and_exponential():
    # 40 spreads beyond the location: each sample's excess is about exponential with mean
    # t s / z, the largest of n about H_n times that
    m, s, n = 6.0, 0.3, 8
    t = math.exp(m + 40 * s)
    got = expected_longest_left(m, s, {t: n})
    approx = t * s / 40 * sum(1.0 / k for k in range(1, n + 1))
    assert got == pytest.approx(approx, rel=0.05)


def test_no_samples_and_bad_input():
    assert expected_longest_left(6.0, 0.3, {}) == 0.0
    assert expected_longest_left(6.0, 0.3, {400: 0}) == 0.0
    with pytest.raises(ValueError, match="spread"):
        expected_longest_left(6.0, 0.0, {400: 2})
    with pytest.raises(ValueError, match="scale"):
        expected_longest_left(6.0, 0.3, {400: 2}, 0.0)
