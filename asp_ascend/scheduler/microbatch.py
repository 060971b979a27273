"""Micro-batch planning for one optimizer step: token budget, least padding, balanced ranks.

A pure function of the step's sequence lengths (prompt + response tokens), shared by the
trainer (``engines/``) and the simulator, so both cut micro-batches by the same rule.

The memory unit is a **token budget** ``B`` per micro-batch, counted in the token slots the
trainer computes on: ``count x longest`` for a padded micro-batch, ``sum of lengths`` for a
packed one. A sequence longer than ``B`` forms a micro-batch of its own (it must be trained).

Modes (``train.micro_batching``):

- ``padded``: arrival order; a micro-batch closes when the next sequence would take it over
  the budget (or past ``max_seqs`` sequences). The historical behaviour.
- ``sorted``: the same cut over the sequences sorted by length (longest first), so each
  micro-batch holds sequences of similar length: far less padding at the same budget.
- ``packed``: no padding at all (the sequences of a micro-batch are concatenated into one
  row): the fewest micro-batches the budget allows, ``n = ceil(total / B)``, filled
  longest-first onto the lightest micro-batch (LPT), one more micro-batch while any exceeds
  ``B``. LPT keeps them within one sequence of each other (max - min <= longest sequence).

Balanced ranks (``world > 1``, data-parallel trainer ranks that meet at every micro-batch's
collectives): every rank gets the **same number** of micro-batches and nearly equal work.
``packed`` plans ``world x m`` micro-batches at once (m = ceil(total / (world x B))), the
others split their heaviest micro-batch until the count divides by ``world``; then the
micro-batches are partitioned over the ranks with equal counts by Karmarkar-Karp's largest
differencing method (sorted chunks of ``world``, the two partial solutions with the largest
spread merged heaviest-to-lightest). A merge never widens the spread, so the ranks' slot totals
differ by at most (heaviest - lightest micro-batch), i.e. at most one sequence for ``packed``.
Each rank runs its micro-batches heaviest first, so pass j has similar work on every rank.
Fewer splittable sequences than ranks is the one case with unequal counts: the trainer then
runs empty passes on the short ranks.

Left out: a quadratic attention term in the workload (slots are the cost; with varlen
attention the quadratic part is sum L^2 per sequence, the same however they are grouped).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MODES = ("padded", "sorted", "packed")

# What one packed token costs the trainer, in padded token slots: padded and sorted micro-batches
# pay train_per_token per slot (pads included), packed ones PACKED_TOKEN_COST x train_per_token
# per real token. Measured by benchmarks/bench_packing.py on the CPU trainer (one seed, the
# quickstart and heavy-tail workloads, default and 1024-token budgets): packed tokens/s against the
# padded and sorted slots/s of the same workload and budget, 1.11 +- 0.05 over the four pairs
# (varlen attention gathers each length class of a row into a block, one kernel call per class;
# docs/runtime.md has the table). Used by the simulator's trainer and the analytic estimate.
PACKED_TOKEN_COST = 1.11


def resolve_mode(train_mode: str) -> str:
    """What ``train.micro_batching`` runs as: ``auto`` packs (every platform has a varlen
    attention that keeps packed sequences apart, platforms/attention.py)."""
    return "packed" if train_mode in ("auto", "packed") else train_mode


def step_slots(step, lengths, *, mode: str, micro: int, max_tokens: int = 0) -> tuple:
    """(tokens, pad slots) per optimizer step, vectorised, as :func:`plan_step` cuts each step with
    one rank (``world`` = 1). ``step``: the step code of every sequence (0..n-1, each step's
    sequences contiguous, in their order); ``lengths``: their prompt + response tokens. Budget:
    ``max_tokens``, or when 0 ``micro`` x the step's longest sequence (what the runtime's trainer
    uses, scheduler/microbatch.plan_micro_batches), at most ``micro`` sequences per padded/sorted
    micro-batch. With the default budget the cut is exactly every ``micro`` sequences (in order;
    longest first for ``sorted``): no smaller count reaches micro x longest. ``packed``: no pad."""
    step = np.asarray(step, dtype=np.int64)
    seq = np.asarray(lengths, dtype=np.int64)
    n = int(step.max(initial=-1)) + 1
    tokens = np.bincount(step, weights=seq, minlength=n).astype(np.int64)
    if mode == "packed" or seq.size == 0:
        return tokens, np.zeros(n, dtype=np.int64)
    if mode not in MODES:
        raise ValueError(f"train.micro_batching: {mode!r} is not one of {', '.join(MODES)}")
    starts = np.searchsorted(step, np.arange(n))
    counts = np.bincount(step, minlength=n)
    if max_tokens > 0:
        pad = [plan_step(seq[a:a + c], mode=mode, max_tokens=int(max_tokens), max_seqs=int(micro)).padded_tokens
               if c else 0 for a, c in zip(starts.tolist(), counts.tolist())]
        return tokens, np.asarray(pad, dtype=np.int64)
    if mode == "sorted":
        seq = seq[np.lexsort((-seq, step))]
    pos = np.arange(seq.size) - starts[step]
    first = np.r_[True, (step[1:] != step[:-1]) | (pos[1:] % int(micro) == 0)]
    mstart = np.flatnonzero(first)
    mcnt = np.diff(np.r_[mstart, seq.size])
    mpad = np.maximum.reduceat(seq, mstart) * mcnt - np.add.reduceat(seq, mstart)
    return tokens, np.bincount(step[mstart], weights=mpad, minlength=n).astype(np.int64)


def slots(lengths: Sequence[int], members: Sequence[int], mode: str) -> int:
    """Token slots one micro-batch computes on: sum (packed) or count x longest (padded, sorted)."""
    if not members:
        return 0
    if mode == "packed":
        return int(sum(lengths[i] for i in members))
    return len(members) * int(max(lengths[i] for i in members))


@dataclass(frozen=True)
class StepPlan:
    """``ranks[r][j]``: indices (into the step's sequences) of rank r's j-th micro-batch."""
    ranks: list
    mode: str
    lengths: tuple

    @property
    def micro_batches(self) -> list:
        return [mb for rank in self.ranks for mb in rank]

    def rank_slots(self) -> list[int]:
        return [sum(slots(self.lengths, mb, self.mode) for mb in rank) for rank in self.ranks]

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def padded_tokens(self) -> int:
        return sum(self.rank_slots()) - self.tokens


def plan_step(lengths: Sequence[int], *, mode: str, max_tokens: int, max_seqs: int = 0,
              world: int = 1) -> StepPlan:
    """Micro-batches of one optimizer step for ``world`` ranks (see the module docstring).

    ``max_tokens``: the token budget per micro-batch (> 0). ``max_seqs``: at most this many
    sequences per padded/sorted micro-batch (0 = no cap; packed ignores it).
    """
    if mode not in MODES:
        raise ValueError(f"train.micro_batching: {mode!r} is not one of {', '.join(MODES)}")
    if max_tokens < 1:
        raise ValueError(f"train.max_tokens_per_micro_batch: the budget must be >= 1 token, got {max_tokens}")
    if world < 1:
        raise ValueError(f"train.devices: must be >= 1, got {world}")
    lens = tuple(int(x) for x in lengths)
    if any(x < 1 for x in lens):
        raise ValueError("every sequence needs at least one token")
    if not lens:
        return StepPlan([[] for _ in range(world)], mode, lens)
    if mode == "packed":
        mbs = _packed(lens, max_tokens, world)
    else:
        order = range(len(lens)) if mode == "padded" else sorted(range(len(lens)), key=lambda i: (-lens[i], i))
        mbs = _cut(lens, list(order), max_tokens, max_seqs)
        mbs = _split_to_multiple(lens, mbs, mode, world)
    cost = [slots(lens, mb, mode) for mb in mbs]
    ranks = [[mbs[x] for x in part] for part in partition_equal(cost, world)]
    for rank in ranks:
        rank.sort(key=lambda mb: -slots(lens, mb, mode))
    return StepPlan(ranks, mode, lens)


def _cut(lens: tuple, order: list[int], budget: int, max_seqs: int) -> list[list[int]]:
    """Consecutive runs of ``order``, each within ``budget`` slots (count x longest) and ``max_seqs``."""
    mbs: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        top = max(longest, lens[i])
        if cur and ((len(cur) + 1) * top > budget or (max_seqs and len(cur) >= max_seqs)):
            mbs.append(cur)
            cur, top = [], lens[i]
        cur.append(i)
        longest = top
    mbs.append(cur)
    return mbs


def _packed(lens: tuple, budget: int, world: int) -> list[list[int]]:
    """``world x m`` bins filled longest-first onto the lightest; m grows until every bin of
    two or more sequences fits ``budget`` (m never exceeds what puts each sequence alone)."""
    n = len(lens)
    order = sorted(range(n), key=lambda i: (-lens[i], i))
    m = max(1, math.ceil(sum(lens) / (world * budget)))
    while True:
        k = min(world * m, n)
        heap = [(0, b) for b in range(k)]
        bins: list[list[int]] = [[] for _ in range(k)]
        for i in order:
            load, b = heapq.heappop(heap)
            bins[b].append(i)
            heapq.heappush(heap, (load + lens[i], b))
        if k == n or all(len(b) < 2 or sum(lens[i] for i in b) <= budget for b in bins):
            return [sorted(b) for b in bins]
        m += 1


def _split_to_multiple(lens: tuple, mbs: list[list[int]], mode: str, world: int) -> list[list[int]]:
    """Split the heaviest splittable micro-batch in two until the count divides by ``world``
    (splitting never adds slots); stops early when nothing can be split."""
    mbs = [list(mb) for mb in mbs]
    while len(mbs) % world:
        cand = [x for x, mb in enumerate(mbs) if len(mb) > 1]
        if not cand:
            break
        x = max(cand, key=lambda x: (slots(lens, mbs[x], mode), -x))
        mb = mbs.pop(x)
        half = len(mb) // 2
        mbs[x:x] = [mb[:half], mb[half:]]
    return mbs


def partition_equal(costs: Sequence[float], k: int) -> list[list[int]]:
    """Indices of ``costs`` in ``k`` parts with nearly equal sums (Karmarkar-Karp's largest
    differencing method). Counts are equal when ``k`` divides ``len(costs)``; otherwise they
    differ by at most one. The spread (max - min part sum) is at most max(costs) - min(costs)."""
    n = len(costs)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    heap = []
    for c, start in enumerate(range(0, n, k)):
        chunk = order[start:start + k]
        parts = [(float(costs[i]), [i]) for i in chunk] + [(0.0, []) for _ in range(k - len(chunk))]
        parts.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), c, parts))
    if not heap:
        return [[] for _ in range(k)]
    tie = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))]
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    return [sorted(ix) for _, ix in heap[0][2]]


def step_denominator(samples: list[dict], loss_agg: str) -> float:
    """What one optimizer step over ``samples`` divides its loss sum by, when nobody passes
    one: ``seq-mean`` the samples, otherwise their response tokens (masked samples count in
    neither)."""
    kept = [s for s in samples if not s.get("masked")]
    if loss_agg == "seq-mean":
        return float(len(kept))
    return float(sum(len(s["response_ids"]) for s in kept))


def plan_micro_batches(samples: list[dict], mode: str, max_tokens: int, micro: int, world: int = 1):
    """The micro-batches of one optimizer step over ``world`` ranks (a ``StepPlan`` of
    scheduler/microbatch.py over the samples' prompt + response lengths). Budget:
    ``max_tokens``, or when 0 ``micro`` x the step's longest sequence (the slots of a full padded
    micro-batch of the step); padded and sorted micro-batches hold at most ``micro`` sequences."""
    lengths = [len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples]
    budget = int(max_tokens) or int(micro) * max(lengths, default=1)
    return plan_step(lengths, mode=mode, max_tokens=budget, world=world, max_seqs=0 if mode == "packed" else micro)
