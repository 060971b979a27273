"""Partial rollout with carry-over (DESIGN 9 e): who is trained in which iteration.

Opt-in (``rollout.partial_rollout: true``, ``rollout.max_split: S``), bounded off-policy.
When iteration i waits only on groups predicted to finish past a budget, those groups are
*deferred* to iteration i + 1, and iteration i instead takes the same number of already
finished groups of iteration i + 1, earliest finished first (a *swap*: each takes the
other's mini-batch slot). So every iteration still trains its full batch, in as many
optimizer steps of the same sizes, and every group is trained exactly once. A deferred group
keeps generating (its later tokens come from newer weights); it may be deferred again while
it stays within S iterations of its planned one, so its lag is at most ``k + S``.

:class:`CarryOver` holds the current membership and answers ``defer(i, late)`` with the
swaps it made. The caller decides what is late (``TailControl.late``: re-estimated
remaining tokens past the iteration's budget) and when to ask (the trainer is ready for a mini-batch of i that is not generated);
nothing here knows about time, threads, Ray or vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable

from .regroup import heavy_first_pairs, regroup_pairs


@dataclass(frozen=True)
class Swap:
    """``deferred`` leaves (``iteration``, ``mini_batch``) for ``to_iteration``; ``swapped_in``
    (a finished group of ``to_iteration``) takes its place and vice versa."""
    deferred: Hashable
    swapped_in: Hashable
    iteration: int
    mini_batch: int
    to_iteration: int
    to_mini_batch: int


class CarryOver:
    """Iteration membership under deferral and swap; exactly-once and the lag bound kept.

    ``slots``: (key, planned iteration, mini-batch) of every group, in the order the
    trainer reads a mini-batch. ``max_split`` = S.
    """

    def __init__(self, slots: Iterable[tuple[Hashable, int, int]], max_split: int):
        if max_split < 1:
            raise ValueError(f"max_split must be >= 1, got {max_split}")
        self.S = int(max_split)
        self.planned: dict[Hashable, int] = {}
        self.where: dict[Hashable, tuple[int, int]] = {}            # key -> (iteration, mini-batch)
        self.members: dict[tuple[int, int], list[Hashable]] = {}    # (iteration, mini-batch) -> keys
        self._slots_of: dict[int, list[tuple[int, int]]] = {}      # iteration -> its members' keys, in order
        self.finished: dict[Hashable, int] = {}        # key -> finish order
        self.n_finished: dict[tuple[int, int], int] = {}  # (iteration, mini-batch) -> its finished members
        self.weight: dict[Hashable, float] = {}        # key -> its training work once finished (tokens)
        self.trained: set[Hashable] = set()
        self.swaps: list[Swap] = []
        self.regroups: list[Swap] = []   # pipeline.regroup's moves (within an iteration)
        self.add(slots)

    def add(self, slots: Iterable[tuple[Hashable, int, int]]) -> None:
        """More groups (a re-planned epoch): (key, planned iteration, mini-batch) each."""
        for key, it, mb in slots:
            if key in self.planned:
                raise ValueError(f"group {key!r} appears twice")
            self.planned[key] = int(it)
            self.where[key] = (int(it), int(mb))
            self._member_list((int(it), int(mb))).append(key)

    # state updates -----------------------------------------------------------------
    def on_finish(self, key: Hashable, weight: float = 0.0) -> None:
        if key in self.finished:
            raise ValueError(f"group {key!r} finished twice")
        if key not in self.where:
            raise KeyError(f"unknown group {key!r}")
        self.finished[key] = len(self.finished)
        self.weight[key] = float(weight)
        slot = self.where[key]
        self.n_finished[slot] = self.n_finished.get(slot, 0) + 1

    def on_trained(self, iteration: int, mini_batch: int) -> list[Hashable]:
        """The trainer took mini-batch (iteration, mini_batch): its members, each exactly once."""
        keys = self.members.get((iteration, mini_batch), [])
        for key in keys:
            if key in self.trained:
                raise ValueError(f"group {key!r} trained twice")
            if key not in self.finished:
                raise ValueError(f"group {key!r} trained before it finished")
            self.trained.add(key)
        return list(keys)

    # decisions ---------------------------------------------------------------------
    def iteration_of(self, key: Hashable) -> int:
        return self.where[key][0]

    def mini_batch_of(self, key: Hashable) -> tuple[int, int]:
        return self.where[key]

    def ready(self, iteration: int, mini_batch: int) -> bool:
        return all(k in self.finished for k in self.members.get((iteration, mini_batch), []))

    def members_of(self, iteration: int) -> list[Hashable]:
        """The groups of ``iteration`` now, by mini-batch (as first created) then in trainer order."""
        return [k for slot in self._slots_of.get(iteration, ()) for k in self.members[slot]]

    def unfinished(self, iteration: int) -> list[Hashable]:
        """The unfinished groups of ``iteration``, in :meth:`members_of`'s order (mini-batches whose
        members all finished are skipped by their count)."""
        fin, nfin, members = self.finished, self.n_finished, self.members
        return [k for slot in self._slots_of.get(iteration, ()) if nfin.get(slot, 0) < len(members[slot])
                for k in members[slot] if k not in fin]

    def defer(self, iteration: int, late: Iterable[Hashable]) -> list[Swap]:
        """Defer the ``late`` groups of ``iteration`` to ``iteration + 1`` where the rules allow.

        Nothing happens unless every unfinished group of the iteration is late (it waits only
        on them). A group is deferred only within S iterations of its planned one, and only
        against a finished, untrained group of ``iteration + 1`` (earliest finished first);
        with fewer such groups than late ones, the first of ``late`` go (pass the latest first).
        Returns the swaps made (also appended to ``self.swaps``).
        """
        late = [k for k in late if self.where.get(k, (None,))[0] == iteration and k not in self.finished]
        waiting = self.unfinished(iteration)
        if not late or set(late) != set(waiting):
            return []
        nxt = iteration + 1
        movable = [k for k in late if nxt <= self.planned[k] + self.S]
        if not movable:
            return []
        fin, trained = self.finished, self.trained
        donors = sorted((k for slot in self._slots_of.get(nxt, ()) for k in self.members[slot]
                         if k in fin and k not in trained), key=fin.__getitem__)
        out = self._trade(zip(movable, donors))
        self.swaps.extend(out)
        return out

    def regroup(self, iteration: int, target: int | None = None) -> list[Swap]:
        """``pipeline.regroup`` (scheduler/regroup.py): complete an untrained mini-batch of
        ``iteration`` from finished groups of its other untrained mini-batches (``target``: fill
        that one as far as they allow). Returns the moves as :class:`Swap` s within the
        iteration (``deferred``: the unfinished group, ``swapped_in``: the finished one that
        takes its slot in (``iteration``, ``mini_batch``)); also appended to ``self.regroups``."""
        members, counts = self._untrained(iteration)
        out = self._trade(regroup_pairs(members, sorted(members), self.finished.get, target, counts))
        self.regroups.extend(out)
        return out

    def heavy_first(self, iteration: int, target: int) -> list[Swap]:
        """``pipeline.regroup_heavy`` (scheduler/regroup.py, :func:`heavy_first_pairs`): the trainer is
        about to train mini-batch ``target`` of ``iteration`` (all of its groups finished); while some
        untrained group of the iteration is unfinished, its lightest groups trade slots with the
        heaviest finished groups of the other untrained mini-batches. :class:`Swap` s as
        :meth:`regroup`'s (``deferred``: the group leaving ``target``); also in ``self.regroups``."""
        members, counts = self._untrained(iteration)
        out = self._trade(heavy_first_pairs(members, sorted(members), target, self.finished.get,
                                            self.weight.__getitem__, counts))
        self.regroups.extend(out)
        return out

    def _trade(self, pairs) -> list[Swap]:
        """Each (a, b) of ``pairs`` trades slots, in order (a pair may be chosen after the moves
        before it): a takes b's slot and b takes a's; one :class:`Swap` each (``deferred`` = a)."""
        out = []
        for a, b in pairs:
            (i, m), (j, n) = self.where[a], self.where[b]
            self._move(a, (j, n))
            self._move(b, (i, m))
            out.append(Swap(a, b, i, m, j, n))
        return out

    def _untrained(self, iteration: int) -> tuple[dict, dict]:
        """The untrained mini-batches of ``iteration`` (in creation order): mini-batch -> its keys,
        and mini-batch -> how many of them finished. A mini-batch is trained whole, so its first
        key tells."""
        trained, allm, nfin = self.trained, self.members, self.n_finished
        members, counts = {}, {}
        for slot in self._slots_of.get(iteration, ()):
            keys = allm[slot]
            if keys and keys[0] in trained:
                continue
            members[slot[1]] = keys
            counts[slot[1]] = nfin.get(slot, 0)
        return members, counts

    def _move(self, key: Hashable, slot: tuple[int, int]) -> None:
        old = self.where[key]
        self.members[old].remove(key)
        self._member_list(slot).append(key)
        self.where[key] = slot
        if key in self.finished:
            self.n_finished[old] -= 1
            self.n_finished[slot] = self.n_finished.get(slot, 0) + 1

    def _member_list(self, slot: tuple[int, int]) -> list[Hashable]:
        """``members[slot]``, created (and indexed by its iteration) on first use."""
        keys = self.members.get(slot)
        if keys is None:
            keys = self.members[slot] = []
            self._slots_of.setdefault(slot[0], []).append(slot)
        return keys

    def iterations(self) -> dict[int, dict[int, list[Hashable]]]:
        """The current membership, iteration -> mini-batch -> keys (the trainer's order), trained
        mini-batches included: what a checkpoint saves and a resume continues from."""
        out: dict[int, dict[int, list[Hashable]]] = {}
        for (i, m), keys in sorted(self.members.items()):
            out.setdefault(i, {})[m] = list(keys)
        return out

    def restore_planned(self, planned: dict) -> None:
        """A resume: groups that sit in a later iteration than their schedule's (deferred before
        the checkpoint) get back their planned iteration, so the bounds ``k + S`` and "at most S
        iterations after the planned one" count from where the uninterrupted run counts."""
        for key, it in planned.items():
            if key not in self.where:
                raise KeyError(f"restored deferral of unknown group {key!r}")
            cur = self.where[key][0]
            if not cur - self.S <= int(it) <= cur:
                raise ValueError(f"group {key!r} in iteration {cur} cannot have been planned for iteration {it} "
                                 f"with max_split {self.S}")
            self.planned[key] = int(it)

    def lag_bound_of(self, key: Hashable, lag_bound: int) -> int:
        """The largest lag this group can be trained with: k + (its iteration - planned)."""
        return lag_bound + max(0, self.where[key][0] - self.planned[key])


def late_groups(remaining: dict, budget: float) -> list:
    """The groups whose re-estimated remaining tokens (``remaining``: key -> tokens) exceed
    ``budget``, latest first (the order :meth:`CarryOver.defer` gives up to when donors are few)."""
    return [k for k, x in sorted(remaining.items(), key=lambda kv: -kv[1]) if x > budget]
