"""Row order of one verl batch, so verl's update steps are the schedule's mini-batches.

Where verl 0.9.1 forms mini-batches (checked in its source, docs/verl.md): ``RayPPOTrainer.fit``
repeats every prompt ``rollout.n`` times *interleaved* (a prompt's samples stay adjacent),
optionally reorders the batch (``trainer.balance_batch``), and ``_update_actor`` hands it to the
actor worker group, whose dispatch (``make_nd_compute_dataproto_dispatch_fn``) cuts it into
``dp`` contiguous chunks; each rank's ``train_mini_batch`` then takes consecutive slices of
``ppo_mini_batch_size / dp`` prompts (``tu.make_iterator``, shuffled only with
``actor.shuffle``). So global update step j holds, from every rank r, the j-th slice of
chunk r. Laying the batch out rank-major -- chunk r = the r-th share of every ASP
mini-batch, mini-batches in order -- makes step j exactly ASP mini-batch j.

Pure functions of a schedule's rows; no torch, no verl.
"""
from __future__ import annotations

from typing import Sequence

from ...errors import ConfigError

LAYOUTS = ("mini_batch", "dispatch")


def mini_batch_layout(mini_batches: Sequence[Sequence], dp: int) -> list:
    """Rank-major order of ``mini_batches`` (lists of prompt ids, each ``m`` long, ``m % dp == 0``).

    >>> mini_batch_layout([["a", "b"], ["c", "d"]], dp=2)
    ['a', 'c', 'b', 'd']
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    sizes = {len(mb) for mb in mini_batches}
    if len(sizes) > 1:
        raise ConfigError([f"actor_rollout_ref.actor.ppo_mini_batch_size: the schedule's mini-batches have sizes "
                           f"{sorted(sizes)}; re-run `asp schedule` with train.mini_batch_size equal to "
                           f"ppo_mini_batch_size"])
    m = sizes.pop() if sizes else 0
    if m % dp:
        raise ConfigError([f"actor_rollout_ref.actor.ppo_mini_batch_size: {m} prompts per mini-batch cannot be "
                           f"split over the actor's {dp} data-parallel ranks without splitting a prompt's group "
                           f"across update steps; use a multiple of {dp}"])
    share = m // dp
    return [pid for r in range(dp) for mb in mini_batches for pid in mb[r * share:(r + 1) * share]]


def iteration_order(rows, layout: str, dp: int = 1) -> list:
    """Prompt ids of one iteration's schedule rows (records with ``prompt_id``, ``mini_batch``,
    ``dispatch_rank``, ``instance``) in verl batch order.

    ``mini_batch``: rank-major mini-batch layout (sync and one-step-off trainers).
    ``dispatch``: the order the schedule starts the prompts (the fully async feed).
    """
    if layout == "dispatch":
        return [r["prompt_id"] for r in sorted(rows, key=lambda r: (r["dispatch_rank"], r["instance"],
                                                                     str(r["prompt_id"])))]
    if layout != "mini_batch":
        raise ConfigError([f"asp.verl.batch_layout: unknown value {layout!r}; choose one of {', '.join(LAYOUTS)}"])
    groups: dict[int, list] = {}
    for r in sorted(rows, key=lambda r: (r["mini_batch"], r["dispatch_rank"], str(r["prompt_id"]))):
        groups.setdefault(int(r["mini_batch"]), []).append(r["prompt_id"])
    return mini_batch_layout([groups[k] for k in sorted(groups)], dp)


def update_steps(order: Sequence, mini_batch_size: int, dp: int) -> list[list]:
    """What verl's update does with a batch in ``order`` (prompt level): the prompts of each
    update step, as the dispatch + ``train_mini_batch`` slicing described above forms them.
    The inverse view of :func:`mini_batch_layout`, used to check a layout."""
    n = len(order)
    if n % dp or mini_batch_size % dp:
        raise ValueError(f"{n} prompts / mini-batches of {mini_batch_size} do not split over {dp} ranks")
    chunk, share = n // dp, mini_batch_size // dp
    steps = n // mini_batch_size
    return [[p for r in range(dp) for p in order[r * chunk + j * share: r * chunk + (j + 1) * share]]
            for j in range(steps)]
