"""Run-time mini-batch fill within an iteration (``pipeline.regroup``): which groups trade slots.

The plan fixes an iteration's membership and each mini-batch's composition; a trainer step
starts only once every group of one mini-batch is generated. All mini-batches of iteration i are
trained at the same policy version (i), and the iteration's membership alone decides the lag
and the length mix of what it trains, so moving groups between the untrained mini-batches of
*the same* iteration changes neither: it is lossless. ``regroup`` chooses such moves when the
trainer is ready for iteration i and none of i's untrained mini-batches is fully generated:

- the *target* is the untrained mini-batch with the fewest groups still to generate (= the most
  generated ones: a schedule's mini-batches hold ``mini_batch_size`` prompts each), lowest
  index on ties (the index order the trainer takes complete mini-batches in);
- it is filled only when it can be completed: the other untrained mini-batches hold at least as
  many generated groups as it misses (else nothing moves: a partly filled mini-batch trains no
  earlier);
- each of its not-yet-generated groups (in trainer order) trades slots with one generated group
  of another untrained mini-batch (a *donor*). Donor mini-batches are drained one at a time, the
  one with the fewest generated groups first (highest index on ties): that is the mini-batch
  likeliest to be trained last, so the late groups collect there instead of spreading over
  several mini-batches, each of which would then wait. Within a donor mini-batch the earliest
  generated group goes first (carry-over's donor order).

Every mini-batch keeps its size, every group keeps its iteration, and a trained mini-batch never
changes (the caller passes only untrained ones), so every group is trained exactly once.

With a *forced* target (``pipeline.stream_groups``: the mini-batch being streamed, whose groups
the trainer takes one by one), its not-yet-generated groups are filled with as many donors as
there are: each one lets the trainer go on at once.

Pure: nothing here knows about time, Ray or the simulator; :class:`~asp_ascend.scheduler.carryover.CarryOver`
applies the moves to the membership it holds, ``TailControl.regroup`` records them
(``regroup`` timeline events).
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Mapping, Sequence


def regroup_pairs(members: Mapping[int, Sequence[Hashable]], todo: Iterable[int],
                  generated: Callable[[Hashable], int | None], target: int | None = None,
                  counts: Mapping[int, int] | None = None) -> list[tuple[Hashable, Hashable]]:
    """(late group, donor) pairs to swap, each late group taking its donor's slot and vice versa.

    ``members``: mini-batch -> its groups in trainer order; ``todo``: the iteration's untrained
    mini-batches; ``generated(key)``: the group's generation order (lower = earlier), or None
    while it is not generated. ``target``: a forced target (the mini-batch being streamed),
    filled as far as donors allow; else the rule of the module docstring, and no pair unless a
    mini-batch can be completed and none is complete already. ``counts`` (optional): per mini-batch
    of ``todo``, how many of its groups are generated; with it the usual answers (no pair) come
    from the counts alone, without asking ``generated`` of every group (the same pairs)."""
    todo = list(todo)
    if counts is not None and not _may_pair(members, todo, counts, target):
        return []
    gen = {m: [k for k in members[m] if generated(k) is not None] for m in todo}
    forced = target is not None
    if not forced:
        if not todo or any(len(gen[m]) == len(members[m]) for m in todo):
            return []
        target = min(todo, key=lambda m: (len(members[m]) - len(gen[m]), m))
    elif target not in gen:
        raise ValueError(f"regroup: target mini-batch {target} is not among the untrained ones {todo}")
    missing = [k for k in members[target] if generated(k) is None]
    donor_mbs = sorted((m for m in todo if m != target and gen[m]), key=lambda m: (len(gen[m]), -m))
    donors = [k for m in donor_mbs for k in sorted(gen[m], key=generated)]
    if not forced and len(donors) < len(missing):
        return []
    return list(zip(missing, donors))


def _may_pair(members, todo: list, counts: Mapping[int, int], target: int | None) -> bool:
    """False where :func:`regroup_pairs` returns no pair, judged from the generated counts alone:
    no untrained mini-batch, one complete already, or fewer donors than the target misses (no
    donor at all, or nothing missing, with a forced target)."""
    if target is None:
        if not todo or any(counts[m] == len(members[m]) for m in todo):
            return False
        target = min(todo, key=lambda m: (len(members[m]) - counts[m], m))
        return sum(counts[m] for m in todo if m != target) >= len(members[target]) - counts[target]
    if target not in counts:
        return True     # regroup_pairs raises
    return counts[target] < len(members[target]) and any(counts[m] for m in todo if m != target)


def heavy_first_pairs(members: Mapping[int, Sequence[Hashable]], todo: Iterable[int], target: int,
                      generated: Callable[[Hashable], int | None], weight: Callable[[Hashable], float],
                      counts: Mapping[int, int] | None = None) -> list[tuple[Hashable, Hashable]]:
    """(light group of ``target``, heavier generated group of another untrained mini-batch) pairs to
    swap (``pipeline.regroup_heavy``), so that the step about to train ``target`` (all of its groups
    generated) holds the heaviest generated groups of the iteration's untrained mini-batches.

    Only while some untrained group is not generated yet (else the order of the remaining steps
    moves nothing). Why it never delays the iteration: with regroup, the k-th step of an iteration
    can start once k mini-batches' worth of its groups are generated, whichever they are, so the
    steps' release times do not depend on who trains when; the iteration's last step ends at the
    latest over steps s of (release of s + the work of steps s, s+1, ...), and moving work from a
    later step to an earlier one lowers or keeps every such sum. The groups trained after the last
    one to be generated are then the lightest left. ``weight(key)``: a generated group's training
    work (its tokens: known once it is generated, not a prediction); ties: the earlier generated.
    ``counts`` (optional): as :func:`regroup_pairs`'s, to see that every group is generated
    without asking ``generated`` of each."""
    todo = list(todo)
    if target not in todo:
        raise ValueError(f"regroup: target mini-batch {target} is not among the untrained ones {todo}")
    if (all(counts[m] == len(members[m]) for m in todo) if counts is not None
            else all(generated(k) is not None for m in todo for k in members[m])):
        return []
    gen = [k for m in todo for k in members[m] if generated(k) is not None]
    heavy = sorted(gen, key=lambda k: (-weight(k), generated(k)))[:len(members[target])]
    hs, own = set(heavy), set(members[target])
    out = sorted((k for k in members[target] if k not in hs), key=lambda k: (weight(k), generated(k)))
    return list(zip(out, [k for k in heavy if k not in own]))
