"""The run's own costs, measured while it runs: decode step and trainer time per iteration.

The planner and the tail model price work with a :class:`~asp_ascend.scheduler.cost.CostModel`
whose defaults are an accelerator's (``cost.*``). A run on other hardware (the CPU, another
device, a shared machine) has other costs, and a tail room sized with the wrong ones takes
capacity without making the tail faster. So the runtime measures its own:

- decode: every instance reports, with each poll, its engine steps so far, the running
  sequences and their context tokens summed over those steps, and the wall time inside the
  steps (``RolloutEngine.poll``'s ``meter``). Between two polls an instance ran ``m`` steps over
  ``N = sum n`` sequence-steps and ``C = sum context`` token-steps in ``T`` seconds; with the
  cost model's step formula ``t_step = a + b * context + c * n`` that is one equation
  ``T = a m + b C + c N``. :class:`CostMeter` fits (a, b, c) >= 0 by least squares over all
  windows so far (each window weighted by its steps; a term whose coefficient would come out
  negative is left at 0, so a step that costs the same at any batch has b = c = 0);
- the trainer: seconds from an iteration's first optimizer step to the end of its weight sync
  (``on_iteration``), averaged.

``cost()`` is the config's model with the measured decode coefficients and no prefill term
(prefill is inside the measured steps), or None until ``min_steps`` steps were measured.
Nothing here knows about time, threads, Ray or vLLM.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np

from .cost import CostModel


class CostMeter:
    """Least-squares decode-step coefficients and mean trainer time of the run so far."""

    def __init__(self, prior: CostModel | None = None, *, min_steps: int = 100, refit_every: int = 20):
        self.prior = prior or CostModel()
        self.min_steps = int(min_steps)
        self.refit_every = int(refit_every)
        self._last: dict[int, tuple[float, ...]] = {}   # instance -> cumulative (steps, seq_steps, ctx_steps, busy_s)
        self._gram = np.zeros((4, 4))   # sums over windows of the weighted (a, b, c, y) products (the fit's data)
        self._steps = 0.0
        self._fit: CostModel | None = None
        self._fit_steps = 0.0
        self._since_fit = 0
        self.revision = 0                                # grows each time cost() changes
        self._train: list[float] = []

    # state updates ------------------------------------------------------------------
    def on_poll(self, instance: int, meter: dict | None) -> None:
        """Cumulative counters of ``instance`` (``steps``, ``seq_steps``, ``ctx_steps``, ``busy_s``)."""
        if not meter:
            return
        now = (float(meter["steps"]), float(meter["seq_steps"]), float(meter.get("ctx_steps", 0.0)),
               float(meter["busy_s"]))
        last = self._last.get(instance)
        self._last[instance] = now
        if last is None or now[0] < last[0]:        # first report, or a restarted instance
            return
        m, N, C, T = (x - y for x, y in zip(now, last))
        if m <= 0 or T <= 0:
            return
        z = window_features(m, N, C, T)
        self._gram += np.outer(z, z)
        self._steps += m
        self._since_fit += 1
        # refit every ``refit_every`` windows, or sooner while the data grows by a tenth per window
        if self._since_fit >= self.refit_every or self._steps >= 1.1 * self._fit_steps:
            self._refit()

    def on_iteration(self, seconds: float) -> None:
        """An iteration's trainer time: its first optimizer step's start to its sync's end."""
        if seconds > 0:
            self._train.append(float(seconds))

    def forget_instance(self, instance: int) -> None:
        """A failed instance: its next report starts a new series."""
        self._last.pop(instance, None)

    # decisions -------------------------------------------------------------------------
    @property
    def steps(self) -> float:
        return self._steps

    def totals(self) -> dict[str, float]:
        """The measured windows' sums, every instance together: engine steps, sequence-steps
        (running sequences summed over the steps: / steps = the mean batch) and seconds inside the steps."""
        g = self._gram
        return {"steps": float(g[0, 0]), "seq_steps": float(g[0, 2]), "busy_s": float(g[0, 3])}

    def cost(self) -> CostModel | None:
        """The measured cost model, or None until ``min_steps`` decode steps were measured."""
        return self._fit if self._steps >= self.min_steps else None

    def train_time(self) -> float | None:
        """Mean trainer seconds per iteration (steps + sync) so far, or None."""
        return float(np.mean(self._train)) if self._train else None

    def _refit(self) -> None:
        a, b, c = fit_gram(self._gram)
        self._fit = replace(self.prior.with_decode(a, b, c), prefill_per_token=0.0)
        self._since_fit = 0
        self._fit_steps = self._steps
        self.revision += 1


def window_features(m, N, C, T) -> np.ndarray:
    """One window's (or an array of windows') row of the weighted fit: (sqrt m) x (1, C / m, N / m, T / m),
    the features of a, b, c and the target; the fit needs only the sums of their products."""
    w = np.sqrt(m)
    return np.stack(np.broadcast_arrays(w, C / m * w, N / m * w, T / m * w), axis=-1)


def fit_gram(gram: np.ndarray) -> tuple[float, float, float]:
    """(a, b, c) >= 0 minimising sum_w m_w (T_w / m_w - a - b C_w / m_w - c N_w / m_w)^2 over the
    windows (m, N, C, T) (per-step averages weighted by steps), from ``gram``, the sums of the
    products of :func:`window_features` over the windows (so a meter keeps 16 numbers, not every
    window, and a refit costs the same after an hour as after a second). Every subset of the
    three terms is tried (a always in); the best fit with no negative coefficient wins, a term
    only when it lowers the residual by more than rounding."""
    g = np.asarray(gram, dtype=float)
    yy = g[3, 3]
    best, best_err = {"a": float(g[0, 3] / g[0, 0]) if g[0, 0] > 0 else 0.0}, np.inf
    tol = 1e-12 * yy
    for k in range(0, 3):
        for extra in combinations(("b", "c"), k):
            idx = [0] + [1 if e == "b" else 2 for e in extra]
            xtx, xty = g[np.ix_(idx, idx)], g[idx, 3]
            coef, *_ = np.linalg.lstsq(xtx, xty, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(yy - 2.0 * coef @ xty + coef @ xtx @ coef)
            if err < best_err * (1.0 - 1e-9) - tol or best_err == np.inf:
                best, best_err = dict(zip(("a",) + extra, map(float, coef))), err
    return best.get("a", 0.0), best.get("b", 0.0), best.get("c", 0.0)
