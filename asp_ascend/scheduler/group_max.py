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
room sizing (per group, with the learnt spread) all read this one function. Re-estimation reads
its conditional form, :func:`expected_longest_left` (a running group's unfinished samples, each
longer than its tokens so far), which before any token is this factor x the expected length, so
the reactive caps compare a running group and a group not admitted yet on the same terms.
numpy and math only.
"""
from __future__ import annotations

import functools
import math
from statistics import NormalDist

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


# ------------------------------------------------------------------ the unfinished samples' longest
# The expected longest of a running group's unfinished samples, each conditioned on its tokens so far
# (GroupEstimator.remaining). With F_k the CDF of a sample's tokens left given that it has t_k and
# its length L ~ lognormal(m, s) scaled by c (c L > c t_k: the condition is on L > t_k),
#
#     E[max_j (c L_j - t_j)] = integral over y >= 0 of (1 - prod_k F_k(y)^(n_k)) dy,
#
# n_k samples at t_k. In y the product is below EPS up to y0 (the largest of the samples' lower
# cut-offs: there the integrand is 1 to within EPS), and 1 - product is below EPS beyond y1 (the
# largest upper cut-off), so the integral is y0 plus Gauss-Legendre panels between y0 and y1 (in
# log(y + the fewest tokens so far), where a CDF rises over a few spreads whatever the spread), split
# at every sample's own cut-offs (each panel holds at most the rise of one sample's CDF, which a
# panel of LEG_NODES resolves: ~1e-9 relative to the answer against an adaptive quadrature in
# 40-digit arithmetic for spreads 0.05-1.5, up to 64 samples and tokens from 4 spreads below to 40
# beyond the location; tests/core/test_group_max_left.py checks it against closed forms, a fine grid
# and Monte Carlo). A fixed grid in the normal variable (as
# group_max_factor's) does not fit here: above a censoring point far in the tail the conditional
# distribution's scale is s / z, not s.
LEG_NODES = 64
EPS = 1e-17
_LEG_X, _LEG_W = (np.asarray(a) for a in np.polynomial.legendre.leggauss(LEG_NODES))
_LOG_SQRT2PI = 0.5 * math.log(2.0 * math.pi)
_FAR = 37.0         # beyond this z, erfc underflows: log P(Z > z) from its asymptotic series
_NORMAL = NormalDist()


def _log_sf(z: float) -> float:
    """log P(Z > z) for a standard normal, to ~1e-9 relative however far in the tail."""
    if z < _FAR:
        return math.log(0.5 * math.erfc(z * _SQRT_HALF))
    r = 1.0 / (z * z)
    return -0.5 * z * z - math.log(z) - _LOG_SQRT2PI + math.log1p(-r * (1.0 - 3.0 * r * (1.0 - 5.0 * r)))


def _z_above(z0: float, log_u: float) -> float:
    """The z > z0 with P(Z > z) = u P(Z > z0), u = exp(log_u) <= 1 (an inverse survival function
    conditioned on Z > z0; far in the tail from the asymptotic, a little beyond the exact z)."""
    target = (_log_sf(z0) if z0 > -_FAR else 0.0) + log_u
    if target > -690.0:
        q = math.exp(target)
        z = -_NORMAL.inv_cdf(q) if q < 0.5 else _NORMAL.inv_cdf(1.0 - q) if q < 1.0 else -math.inf
        return max(z, z0)
    # -z^2/2 - log z - log sqrt(2 pi) = target: z^2/2 >= -target - log z..., one fixed-point step
    z = math.sqrt(-2.0 * target)
    z = math.sqrt(max(-2.0 * (target + math.log(z) + _LOG_SQRT2PI), z0 * z0))
    return max(z, z0)


def expected_longest_left(m: float, s: float, tokens: dict, scale: float = 1.0) -> float:
    """E[max_j (scale L_j - t_j)]: the expected tokens until the last of a group's unfinished
    samples finishes, each sample's length ``L_j`` lognormal (log-location ``m``, log-spread
    ``s``) and longer than its tokens so far ``t_j`` (``tokens``: {t: samples at t}; t < 1 is no
    condition), its length scaled by ``scale`` (GroupEstimator: the location's uncertainty,
    exp(v / 2)). Exact to ~1e-9 relative; with every t below 1 it is
    ``scale exp(m + s^2 / 2) group_max_factor(s, n)``, with one sample the conditional mean."""
    if s <= 0 or not math.isfinite(s) or not math.isfinite(m) or scale <= 0:
        raise ValueError(f"expected_longest_left: spread {s!r} must be > 0, location {m!r} finite, "
                         f"scale {scale!r} > 0")
    comps = [(float(t), int(n)) for t, n in tokens.items() if n > 0]
    if not comps:
        return 0.0
    if all(t < 1.0 for t, _ in comps):
        n = sum(k for _, k in comps)
        return scale * math.exp(m + 0.5 * s * s) * group_max_factor(s, n)
    mu = m + math.log(scale)                    # scale L: log-location m + log(scale), the same z's
    log_eps = math.log(EPS)
    parts, cuts = [], []
    y0 = y1 = 0.0
    for t, n in comps:
        z0 = (math.log(t) - m) / s if t >= 1.0 else -math.inf
        lsf0 = _log_sf(z0) if z0 > -_FAR else 0.0
        # F^n < EPS below lo (P(left > y) > 1 - EPS^(1/n)); n P(left > y) < EPS above hi
        lo = max(math.exp(mu + s * _z_above(z0, math.log1p(-math.exp(log_eps / n)))) - t, 0.0)
        hi = max(math.exp(mu + s * _z_above(z0, log_eps - math.log(n))) - t, lo)
        parts.append((t, n, lsf0))
        cuts += [lo, hi]
        y0, y1 = max(y0, lo), max(y1, hi)
    if y1 <= y0:
        return y0
    # in w = log(y + T), T the fewest tokens so far (dy = e^w dw): each sample's CDF rises over a
    # few spreads in w, whatever the spread (in y a spread of 1.5 spans orders of magnitude)
    T = min(t for t, _ in comps)
    ws = sorted({math.log(y + T) for y in (y0, y1, *(c for c in cuts if y0 < c < y1))})
    total = y0
    for a, b in zip(ws[:-1], ws[1:]):
        half = 0.5 * (b - a)
        x = np.exp(half * _LEG_X + (a + half))          # y + T at the nodes
        log_h = np.zeros(LEG_NODES)
        for t, n, lsf0 in parts:
            z = (np.log(x + (t - T)) - mu) / s
            zl = z.tolist()
            if max(zl) < _FAR:
                sf = np.array([0.5 * math.erfc(v * _SQRT_HALF) for v in zl])
                left = np.minimum(sf * math.exp(-lsf0), 1.0)
            else:
                left = np.minimum(np.exp(np.array([_log_sf(v) for v in zl]) - lsf0), 1.0)
            with np.errstate(divide="ignore"):
                log_h += n * np.log1p(-left)
        total += half * float(np.dot(_LEG_W, -np.expm1(log_h) * x))
    return total
