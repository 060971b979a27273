"""Per-iteration lower bounds LB_i of a real run, for ``lower_bound_ratio`` (DESIGN 5).

The rollout terms need the instance's peak throughput and a group's solo latency, which a
real run does not observe directly: they come from the cost model fitted to the run's own
timeline (:func:`asp_ascend.sim.calibrate.fit_timeline`, the ``asp simulate --calibrate``
fit) and the simulator's exact group-latency formula. The trainer term is the measured
optimizer-step time of the iteration. The combination is the shared
:func:`~asp_ascend.metrics.bubbles.iteration_lower_bounds`.
"""
from __future__ import annotations

import numpy as np


def run_lower_bounds(timeline, cfg, lag_bound: int) -> np.ndarray:
    from ..metrics.bubbles import iteration_lower_bounds
    from ..scheduler.cost import CostModel
    from ..sim.bounds import group_latencies
    from ..sim.calibrate import fit_timeline

    from ..config import prefix_block_of

    fit = fit_timeline(timeline, prefix_block=prefix_block_of(cfg))
    cm = CostModel(decode_a=fit["decode_a"], decode_b=fit["decode_b"], decode_c=fit["decode_c"],
                   prefill_per_token=fit.get("prefill_per_token") or 0.0,
                   prefix_block=int(fit.get("prefix_block") or 0))
    req = timeline.frame("request")
    steps = timeline.frame("step")
    n_it = int(req["iteration"].max()) + 1
    it0 = int(req["iteration"].min())
    R, S = cfg.rollout.num_instances, cfg.rollout.max_num_seqs
    decode_s, train_s, lat = np.zeros(n_it), np.zeros(n_it), np.zeros(n_it)
    for i, g in req.groupby("iteration"):
        ctx = float((g["prompt_length"] + g["response_length"] / 2).mean())
        decode_s[i] = g["response_length"].sum() / (R * cm.peak_throughput(S, ctx))
        groups = g.sort_values("sample").groupby(["epoch", "prompt_id"])
        resp = np.stack([x["response_length"].to_numpy(float) for _, x in groups])
        plen = np.asarray([x["prompt_length"].iloc[0] for _, x in groups], dtype=float)
        lat[i] = group_latencies(plen, resp, cm).max()
    if not steps.empty:
        np.add.at(train_s, steps["iteration"].to_numpy(int), (steps["t_end"] - steps["t_start"]).to_numpy(float))
    return iteration_lower_bounds(decode_s[it0:], train_s[it0:], lat[it0:], lag_bound)
