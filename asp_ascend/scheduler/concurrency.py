"""ASP's admission concurrency: how many sequences the dispatcher keeps admitted per instance.

A decode step costs ``a + b * C + c * n`` (scheduler/cost.py): every sequence running beside an
iteration's longest group slows that group down, and with lag bound k the longest group's latency
/ (k + 1) is the floor of an iteration (DESIGN 9). Where the instances have more decode capacity
than the run can use (the trainer or that floor sets the period, not the decode work), admitting
every admissible group at once only slows the tail: the instances fill up when a version makes a
whole iteration admissible, then idle, lag-blocked. ``scheduler.concurrency: auto`` has the planner
pick, offline from the predicted lengths, the fewest sequences per instance ``n`` (a multiple of
G, at most ``rollout.max_num_seqs``) whose throughput still generates ``MARGIN`` times an
iteration's predicted decode work within the iteration's predicted period::

    R * n / t_step(n, n * ctx) * P  >=  MARGIN * decode tokens per iteration
    P = max(trainer time per iteration + sync, longest group's solo latency / (k + 1))

P is DESIGN 5's per-iteration lower bound without its decode term (the period the run cannot go
below whatever the instances do); ``ctx`` is the mean context of a running sequence (prompt + half
its response); the longest group of an iteration is the mean over the epoch's ``n_iter`` longest
groups (ASP's stratified iterations hold one of them each). The margin covers what the average
hides: work arrives in bursts (a whole iteration becomes admissible at each sync) and long groups
hold their slots. ``full`` keeps ``rollout.max_num_seqs`` (what the engine would run). Nothing
learned changes: the same groups, iterations and lag; only how many run at once.

``full`` is the default: the cap is only as good as the cost coefficients it is chosen from. Where
the true per-step cost is 10x the planned one, a small cap starves the instances (docs/scheduler.md,
"Should `auto` be asp's default?": the conversation trace at 32 devices goes from 1.2 % ahead of a
shared FIFO queue to 7.1 % behind), so ``auto`` is for cost models calibrated on the deployment.
"""
from __future__ import annotations

import numpy as np

from .cost import CostModel
from .microbatch import PACKED_TOKEN_COST

MARGIN = 2.0
MODES = ("full", "auto")


def admission_concurrency(pred, plen, *, group_size: int, global_batch_size: int, mini_batch_size: int,
                          num_instances: int, max_num_seqs: int, lag_bound: int, cost: CostModel,
                          group_max_factor: float = 1.0, max_response_length: float | None = None,
                          packed: bool = True, margin: float = MARGIN) -> int:
    """Sequences per instance the dispatcher admits (see the module docstring); ``pred``/``plen``:
    per prompt predicted mean response length and prompt length; ``packed``: the trainer packs
    (PACKED_TOKEN_COST per token) rather than pads (then the estimate of P is a lower one: the
    choice only gets more conservative)."""
    G, S, R = int(group_size), int(max_num_seqs), int(num_instances)
    pred = np.asarray(pred, dtype=float)
    plen = np.asarray(plen, dtype=float)
    n = pred.size
    if n == 0 or S <= G:
        return S
    n_iter = max(1, -(-n // int(global_batch_size)))
    B = n / n_iter
    tokens = G * B * float(np.mean(pred))                        # decode tokens per iteration
    slots = G * B * float(np.mean(pred + plen)) * (PACKED_TOKEN_COST if packed else 1.0)
    steps = -(-int(round(B)) // int(mini_batch_size))
    train = float(cost.train_time(slots, steps)) + cost.sync_s
    longest = np.minimum(pred * group_max_factor, np.inf if max_response_length is None else max_response_length)
    lat = np.sort(np.asarray(cost.group_latency(plen, longest, G), dtype=float))[::-1][:n_iter]
    period = max(train, float(lat.mean()) / (int(lag_bound) + 1))
    ctx = float(np.mean(plen + pred / 2.0))
    for m in range(2 * G, S, G):   # at least two groups per instance
        if R * m / float(cost.step(m, m * ctx)) * period >= margin * tokens:
            return m
    return S


def configured_concurrency(cfg, pred, plen, *, group_size: int, num_instances: int, max_num_seqs: int,
                           lag_bound: int, cost: CostModel, group_max_factor: float, packed: bool) -> int:
    """asp's admission concurrency under ``cfg`` (``scheduler.concurrency``): ``max_num_seqs`` for
    ``full``, else :func:`admission_concurrency` with the run's batch sizes and response cap.
    ``asp schedule`` (scheduler/run.py) and ``asp simulate`` (sim/run.py) both call this; they pass
    what differs between them (instances, concurrency, costs of the system they plan for)."""
    if cfg.scheduler.concurrency != "auto":
        return int(max_num_seqs)
    t = cfg.train
    return admission_concurrency(pred, plen, group_size=group_size, global_batch_size=t.global_batch_size,
                                 mini_batch_size=t.mini_batch_size, num_instances=num_instances,
                                 max_num_seqs=max_num_seqs, lag_bound=lag_bound, cost=cost,
                                 group_max_factor=group_max_factor,
                                 max_response_length=cfg.lengths.max_response_length, packed=packed)
