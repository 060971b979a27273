"""A prompt set: ids, texts, reference answers and lengths (loaded by datasets.py or built by synthetic.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PromptSet:
    ids: list[str]
    prompts: list[str]
    answers: list[str | None]
    prompt_lengths: np.ndarray
    known_lengths: np.ndarray | None = None  # answer lengths known by construction (synthetic task)
    source: str = "<memory>"
    extra: dict[str, list[Any]] = field(default_factory=dict)
    # how prompt_lengths were counted: {"unit": "words"} as loaded; the run's tokens once a tokenizer counted them
    # (data/prompt_tokens.py); None for a built-in task (its own lengths)
    length_unit: dict | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, index) -> "PromptSet":
        idx = np.asarray(index)
        return PromptSet([self.ids[i] for i in idx], [self.prompts[i] for i in idx],
                         [self.answers[i] for i in idx], self.prompt_lengths[idx],
                         None if self.known_lengths is None else self.known_lengths[idx], self.source,
                         {k: [v[i] for i in idx] for k, v in self.extra.items()}, self.length_unit)
