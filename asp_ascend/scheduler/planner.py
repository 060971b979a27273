"""The offline ASP planner and the baseline dispatch policies (DESIGN 4).

``plan(...)`` is a pure function of its inputs and a seed: it returns one epoch's
schedule (columns of DESIGN 6). Everything is vectorised with numpy so a million
prompts plan in well under a second.

ASP, jointly:

1. **Iterations keep the epoch's length mix and equal predicted work.** Prompts are
   sorted by predicted length and cut into ``B`` strata (B = global batch) of
   consecutive lengths; every iteration takes exactly one prompt from each stratum, so
   each iteration's length distribution is the epoch's quantiles (no curriculum). Within a
   stratum, the longest prompt goes to the iteration with the least predicted work so far
   (ties broken by a seeded shuffle), so iterations carry equal work: no iteration of
   all-short or all-long prompts, hence no bursts/droughts at the trainer (sorting bubble).
2. **Length-homogeneous mini-batches.** Within an iteration, prompts sorted by predicted
   length are cut into mini-batches of ``m`` (padding bubble); mini-batch 0 is the
   shortest, i.e. the first expected to complete.
3. **Balanced instances, long tail spread and started early.** Within each iteration,
   groups are placed longest-first on the least-loaded instance (LPT), a group's load being
   its work or, for a long-tail group, half its solo latency (so a host of a long tail gets
   less other work and decodes it at a lighter load); then each iteration's buckets are mapped to instances so that the heaviest
   bucket lands on the instance with the least cumulative work, keeping every window of
   the run balanced (skewness bubble). Each instance admits its share of an iteration
   longest first (``dispatch_rank``), iterations in order; a group whose solo latency
   exceeds the k + 1 iterations' worth of an instance's work that this order gives it is
   ranked up to k iterations earlier (``pull_forward_windows``), so it starts as early as its
   iteration becomes admissible (lag bound k) instead of behind the previous iteration's
   groups; every other group keeps its iteration's window, so an earlier iteration's groups
   are not delayed by later ones (the publish that admits the next window waits for them);
   never into the run's first window (``fill_first``): there no training runs yet, and a
   later group admitted ahead of one of iteration 0 delays the trainer's first step.

Baselines: ``fifo`` (dataset order, shared queue), ``random`` (seeded shuffle, shared
queue), ``sorted`` (ascending predicted length over the epoch, shared queue),
``balanced`` (fifo iterations, LPT placement, dataset order per instance).
For shared-queue policies ``instance`` holds the instance a least-loaded pull would
predictably give; the runtime lets instances pull from the shared queue instead.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..config.schema import SchedulerConfig
from .concentrate import concentrate_tail, drawn_lengths, iter_drawn_from_record, lower_chain
from . import first_iteration
from .cost import CostModel
from .membership import asp_iterations, gathered_strata, iteration_sizes, lightest_floor_first

POLICIES = ("asp", "fifo", "random", "sorted", "balanced")

# A baseline's dispatch order of an epoch's prompts; its iterations are consecutive slices of
# it. ``balanced`` keeps dataset order and differs in placement (longest first, least loaded).
BASELINE_ORDER = {
    "fifo": lambda pred, rng: np.arange(pred.shape[0]),
    "random": lambda pred, rng: rng.permutation(pred.shape[0]),
    "sorted": lambda pred, rng: np.argsort(pred, kind="stable"),  # ascending predicted length
    "balanced": lambda pred, rng: np.arange(pred.shape[0]),
}
assert set(BASELINE_ORDER) == set(POLICIES) - {"asp"}
SHARED_QUEUE = {"fifo": True, "random": True, "sorted": True, "balanced": False, "asp": False}


def _desc_order(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices by descending value, ties in a seeded random order.

    The sort must be stable: the seeded shuffle is what orders equal values (previous-epoch
    means repeat often), and numpy's default kind is unstable, with a tie order that depends
    on numpy's version and on the CPU's SIMD kernels -- another machine would plan another epoch."""
    perm = rng.permutation(values.shape[0])
    return perm[np.argsort(-values[perm], kind="stable")]


def _rank_of(order: np.ndarray) -> np.ndarray:
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return rank


def _place(iteration: np.ndarray, pick_rank: np.ndarray, work: np.ndarray, R: int, n_iter: int,
           carry: bool) -> np.ndarray:
    """Instance of each prompt. Within each iteration, prompts are taken in ``pick_rank``
    order (a permutation of 0..n-1) in rounds of R, each round's items going to the
    instances least loaded so far in that iteration (picked by descending work: LPT; in
    dataset order: what a least-loaded pull does). With ``carry``, each iteration's
    buckets are then mapped onto instances by cumulative load."""
    n = iteration.shape[0]
    if R == 1:
        return np.zeros(n, dtype=np.int64)
    idx = np.argsort(iteration * n + pick_rank)  # grouped by iteration, in pick order
    counts = np.bincount(iteration, minlength=n_iter)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(n) - np.repeat(starts, counts)
    width = int(counts.max())
    rounds = -(-width // R)
    W = np.zeros((n_iter, rounds * R))
    W[iteration[idx], pos] = work[idx]
    loads = np.zeros((n_iter, R))
    bucket = np.zeros((n_iter, rounds * R), dtype=np.int64)
    rows = np.arange(n_iter)[:, None]
    for q in range(rounds):
        items = W[:, q * R:(q + 1) * R]
        # the round's items, in pick order, go to the instances from least to most loaded
        inst = np.argsort(loads, axis=1, kind="stable")
        bucket[:, q * R:(q + 1) * R] = inst
        loads[rows, inst] += items  # inst is a permutation of each row: no repeats
    if carry:
        bucket = _carry(bucket, loads, R, n_iter)
    inst = np.empty(n, dtype=np.int64)
    inst[idx] = bucket[iteration[idx], pos]
    return inst


def _as_str_ids(ids) -> np.ndarray:
    a = np.asarray(ids)
    if a.dtype.kind == "U" or (a.dtype == object and (a.size == 0 or isinstance(a[0], str))):
        return a
    return a.astype(str)


def _lpt(iteration: np.ndarray, pick_rank: np.ndarray, load: np.ndarray, R: int, n_iter: int,
         carry: bool) -> np.ndarray:
    """Greedy LPT per iteration: prompts in ``pick_rank`` order (descending load), each to
    the instance with the least load so far in its iteration (counts may differ), all
    iterations at once; with ``carry``, buckets are then mapped by cumulative load."""
    n = iteration.shape[0]
    if R == 1:
        return np.zeros(n, dtype=np.int64)
    idx = np.argsort(iteration * n + pick_rank)
    counts = np.bincount(iteration, minlength=n_iter)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(n) - np.repeat(starts, counts)
    width = int(counts.max())
    Wm = np.zeros((n_iter, width))
    Wm[iteration[idx], pos] = load[idx]
    loads = np.zeros((n_iter, R))
    bucket = np.zeros((n_iter, width), dtype=np.int64)
    rows = np.arange(n_iter)
    for t in range(width):
        r = np.argmin(loads, axis=1)
        bucket[:, t] = r
        loads[rows, r] += Wm[:, t]
    if carry:
        bucket = _carry(bucket, loads, R, n_iter)
    inst = np.empty(n, dtype=np.int64)
    inst[idx] = bucket[iteration[idx], pos]
    return inst


def _carry(bucket: np.ndarray, loads: np.ndarray, R: int, n_iter: int) -> np.ndarray:
    """Map each iteration's buckets onto instances: heaviest bucket to the instance with the
    least cumulative load (every window of the run stays balanced)."""
    cum = np.zeros(R)
    mapping = np.empty((n_iter, R), dtype=np.int64)
    for i in range(n_iter):
        heavy_first = np.argsort(-loads[i], kind="stable")
        light_first = np.argsort(cum, kind="stable")
        mapping[i, heavy_first] = light_first
        cum[light_first] += loads[i, heavy_first]
    return np.take_along_axis(mapping, bucket, axis=1)


TAIL_WEIGHT = 0.5
# scheduler.relieve_first's default, whose one home is config/schema.py: the KS iteration 0's predicted
# lengths may move when it gives its predicted-longest groups to later iterations (scheduler/first_iteration.py)
RELIEVE_FIRST = SchedulerConfig.relieve_first
# scheduler.gather_top's default, whose one home is config/schema.py (scheduler/membership.py)
GATHER_TOP = SchedulerConfig.gather_top


def tail_aware_load(work: np.ndarray, solo_latency: np.ndarray) -> np.ndarray:
    """The load a group puts on its instance for placement: its work at full concurrency,
    or ``TAIL_WEIGHT`` x its solo latency when that is larger (a long-tail group)."""
    return np.maximum(work, TAIL_WEIGHT * solo_latency)


# scheduler.pull_forward's choices and default, whose one home is config/schema.py (pull_forward_windows)
PULL_FORWARD_RULES = tuple(SchedulerConfig.__dataclass_fields__["pull_forward"].metadata["choices"])
PULL_FORWARD = SchedulerConfig.pull_forward


def pull_forward_windows(lat: np.ndarray, period: float, k: int, rule: str = PULL_FORWARD) -> np.ndarray:
    """How many windows (0..k) each group is ranked ahead of its own iteration, from its predicted
    solo latency ``lat`` and the predicted period ``period`` (an instance's work per iteration).

    ``needed``: a group of iteration i ranked in its own window starts, at the latest, when the
    instances have admitted iteration i - 1 (strict iteration order, longest first within the
    window), and iteration i + k + 1 becomes admissible only once i has finished and is trained:
    between the two lie k + 1 periods of admitted work. A group whose latency fits in them finishes
    before the instances could run out of admissible work on its account, so pulling it forward only
    takes slots from iteration i - 1's groups and delays the publish that admits the next window
    (where rollout is throughput-bound, every window's slots then idle under the lag bound). A group
    longer than that lacks ceil(lat / period - (k + 1)) periods and is ranked that many windows
    earlier (at most k: the lag bound admits it no sooner).

    ``rounded`` (before 2026-12-04): a group whose latency rounds to j >= 1 periods is ranked
    min(j, k) windows earlier, i.e. every group longer than half a period."""
    p = max(period, 1e-12)
    if rule == "needed":
        return np.clip(np.ceil(lat / p - (k + 1) - 1e-9), 0, k).astype(np.int64)
    if rule == "rounded":
        return np.minimum(k, np.floor(lat / p + 0.5)).astype(np.int64)
    raise ValueError(f"unknown scheduler.pull_forward {rule!r}; valid: {', '.join(PULL_FORWARD_RULES)}")


def _chain_views(pred, plen, *, G, cost: CostModel, group_max_factor, max_len, forecasts, quality):
    """The views of the publish chain the membership's choices compare (``concentrate.lower_chain``):
    the predictions, and lengths drawn from the history's own forecasts and outcomes (``forecasts``,
    ``drawn_from_record``) or, given only a ``quality``, around the predictions as good as it says
    (``drawn_lengths``); None where neither is known or the predictions rank nothing (quality 0)."""
    q = forecasts.quality if forecasts is not None else quality
    if not q or q <= 0:
        return None
    cap = np.inf if max_len is None else max_len
    if forecasts is not None:
        draws = _DrawnChain(lambda: iter_drawn_from_record(pred, forecasts), plen, G, cost, group_max_factor, cap)
    else:
        draws = _DrawnChain(lambda: ((p, None) for p in drawn_lengths(pred, q)), plen, G, cost, group_max_factor, cap)
    return [[(cost.group_latency(plen, np.minimum(pred * group_max_factor, cap), G), G * (plen + pred))], draws]


class _DrawnChain:
    """A view of drawn lengths for ``concentrate.lower_chain``: (each group's longest sample alone, its
    tokens) per draw, computed as iterated (one draw's arrays at a time), every iteration the same draws."""

    def __init__(self, draws, plen, G, cost, group_max_factor, cap):
        self.draws, self.plen, self.G, self.cost, self.gmf, self.cap = draws, plen, G, cost, group_max_factor, cap

    def __iter__(self):
        for means, longest in self.draws():
            L = means * self.gmf if longest is None else longest
            yield self.cost.group_latency(self.plen, np.minimum(L, self.cap), self.G), self.G * (self.plen + means)


def _plan_asp(pred, plen, work, *, B, m, R, G, S, k, cost: CostModel, rng, n_iter, tail, group_max_factor,
              speculation=None, max_len=None, concentrate=0.0, relief=0.0, fill_first=False,
              pull_forward=PULL_FORWARD, membership="stratified", prediction_quality=None, gather_top=0.0,
              forecasts=None):
    """(iteration, mini_batch, instance, dispatch_order, room) of the ASP schedule."""
    n = pred.shape[0]
    by_len = _desc_order(pred, rng)
    len_rank = _rank_of(by_len)
    lat = cost.group_latency(plen, pred, G)
    # the floor is a group's longest sample: its mean x group_max_factor, capped
    longest = np.minimum(pred * group_max_factor, np.inf if max_len is None else max_len)
    views = None    # drawn only where a choice reads them (each draw is a pass over the epoch)
    if membership == "auto" or gathered_strata(gather_top, B):
        views = _chain_views(pred, plen, G=G, cost=cost, group_max_factor=group_max_factor, max_len=max_len,
                             forecasts=forecasts, quality=prediction_quality)
    iteration = asp_iterations(by_len, work, B, rng, latency=lat, views=views, m_mb=m, k=k, cost=cost, n_iter=n_iter,
                               gather_top=gather_top)
    if membership == "auto" and views is not None:    # opt-in: the dataset order's iterations (fifo's)
        # if their chain is 1 % lower on the predictions and on lengths drawn as the history says they come true
        dataset = lightest_floor_first(np.arange(n) // B, lat, n_iter, n % B != 0)
        iteration = lower_chain(iteration, dataset, views, m_mb=m, k=k, cost=cost, n_iter=n_iter)
    if concentrate > 0 and k >= 0:
        iteration = concentrate_tail(iteration, by_len, cost.group_latency(plen, longest, G), G * (plen + pred),
                                      B=B, m_mb=m, k=k, margin=concentrate,
                                      cost=cost, n_iter=n_iter, partial_last=n % B != 0)
    if relief > 0:
        iteration = first_iteration.relieve_first(iteration, by_len, longest, B=B,
                                                  margin=relief, n_iter=n_iter, partial_last=n % B != 0)
    counts = np.bincount(iteration, minlength=n_iter)
    n_mb = -(-counts // m)
    mini_batch = _mini_batches(iteration, pred + plen, counts, m, rng)
    room = np.zeros(n, dtype=np.int64)
    if tail in ("off", "reactive"):    # reactive: caps decided at run time (scheduler/tail_control.py)
        is_tail = np.zeros(n, dtype=bool)
        # a group holds its instance for at least part of its own latency: balancing on
        # max(work, latency / 2) gives the hosts of long-tail groups less other work
        eff = tail_aware_load(work, lat)
    else:
        is_tail, room, eff = _tail_rooms(iteration, pred, plen, work, n_mb, G=G, S=S, k=k, R=R, cost=cost,
                                         tail=tail, group_max_factor=group_max_factor, speculation=speculation,
                                         max_len=max_len)
        # a group without a room is placed as with tail=off: where nothing pays for a cap, auto plans as off
        eff = np.where(is_tail, eff, tail_aware_load(work, lat))
    instance = _lpt(iteration, _rank_of(_desc_order(eff, rng)), eff, R, n_iter, carry=True)
    # dispatch: a group whose generation spans more iterations' worth of an instance's work than
    # iteration order gives it (``pull_forward``; every tail) is pulled forward by up to k windows
    # (it still waits for its own admission version): long tails start as early as the lag bound
    # allows. Within a window, longest first.
    shift = np.zeros(n, dtype=np.int64)
    period = work.sum() / (R * n_iter)
    if k > 0 and n_iter > 1:
        shift = pull_forward_windows(lat, period, k, pull_forward)
        shift[is_tail] = k
        # fill_first: the first window is iteration 0's alone (nothing pulled into the pipeline fill)
        shift = np.minimum(shift, np.maximum(iteration - 1, 0) if fill_first else iteration)
    window = iteration - shift
    return iteration, mini_batch, instance, np.argsort(window * n + len_rank), room


def plan_tail_model(iteration, predicted_length, prompt_lengths, *, group_size: int, mini_batch_size: int,
                    num_instances: int, max_num_seqs: int, lag_bound: int, cost: CostModel,
                    group_max_factor: float = 1.0, speculation=None, max_response_length: float | None = None):
    """The ``TailModel`` (scheduler/tail.py) asp's planner decides tails and rooms with
    (``rollout.tail_concurrency``) for one epoch's schedule: ``iteration`` per prompt (the
    schedule's column, any offset), the predictions and prompt lengths it was planned from, and
    ``plan``'s arguments of the same names. Whatever ``tail`` the plan ran with, this is the model
    ``auto`` consults (its periods, batches, latencies)."""
    it = np.asarray(iteration, dtype=np.int64)
    pred = np.asarray(predicted_length, dtype=np.float64)
    plen = np.asarray(prompt_lengths, dtype=np.float64)
    n_mb = -(-np.bincount(it - it.min()) // mini_batch_size)
    work = group_size * cost.work(plen, pred, max_num_seqs, group_size)
    return _tail_model(it, pred, plen, work, n_mb, G=group_size, S=max_num_seqs, k=lag_bound, R=num_instances,
                       cost=cost, group_max_factor=group_max_factor, speculation=speculation,
                       max_len=max_response_length)[0]


def _tail_model(iteration, pred, plen, work, n_mb, *, G, S, k, R, cost: CostModel, group_max_factor,
                speculation=None, max_len=None):
    """(the plan's TailModel, each group's expected longest sample)."""
    from .tail import TailModel, iteration_loads

    L = np.minimum(pred * group_max_factor, np.inf if max_len is None else max_len)
    tokens = np.bincount(iteration - iteration.min(), weights=G * (plen + pred), minlength=n_mb.size)
    train = cost.train_time(tokens, n_mb) + cost.sync_s
    tm = TailModel(cost, group_size=G, max_num_seqs=S, lag_bound=k, num_instances=R, speculation=speculation)
    tm = TailModel(cost, group_size=G, max_num_seqs=S, lag_bound=k, num_instances=R, speculation=speculation,
                   loads=iteration_loads(iteration, plen, L, work, train, tail_model=tm))
    return tm, L


def _tail_rooms(iteration, pred, plen, work, n_mb, *, G, S, k, R, cost: CostModel, tail, group_max_factor,
                speculation=None, max_len=None):
    """(is_tail, room, placement load) per group (scheduler/tail.py decides)."""
    tm, L = _tail_model(iteration, pred, plen, work, n_mb, G=G, S=S, k=k, R=R, cost=cost,
                        group_max_factor=group_max_factor, speculation=speculation, max_len=max_len)
    ctx = tm.loads.context[iteration]
    target = np.array([tm.target(i) for i in range(n_mb.size)])[iteration]
    # uncapped, a group runs beside the sequences an instance holds at the target's period (TailModel.batch)
    batch = np.array([tm.target_batch(i) for i in range(n_mb.size)])[iteration]
    is_tail = tm.latency(L, plen, batch, ctx) > target * (1.0 + 1e-9)
    room = np.zeros(iteration.shape[0], dtype=np.int64)
    eff = work.copy()
    g = np.flatnonzero(is_tail)
    Lt, pt, ct = L[g], plen[g], ctx[g]
    if tail == "auto":  # TailModel.room for every tail at once: the largest room meeting the target
        lat = tm.latency(Lt[:, None], pt[:, None], np.minimum(tm.rooms[None, :], batch[g][:, None]), ct[:, None])
        ok = lat <= target[g][:, None] * (1.0 + 1e-9)
        last = tm.rooms.size - 1 - np.argmax(ok[:, ::-1], axis=1)
        n = np.where(ok.any(axis=1), tm.rooms[last], float(G)).astype(np.int64)
    else:
        n = np.full(g.size, min(int(tail), S), dtype=np.int64)
    room[g] = np.where(n < S, n, 0)
    # the capacity its instance gives up while it runs, this window's share of it
    lat = tm.latency(Lt, pt, n, ct)
    lost = lat * (1.0 - tm.throughput(n, ct) / tm.throughput(S, ct))
    eff[g] += lost / (k + 1)
    return is_tail, room, eff


def _mini_batches(iteration, seq_len, counts, m, rng) -> np.ndarray:
    """Mini-batch of each group: by predicted sequence length (prompt + response: what a
    padded micro-batch pays for), longest first inside the iteration; mini-batch 0 is the
    shortest (the first expected to complete)."""
    n = iteration.shape[0]
    seq_rank = _rank_of(_desc_order(seq_len, rng))
    desc = np.argsort(iteration * n + seq_rank)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_desc = np.empty(n, dtype=np.int64)
    rank_desc[desc] = np.arange(n) - np.repeat(starts, counts)
    n_mb = -(-counts // m)
    return n_mb[iteration] - 1 - rank_desc // m

def plan(prompt_ids, predicted_length, prompt_lengths=None, *, policy: str = "asp", group_size: int = 8,
         global_batch_size: int = 64, mini_batch_size: int = 16, num_instances: int = 2, max_num_seqs: int = 64,
         lag_bound: int = 1, cost: CostModel | None = None, epoch: int = 0, iteration_offset: int = 0,
         seed: int = 0, tail="off", group_max_factor: float = 1.0, speculation=None,
         max_response_length: float | None = None, concentrate_tail: float = 0.0,
         relieve_first: float = RELIEVE_FIRST, fill_first: bool = True,
         pull_forward: str = PULL_FORWARD, membership: str = "stratified",
         prediction_quality: float | None = None, gather_top: float = GATHER_TOP,
         forecasts=None) -> pd.DataFrame:
    """One epoch's schedule (DESIGN 6 columns plus ``room``). Deterministic for ``seed`` and ``epoch``.

    ``tail`` (asp; ``rollout.tail_concurrency``): ``off``, ``auto`` or a number of sequences;
    ``room`` is then, per group, the sequences its instance may hold while it runs (0: no cap).
    ``cost`` also times the trainer (``train_time`` + ``sync_s``) for the tail decisions;
    ``group_max_factor`` = expected longest sample of a group / its mean (capped at
    ``max_response_length``); ``speculation`` (a
    ``speculative.Speculation``) the instances' speculative decoding, if any; ``pull_forward``
    (``scheduler.pull_forward``) which groups are ranked ahead of their iteration
    (``pull_forward_windows``); ``membership`` (``scheduler.membership``) asp's iterations: stratified,
    or (``auto``) stratified unless the dataset order's have a lower publish chain (``lower_chain``) on the
    predictions and on lengths drawn around them as good as ``prediction_quality`` says (``drawn_lengths``;
    lengths/predictors.prediction_quality; None, unknown: auto keeps stratified); ``gather_top``
    (``scheduler.gather_top``) the KS the top strata may move an iteration's predicted lengths when they are
    dealt in predicted-length order (scheduler/membership.py)."""
    cols = plan_columns(predicted_length, prompt_lengths, policy=policy, group_size=group_size,
                        global_batch_size=global_batch_size, mini_batch_size=mini_batch_size,
                        num_instances=num_instances, max_num_seqs=max_num_seqs, lag_bound=lag_bound, cost=cost,
                        epoch=epoch, iteration_offset=iteration_offset, seed=seed, tail=tail,
                        group_max_factor=group_max_factor, speculation=speculation,
                        max_response_length=max_response_length, concentrate_tail=concentrate_tail,
                        relieve_first=relieve_first, fill_first=fill_first, pull_forward=pull_forward,
                        membership=membership, prediction_quality=prediction_quality, gather_top=gather_top,
                        forecasts=forecasts)
    return schedule_frame(cols, prompt_ids)


def schedule_frame(cols: dict, prompt_ids) -> pd.DataFrame:
    """The schedule DataFrame (DESIGN 6 column order) of ``plan_columns`` output and its prompt ids."""
    ids = _as_str_ids(prompt_ids)
    if len(ids) != len(cols["epoch"]):
        raise ValueError(f"{len(ids)} prompt ids for a schedule of {len(cols['epoch'])} rows")
    return pd.DataFrame({"epoch": cols["epoch"], "prompt_id": ids,
                         **{k: cols[k] for k in ("iteration", "mini_batch", "instance", "dispatch_rank",
                                                 "predicted_length", "room")}})


def plan_columns(predicted_length, prompt_lengths=None, *, policy: str = "asp", group_size: int = 8,
                 global_batch_size: int = 64, mini_batch_size: int = 16, num_instances: int = 2,
                 max_num_seqs: int = 64, lag_bound: int = 1, cost: CostModel | None = None, epoch: int = 0,
                 iteration_offset: int = 0, seed: int = 0, tail="off", group_max_factor: float = 1.0,
                 speculation=None, max_response_length: float | None = None,
                 concentrate_tail: float = 0.0, relieve_first: float = RELIEVE_FIRST,
                 fill_first: bool = True, pull_forward: str = PULL_FORWARD,
                 membership: str = "stratified", prediction_quality: float | None = None,
                 gather_top: float = GATHER_TOP, forecasts=None) -> dict[str, np.ndarray]:
    """``plan`` as numpy columns, one row per prompt in input order, without the prompt ids
    (building a string column costs more than planning the baselines of a report)."""
    from ..config import parse_tail_concurrency

    tail = parse_tail_concurrency(tail)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    pred = np.asarray(predicted_length, dtype=np.float64)
    n = pred.shape[0]
    if n == 0:
        raise ValueError("no prompts to schedule")
    if pull_forward not in PULL_FORWARD_RULES:
        raise ValueError(f"unknown scheduler.pull_forward {pull_forward!r}; valid: {', '.join(PULL_FORWARD_RULES)}")
    if membership not in ("auto", "stratified"):
        raise ValueError(f"unknown scheduler.membership {membership!r}; valid: auto, stratified")
    if global_batch_size % mini_batch_size:
        raise ValueError(f"mini_batch_size {mini_batch_size} does not divide global_batch_size {global_batch_size}")
    cost = cost or CostModel()
    plen = np.zeros(n) if prompt_lengths is None else np.asarray(prompt_lengths, dtype=np.float64)
    B, m, R, G = global_batch_size, mini_batch_size, num_instances, group_size
    rng = np.random.default_rng([seed, epoch, 104729])
    work = G * cost.work(plen, pred, max_num_seqs, G)
    sizes = iteration_sizes(n, B)
    n_iter = sizes.size

    room = np.zeros(n, dtype=np.int64)
    if policy == "balanced":
        work_rank = _rank_of(_desc_order(work, rng))
    if policy == "asp":
        iteration, mini_batch, instance, dispatch_order, room = _plan_asp(
            pred, plen, work, B=B, m=m, R=R, G=G, S=max_num_seqs, k=lag_bound, cost=cost, rng=rng, n_iter=n_iter,
            tail=tail, group_max_factor=group_max_factor, speculation=speculation, max_len=max_response_length,
            concentrate=concentrate_tail,
            # only the run's first iteration fills the pipeline: a later epoch's first iteration follows
            # the previous epoch's last one (scheduler/first_iteration.py)
            relief=relieve_first if iteration_offset == 0 else 0.0, fill_first=fill_first and iteration_offset == 0,
            pull_forward=pull_forward, membership=membership, prediction_quality=prediction_quality,
            gather_top=gather_top, forecasts=forecasts)
    else:
        order = BASELINE_ORDER[policy](pred, rng)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        iteration = position // B
        mini_batch = (position % B) // m
        pick = work_rank if policy == "balanced" else position
        instance = _place(iteration, pick, work, R, n_iter, carry=False)
        dispatch_order = order
    dispatch_rank = np.empty(n, dtype=np.int64)
    dispatch_rank[dispatch_order] = np.arange(n)
    return {
        "epoch": np.full(n, epoch, dtype=np.int64),
        "iteration": iteration.astype(np.int64) + iteration_offset,
        "mini_batch": mini_batch.astype(np.int64),
        "instance": instance.astype(np.int64),
        "dispatch_rank": dispatch_rank,
        "predicted_length": pred.astype(np.float32),
        "room": room.astype(np.int64),
    }
