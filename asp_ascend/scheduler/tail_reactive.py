"""Reactive tail caps (``rollout.tail_concurrency: reactive``, DESIGN 9 c, opt-in): which running
groups' instances to cap, decided from run-time evidence, not from the plan's predictions.

An iteration is in its tail once at most ``REACTIVE_SHARE`` of its groups is unfinished; its
critical groups are its running groups whose re-estimated remaining tokens are at least
``REACTIVE_RATIO`` x the largest; at most ``REACTIVE_HOSTS`` x the instances host a capped group of
one iteration at once (the largest remaining first); a critical group's instance holds at most
``REACTIVE_ROOM`` x max_num_seqs sequences (at least G) while it runs. A decision is re-taken when a
group of the iteration is admitted or a capped one finishes, else once its unfinished groups fell
to ``REACTIVE_STEP`` x their number at the last decision. A capped instance full to its cap still
admits the group it would take next when that group is expected to run at least ``REACTIVE_RATIO`` x
as long as the longest remaining of the groups the cap protects (:func:`passes_cap`). Counts, token
ratios and shares only:
nothing depends on the cost model's scale (chosen on the reasoning-like workload at 64 devices,
docs/scheduler.md "Reactive tail caps"). :class:`ReactiveCaps` is the bookkeeping;
:class:`~asp_ascend.scheduler.tail_control.TailControl` applies its decisions to the governor.
"""
from __future__ import annotations

from typing import Callable, Hashable

REACTIVE_SHARE = 0.5
REACTIVE_RATIO = 0.7
REACTIVE_HOSTS = 0.5
REACTIVE_ROOM = 0.125
REACTIVE_STEP = 0.75

Key = Hashable


def passes_cap(expected: float, protected) -> bool:
    """Does a group expected to run ``expected`` tokens (its longest sample) pass the cap of an
    instance whose capped groups have ``protected`` tokens left? Yes when it would be critical
    beside them (at least ``REACTIVE_RATIO`` x the longest of them): it matters to its own
    iteration as much as they do to theirs, and waiting for the cap to lift would delay it by
    their remaining tokens (the 6 s per iteration a critical group waited on bimodal at 64
    devices, docs/scheduler.md "Reactive tail caps")."""
    top = max(protected, default=0.0)
    return top > 0 and expected >= REACTIVE_RATIO * top


class ReactiveCaps:
    """Per iteration its unfinished groups, its size; the groups capped now."""

    def __init__(self, group_size: int, max_num_seqs: int, num_instances: int):
        self.G, self.S, self.R = group_size, max_num_seqs, num_instances
        self.unfinished: dict[int, set] = {}
        self.size: dict[int, int] = {}
        self.capped: dict[Key, int] = {}
        self.it_of: dict[Key, int] = {}
        self.seen: dict[int, int] = {}     # iteration -> its unfinished groups at the last decision

    @property
    def room(self) -> int:
        """A capped group's instance holds at most this many sequences."""
        return max(self.G, int(REACTIVE_ROOM * self.S) // self.G * self.G)

    def track(self, iterations: dict) -> None:
        """Add iterations (``{iteration: {mini_batch: [key, ...]}}``) to follow."""
        for i, mbs in iterations.items():
            keys = {key for m in mbs.values() for key in m}
            self.unfinished.setdefault(i, set()).update(keys)
            self.size[i] = self.size.get(i, 0) + len(keys)
            self.it_of.update(dict.fromkeys(keys, i))

    def finished(self, key: Key, iteration: int) -> bool:
        """``key`` (of ``iteration``) finished; returns whether it was capped."""
        was_capped = self.capped.pop(key, None) is not None
        left = self.unfinished.get(iteration)
        if left is not None:
            left.discard(key)
            if not left:
                del self.unfinished[iteration]
                self.seen.pop(iteration, None)
        return was_capped

    def decide(self, iteration: int, force: bool, where: dict, remaining: Callable[[Key], float]
               ) -> tuple[list[Key], dict[Key, float]] | None:
        """The caps of ``iteration`` now: (groups to uncap, {group to cap: its remaining tokens}),
        or None when nothing is to be re-decided. ``where``: running group -> its instance;
        ``remaining``: a running group's re-estimated remaining tokens. Updates ``capped``."""
        left = self.unfinished.get(iteration)
        in_tail = bool(left) and len(left) <= REACTIVE_SHARE * self.size[iteration]
        if not in_tail:
            if not any(i == iteration for i in self.capped.values()):
                return None
        elif not force and len(left) > REACTIVE_STEP * self.seen.get(iteration, float("inf")):
            return None
        want: dict[Key, float] = {}
        if in_tail:
            self.seen[iteration] = len(left)
            rem = {k: remaining(k) for k in left if k in where}
            top = max(rem.values(), default=0.0)
            hosts: set[int] = set()
            limit = max(1, int(REACTIVE_HOSTS * self.R))
            for k in sorted(rem, key=lambda x: -rem[x]):
                if top <= 0 or rem[k] < REACTIVE_RATIO * top:
                    break
                r = where[k]
                if r not in hosts and len(hosts) >= limit:
                    continue
                hosts.add(r)
                want[k] = rem[k]
        drop = [k for k, i in self.capped.items() if i == iteration and k not in want]
        for k in drop:
            del self.capped[k]
        add = {k: v for k, v in want.items() if k not in self.capped}
        for k in add:
            self.capped[k] = iteration
        return drop, add
