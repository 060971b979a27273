"""The expected longest sample of a group, over the group's mean (one exact function).

A group's G samples of one prompt have lengths ``mean x Y`` with ``Y`` mean-one lognormal of
spread ``s`` (``Y = exp(s Z - s^2 / 2)``, ``Z`` standard normal; lengths/workloads.py draws them so).
Since ``exp`` is increasing, the largest of G is ``exp(s Z_(G) - s^2 / 2)`` with ``Z_(G)`` the
largest of G standard normals, whose density is ``G phi(z) Phi(z)^(G-1)``:

    E[max of G] / mean = integral G phi(z) Phi(z)^(G-1) exp(s z - s^2 / 2) dz
                       = G E[Phi(X + s)^(G-1)],   X standard normal,

the second form by ``z = x + s`` (``phi(x + s) exp(s (x + s) - s^2 / 2) = phi(x)``): a bounded,
smooth integrand against the normal weight. A fixed trapezoid grid (step :data:`STEP` over
``|x| <= 12``, 241 points; the normal weight beyond is ~1e-32) integrates it to ~1e-13 relative
for every spread and G <= 4096 (adaptive quadrature agrees to that; a Gauss-Hermite rule of 64
points was off by up to 0.2 % at G >= 64); tests/core/test_group_max.py checks it against a large
Monte Carlo. It is
1 at ``s = 0`` or ``G = 1``, increasing in both, and tends to G as ``s`` grows.

The planner (``asp schedule`` and ``asp simulate`` plan with it), the analytic estimate's capped
sample mean (:func:`spread_of_group_max_factor`, its inverse) and the runtime's tail control and
room sizing (per group, with the learnt spread) all read this one function. numpy and math only.
"""
from __future__ import annotations

import functools
import math

import numpy as np

STEP = 0.1    # the grid's step in x
_GRID = np.linspace(-12.0, 12.0, 241)
_X = tuple(float(x) for x in _GRID)
_W = STEP * np.exp(-0.5 * _GRID * _GRID) / math.sqrt(2.0 * math.pi)   # E[f(X)] = sum _W f(_X), X ~ N(0, 1)
_SQRT_HALF = math.sqrt(0.5)


def _check(spread: float, group_size: int) -> None:
    if not math.isfinite(spread) or spread < 0:
        raise ValueError(f"group_max_factor: spread {spread!r} must be finite and >= 0 "
                         "(workload.group_spread, or the learnt within-group log-std)")
    if int(group_size) != group_size or group_size < 1:
        raise ValueError(f"group_max_factor: group size {group_size!r} must be an integer >= 1 (train.group_size)")


@functools.lru_cache(maxsize=4096)
def _factor(spread: float, G: int) -> float:
    # log Phi(x + s) from erfc: exact in the lower tail, where Phi^(G-1) underflows harmlessly
    log_cdf = np.log(np.array([0.5 * math.erfc(-(x + spread) * _SQRT_HALF) for x in _X]))
    return float(min(max(G * np.dot(_W, np.exp((G - 1) * log_cdf)), 1.0), float(G)))


def group_max_factor(spread: float, group_size: int) -> float:
    """E[largest of ``group_size`` mean-one lognormal(``spread``) samples]: a group's expected
    longest sample over its mean (1 at spread 0 or one sample). Cached per (spread, group size)."""
    spread = float(spread)
    _check(spread, group_size)
    if spread == 0.0 or group_size == 1:
        return 1.0
    return _factor(spread, int(group_size))


@functools.lru_cache(maxsize=4096)
def _spread(factor: float, G: int) -> float:
    lo, hi = 0.0, 1.0
    while group_max_factor(hi, G) < factor and hi < 64.0:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if group_max_factor(mid, G) < factor:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def spread_of_group_max_factor(factor, group_size: int) -> np.ndarray:
    """The inverse of :func:`group_max_factor` in the spread, elementwise: the spread whose
    expected longest of ``group_size`` samples is ``factor`` x the mean. A factor <= 1 gives 0;
    one at or beyond ``group_size`` (out of reach: the factor tends to G) the largest spread
    searched (64)."""
    f = np.asarray(factor, dtype=np.float64)
    if group_size < 1 or int(group_size) != group_size:
        raise ValueError(f"spread_of_group_max_factor: group size {group_size!r} must be an integer >= 1")
    if not np.isfinite(f).all():
        raise ValueError("spread_of_group_max_factor: every factor must be finite")
    out = np.zeros(f.shape)
    if group_size == 1:
        return out
    values, inverse = np.unique(f, return_inverse=True)
    spreads = np.array([_spread(float(v), int(group_size)) if v > 1.0 else 0.0 for v in values])
    return spreads[inverse].reshape(f.shape)
