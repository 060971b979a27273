"""Weight syncs in flight, oldest first: each finishes in order, and a failed one is sent again.

A sync finishes when every live instance it was sent to holds its version (or died). One that
failed for some live instances (a member died mid-broadcast, its group broke) is sent again to
them over a new group, at most ``SYNC_TRIES`` times in all, or ends without them when the
trainer no longer holds its version: they keep their older version (admission keeps their lag
within k) and catch up at the next sync.

The object store keeps every published version, so its tickets can always be sent again. A
broadcast sent again needs the trainer to hold exactly that version: no optimizer step starts
while a broadcast is in flight (:attr:`PendingSyncs.broadcasting`), but one may start once it
has failed, and then the version is gone. Skipping it is safe for k >= 1 (the missed instances
still admit work within the bound); with k = 0 the trainer cannot have stepped, since it waits
for samples drawn with this version.

A trainer that hangs in its broadcast (alive, its ``send_weights`` never returning) cannot be sent
anything again: every later call would wait behind that one. Its receivers give up on it after
``weight_sync.stall_timeout_s`` (platforms/recv_wait.py), and a sender whose receivers failed or
stopped gives up itself within that timeout; so once no receiver of a broadcast is pending, its
send has ``stall_timeout_s + send_slack_s`` more to return (``weight_sync.send_slack_s``, default
30 s). Past that the run stops with
:class:`TrainerHung` (:meth:`PendingSyncs.check_sends`, run at every :meth:`PendingSyncs.finish`).
The other way round, once a broadcast's send has ended (done, or given up: a sender gives up on
receivers that make no progress for the stall timeout and marks the version failed, which every
healthy receiver reads within 50 ms), an instance whose receive is still pending after the same
bound hangs: it is reported (``on_hung``; the loop kills it and fails it over, as a hung instance),
so the sync ends without it instead of waiting on it for ever.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import AspError
from .contracts import PendingWeights, WeightTransport

SYNC_TRIES = 3  # broadcasts of one version before the run stops
SEND_SLACK_S = 30.0  # default of weight_sync.send_slack_s: beyond the stall timeout, for a send whose receivers ended


class TrainerHung(RuntimeError, AspError):
    """The trainer's broadcast did not return within the stall timeout (plus slack) after its last
    receiver ended: the trainer hangs, and the run cannot go on without it. An AspError: the CLI
    prints its message (version, the bound, ``resume=true``, the keys to raise) without a traceback."""


class PendingSyncs:
    """``live()``: the live instances now. ``trainer_holds(v)``: the trainer's weights are exactly
    version v (no optimizer step since v was published). ``say``: a line for the run's log."""

    def __init__(self, transport: WeightTransport, live: Callable[[], list[int]],
                 trainer_holds: Callable[[int], bool], say: Callable[[str], None], send_slack_s: float = SEND_SLACK_S):
        self.transport = transport
        self.live, self.trainer_holds, self.say = live, trainer_holds, say
        self.send_slack_s = float(send_slack_s)
        self.pending: list[PendingWeights] = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, sync: PendingWeights) -> None:
        """A version just published (``transport.start``), after every one already pending."""
        self.pending.append(sync)

    @property
    def broadcasting(self) -> bool:
        """A broadcast is in flight: the trainer's weights must stay those of its version."""
        return any(s.send is not None for s in self.pending)

    def waiting(self) -> list:
        """Every reference a pending sync waits on (for the loop's ``ray.wait``)."""
        return [ref for s in self.pending for ref in s.waiting()]

    def finish(self, ray: Any, t0: float, *, on_synced: Callable[[int, int], None],
               on_dead: Callable[[int, BaseException], None],
               on_done: Callable[[PendingWeights], None],
               on_hung: Callable[[int, BaseException], None] | None = None) -> None:
        """Take what finished, oldest sync first: ``on_synced(instance, version)`` for each instance
        that now holds a version, ``on_dead(instance, error)`` for one that died, ``on_done(sync)``
        for each sync that ended, in order; stops at the first still in flight or sent again.
        First :meth:`check_sends`: raises :class:`TrainerHung` if a broadcast's send is overdue, and
        reports each instance whose receive is overdue to ``on_hung(instance, error)``."""
        self.check_sends(ray, on_hung)
        while self.pending:
            s = self.pending[0]
            for r in s.poll(ray, t0, on_dead):
                on_synced(r, s.version)
            if s.in_flight or (s.failed is not None and self.retry(s)):
                return
            self.pending.pop(0)
            on_done(s)

    def check_sends(self, ray: Any, on_hung: Callable[[int, BaseException], None] | None = None) -> None:
        """Broadcast only. Raise :class:`TrainerHung` if a broadcast's send (the trainer's
        ``send_weights``) is still in flight ``weight_sync.stall_timeout_s`` + ``send_slack_s``
        seconds after none of its receivers was pending any more; report to ``on_hung`` (once per
        sync) each instance whose receive is still pending that long after the send ended. Cheap: two
        ``ray.wait`` with no timeout per sync in flight."""
        if not self.transport.broadcast:
            return
        stall = float(self.transport.stall_timeout_s)
        bound, now = stall + self.send_slack_s, time.monotonic()
        for s in self.pending:
            waited, late = s.overdue(ray, now, bound)
            for r in late:
                if on_hung is not None and r not in s.reported:
                    s.reported.add(r)
                    on_hung(r, TimeoutError(f"weight sync of version {s.version}: instance {r}'s receive is still "
                                            f"pending {bound:g} s (weight_sync.stall_timeout_s {stall:g} s + "
                                            f"weight_sync.send_slack_s {self.send_slack_s:g} s) after the trainer's "
                                            f"send ended: it hangs"))
            if waited is None:
                continue
            why = f"; the instances' receives ended with {s.failed!r}" if s.failed is not None else ""
            raise TrainerHung(f"weight sync of version {s.version}: the trainer's send_weights has not returned "
                              f"{waited:.0f} s after every instance's receive ended ({len(s.synced)} hold the version"
                              f"{why}): the trainer hangs in its broadcast (alive, no progress; a sender whose "
                              f"receivers fail or stop gives up itself within weight_sync.stall_timeout_s = "
                              f"{stall:g} s), and every later trainer call would wait behind it. The run stops: "
                              f"resume from the last checkpoint with resume=true; if the trainer is only slow "
                              f"after its last bucket, raise weight_sync.send_slack_s (now {self.send_slack_s:g} s) "
                              f"or weight_sync.stall_timeout_s")

    def retry(self, s: PendingWeights) -> bool:
        """Returns True if ``s.version`` is sent again to the live instances that lack it; False if
        the sync ends without them (none missing, or the trainer has moved past the version).
        Raises after ``SYNC_TRIES`` tries, naming how to go on."""
        missing = [r for r in self.live() if r not in s.synced]
        if not missing:
            return False
        if self.transport.broadcast and not self.trainer_holds(s.version):
            self.say(f"weight sync of version {s.version} failed for instance(s) {missing} "
                     f"({type(s.failed).__name__}); the trainer has moved on, they catch up at the next sync")
            return False
        if s.tries >= SYNC_TRIES:
            raise RuntimeError(f"weight sync of version {s.version} failed {s.tries} times "
                               f"(last error: {s.failed!r}); resume from the last checkpoint with resume=true, "
                               "or set weight_sync.transport=object_store") from s.failed
        self.say(f"weight sync of version {s.version} failed ({type(s.failed).__name__}); "
                 f"sending it again to instance(s) {missing}")
        self.transport.regroup()
        s.failed, s.tries = None, s.tries + 1
        self.transport.push(s, missing)
        return True
