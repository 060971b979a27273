"""Per-instance cost model used by the planner's estimate and by the simulator.

Decode step (one token for every running sequence of an instance)::

    t_step(n, C) = a + b * C + c * n          n = running sequences, C = sum of their context tokens

Defaults (``CostConfig``) are of the order of a 7B-class model on one accelerator with
vLLM: a = 20 ms fixed per step, b = 2e-8 s per context token, c = 0.1 ms per sequence.
Prefill costs ``prefill_per_token`` per prompt token. Trainer: ``train_per_token`` per
(padded) token plus ``train_per_step`` per optimizer step; ``logprob_per_token`` per token
for each extra forward pass (old/reference log-probs). ``sync_s`` per weight sync.
docs/simulator.md ("Default cost models", "Calibration") gives the defaults per model class and
how the coefficients are fitted to a real run (``asp simulate --calibrate RUN_DIR``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    decode_a: float = 0.020
    decode_b: float = 2.0e-8
    decode_c: float = 1.0e-4
    prefill_per_token: float = 5.0e-5
    train_per_token: float = 5.0e-6
    train_per_step: float = 0.05
    logprob_per_token: float = 1.5e-6
    logprob_passes: int = 1
    sync_s: float = 0.5

    @classmethod
    def from_config(cls, cost_cfg, logprob_passes: int = 1) -> "CostModel":
        return cls(decode_a=cost_cfg.decode_a, decode_b=cost_cfg.decode_b, decode_c=cost_cfg.decode_c,
                   prefill_per_token=cost_cfg.prefill_per_token, train_per_token=cost_cfg.train_per_token,
                   train_per_step=cost_cfg.train_per_step, logprob_per_token=cost_cfg.logprob_per_token,
                   logprob_passes=logprob_passes, sync_s=cost_cfg.sync_s)

    # rollout ------------------------------------------------------------------
    def decode_step(self, n_running, context_tokens):
        """Seconds for one decode step with ``n_running`` sequences holding ``context_tokens``."""
        return self.decode_a + self.decode_b * context_tokens + self.decode_c * n_running

    def solo_latency(self, prompt_len, resp_len):
        """Seconds to generate ``resp_len`` tokens of one sequence alone on an instance
        (prefill + sum over its decode steps of a + b*context + c)."""
        p = np.asarray(prompt_len, dtype=float)
        L = np.asarray(resp_len, dtype=float)
        return (self.prefill_per_token * p + L * (self.decode_a + self.decode_c)
                + self.decode_b * (p * L + L * (L + 1) / 2))

    def group_latency(self, prompt_len, resp_len, group_size: int):
        """Seconds to generate one group (G sequences together) alone on an instance."""
        p = np.asarray(prompt_len, dtype=float)
        L = np.asarray(resp_len, dtype=float)
        G = group_size
        return (self.prefill_per_token * p * G + L * (self.decode_a + self.decode_c * G)
                + self.decode_b * G * (p * L + L * (L + 1) / 2))

    def work(self, prompt_len, resp_len, concurrency):
        """Instance-seconds one sequence costs when sharing steps with ``concurrency`` others:
        its share of the fixed part a/S, plus c, plus b * its context, per token; plus prefill."""
        p = np.asarray(prompt_len, dtype=float)
        L = np.asarray(resp_len, dtype=float)
        S = np.maximum(1, concurrency)
        return (self.prefill_per_token * p + L * (self.decode_a / S + self.decode_c)
                + self.decode_b * (p * L + L * (L + 1) / 2))

    def peak_throughput(self, concurrency: int, mean_context: float) -> float:
        """Tokens/s of one instance at full concurrency and a given mean context length."""
        S = max(1, concurrency)
        return S / (self.decode_a + self.decode_b * S * mean_context + self.decode_c * S)

    # trainer ------------------------------------------------------------------
    def train_time(self, slot_tokens, num_steps):
        """Trainer seconds for optimizer steps over ``slot_tokens`` (padded) token slots,
        including the extra log-prob passes."""
        per_tok = self.train_per_token + self.logprob_per_token * self.logprob_passes
        return per_tok * np.asarray(slot_tokens, dtype=float) + self.train_per_step * np.asarray(num_steps, dtype=float)
