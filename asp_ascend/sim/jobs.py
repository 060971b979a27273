"""What the simulator executes: prompt groups with their true lengths, and the trainer's mini-batches."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


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



def minibatch_tokens(jobs: SimJobs, micro_batch_size: int, mode: str) -> pd.DataFrame:
    """Per (iteration, mini_batch): groups, real tokens, padded token slots.

    The mini-batch's sequences (its prompts in dispatch order, samples in order; or sorted
    by length for ``sorted``) are cut into micro-batches of ``micro_batch_size`` sequences,
    each padded to its longest sequence (prompt + response). ``packed`` has no padding.
    """
    J, G = jobs.resp.shape
    rank = jobs.dispatch_rank if jobs.train_rank is None else jobs.train_rank
    order = np.lexsort((rank, jobs.mini_batch, jobs.iteration))
    it = np.repeat(jobs.iteration[order], G)
    mb = np.repeat(jobs.mini_batch[order], G)
    seq_len = (jobs.resp[order] + jobs.prompt_length[order, None]).reshape(-1).astype(np.int64)
    key = it.astype(np.int64) * (int(mb.max(initial=0)) + 1) + mb
    if mode == "sorted":
        o2 = np.lexsort((seq_len, key))
        key, seq_len, it, mb = key[o2], seq_len[o2], it[o2], mb[o2]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    pos = np.arange(key.size) - np.repeat(starts, np.diff(np.r_[starts, key.size]))
    micro = np.r_[True, (key[1:] != key[:-1]) | (pos[1:] % micro_batch_size == 0)]
    mstart = np.flatnonzero(micro)
    mmax = np.maximum.reduceat(seq_len, mstart)
    msum = np.add.reduceat(seq_len, mstart)
    mcnt = np.diff(np.r_[mstart, key.size])
    mpad = mmax * mcnt - msum if mode != "packed" else np.zeros_like(msum)
    mkey = key[mstart]
    df = pd.DataFrame({"key": mkey, "tokens": msum, "padded_tokens": mpad})
    agg = df.groupby("key", sort=True).sum()
    first = pd.DataFrame({"key": key[starts], "iteration": it[starts], "mini_batch": mb[starts]}).set_index("key")
    groups = pd.Series(np.repeat(1, J), index=(jobs.iteration.astype(np.int64) * (int(mb.max(initial=0)) + 1)
                                               + jobs.mini_batch)).groupby(level=0).sum()
    out = first.join(agg)
    out["groups"] = groups.reindex(out.index).to_numpy()
    return out.reset_index(drop=True)
