"""What the trainer did in one iteration, and the trainer's part of its metrics row."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class IterationProgress:
    """One iteration in training (its mini-batches are the plan's)."""
    done: set = field(default_factory=set)
    rewards: list = field(default_factory=list)
    resp_lens: list = field(default_factory=list)
    lags: list = field(default_factory=list)
    steps: list = field(default_factory=list)

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
            "train_time_s": float(sum(s["t_end"] - s["t_start"] for s in steps)),
            "logprob_diff_max": max(diffs) if diffs else None,
        }
