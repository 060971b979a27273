"""A weight-sync bucket's wait, on every backend, on both ends: a receiver's ends when its sender
failed or stopped making progress, the sender's when a receiver failed or stopped making progress.

A receiver's collective alone cannot tell that its sender failed or hung mid-version: on NCCL / HCCL
the broadcast kernel waits for rank 0's data with no timeout of its own, and a gloo receive waits
until the sender's connections close (at the latest the group's timeout). The sender's broadcast,
likewise, waits for every receiver (a gloo root's send completes only once each receiver posted its
receive; NCCL's root kernel, and the sender's final synchronize, wait for the ring). So each side
reports its progress in the group's rendezvous store (the one the sender hosts), one counter per
version and side: :func:`sync_key` counts the sender's steps on that version (:class:`SendProgress`:
the start, each tensor gathered, each bucket issued), :func:`recv_key` the receivers' (:class:`RecvProgress`:
each receiver's start and each bucket it received); at most one write per :data:`POLL_S` and
writer. A side that fails or gives up adds :data:`FAILED` to its counter (:func:`mark_failed`;
``SenderEndpoint.fail``) before it lets go of the group.

Each side issues each bucket's collective so that its completion can be polled
(:func:`start_broadcast`: a torch ``Work`` on gloo, a device event recorded after the broadcast on
CUDA / NPU) and, while the bucket has not completed, reads the other side's counter every
:data:`POLL_S` seconds (:class:`SenderWatch` on a receiver, :class:`ReceiverWatch` on the sender; one
store round trip per read). It stops when the counter says the other side failed, when the store no
longer answers (a receiver: the sender's process died, or it dropped the group and closed it), or
when nothing progressed for ``stall_s`` seconds (``weight_sync.stall_timeout_s``): no bucket
completed here and the other side's counter did not move. A side that is slow but healthy keeps
moving it (or its buckets keep completing), so only a stalled one is stopped. On any of these it
marks its own counter failed, aborts its end (:func:`abort_communicator`) and raises
:class:`SenderFailed` (:class:`SenderStalled` for a stall) on a receiver, :class:`ReceiverFailed`
(:class:`ReceiverStalled`) on the sender, naming the version and the bucket; a receiver's callers
drop their end and join again at the next version (``engines/vllm_ext.py``,
``integrations/mindspeed_rl/weight_push.PushEndpoint.recv``), the sender's (``SenderEndpoint.send``)
mark the version failed, so that every other receiver stops within a poll, and drop the group.

Cost: nothing on the store while buckets complete within :data:`POLL_S` of being issued; one store
round trip per waiting end per :data:`POLL_S` while one is awaited; each end writes its counter at
most once per :data:`POLL_S`. torch is never imported here.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

POLL_S = 0.05
"""Seconds between two store reads while a bucket is awaited: how long after its sender marked a
version failed (or its store went away) a receiver at most keeps waiting, less the read itself."""

STALL_S = 300.0
"""Default of ``weight_sync.stall_timeout_s``: the seconds a receiver waits with no bucket arriving
and no step of its sender before it gives up. It covers one bucket's transfer (``bucket_mb``) and
the sender's preparation before the first bucket (e.g. MindSpeed-RL's resharding)."""

STALL_KEY = "weight_sync.stall_timeout_s"

FAILED = 1 << 48
"""Added to a version's counter when its side fails: a count at or above it means failed."""

_EVENT_SLEEP_MAX_S = 0.005   # a device event is queried at most this far apart (it has no callback)


def sync_key(version: int) -> str:
    """The store key of ``version``'s sender counter: its steps, plus :data:`FAILED` once it failed."""
    return f"asp_sync/{int(version)}"


def recv_key(version: int) -> str:
    """The store key of ``version``'s receiver counter: the steps of all its receivers together,
    plus :data:`FAILED` once one gave up."""
    return f"asp_recv/{int(version)}"


def store_of(comm) -> Optional[Any]:
    """The rendezvous store ``comm`` was formed on (None once let go): the gloo communicator's
    ``store``, or the ``StatelessProcessGroup.store`` of vLLM's / vllm-ascend's communicators."""
    store = getattr(comm, "store", None)
    if store is None:
        store = getattr(getattr(comm, "group", None), "store", None)
    return store


def read_sync(store, version: int, key=sync_key) -> int:
    """``version``'s counter in ``store`` (``key``: :func:`sync_key`, the sender's, or :func:`recv_key`;
    one round trip; ``add`` of 0, which does not block on a key not yet set, as ``get`` would: an
    unset counter reads 0). Raises what the store raises."""
    return int(store.add(key(version), 0))


def mark_failed(store, version: int, key=sync_key) -> bool:
    """Add :data:`FAILED` to ``version``'s counter ``key`` in ``store`` (the sender's, :func:`sync_key`,
    before it drops the group; a receiver's, :func:`recv_key`, before it aborts its end). Returns
    whether it was written: a store that fails here is going away, which the other side reads the
    same way, and this side's own error is the one to raise."""
    if store is None:
        return False
    try:
        store.add(key(version), FAILED)
        return True
    except Exception:  # noqa: BLE001 - best effort; see the docstring
        return False


class SendProgress:
    """The sender's steps on ``version``, counted in the store of its communicator ``comm``
    (:func:`sync_key`; :class:`RecvProgress`: a receiver's, :func:`recv_key`). Call :meth:`step`
    where the transfer advances (never from a thread beside it: a beat must prove that the transfer
    itself moves). At most one write per ``min_interval_s``; nothing once the group let go of its
    store, or after a write failed (the other side sees a failing store itself). The store is looked
    up at each step, never kept: a failed transfer's frames, kept with its exception, must not keep
    the store (and its port) alive past the group's drop."""

    key_of = staticmethod(sync_key)

    def __init__(self, comm, version: int, min_interval_s: float = POLL_S):
        self.comm, self.key, self.min_interval_s = comm, self.key_of(version), float(min_interval_s)
        self._last = -float("inf")

    def step(self) -> None:
        now = time.monotonic()
        if self.comm is None or now - self._last < self.min_interval_s:
            return
        self._last = now
        try:
            store_of(self.comm).add(self.key, 1)
        except Exception:  # noqa: BLE001 - see the class docstring (a let-go store is None here)
            self.comm = None


class RecvProgress(SendProgress):
    """A receiver's steps on ``version`` (:func:`recv_key`, one counter all receivers add to): its
    start and each bucket it received, so the sender tells a slow receiver from a hung one."""

    key_of = staticmethod(recv_key)


class SenderFailed(RuntimeError):
    """A weight-sync receive ended because its sender failed (it marked the version failed, its store
    went away) or stalled (:class:`SenderStalled`)."""


class SenderStalled(SenderFailed):
    """A weight-sync receive ended because nothing progressed for ``weight_sync.stall_timeout_s``."""


class ReceiverFailed(RuntimeError):
    """A weight-sync send ended because a receiver gave up (it marked the version's receiver counter
    failed) or stalled (:class:`ReceiverStalled`)."""


class ReceiverStalled(ReceiverFailed):
    """A weight-sync send ended because no receiver progressed for ``weight_sync.stall_timeout_s``."""


class SenderWatch:
    """What one receive of ``version`` knows of its sender. :meth:`arrived` after each bucket;
    :meth:`check` while one is awaited (one store round trip; ``checks`` counts them). Progress is a
    bucket arriving here or the sender's counter moving; ``stall_key`` is the config key the stall
    error names (its spelling in the caller's config). :meth:`give_up` marks this side failed."""

    doing, own_key = "receiving", staticmethod(recv_key)
    then = "join again for the next version"

    def __init__(self, comm, version: int, stall_s: float = STALL_S, stall_key: str = STALL_KEY,
                 poll_s: float = POLL_S):
        self.comm, self.version = comm, int(version)   # its store is looked up at each check, never kept
        self.stall_s, self.stall_key, self.poll_s = float(stall_s), stall_key, float(poll_s)
        self.checks, self._seen, self._since = 0, 0, time.monotonic()

    def arrived(self) -> None:
        self._since = time.monotonic()

    def check(self, what: str) -> Optional[SenderFailed]:
        """The error to stop with while awaiting ``what`` (e.g. ``bucket 2/3``), or None to go on."""
        self.checks += 1
        stop = self._why()
        if stop is None:
            return None
        cls, why = stop
        return cls(f"weight sync: {self.doing} version {self.version} stopped at {what}: {why}; "
                   f"this end of the group is aborted ({self.then})")

    def give_up(self) -> None:
        """Mark this side's counter of the version failed (best effort), before this end is aborted:
        the other side stops within a poll instead of waiting out its own stall timeout."""
        mark_failed(store_of(self.comm), self.version, self.own_key)

    # what this side watches: the other side's counter, the errors it stops with, and how it says why
    watched_key, failed, stalled = staticmethod(sync_key), SenderFailed, SenderStalled

    def _store_fails(self, exc: BaseException) -> str:
        return f"the sender's store no longer answers ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"

    def _marked(self) -> str:
        return f"the sender marked version {self.version} failed"

    def _stalled(self, waited: float, count: int) -> str:
        return (f"no progress for {waited:.1f} s (no bucket arrived and the sender, whose store still answers, "
                f"made no step and did not mark the version failed: it hangs); if it is slow but healthy (a large "
                f"bucket on a slow link, a long preparation before the first bucket), raise {self.stall_key} "
                f"(now {self.stall_s:g} s)")

    def _why(self) -> Optional[tuple[type, str]]:
        store = store_of(self.comm)
        if store is None:
            return self.failed, "the group's store was let go"
        try:
            count = read_sync(store, self.version, self.watched_key)
        except Exception as exc:  # noqa: BLE001 - any store error: it no longer answers
            return self.failed, self._store_fails(exc)
        if count >= FAILED:
            return self.failed, self._marked()
        now = time.monotonic()
        if count != self._seen:                      # the other side made a step
            self._seen, self._since = count, now
        elif now - self._since >= self.stall_s:
            return self.stalled, self._stalled(now - self._since, count)
        return None


class ReceiverWatch(SenderWatch):
    """What the sender of ``version`` knows of its receivers while a bucket of its is pending (a gloo
    root's broadcast completes once every receiver posted its receive; NCCL's root kernel once the
    ring took the data). Progress is a bucket completing here or the receivers' counter
    (:func:`recv_key`) moving; a receiver that gave up marked it failed. A sender's own store does
    not go away under it, but one let go (or failing) ends the wait as well."""

    doing, own_key = "sending", staticmethod(sync_key)
    then = "the version is marked failed; the next send forms the group again"

    watched_key, failed, stalled = staticmethod(recv_key), ReceiverFailed, ReceiverStalled

    def _store_fails(self, exc: BaseException) -> str:
        return f"the store fails ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"

    def _marked(self) -> str:
        return f"a receiver gave up on version {self.version}"

    def _stalled(self, waited: float, count: int) -> str:
        return (f"no progress for {waited:.1f} s (this bucket did not complete and no receiver made a step ({count} "
                f"so far) or gave up: one hangs, or died with its process left); if one is slow but healthy (a large "
                f"bucket on a slow link), raise {self.stall_key} (now {self.stall_s:g} s)")


class WorkPending:
    """A torch.distributed ``Work`` (gloo) whose completion :meth:`wait` can wait on with a timeout:
    its future's callback sets an event, so a finished bucket is seen at once, without polling."""

    def __init__(self, work):
        self.work = work
        self._done = threading.Event()
        work.get_future().add_done_callback(lambda _fut: self._done.set())

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def result(self) -> None:
        """Raise the collective's own error, if it ended in one. The work is let go either way: a
        caller that keeps the error keeps this frame, which must not keep the group's resources."""
        try:
            self.work.wait()
        finally:
            self.work = None

    def detach(self):
        """Hand the work over (to whoever keeps it until it ends); this object no longer holds it."""
        work, self.work = self.work, None
        return work


class EventPending:
    """A device event recorded after the broadcast on its stream (CUDA / NPU), queried until it
    completes: at first right away, then at most :data:`_EVENT_SLEEP_MAX_S` apart."""

    def __init__(self, event):
        self.event = event

    def wait(self, timeout: float) -> bool:
        deadline, sleep = time.monotonic() + timeout, 1e-4
        while not self.event.query():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(sleep, left))
            sleep = min(sleep * 2, _EVENT_SLEEP_MAX_S)
        return True

    def result(self) -> None:
        """A device collective reports no error of its own here."""

    def detach(self):
        event, self.event = self.event, None
        return event


def start_broadcast(comm, tensor, src: int):
    """Issue ``comm``'s broadcast of ``tensor`` from ``src`` so its completion can be polled.
    A communicator with ``broadcast_async`` (the gloo one) returns its pending operation; vLLM's
    ``PyNcclCommunicator`` / vllm-ascend's ``PyHcclCommunicator`` enqueue the broadcast on the
    device's current stream, after which the platform records an event there."""
    start = getattr(comm, "broadcast_async", None)
    if callable(start):
        return start(tensor, src)
    from . import get_platform

    platform = get_platform(comm.device.type, check=False)
    stream = platform.current_stream(comm.device)
    comm.broadcast(tensor, src, stream=stream)
    return EventPending(platform.record_event(stream))


def wait_bucket(comm, pending, watch: SenderWatch, what: str) -> None:
    """Wait until ``pending`` (:func:`start_broadcast`) completes, asking ``watch`` (a receiver's
    :class:`SenderWatch`, the sender's :class:`ReceiverWatch`) every ``watch.poll_s`` seconds whether
    to stop; if so, mark this side failed (``watch.give_up``), abort ``comm``
    (:func:`abort_communicator`) and raise the watch's error, which names the version and ``what``
    (e.g. ``bucket 2/3``)."""
    while not pending.wait(watch.poll_s):
        err = watch.check(what)
        if err is not None:
            watch.give_up()
            abort_communicator(comm, pending)
            raise err
    pending.result()
    watch.arrived()


class BucketSender:
    """The sender's side of one version over ``comm``: its steps counted in the store
    (:class:`SendProgress`, the first at once), each of its ``n`` buckets issued
    (:func:`start_broadcast`) and awaited under a :class:`ReceiverWatch` (:func:`wait_bucket`).
    :meth:`step` counts a step of the sender's own (e.g. a tensor gathered)."""

    def __init__(self, comm, version: int, n: int, stall_s: float = STALL_S, stall_key: str = STALL_KEY,
                 src: int = 0):
        self.comm, self.n, self.src = comm, int(n), src
        self.progress = SendProgress(comm, version)
        self.progress.step()
        self.watch = ReceiverWatch(comm, version, stall_s, stall_key)

    def step(self) -> None:
        self.progress.step()

    def bucket(self, i: int, flat) -> None:
        """Broadcast bucket ``i`` (0-based), ``flat``, and wait until it completed."""
        pending = start_broadcast(self.comm, flat, self.src)
        self.progress.step()
        wait_bucket(self.comm, pending, self.watch, f"bucket {i + 1}/{self.n}")


def abort_communicator(comm, pending=None) -> None:
    """Abort this end of the group while ``pending`` may still be in flight.

    gloo (a communicator with ``abort``): the group cannot end its own pending operation, and
    releasing it waits for that operation to end, so it is handed with the pending work to a thread
    that releases both once it ends (a receive: the sender's drop closes its connections; a send:
    the hung receiver's end closes; at the latest the group's timeout). vLLM's ``PyNcclCommunicator``: ``destroy()``, ``ncclCommAbort``
    (vLLM runs it in a thread it waits on for 5 s), which ends the pending kernel. vllm-ascend's
    ``PyHcclCommunicator`` offers no abort (its ``close`` synchronizes the device first, which would
    wait on the pending broadcast; HCCL's ``HcclCommDestroy`` is all its wrapper binds), so the
    pending ``HcclBroadcast`` stays on the stream until HCCL's own execution timeout: the receiver
    only stops waiting. Either way the store is let go."""
    held = pending.detach() if pending is not None else None
    abort = getattr(comm, "abort", None)
    if callable(abort):
        abort(held)
    elif callable(getattr(comm, "destroy", None)):
        comm.destroy()
    group = getattr(comm, "group", None)
    if group is not None and hasattr(group, "store"):
        group.store = None


def release_when_done(work, *held) -> None:
    """Keep ``work`` (a pending gloo operation) and ``held`` (its group) on a daemon thread until the
    work ends, then drop them there: releasing a gloo group waits for its pending operations, which
    must not block the receiver. The caller must keep no reference of its own."""
    box = [work, *held]
    del work, held
    threading.Thread(target=_wait_then_clear, args=(box,), name="asp-weight-sync-release", daemon=True).start()


def _wait_then_clear(box: list) -> None:
    try:
        if box[0] is not None:
            box[0].wait()
    except Exception:  # noqa: BLE001 - the receive failed, as it had to: nothing to report
        pass
    box.clear()
