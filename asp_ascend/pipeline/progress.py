"""What the trainer did in one iteration, and the trainer's part of its metrics row."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import TrainingDiverged


@dataclass
class IterationProgress:
    """One iteration in training (its mini-batches are the plan's)."""
    done: set = field(default_factory=set)
    begun: bool = False                            # the trainer was told (begin_iteration)
    rewards: list = field(default_factory=list)
    resp_lens: list = field(default_factory=list)
    lags: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    truncated: list = field(default_factory=list)  # per sample: cut at max_response_length

    def row(self, i: int) -> dict:
        """Iteration i's metrics row, the trainer's part (the sync adds times and bubbles)."""
        steps = self.steps
        diffs = [s["logprob_diff_max"] for s in steps if s.get("logprob_diff_max") is not None]
        mean = lambda key: float(np.mean([s[key] for s in steps]))  # noqa: E731
        return {
            "iteration": i, "policy_version": i + 1, "tokens": sum(s["tokens"] for s in steps),
            "reward_mean": float(np.mean(self.rewards)), "response_length_mean": float(np.mean(self.resp_lens)),
            "policy_lag_max": int(max(self.lags)), "policy_lag_mean": float(np.mean(self.lags)),
            "loss": mean("loss"), "clip_frac": mean("clip_frac"), "kl": mean("kl"), "grad_norm": mean("grad_norm"),
            "is_weight_mean": mean("is_weight_mean"),
            "truncated_share": float(np.mean(self.truncated)) if self.truncated else 0.0,
            "train_time_s": float(sum(s["t_end"] - s["t_start"] for s in steps)),
            "logprob_diff_max": max(diffs) if diffs else None,
        }


def check_step_finite(st: dict, iteration: int, mini_batch: int) -> None:
    """Stop the run at an optimizer step whose loss or gradient norm is NaN/inf (the trainer
    did not apply that step, so its weights are still those of the last good step)."""
    bad = {k: st.get(k) for k in ("loss", "grad_norm")
           if st.get(k) is None or not math.isfinite(float(st[k]))}
    if bad:
        got = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in bad.items())
        raise TrainingDiverged(
            f"iteration {iteration} (policy version {iteration}), mini-batch {mini_batch}: {got}; training stopped "
            "before applying this optimizer step, and no checkpoint of it is written. Usual causes: a reward "
            "that is NaN/inf, train.lr too high, rollout.temperature near 0; resume=true continues from the "
            "newest checkpoint once the cause is fixed")


def check_rewards_finite(rewards: list[float], prompt_id, iteration: int, reward_name: str) -> None:
    """A NaN/inf reward would turn the group's advantages and then the loss into NaN: stop here."""
    bad = [r for r in rewards if not math.isfinite(r)]
    if bad:
        raise TrainingDiverged(f"iteration {iteration}: the reward function ({reward_name}) returned {bad[0]} for a "
                               f"sample of prompt {prompt_id!r} ({len(bad)} of {len(rewards)} samples); rewards must "
                               "be finite numbers: fix train.reward")


ROW_BUBBLES = ("padding_bubble", "skew_bubble", "sorting_bubble", "queue_occupancy_cv")


class WindowMetrics:
    """The bubbles of each iteration's own window W = [previous sync end, this sync end], for
    its metrics row (summary.json covers the whole run, from the full timeline, once).

    Fed every timeline event as it is added; ``close(t)`` computes the row's
    ``ROW_BUBBLES`` with the shared definitions (metrics/bubbles.py) from the events that
    overlap W only, and keeps those that reach past ``t`` (a request, step or sync still
    running at the sync end; the queue's length at ``t``) for the next window. The work
    per row is the window's events, not the run's (``processed`` counts it).
    A request is known once it finishes, so a window sees the requests finished by the time
    its row is written (as summarising the whole timeline at that moment would)."""

    def __init__(self, num_instances: int, max_num_seqs: int, t_start: float):
        self.R, self.S = num_instances, max_num_seqs
        self.start = t_start
        self.events: dict[str, list[dict]] = {"request": [], "step": [], "sync": [], "queue": []}
        self.queue_before: dict | None = None  # the last queue event before the window
        self.processed = 0                     # events looked at by close() (for the cost test)

    def add(self, kind: str, ev: dict) -> None:
        if kind in self.events:
            self.events[kind].append(ev)

    def close(self, t_end: float) -> dict:
        from ..metrics.bubbles import padding_bubble, rollout_breakdown, time_weighted_cv, trainer_breakdown

        t0, ev = self.start, self.events
        self.processed += sum(map(len, ev.values()))
        col = lambda kind, key, keep=None: np.asarray(  # noqa: E731
            [e[key] for e in ev[kind] if keep is None or keep(e)], dtype=float)
        done = lambda e: e["t_end"] <= t_end  # noqa: E731 - steps counted in the window they end in
        rb = rollout_breakdown(col("request", "instance").astype(np.int64), col("request", "t_admit"),
                               col("request", "t_finish"), self.R, self.S, t0, t_end)
        tb = trainer_breakdown(col("step", "t_start"), col("step", "t_end"), col("step", "tokens"),
                               col("step", "padded_tokens"), col("sync", "t_start"), col("sync", "t_end"),
                               col("request", "t_admit"), col("request", "t_finish"), t0, t_end)
        q = ([self.queue_before] if self.queue_before else []) + ev["queue"]
        row = {"padding_bubble": padding_bubble(col("step", "tokens", done).sum(), col("step", "padded_tokens", done).sum()),
               "skew_bubble": rb["skew_bubble"], "sorting_bubble": tb["sorting_bubble"],
               "queue_occupancy_cv": time_weighted_cv([e["t"] for e in q], [e["size"] for e in q], t0, t_end)}
        before = [e for e in q if e["t"] <= t_end]
        self.queue_before = before[-1] if before else self.queue_before
        self.events = {"request": [e for e in ev["request"] if e["t_finish"] > t_end],
                       "step": [e for e in ev["step"] if e["t_end"] > t_end],
                       "sync": [e for e in ev["sync"] if e["t_end"] > t_end],
                       "queue": [e for e in ev["queue"] if e["t"] > t_end]}
        self.start = t_end
        return row
