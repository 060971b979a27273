"""The expected longest sample of a group over its mean (scheduler/group_max.py): the one exact
function the planner, the analytic estimate and the runtime's tail control read."""
import math

import numpy as np
import pytest

from asp_ascend.scheduler.estimate import capped_sample_mean
from asp_ascend.scheduler.group_max import group_max_factor, spread_of_group_max_factor


def _monte_carlo(spread, G, n=400_000, seed=0):
    rng = np.random.default_rng(seed)
    total = 0.0
    for lo in range(0, n, 100_000):
        z = rng.standard_normal((min(100_000, n - lo), G))
        total += np.exp(spread * z.max(axis=1) - 0.5 * spread * spread).sum()
    return total / n


@pytest.mark.parametrize("spread,G", [(0.1, 2), (0.3, 4), (0.3, 8), (0.8, 4), (0.8, 8), (0.5, 16), (1.0, 8),
                                      (0.3, 64)])
def test_against_a_large_monte_carlo(spread, G):
    assert group_max_factor(spread, G) == pytest.approx(_monte_carlo(spread, G), rel=3e-3)


def test_two_samples_in_closed_form():
    # E[max of 2] / mean = 2 E[Phi(X + s)] = 2 Phi(s / sqrt(2))
    for s in (0.05, 0.3, 0.8, 1.5, 3.0):
        assert group_max_factor(s, 2) == pytest.approx(1.0 + math.erf(s / 2.0), rel=1e-12)


def test_blom_was_low():
    # the approximation the runtime used: exp(s z - s^2 / 2), z Blom's quantile (G - 3/8) / (G + 1/4)
    from statistics import NormalDist

    def blom(s, G):
        return math.exp(s * NormalDist().inv_cdf((G - 0.375) / (G + 0.25)) - 0.5 * s * s)

    assert blom(0.3, 8) / group_max_factor(0.3, 8) - 1 == pytest.approx(-0.014, abs=5e-4)
    assert blom(0.8, 8) / group_max_factor(0.8, 8) - 1 == pytest.approx(-0.112, abs=5e-4)
    assert blom(0.8, 4) / group_max_factor(0.8, 4) - 1 == pytest.approx(-0.139, abs=5e-4)


def test_one_sample_or_no_spread_is_the_mean():
    assert group_max_factor(0.0, 8) == 1.0 and group_max_factor(0.8, 1) == 1.0
    assert group_max_factor(1e-9, 8) == pytest.approx(1.0, abs=1e-8)


def test_monotone_in_spread_and_group_size_and_below_g():
    spreads = [0.01, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0, 4.0]
    for G in (2, 4, 8, 16, 64, 256):
        f = [group_max_factor(s, G) for s in spreads]
        assert all(a < b for a, b in zip(f, f[1:])) and f[-1] < G
    for s in spreads:
        f = [group_max_factor(s, G) for G in (1, 2, 3, 4, 8, 16, 64, 256)]
        assert all(a < b for a, b in zip(f, f[1:]))
    assert group_max_factor(12.0, 8) == pytest.approx(8.0, rel=1e-6)   # the longest holds all the mass


def test_the_inverse_round_trips():
    for G in (2, 4, 8, 64):
        for s in (0.02, 0.3, 0.8, 2.0):
            assert spread_of_group_max_factor(group_max_factor(s, G), G) == pytest.approx(s, rel=1e-9)
    out = spread_of_group_max_factor([[1.0, group_max_factor(0.3, 8)], [0.5, group_max_factor(0.8, 8)]], 8)
    assert out.shape == (2, 2) and out.ravel() == pytest.approx([0.0, 0.3, 0.0, 0.8], rel=1e-9)
    assert spread_of_group_max_factor(1.7, 1) == 0.0


@pytest.mark.parametrize("spread,G", [(0.3, 8), (0.8, 4), (0.8, 8)])
def test_capped_sample_mean_inverts_the_same_function(spread, G):
    # samples mean x lognormal(spread), each cut at the cap: the capped mean from the factor equals the
    # one drawn at the spread the factor came from
    mean, cap = 10_000.0, 16_384.0
    rng = np.random.default_rng(3)
    drawn = np.minimum(mean * np.exp(spread * rng.standard_normal(1_000_000) - 0.5 * spread * spread), cap).mean()
    got = capped_sample_mean([mean], cap, group_max_factor(spread, G), G)[0]
    assert got == pytest.approx(drawn, rel=1e-3)
    assert got < mean


def test_bad_input_names_the_key():
    with pytest.raises(ValueError, match=r"spread -0.1 must be finite and >= 0 \(workload.group_spread"):
        group_max_factor(-0.1, 8)
    with pytest.raises(ValueError, match=r"group size 0 must be an integer >= 1 \(train.group_size\)"):
        group_max_factor(0.3, 0)
    with pytest.raises(ValueError, match="every factor must be finite"):
        spread_of_group_max_factor([np.nan], 8)
