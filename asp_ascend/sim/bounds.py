"""Per-iteration lower bounds LB_i for ``lower_bound_ratio`` (DESIGN 5).

LB_i = max( decode tokens_i / (R * peak instance throughput),
            trainer time_i,
            latency of i's longest group alone on one instance / (k + 1) )

Peak instance throughput: :meth:`CostModel.peak_throughput` at the instance's concurrency
(``max_num_seqs``, or fewer when the KV cache cannot hold that many sequences of the
iteration's mean context) and the iteration's mean context (prompt + half the response).
The group latency is exact for the engine's step model (every sample of the group
decodes together, the group's shortest finishing first).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..metrics.bubbles import iteration_lower_bounds
from ..scheduler.cost import CostModel
from .costs import trainer_slots


def group_latencies(prompt_length: np.ndarray, resp: np.ndarray, cm: CostModel) -> np.ndarray:
    """Each group's latency alone on an instance (:meth:`CostModel.group_latency_exact`)."""
    return cm.group_latency_exact(prompt_length, resp)


def lower_bounds(jobs, mb_table: pd.DataFrame, train_per_token: float, train_per_step: float, cm: CostModel,
                 num_instances: int, max_num_seqs: int, kv_capacity: int, lag_bound: int,
                 micro_batching: str = "padded") -> np.ndarray:
    """LB_i for every iteration of ``jobs`` (a :class:`~asp_ascend.sim.engine.SimJobs`); the trainer
    pays for ``mb_table``'s micro-batches as the simulated trainer does (costs.trainer_slots)."""
    it = jobs.iteration.astype(np.int64)
    n_it = int(it.max()) + 1
    G = jobs.resp.shape[1]
    resp_sum = jobs.resp.sum(axis=1).astype(float)
    ctx_sum = G * jobs.prompt_length.astype(float) + resp_sum / 2.0
    tok = np.bincount(it, weights=resp_sum, minlength=n_it)
    ctx = np.bincount(it, weights=ctx_sum, minlength=n_it) / np.maximum(np.bincount(it, minlength=n_it) * G, 1)
    conc = np.full(n_it, float(max_num_seqs))
    if kv_capacity:
        # KV held per sequence: prefix caching holds a group's shared prompt blocks once
        kv_sum = ctx_sum - (G - 1) * cm.shared_prompt(jobs.prompt_length)
        kv_seq = np.bincount(it, weights=kv_sum, minlength=n_it) / np.maximum(np.bincount(it, minlength=n_it) * G, 1)
        conc = np.maximum(1.0, np.minimum(conc, kv_capacity / np.maximum(kv_seq, 1.0)))
    peak = cm.peak_throughput(conc, ctx)
    decode_s = tok / (num_instances * peak)
    tt = trainer_slots(mb_table["tokens"], mb_table["padded_tokens"], micro_batching)
    train_s = np.bincount(mb_table["iteration"].to_numpy(np.int64),
                          weights=train_per_token * tt + train_per_step, minlength=n_it)
    lat = np.zeros(n_it)
    np.maximum.at(lat, it, group_latencies(jobs.prompt_length, jobs.resp, cm))
    return iteration_lower_bounds(decode_s, train_s, lat, lag_bound)
