"""Speculative decoding as a cost model (DESIGN 9 d): where it pays, and what a decode step costs.

A speculative decode step proposes ``gamma`` draft tokens per sequence (``rollout.
num_speculative_tokens``) and verifies them in one forward pass of the target model;
rejection sampling keeps the target's sampling distribution exact, so what is learnt does not
change (behaviour log-probs stay the target model's). With a per-token acceptance
probability ``alpha`` (``cost.spec_acceptance``), a step yields in expectation

    E = (1 - alpha^(gamma + 1)) / (1 - alpha)          tokens per sequence

(the accepted prefix of the drafts plus the target's own next token). Its cost, in the
decode model ``a + b * sum(context) + c * n``: the weights are read once (``a``), every
sequence's KV cache is read once for all its ``gamma + 1`` query positions (``b * C``), the
per-token compute is paid for every position (``c * n * (gamma + 1)``), and the drafts cost
``draft_s + draft_per_seq * n`` (``cost.spec_draft_s``, ``cost.spec_draft_per_seq``; an
n-gram lookup is host work, a draft model is a small forward pass). Per expected token:

    a' = (a + draft_s) / E,   b' = b / E,   c' = (c * (gamma + 1) + draft_per_seq) / E

so the simulator's closed form for m steps holds unchanged with a token-step as the unit.
At small batch ``a`` dominates and speculation divides it by ``E``; at large batch the
``c * n * (gamma + 1)`` compute dominates and speculation costs more than it saves. vLLM
turns speculation off above a batch size (``disable_by_batch_size``);
``rollout.speculative_max_batch: auto`` sets it to the break-even batch of the cost model,
``always`` never turns it off (vLLM's default), ``N`` at N running sequences.

Pure and runtime-agnostic: the planner, the tail model, the simulator and the runtime's
configuration all read the same figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import parse_speculative_max_batch
from .cost import CostModel

METHODS = ("none", "ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "mtp")


@dataclass(frozen=True)
class Speculation:
    """One speculative-decoding setup of an instance (``max_batch`` 0 = never off)."""
    acceptance: float
    draft_tokens: int
    draft_s: float = 0.0
    draft_per_seq: float = 0.0
    max_batch: int = 0

    def __post_init__(self):
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError(f"acceptance must be in [0, 1), got {self.acceptance}")
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be >= 1, got {self.draft_tokens}")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens per sequence per speculative step."""
        a, g = self.acceptance, self.draft_tokens
        return (1.0 - a ** (g + 1)) / (1.0 - a)

    def coefficients(self, cm: CostModel) -> tuple[float, float, float]:
        """(a', b', c'): the decode model per expected token with speculation on."""
        E = self.tokens_per_step
        return ((cm.decode_a + self.draft_s) / E, cm.decode_b / E,
                (cm.decode_c * (self.draft_tokens + 1) + self.draft_per_seq) / E)

    def token_time(self, cm: CostModel, n: float, context: float) -> float:
        """Seconds per token of each of ``n`` sequences holding ``context`` tokens in all, speculating."""
        a, b, c = self.coefficients(cm)
        return a + b * context + c * n

    def pays(self, cm: CostModel, n: float, context: float) -> bool:
        return self.token_time(cm, n, context) < cm.decode_a + cm.decode_b * context + cm.decode_c * n

    def break_even_batch(self, cm: CostModel, context_per_seq: float) -> int:
        """Largest batch at which speculating is faster (0: never), at ``context_per_seq`` tokens each."""
        a1, b1, c1 = self.coefficients(cm)
        # plain: a + n * (b * ctx + c); speculating: a1 + n * (b1 * ctx + c1)
        gain = cm.decode_a - a1
        slope = (b1 * context_per_seq + c1) - (cm.decode_b * context_per_seq + cm.decode_c)
        if gain <= 0:
            return 0
        if slope <= 0:
            return 1 << 30
        return max(0, int(gain / slope - 1e-9))

    def on(self, n: int) -> bool:
        """Is speculation on for an instance running ``n`` sequences?"""
        return self.max_batch <= 0 or n <= self.max_batch


def from_config(rollout_cfg, cost_cfg, cm: CostModel, context_per_seq: float) -> Speculation | None:
    """The instance's :class:`Speculation` (None when ``rollout.speculative`` is none);
    ``context_per_seq`` = mean context of a running sequence, for the ``auto`` threshold."""
    if rollout_cfg.speculative == "none":
        return None
    spec = Speculation(cost_cfg.spec_acceptance, int(rollout_cfg.num_speculative_tokens),
                       cost_cfg.spec_draft_s, cost_cfg.spec_draft_per_seq)
    mode = parse_speculative_max_batch(rollout_cfg.speculative_max_batch)
    if mode == "always":
        limit = 0
    elif mode == "auto":
        limit = spec.break_even_batch(cm, context_per_seq)
        if limit == 0:
            return None          # never pays with these costs: off
    else:
        limit = int(mode)
    return Speculation(spec.acceptance, spec.draft_tokens, spec.draft_s, spec.draft_per_seq, limit)
