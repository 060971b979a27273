"""What the simulator executes: prompt groups with their true lengths, and the trainer's mini-batches."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SimJobs:
    """One row per prompt group to generate and train (all simulated epochs).

    ``iteration`` is global over epochs; ``resp`` is (J, G) response lengths.
    """
    epoch: np.ndarray
    prompt_id: np.ndarray
    iteration: np.ndarray
    mini_batch: np.ndarray
    instance: np.ndarray
    dispatch_rank: np.ndarray
    prompt_length: np.ndarray
    resp: np.ndarray
    predicted_length: np.ndarray | None = None
    train_rank: np.ndarray | None = None   # order of groups within a mini-batch (default: dispatch_rank)
    room: np.ndarray | None = None         # tail-aware concurrency: sequences its instance may hold (0: no cap)

    def __len__(self) -> int:
        return int(self.epoch.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.resp.shape[1])
