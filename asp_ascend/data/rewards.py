"""Rule-based rewards: ``fn(response_text, answer) -> float`` in [0, 1].

- ``synthetic``: the built-in task's checker (:func:`asp_ascend.data.synthetic.score`).
- ``math``: GSM8K/MATH-style final answers: the last ``\\boxed{...}`` in the response, else
  the text after ``####``, else the last number; compared with the reference after
  normalisation (spaces, ``$``, thousands separators, trailing ``.0``; numerically when both
  parse as numbers). 1.0 when equal, else 0.0. A response cut at the length cap
  (``truncated=True``) scores 0.0: its "last number" is wherever the cut fell.
- ``module:function``: a user's own function, imported by path, same signature.
- ``auto``: ``synthetic`` for the built-in task, ``math`` for a dataset.
No torch here: rewards run in the orchestrator process.
"""
from __future__ import annotations

import importlib
import re
from typing import Callable, Optional

from ..errors import ConfigError

RewardFn = Callable[[str, Optional[str]], float]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        m = re.match(r"\\boxed\s+(\S+)", text[idx:])  # "\boxed 5"
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_answer(text: str) -> str | None:
    """The final answer of a math response: last boxed, else after '####', else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().splitlines()[0].strip() if text.rsplit("####", 1)[1].strip() else None
    nums = _NUM.findall(text)
    return nums[-1] if nums else None


def normalize_answer(ans: str) -> str:
    s = ans.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("\\left", "").replace("\\right", "")
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def _as_number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        m = re.fullmatch(r"(-?\d+)/(\d+)", s) or re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
        if m and int(m.group(2)) != 0:
            return int(m.group(1)) / int(m.group(2))
    return None


def math_score(response: str, answer: str | None, truncated: bool = False) -> float:
    """1.0 when the response's final answer equals the reference (see module doc)."""
    if answer is None or truncated:
        return 0.0
    got = extract_answer(response)
    if got is None:
        return 0.0
    ref = extract_answer(answer) if ("\\boxed" in answer or "####" in answer) else answer
    if ref is None:
        return 0.0
    g, r = normalize_answer(got), normalize_answer(ref)
    if g == r:
        return 1.0
    gn, rn = _as_number(g), _as_number(r)
    return 1.0 if gn is not None and rn is not None and abs(gn - rn) <= 1e-6 * max(1.0, abs(rn)) else 0.0


math_score.takes_truncated = True  # the orchestrator passes finish_reason == "length" as truncated


def get_reward_fn(spec: str, builtin_task: bool) -> RewardFn:
    """The reward function named by ``train.reward`` (auto|synthetic|math|module:function)."""
    if spec == "auto":
        spec = "synthetic" if builtin_task else "math"
    if spec == "synthetic":
        from .synthetic import score

        return score
    if spec == "math":
        return math_score
    if ":" in spec:
        mod, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError([f"train.reward: cannot import {spec!r} ({exc}); give module:function of an "
                               "importable module, e.g. my_rewards:score"]) from None
        if not callable(fn):
            raise ConfigError([f"train.reward: {spec!r} is not callable"])
        return fn
    raise ConfigError([f"train.reward: {spec!r} is not one of auto, synthetic, math or module:function"])
