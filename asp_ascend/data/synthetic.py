"""The built-in synthetic task: answers of very different, known lengths.

Counting task: the prompt ``count 5 to 11 :`` asks for ``5 6 7 8 9 10 11``. The number of
answer words n = end - start + 1 is drawn from a truncated Pareto between
``min_answer_length`` and ``max_answer_length``, so answer lengths are heavy-tailed and known
by construction (``known_lengths`` = n words + the end-of-sequence token); start is uniform
in 1..``alphabet_size``. A tiny two-layer model learns it within minutes: continuing a
count is a bigram, starting and stopping are look-ups of the two prompt numbers; stopping
exactly at the end is what a short supervised warm start leaves imperfect and RL improves.

Reward (``score``): 1.0 for the exact answer; otherwise half the share of positions right
(over the longer of answer and response), so a near-miss earns partial credit. A response
cut at the length cap (``truncated=True``) never stopped: it earns partial credit at most,
even when its words happen to equal the answer.
"""
from __future__ import annotations

import numpy as np

from .prompts import PromptSet


def _answer_lengths(rng: np.random.Generator, n: int, lo: int, hi: int, alpha: float) -> np.ndarray:
    u = rng.random(n)
    # inverse CDF of a Pareto(alpha) truncated to [lo, hi]
    la, ha = lo ** -alpha, hi ** -alpha
    x = (la - u * (la - ha)) ** (-1.0 / alpha)
    return np.clip(np.floor(x).astype(np.int64), lo, hi)


def _make(rng, n: int, syn, prefix: str) -> PromptSet:
    lengths = _answer_lengths(rng, n, syn.min_answer_length, syn.max_answer_length, syn.tail_alpha)
    starts = rng.integers(1, max(1, syn.alphabet_size) + 1, size=n)
    ids, prompts, answers = [], [], []
    for i, (L, s) in enumerate(zip(lengths, starts)):
        e = int(s) + int(L) - 1
        ids.append(f"{prefix}{i}")
        prompts.append(f"count {int(s)} to {e} :")
        answers.append(" ".join(str(x) for x in range(int(s), e + 1)))
    plen = np.full(n, 5, dtype=np.int64)
    return PromptSet(ids, prompts, answers, plen, (lengths + 1).astype(np.int64), "builtin:synthetic-count")


def make_synthetic_task(syn, seed: int = 0) -> tuple[PromptSet, PromptSet]:
    """(train, eval) prompt sets of the counting task, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    train = _make(rng, syn.num_prompts, syn, "syn-")
    ev = _make(rng, syn.num_eval_prompts, syn, "syn-eval-")
    return train, ev


def vocabulary(syn) -> list[str]:
    """Every word the task can produce (prompts and answers), for a word-level tokenizer."""
    top = max(1, syn.alphabet_size) + syn.max_answer_length
    return ["count", "to", ":"] + [str(i) for i in range(1, top + 1)]


def score(response: str, answer: str, truncated: bool = False) -> float:
    """1.0 for the exact answer that stopped; otherwise half the share of positions right."""
    got, want = response.split(), answer.split()
    if got == want and not truncated:
        return 1.0
    if not want:
        return 0.0
    right = sum(1 for a, b in zip(got, want) if a == b)
    return 0.5 * right / max(len(want), len(got))


score.takes_truncated = True  # the orchestrator passes finish_reason == "length" as truncated
