"""The built-in synthetic task: answers of very different, known lengths.

Copy task: the prompt lists n symbols; the correct answer repeats them in order.
n is drawn from a truncated Pareto between ``min_answer_length`` and
``max_answer_length`` so answer lengths are heavy-tailed and known by construction
(``known_lengths`` = n symbols + the end-of-sequence token). Reward: ``score``.
"""
from __future__ import annotations

import numpy as np

from .datasets import PromptSet

SYMBOLS = [chr(ord("a") + i) for i in range(26)]


def _answer_lengths(rng: np.random.Generator, n: int, lo: int, hi: int, alpha: float) -> np.ndarray:
    u = rng.random(n)
    # inverse CDF of a Pareto(alpha) truncated to [lo, hi]
    la, ha = lo ** -alpha, hi ** -alpha
    x = (la - u * (la - ha)) ** (-1.0 / alpha)
    return np.clip(np.floor(x).astype(np.int64), lo, hi)


def _make(rng, n: int, syn, prefix: str) -> PromptSet:
    k = min(max(1, syn.alphabet_size), len(SYMBOLS))
    lengths = _answer_lengths(rng, n, syn.min_answer_length, syn.max_answer_length, syn.tail_alpha)
    ids, prompts, answers = [], [], []
    for i, L in enumerate(lengths):
        seq = " ".join(SYMBOLS[j] for j in rng.integers(0, k, size=int(L)))
        ids.append(f"{prefix}{i}")
        prompts.append(f"copy : {seq} =")
        answers.append(seq)
    plen = lengths + 3
    return PromptSet(ids, prompts, answers, plen.astype(np.int64), lengths + 1, "builtin:synthetic-copy")


def make_synthetic_task(syn, seed: int = 0) -> tuple[PromptSet, PromptSet]:
    """(train, eval) prompt sets of the copy task, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    train = _make(rng, syn.num_prompts, syn, "syn-")
    ev = _make(rng, syn.num_eval_prompts, syn, "syn-eval-")
    return train, ev


def score(response: str, answer: str) -> float:
    """1.0 for an exact copy; otherwise the share of positions right, times a length penalty."""
    got, want = response.split(), answer.split()
    if got == want:
        return 1.0
    if not want:
        return 0.0
    right = sum(1 for a, b in zip(got, want) if a == b)
    return 0.5 * right / max(len(want), len(got))
