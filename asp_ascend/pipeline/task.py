"""What the loop runs and where it writes: the sampling settings, the task (prompts, reward,
decoding, the ``truncated`` rule) and the run's outputs (used by pipeline/orchestrator.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..algos.grpo import iteration_denominator
from .evaluation import Prompts
from .logger import RunLogger

__all__ = ["RunOutputs", "Sampling", "Task", "score_response"]


@dataclass
class Sampling:
    group_size: int
    max_tokens: int
    temperature: float
    top_p: float
    stop_token_ids: list[int]
    seed: int


@dataclass
class Task:
    """What the instances generate and how a sample is scored.

    ``truncated`` (``train.truncated``): what a sample cut at ``max_tokens`` (vLLM's
    ``finish_reason == "length"``) gets: ``keep`` (scored like the others; the built-in rewards
    never give it full credit), ``mask`` (in its group's statistics, out of the loss),
    ``zero_reward``. ``loss_agg`` (``train.loss_agg``) and ``adv_unbiased`` (``train.adv_std``):
    see algos/grpo.py."""
    prompts: Prompts
    reward_fn: Callable
    decode: Callable[[list[int]], str]
    sampling: Sampling
    truncated: str = "keep"
    loss_agg: str = "token-mean-step"
    adv_unbiased: bool = True

    def iteration_denominator(self, predicted: float, groups: int, mini_batches: int) -> float | None:
        """``token-mean-iteration``: what every optimizer step of an iteration divides by, the
        iteration's response tokens / its mini-batches. The tokens of groups still generating
        are not known when its first step runs, so the count is the plan's: every sample at its
        prompt's predicted length (``predicted``: the iteration's sum; clamped to [1, max_tokens];
        max_tokens where the plan has no prediction). Every token of the iteration then weighs
        the same whatever mini-batch it lands in; the scale is close to a token mean's. None:
        the trainer's own rule."""
        if self.loss_agg != "token-mean-iteration":
            return None
        return iteration_denominator(predicted, groups, self.sampling.group_size, mini_batches,
                                     self.sampling.max_tokens)

    def rewards(self, samples: list[dict], answer) -> list[float]:
        """Each sample's reward under the ``truncated`` rule (a sample dict: token_ids, finish_reason)."""
        out = []
        for s in samples:
            cut = s.get("finish_reason") == "length"
            if cut and self.truncated == "zero_reward":
                out.append(0.0)
            else:
                out.append(float(score_response(self.reward_fn, self.decode(s["token_ids"]), answer, cut)))
        return out


def score_response(reward_fn: Callable, text: str, answer, truncated: bool) -> float:
    """``reward_fn(text, answer)``; a reward that takes ``truncated`` (the built-in ones) is told."""
    if getattr(reward_fn, "takes_truncated", False):
        return reward_fn(text, answer, truncated=truncated)
    return reward_fn(text, answer)


@dataclass
class RunOutputs:
    """Where the loop writes: the timeline, the log, checkpoints; ``t0`` is the run's time zero."""
    timeline_path: Path
    logger: RunLogger
    t0: float
    checkpoint_every: int = 0
    checkpoint_dir: Path | None = None
