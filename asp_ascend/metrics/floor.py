"""Where an iteration's time goes beside its lag floor (DESIGN 5's third term, DESIGN 9).

With lag bound k, iteration i's groups may start once version i - k is published (``V_{i-k}``,
0 for i <= k) and the trainer publishes version i + 1 (``V_{i+1}``) only after i's last group
has finished. So over the k + 1 periods from ``V_{i-k}`` to ``V_{i+1}``::

    V_{i+1} - V_{i-k} = wait + latency + after

with, for the group of i that finished last (the *critical* group): ``wait`` = its admission
(first sample) - ``V_{i-k}``, ``latency`` = its last sample's finish - its admission, ``after`` =
``V_{i+1}`` - that finish (the trainer's optimizer steps after it, and the weight sync). The
floor of those k + 1 periods is the longest group's latency alone (``solo``), so
``latency - solo`` of the critical group is what running beside other sequences cost it, and
``wait`` and ``after`` are the rest. :func:`floor_breakdown` gives these per iteration from a
run's timeline (simulated or real) and each group's latency alone (the cost model's
``group_latency_exact``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ("iteration", "allowed", "floor_group_solo", "floor_group_latency", "floor_group_wait",
           "critical_solo", "critical_latency", "critical_wait", "critical_is_floor_group",
           "critical_beside", "last_finish", "published", "after", "window")


def group_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (epoch, prompt_id) group of a request frame: iteration, instance, admission (its
    first sample's), finish (its last sample's), and its samples' response lengths by sample."""
    r = requests.sort_values(["epoch", "prompt_id", "sample"], kind="stable")
    g = r.groupby(["epoch", "prompt_id"], sort=False)
    out = g.agg(iteration=("iteration", "first"), instance=("instance", "first"), t_admit=("t_admit", "min"),
                t_finish=("t_finish", "max"), prompt_length=("prompt_length", "first"))
    out["response_lengths"] = g["response_length"].agg(list)
    return out


def beside(requests: pd.DataFrame, instance: int, t0: float, t1: float, exclude: tuple) -> float:
    """Mean number of sequences other than group ``exclude`` (epoch, prompt_id) that ``instance``
    ran between ``t0`` and ``t1`` (each sequence counted from its admission to its finish)."""
    if t1 <= t0:
        return 0.0
    r = requests[(requests["instance"] == instance) & (requests["t_admit"] < t1) & (requests["t_finish"] > t0)]
    r = r[~((r["epoch"] == exclude[0]) & (r["prompt_id"] == exclude[1]))]
    overlap = (np.minimum(r["t_finish"].to_numpy(float), t1) - np.maximum(r["t_admit"].to_numpy(float), t0))
    return float(np.clip(overlap, 0.0, None).sum() / (t1 - t0))


def floor_breakdown(requests: pd.DataFrame, syncs: pd.DataFrame, solo: pd.Series, lag_bound: int) -> pd.DataFrame:
    """Per iteration (module docstring): ``allowed`` = V_{i-k}; the floor-setting group (longest
    ``solo``): its solo latency, its latency in the run and its wait after ``allowed``; the
    critical group (the last to finish): the same three, whether it is the floor-setting group
    and ``critical_beside`` (mean sequences its instance ran beside it); ``last_finish``;
    ``published`` = V_{i+1}; ``after`` = published - last_finish; ``window`` = published -
    allowed (k + 1 periods in a steady pipeline). ``solo``: each group's latency alone, indexed
    by (epoch, prompt_id). Iterations without a publish are left out."""
    k = int(lag_bound)
    if k < 0:
        raise ValueError(f"lag_bound must be >= 0, got {lag_bound}")
    g = group_table(requests)
    missing = g.index.difference(solo.index)
    if len(missing):
        raise ValueError(f"solo latency missing for {len(missing)} groups, e.g. {missing[0]}")
    g["solo"] = solo.reindex(g.index).to_numpy(float)
    pub = dict(zip(syncs["version"].astype(int), syncs["t_end"].astype(float)))
    rows = []
    for i, gi in g.groupby("iteration", sort=True):
        i = int(i)
        if i + 1 not in pub:
            continue
        allowed = pub.get(i - k, 0.0) if i - k > 0 else 0.0
        fg = gi["solo"].idxmax()
        cg = gi["t_finish"].idxmax()
        f, c = gi.loc[fg], gi.loc[cg]
        last = float(c["t_finish"])
        rows.append((i, allowed, float(f["solo"]), float(f["t_finish"] - f["t_admit"]), float(f["t_admit"] - allowed),
                     float(c["solo"]), float(c["t_finish"] - c["t_admit"]), float(c["t_admit"] - allowed), fg == cg,
                     beside(requests, int(c["instance"]), float(c["t_admit"]), last, cg),
                     last, pub[i + 1], pub[i + 1] - last, pub[i + 1] - allowed))
    return pd.DataFrame(rows, columns=list(COLUMNS))


LAST_STEP_COLUMNS = ("iteration", "steps", "left_at_last_but_one", "last_groups", "last_step_s", "last_tokens_share")


def last_steps(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per iteration with at least two optimizer steps, what its last step could hold (why
    ``pipeline.regroup_heavy`` can or cannot lighten it): ``left_at_last_but_one`` = the
    iteration's groups whose last sample finished after its last-but-one step began (a streamed
    step's ``t_first``, else ``t_start``): none of them can be in an earlier step, so when it equals
    ``last_groups`` (the last step's groups: every step of an iteration holds
    ``train.mini_batch_size`` of them) the last step is exactly the groups generated last and
    no choice among generated groups changes it; ``last_step_s`` = the trainer's seconds on the last
    step (``t_end - t_start``); ``last_tokens_share`` = its tokens / the mean tokens of the
    iteration's steps. ``steps``: the timeline's ``step`` frame (``iteration``, ``t_start``,
    ``t_end``, ``tokens``, optionally ``t_first``); ``requests``: its ``request`` frame (the
    trained iteration)."""
    g = group_table(requests)
    fin = g.groupby("iteration")["t_finish"].apply(lambda s: np.sort(s.to_numpy(float)))
    size = g.groupby("iteration").size()
    began = steps["t_start"].astype(float)
    if "t_first" in steps:
        began = steps["t_first"].astype(float).fillna(began)
    st = steps.assign(began=began).sort_values(["iteration", "t_end"], kind="stable")
    rows = []
    for i, s in st.groupby("iteration", sort=True):
        i = int(i)
        if len(s) < 2 or i not in fin.index:
            continue
        prev, last = s.iloc[-2], s.iloc[-1]
        f = fin.loc[i]
        left = int(f.size - np.searchsorted(f, float(prev["began"]), side="right"))
        rows.append((i, len(s), left, int(size.loc[i]) // len(s), float(last["t_end"] - last["t_start"]),
                     float(last["tokens"] / s["tokens"].mean())))
    return pd.DataFrame(rows, columns=list(LAST_STEP_COLUMNS))


def publish_floor(busy, floor, lag_bound: int, fill: float = 0.0) -> np.ndarray:
    """The earliest publish times V_1 .. V_n any run of these n iterations could reach, whatever its
    dispatch order and mini-batches (the iterations' membership fixed): the trainer trains iteration i
    only once it holds version i and publishes i + 1 after it, and i's longest group starts no earlier
    than V_{i-k} (0 for i <= k), so::

        V_{i+1} >= V_i + busy_i          (V_0 = fill)
        V_{i+1} >= V_{i-k} + floor_i

    ``busy[i]``: the trainer's seconds on iteration i (its optimizer steps and the weight sync that
    publishes i + 1); ``floor[i]``: at least i's longest group alone plus that sync; ``fill``: the
    seconds before the trainer can begin iteration 0 (at least its shortest group alone). V_n / n
    bounds the mean iteration time from below more tightly than DESIGN 5's sum of LB_i / n, which
    prices each iteration's floor in full even where the trainer's slack beside it absorbs part."""
    busy = np.asarray(busy, dtype=float)
    floor = np.asarray(floor, dtype=float)
    k = int(lag_bound)
    if k < 0:
        raise ValueError(f"lag_bound must be >= 0, got {lag_bound}")
    if busy.shape != floor.shape or busy.ndim != 1:
        raise ValueError(f"busy and floor must be 1-D of one length (one entry per iteration), got shapes "
                         f"{busy.shape} and {floor.shape}")
    V = np.zeros(busy.size + 1)
    V[0] = fill
    for i in range(busy.size):
        V[i + 1] = max(V[i] + busy[i], (V[i - k] if i - k > 0 else 0.0) + floor[i])
    return V[1:]


def publish_floor_orders(busy, floor, lag_bound: int, orders, fill: float = 0.0) -> np.ndarray:
    """The last publish :func:`publish_floor` allows for each order of the same iterations: ``orders``
    is a sequence of permutations of 0 .. n-1 (order[j] = the iteration placed j-th), each run with
    the busy times and floors of the iterations it places, ``fill`` unchanged. The iterations keep
    their membership; only which come together within k + 1 periods changes: floors of iterations
    at most k apart overlap (they are generated together), floors further apart add up. So the
    spread over random orders is what the order alone decides, e.g. a plan that draws its order
    from a seed (docs/scheduler.md, "Where a step costs 10x: the order of the iterations")."""
    busy = np.asarray(busy, dtype=float)
    floor = np.asarray(floor, dtype=float)
    out = []
    for order in orders:
        o = np.asarray(order, dtype=np.int64)
        if o.shape != busy.shape or not np.array_equal(np.sort(o), np.arange(busy.size)):
            raise ValueError(f"an order must be a permutation of the {busy.size} iterations, got {o.tolist()}")
        out.append(publish_floor(busy[o], floor[o], lag_bound, fill)[-1] if o.size else fill)
    return np.asarray(out, dtype=float)


CORUN_COLUMNS = ("iteration", "instance", "latency", "on_instance", "previous", "same", "next", "prefill", "even")


def corunning(requests: pd.DataFrame, decode_b: float, decode_c: float, num_instances: int,
              prefill_per_token: float = 0.0, prefill_tokens=None) -> pd.DataFrame:
    """What the other sequences cost each iteration's critical (last-finishing) group, in seconds.

    A decode step costs ``a + c * n + b * context`` (scheduler/cost.py), and every sequence running
    gets one token per step, so each token another sequence generates on the critical group's
    instance while that group runs adds ``c + b * its context`` to the group's latency: what
    running beside other sequences cost it is the sum over those tokens (its latency minus its
    latency alone, ``floor_breakdown``'s terms, up to preemption). Per iteration: ``on_instance``,
    that sum plus ``prefill``; the sum split by the other sequence's iteration against the critical
    group's (``previous`` = earlier, ``same``, ``next`` = later); ``prefill``, what the prompts of
    the other sequences that started on its instance in that window cost (``prefill_per_token`` x
    the prompt tokens each prefills: an instance prefills the sequences it starts before their
    next step, stalling the ones it runs; included in ``on_instance``; ``prefill_tokens``, one
    value per request, defaults to each whole prompt; with vLLM's prefix caching a sample of a
    group prefills only its share, ``CostModel.prefill_share``); ``even``, the same sums over every
    instance in that window divided by ``num_instances``: what the group
    would pay if the window's other tokens were spread evenly over the instances, whichever held
    it. A dispatch that cannot tell the critical group from the others while it runs pays about
    ``even``; only one that moves other tokens off the critical group's instance pays less.
    Tokens are spread evenly over a sequence's life (first token to finish: the frame has no
    per-step times), so a sequence running across the window's edges counts its share.
    ``requests``: the timeline's ``request`` frame (``t_first_token``, else ``t_admit``, is when a
    sequence started)."""
    r = requests
    if num_instances < 1:
        raise ValueError(f"num_instances must be >= 1, got {num_instances}")
    t_admit = r["t_admit"].to_numpy(float)
    start = r["t_first_token"].to_numpy(float) if "t_first_token" in r else t_admit.copy()
    start = np.where(np.isfinite(start) & (start > 0), start, t_admit)
    fin = r["t_finish"].to_numpy(float)
    L = r["response_length"].to_numpy(float)
    p = r["prompt_length"].to_numpy(float)
    pf = p if prefill_tokens is None else np.asarray(prefill_tokens, dtype=float)
    if pf.shape != p.shape:
        raise ValueError(f"prefill_tokens: {pf.shape[0] if pf.ndim else 'a scalar'} values for {p.shape[0]} "
                         f"requests; give one per request (the request frame's rows)")
    dur = np.maximum(fin - start, 1e-12)
    it = r["iteration"].to_numpy(np.int64)
    inst = r["instance"].to_numpy(np.int64)
    g = group_table(r)
    rows = []
    for i, gi in g.groupby("iteration", sort=True):
        key = gi["t_finish"].idxmax()
        c = gi.loc[key]
        t0, t1 = float(c["t_admit"]), float(c["t_finish"])
        own = (r["epoch"].to_numpy() == key[0]) & (r["prompt_id"].to_numpy() == key[1])
        k0 = np.clip((np.maximum(start, t0) - start) / dur, 0.0, 1.0) * L
        k1 = np.clip((np.minimum(fin, t1) - start) / dur, 0.0, 1.0) * L
        n = np.clip(k1 - k0, 0.0, None)
        cost = np.where(own, 0.0, n * (decode_c + decode_b * (p + (k0 + k1) / 2.0)))
        pre = np.where(~own & (start >= t0) & (start < t1), prefill_per_token * pf, 0.0)
        here = inst == int(c["instance"])
        rel = np.sign(it - int(i))
        rows.append((int(i), int(c["instance"]), t1 - t0, float(cost[here].sum() + pre[here].sum()),
                     float(cost[here & (rel < 0)].sum()), float(cost[here & (rel == 0)].sum()),
                     float(cost[here & (rel > 0)].sum()), float(pre[here].sum()),
                     float(cost.sum() + pre.sum()) / num_instances))
    return pd.DataFrame(rows, columns=list(CORUN_COLUMNS))
