"""Online re-estimation of a prompt group's length (DESIGN 9 b): events in, estimates out.

The planner knows one number per prompt, a predicted mean response length. Once a group
runs, better evidence arrives: its siblings finish (the G samples of one prompt are the best
length signal there is) and its unfinished samples grow past lengths that were likely.
:class:`GroupEstimator` turns that evidence into two figures per running group, feeding
guided dispatch (which instance has the most work left) and tail-aware concurrency
(which group will set its iteration's floor):

- ``mean(key)``: the group's expected sample length;
- ``remaining(key)``: expected tokens until the group's last sample finishes.

Model. A sample's log-length is normal around its group's log-location ``m``, with the
within-group spread ``sigma``; before any sibling is seen, ``m`` is normal around the
prediction with the prediction-error spread ``tau`` (centred so that the expected length
is the prediction times the learnt ``bias`` factor). A finished sibling is an exact
observation; an unfinished one with ``t`` tokens is a censored one (its length is above
``t``), folded in by EM (its expected log-length given ``> log t``): a sample still short
of what was likely says nothing, one far beyond it pulls ``m`` up. The posterior mean of
``m`` and its variance give each unfinished sample's predictive distribution above its
``t``; the group's remaining length is the exact expected largest of the ``n`` samples' tokens
left, each conditioned on its own ``t`` (``group_max.expected_longest_left``: before any token it
is the planner's ``group_max_factor`` x the expected length), capped at ``max_length``.

``sigma``, ``tau`` and ``bias`` start from the given defaults and are learnt from every
finished group (pooled within-group variance; the error of the group's observed mean
against its prediction, less the sampling noise of a G-sample mean), shrunk towards the
defaults by ``prior_groups`` pseudo-groups. So a workload whose lengths drift, or whose
predictions are worse than assumed, corrects the estimates by itself.

Nothing here knows about time, threads, Ray or vLLM: the simulator and the runtime call
the same ``on_*`` updates and read the same estimates.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from .group_max import expected_longest_left

_EM_ITERS = 8
_SQRT2, _SQRT2PI = math.sqrt(2.0), math.sqrt(2.0 * math.pi)


def _mills(z: float) -> float:
    """phi(z) / P(Z > z), the inverse Mills ratio (expected excess of a normal above z)."""
    sf = 0.5 * math.erfc(z / _SQRT2)
    if sf < 1e-300:
        return z + 1.0 / max(z, 1e-9)
    return math.exp(-0.5 * z * z) / _SQRT2PI / sf


@dataclass
class _Group:
    predicted: float
    finished: list = field(default_factory=list)     # exact lengths of finished samples
    tokens: tuple = ()                               # tokens so far of each unfinished sample (last update)
    memo: tuple | None = None                        # (parameter stamp, remaining()) until the group changes


class _Pooled:
    """Running mean and variance (Welford)."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)


class GroupEstimator:
    """Re-estimates running groups' lengths from their siblings and their tokens so far.

    Keys are whatever identifies a group (the runtime and the simulator use
    ``(epoch, prompt_id)``). ``spread`` = within-group log-std, ``prior_spread`` = log-std of
    the prediction error, both defaults that finished groups refine (``learn``).
    """

    def __init__(self, group_size: int, *, max_length: float | None = None, spread: float = 0.3,
                 prior_spread: float = 0.5, learn: bool = True, prior_groups: int = 8):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if spread <= 0 or prior_spread <= 0:
            raise ValueError(f"spread and prior_spread must be > 0, got {spread}, {prior_spread}")
        self.G = int(group_size)
        self.max_length = None if max_length is None else float(max_length)
        self.sigma0, self.tau0 = float(spread), float(prior_spread)
        self.learn = learn
        self.n0 = int(prior_groups)
        self.groups: dict[Hashable, _Group] = {}
        self._within = [0, 0.0]       # pooled within-group: degrees of freedom, sum of squares
        self._err = _Pooled()         # log(observed group mean / prediction)
        self._params: tuple | None = None   # (sigma, tau, bias) until the next learnt group
        self._stamp = 0                     # counts learnt groups: a memo of remaining() made before is stale

    def _learnt(self) -> tuple[float, float, float]:
        """(sigma, tau, bias), computed once per learnt group (hot path of guided dispatch)."""
        if self._params is None:
            self._params = (self.sigma, self.tau, self.bias)
        return self._params

    # learnt parameters ------------------------------------------------------------
    @property
    def learnt(self) -> int:
        """Groups learnt from so far: what :meth:`predict` returns changes only when this does."""
        return self._stamp

    @property
    def sigma(self) -> float:
        dof, ss = self._within
        w0 = self.n0 * max(1, self.G - 1)
        return math.sqrt((w0 * self.sigma0 ** 2 + ss) / (w0 + dof))

    @property
    def bias(self) -> float:
        e = self._err
        return e.n * e.mean / (self.n0 + e.n)

    @property
    def tau(self) -> float:
        e = self._err
        if e.n < 2:
            return self.tau0
        var = max(e.m2 / (e.n - 1) - self.sigma ** 2 / self.G, 0.01)
        return math.sqrt((self.n0 * self.tau0 ** 2 + (e.n - 1) * var) / (self.n0 + e.n - 1))

    # state updates ------------------------------------------------------------------
    def on_admit(self, key: Hashable, predicted_length: float) -> None:
        if key in self.groups:
            raise ValueError(f"group {key!r} admitted twice")
        self.groups[key] = _Group(max(1.0, float(predicted_length)))

    def on_progress(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Tokens generated so far by each unfinished sample of the group."""
        g = self.groups[key]
        left = self.G - len(g.finished)
        if len(tokens) > left:
            raise ValueError(f"group {key!r}: {len(tokens)} unfinished samples reported, {left} left")
        g.tokens = tuple(map(int, tokens))
        g.memo = None

    def on_sample_finish(self, key: Hashable, length: int) -> None:
        g = self.groups[key]
        if len(g.finished) >= self.G:
            raise ValueError(f"group {key!r}: more than {self.G} samples finished")
        g.finished.append(max(1, int(length)))
        g.memo = None
        if len(g.tokens) > self.G - len(g.finished):
            # it leaves the unfinished list (as the longest so far: siblings start together)
            g.tokens = tuple(sorted(g.tokens)[:-1])

    def on_samples_finish(self, key: Hashable, lengths: Sequence[int]) -> None:
        """:meth:`on_sample_finish` for each of ``lengths`` in turn (one call: a group's last report)."""
        g = self.groups[key]
        G, finished = self.G, g.finished
        ordered = False     # g.tokens sorted already (after the first drop): the next drop needs no sort
        for length in lengths:
            if len(finished) >= G:
                raise ValueError(f"group {key!r}: more than {G} samples finished")
            finished.append(max(1, int(length)))
            g.memo = None
            if len(g.tokens) > G - len(finished):
                g.tokens = g.tokens[:-1] if ordered else tuple(sorted(g.tokens)[:-1])
                ordered = True

    def on_group_finish(self, key: Hashable) -> None:
        """The group is done: forget it, and learn the spread and the prediction error from it."""
        g = self.groups.pop(key)
        if not self.learn or len(g.finished) < 2:
            return
        logs = [math.log(x) for x in g.finished]
        mu = sum(logs) / len(logs)
        self._within[0] += len(logs) - 1
        self._within[1] += sum((x - mu) ** 2 for x in logs)
        self._err.add(math.log(sum(g.finished) / len(g.finished)) - math.log(g.predicted))
        self._params = None
        self._stamp += 1

    # decisions ------------------------------------------------------------------------
    def predict(self, predicted_length: float) -> float:
        """Expected sample length of a group not yet started (the prediction, bias-corrected)."""
        return self._cap(max(1.0, float(predicted_length)) * math.exp(self._learnt()[2]))

    def _posterior(self, g: _Group, params: tuple | None = None) -> tuple[float, float]:
        """Posterior mean and variance of the group's log-location (``params``: the learnt
        (sigma, tau, bias) to use, default the current ones)."""
        sigma, tau, bias = params or self._learnt()
        s2, t2 = sigma ** 2, tau ** 2
        m0 = math.log(g.predicted) + bias - 0.5 * (s2 + t2)   # prior predictive mean = pred
        fin = [math.log(x) for x in g.finished]
        cens = [math.log(t) for t in g.tokens if t >= 1]
        prec = 1.0 / t2 + (len(fin) + len(cens)) / s2
        sum_fin = sum(fin)
        m = (m0 / t2 + sum_fin / s2) / (1.0 / t2 + len(fin) / s2)
        if cens:
            s = math.sqrt(s2)
            distinct = set(cens)
            if len(distinct) == 1:
                # the usual case (siblings start together): _mills inlined, the one term summed
                # len(cens) times in order (the same floats as the general loop below)
                c, many = cens[0], len(cens)
                erfc, exp = math.erfc, math.exp
                for _ in range(_EM_ITERS):
                    z = (c - m) / s
                    sf = 0.5 * erfc(z / _SQRT2)
                    term = m + s * (z + 1.0 / max(z, 1e-9) if sf < 1e-300 else exp(-0.5 * z * z) / _SQRT2PI / sf)
                    pseudo = sum([term] * many)
                    m = (m0 / t2 + (sum_fin + pseudo) / s2) / prec
                return m, 1.0 / (1.0 / t2 + len(fin) / s2)
            for _ in range(_EM_ITERS):
                # siblings with equal token counts give equal terms: each distinct one computed
                # once, the sum still taken term by term in order (the same float)
                term = {c: m + s * _mills((c - m) / s) for c in distinct}
                pseudo = sum(map(term.__getitem__, cens))
                m = (m0 / t2 + (sum_fin + pseudo) / s2) / prec
        return m, 1.0 / (1.0 / t2 + len(fin) / s2)

    def mean(self, key: Hashable) -> float:
        """Expected sample length of the group (finished siblings and tokens so far included)."""
        g = self.groups[key]
        m, v = self._posterior(g)
        return self._cap(math.exp(m + 0.5 * (self._learnt()[0] ** 2 + v)))

    def remaining(self, key: Hashable) -> float:
        """Expected tokens until the group's last unfinished sample finishes (0 if none is left).
        Kept per group until the group or the learnt parameters change (callers ask again and
        again between two events)."""
        g = self.groups[key]
        if g.memo is not None and g.memo[0] == self._stamp:
            return g.memo[1]
        rem = self._remaining(g)
        g.memo = (self._stamp, rem)
        return rem

    def remaining_later(self, key: Hashable) -> Callable[[], float]:
        """A call that answers, when made, what :meth:`remaining` of ``key`` answers now: the
        group's state and the learnt parameters as they are now (the group's state must not
        change in between; the learnt parameters may). For a caller that records progress now
        and may never need the answer (the simulator's guided dispatch, mechanisms.py)."""
        g = self.groups[key]
        if g.memo is not None and g.memo[0] == self._stamp:
            rem = g.memo[1]
            return lambda: rem
        return functools.partial(self._remaining, g, self._learnt())

    def _remaining(self, g: _Group, params: tuple | None = None) -> float:
        n = self.G - len(g.finished)
        if n <= 0:
            return 0.0
        params = params or self._learnt()
        m, v = self._posterior(g, params)
        # the exact expected largest of the n unfinished samples' tokens left, each sample's
        # length conditioned on its tokens so far (siblings not yet reported have 0); the
        # uncertainty of the group's location scales the lengths by exp(v / 2)
        counts = Counter(g.tokens)
        if len(g.tokens) < n:
            counts[0] += n - len(g.tokens)
        rem = expected_longest_left(m, params[0], counts, math.exp(0.5 * v))
        if self.max_length is not None:
            rem = min(rem, self.max_length - min(counts))
        return max(rem, 0.0)

    def _cap(self, x: float) -> float:
        return x if self.max_length is None else min(x, self.max_length)


def within_group_spread(prompt_ids, epochs, lengths, default: float = 0.3) -> float:
    """Pooled log-std of sample lengths within a (prompt, epoch) group of a length history
    (``default`` when the history has no group of two samples or more)."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame({"p": np.asarray(prompt_ids), "e": np.asarray(epochs),
                       "x": np.log(np.maximum(np.asarray(lengths, dtype=float), 1.0))})
    g = df.groupby(["p", "e"], sort=False)["x"]
    n = g.transform("size").to_numpy()
    dev = (df["x"] - g.transform("mean")).to_numpy()
    dof = float((g.size() - 1).clip(lower=0).sum())
    if dof < 1:
        return default
    return float(np.sqrt((dev[n > 1] ** 2).sum() / dof))
