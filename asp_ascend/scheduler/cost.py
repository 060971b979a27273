"""Per-instance cost model: the one decode-step formula, used by the planner, its estimate,
the tail model, speculative decoding's costs, the simulator and the lower bounds.

Decode step (one token for every running sequence of an instance)::

    t_step(n, C) = a + b * C + c * n          n = running sequences, C = sum of their context tokens

Everything else is this formula summed over steps (:func:`steps_time`): ``m`` consecutive
steps of ``n`` sequences that held ``C0`` context tokens before the first step (each step adds
one token per sequence, the token being generated counted in its own step's context) take::

    sum_{j=1..m} t_step(n, C0 + n * j) = m * (a + c * n) + b * (m * C0 + n * m * (m + 1) / 2)

(the simulator's instances jump between events with it; a group generated alone, one sequence
alone and one sequence's share of a full instance are this sum with particular ``n`` and ``C0``).

Defaults (``CostConfig``) are of the order of a 7B-class model on one accelerator with
vLLM: a = 20 ms fixed per step, b = 2e-8 s per context token, c = 0.1 ms per sequence.
Prefill costs ``prefill_per_token`` per prompt token the engine computes. With vLLM's automatic
prefix caching (``prefix_block`` > 0, its KV block in tokens; ``rollout.prefix_caching``, on by
default as in vLLM V1) the G samples of one prompt on one instance compute the prompt's full
blocks (those before its last token) once: a group pays :meth:`CostModel.group_prefill_tokens`.
Trainer: ``train_per_token`` per
(padded) token plus ``train_per_step`` per optimizer step; ``logprob_per_token`` per token
for each extra forward pass (old/reference log-probs). ``sync_s`` per weight sync.
docs/simulator.md ("Default cost models", "Calibration") gives the defaults per model class and
how the coefficients are fitted to a real run (``asp simulate --calibrate RUN_DIR``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


def step_time(a, b, c, n, context):
    """Seconds of one decode step of ``n`` sequences holding ``context`` tokens in all."""
    return a + b * context + c * n


def steps_time(a, b, c, m, n, context0):
    """Seconds of ``m`` decode steps of ``n`` sequences holding ``context0`` tokens before the
    first (closed form of the sum of :func:`step_time`; array arguments broadcast)."""
    return m * (a + c * n) + b * (m * context0 + n * m * (m + 1) / 2.0)


def shared_prompt_tokens(prompt_len, prefix_block: int):
    """Prompt tokens a sample finds cached when a sibling already holds the prompt on its instance
    (vLLM's prefix caching, KV blocks of ``prefix_block`` tokens: the prompt's full blocks before
    its last token, which vLLM always computes; 0 when ``prefix_block`` <= 0, caching off)."""
    p = np.asarray(prompt_len, dtype=float)
    if prefix_block <= 0:
        return np.zeros_like(p)
    return np.maximum(0.0, np.floor((p - 1.0) / prefix_block) * prefix_block)


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
    prefix_block: int = 0       # prefix caching: KV block, tokens (0 = off: every sample prefills its prompt)

    @classmethod
    def from_config(cls, cost_cfg, logprob_passes: int = 1, prefix_block: int = 0) -> "CostModel":
        return cls(decode_a=cost_cfg.decode_a, decode_b=cost_cfg.decode_b, decode_c=cost_cfg.decode_c,
                   prefill_per_token=cost_cfg.prefill_per_token, train_per_token=cost_cfg.train_per_token,
                   train_per_step=cost_cfg.train_per_step, logprob_per_token=cost_cfg.logprob_per_token,
                   logprob_passes=logprob_passes, sync_s=cost_cfg.sync_s, prefix_block=int(prefix_block))

    def with_decode(self, a: float, b: float, c: float) -> "CostModel":
        """The same model with other decode coefficients (speculation, a mis-specified plan)."""
        return replace(self, decode_a=a, decode_b=b, decode_c=c)

    def scaled(self, factor: float) -> "CostModel":
        """Decode and prefill ``factor`` times as slow (a cost model that differs from the plan's)."""
        return replace(self, decode_a=self.decode_a * factor, decode_b=self.decode_b * factor,
                       decode_c=self.decode_c * factor, prefill_per_token=self.prefill_per_token * factor)

    # rollout ------------------------------------------------------------------
    def shared_prompt(self, prompt_len):
        """Prompt tokens a sample finds cached when a sibling already holds the prompt on its
        instance (:func:`shared_prompt_tokens` with this model's ``prefix_block``)."""
        return shared_prompt_tokens(prompt_len, self.prefix_block)

    def group_prefill_tokens(self, prompt_len, group_size: int):
        """Prompt tokens the engine computes for a group of ``group_size`` samples admitted on one
        instance: the whole prompt once, the uncached rest for each other sample."""
        p = np.asarray(prompt_len, dtype=float)
        return group_size * p - (group_size - 1) * self.shared_prompt(p)

    def prefill_share(self, prompt_len, group_size: int):
        """Prompt tokens one sample of a group of ``group_size`` on one instance costs: its share of
        :meth:`group_prefill_tokens` with prefix caching, its whole prompt without."""
        p = np.asarray(prompt_len, dtype=float)
        if group_size <= 1 or self.prefix_block <= 0:
            return p
        return self.group_prefill_tokens(p, group_size) / group_size

    def group_prefill(self, prompt_len, group_size: int):
        """Seconds of prefill of such a group (``prefill_per_token`` x :meth:`group_prefill_tokens`)."""
        p = np.asarray(prompt_len, dtype=float)
        if self.prefix_block <= 0:
            return self.prefill_per_token * p * group_size
        return self.prefill_per_token * self.group_prefill_tokens(p, group_size)

    def step(self, n_running, context_tokens):
        """Seconds for one decode step with ``n_running`` sequences holding ``context_tokens``."""
        return step_time(self.decode_a, self.decode_b, self.decode_c, n_running, context_tokens)

    def steps(self, m, n_running, context0):
        """Seconds for ``m`` decode steps (see :func:`steps_time`)."""
        return steps_time(self.decode_a, self.decode_b, self.decode_c, m, n_running, context0)

    def steps_to_reach(self, delta: float, n_running: int, context0: float) -> int:
        """Smallest m >= 0 with ``steps(m, n_running, context0) >= delta`` (scalars)."""
        if delta <= 0:
            return 0
        a, b, c, nn = self.decode_a, self.decode_b, self.decode_c, n_running
        qa = b * nn / 2.0
        qb = a + c * nn + b * context0 + b * nn / 2.0
        m = (-qb + math.sqrt(qb * qb + 4 * qa * delta)) / (2 * qa) if qa > 0 else delta / qb
        m = max(1, int(math.ceil(m - 1e-9)))
        while steps_time(a, b, c, m, nn, context0) < delta:
            m += 1
        while m > 1 and steps_time(a, b, c, m - 1, nn, context0) >= delta:
            m -= 1
        return m

    def solo_latency(self, prompt_len, resp_len):
        """Seconds to generate ``resp_len`` tokens of one sequence alone on an instance
        (prefill + its decode steps)."""
        p = np.asarray(prompt_len, dtype=float)
        return self.prefill_per_token * p + self.steps(np.asarray(resp_len, dtype=float), 1, p)

    def group_latency(self, prompt_len, resp_len, group_size: int):
        """Seconds to generate one group (G sequences of ``resp_len`` tokens together) alone on an instance."""
        p = np.asarray(prompt_len, dtype=float)
        G = group_size
        return self.group_prefill(p, G) + self.steps(np.asarray(resp_len, dtype=float), G, G * p)

    def group_latency_exact(self, prompt_length, resp) -> np.ndarray:
        """Seconds to generate each group (rows of ``resp``: its samples' lengths) alone on an
        instance: prefill of its samples (:meth:`group_prefill_tokens`), then decode steps over the
        running samples until the longest finishes, the shortest leaving first."""
        L = np.sort(np.asarray(resp, dtype=float), axis=1)
        J, G = L.shape
        p = np.asarray(prompt_length, dtype=float)
        t = self.group_prefill(p, G)
        done = np.zeros(J)
        for j in range(G):
            m = np.maximum(L[:, j] - done, 0.0)
            nn = G - j
            t = t + self.steps(m, nn, nn * (p + done))
            done = np.maximum(done, L[:, j])
        return t

    def work(self, prompt_len, resp_len, concurrency, group_size: int = 1):
        """Instance-seconds one sequence costs when sharing steps with ``concurrency`` others:
        its decode steps with the fixed part ``a`` shared by all, plus its share of its group's
        prefill (``group_size`` samples of one prompt on one instance)."""
        p = np.asarray(prompt_len, dtype=float)
        S = np.maximum(1, concurrency)
        return self.prefill_per_token * self.prefill_share(p, group_size) + steps_time(self.decode_a / S, self.decode_b, self.decode_c,
                                                       np.asarray(resp_len, dtype=float), 1, p)

    def peak_throughput(self, concurrency, mean_context):
        """Tokens/s of one instance at full concurrency and a given mean context length (arrays broadcast)."""
        S = np.maximum(1, concurrency)
        return S / self.step(S, S * mean_context)

    # trainer ------------------------------------------------------------------
    def train_time(self, slot_tokens, num_steps):
        """Trainer seconds for optimizer steps over ``slot_tokens`` (padded) token slots,
        including the extra log-prob passes."""
        per_tok = self.train_per_token + self.logprob_per_token * self.logprob_passes
        return per_tok * np.asarray(slot_tokens, dtype=float) + self.train_per_step * np.asarray(num_steps, dtype=float)
