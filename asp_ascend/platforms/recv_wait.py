"""A weight-sync receiver's wait for one bucket, which ends when the sender failed, on every backend.

A receiver's collective alone cannot tell that its sender failed mid-version: on NCCL / HCCL the
broadcast kernel waits for rank 0's data with no timeout of its own, and a gloo receive waits until
the sender's connections close. So the sender says so, in the group's rendezvous store (the one it
hosts): before it drops a failed group it sets :func:`failed_key` for that version
(:func:`mark_failed`; ``SenderEndpoint.fail``). A receiver issues each bucket's collective so that
its completion can be polled (:func:`start_broadcast`: a torch ``Work`` on gloo, a device event
recorded after the broadcast on CUDA / NPU) and, while the bucket has not arrived, asks the store
every :data:`POLL_S` seconds whether the key is set (:func:`wait_bucket`). A store that no longer
answers counts as a failed sender (its process died, or it dropped the group and closed it). On
either signal the receiver aborts its end (:func:`abort_communicator`) and raises
:class:`SenderFailed`, naming the version; its callers drop their end and join again at the next
version (``engines/vllm_ext.py``, ``integrations/mindspeed_rl/weight_push.PushEndpoint.recv``).

Cost: nothing on the store while buckets arrive within :data:`POLL_S` of being issued; one store
round trip per receiver per :data:`POLL_S` while one is awaited. torch is never imported here.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

POLL_S = 0.05
"""Seconds between two store checks while a bucket is awaited: how long after its sender marked a
version failed (or its store went away) a receiver at most keeps waiting, less the check itself."""

_EVENT_SLEEP_MAX_S = 0.005   # a device event is queried at most this far apart (it has no callback)


def failed_key(version: int) -> str:
    """The store key a sender sets when ``version`` failed on its side."""
    return f"asp_failed/{int(version)}"


def store_of(comm) -> Optional[Any]:
    """The rendezvous store ``comm`` was formed on (None once let go): the gloo communicator's
    ``store``, or the ``StatelessProcessGroup.store`` of vLLM's / vllm-ascend's communicators."""
    store = getattr(comm, "store", None)
    if store is None:
        store = getattr(getattr(comm, "group", None), "store", None)
    return store


def mark_failed(store, version: int) -> bool:
    """Set :func:`failed_key` for ``version`` in ``store`` (the sender's, before it drops the group).
    Returns whether it was set: a store that fails here is going away, which receivers read the same
    way, and the sender's own error is the one to raise."""
    if store is None:
        return False
    try:
        store.set(failed_key(version), b"1")
        return True
    except Exception:  # noqa: BLE001 - best effort; see the docstring
        return False


class SenderFailed(RuntimeError):
    """A weight-sync receive ended because its sender failed (its failure key, or its store gone)."""


def sender_failure(store, version: int) -> Optional[str]:
    """Why the sender of ``version`` counts as failed, or None while it does not (one store round trip)."""
    if store is None:
        return "the group's store was let go"
    try:
        if store.check([failed_key(version)]):
            return f"the sender marked version {version} failed"
    except Exception as exc:  # noqa: BLE001 - any store error: it no longer answers
        return f"the sender's store no longer answers ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    return None


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


def wait_bucket(comm, pending, version: int, what: str, poll_s: float = POLL_S) -> int:
    """Wait until ``pending`` (:func:`start_broadcast`) completes, checking every ``poll_s`` seconds
    whether the sender of ``version`` failed; if it did, abort ``comm`` (:func:`abort_communicator`)
    and raise :class:`SenderFailed` naming the version and ``what`` (e.g. ``bucket 2/3``). Returns the
    number of store checks it made."""
    store, checks = store_of(comm), 0
    while not pending.wait(poll_s):
        checks += 1
        why = sender_failure(store, version)
        if why is not None:
            abort_communicator(comm, pending)
            raise SenderFailed(f"weight sync: receiving version {version} stopped at {what}: {why}; "
                               f"this end of the group is aborted (join again for the next version)")
    pending.result()
    return checks


def abort_communicator(comm, pending=None) -> None:
    """Abort this receiver's end of the group while ``pending`` may still be in flight.

    gloo (a communicator with ``abort``): the group cannot end its own pending receive, and
    releasing it waits for that receive to end, so it is handed with the pending work to a thread
    that releases both once the receive ends (the sender's drop closes its connections; at the
    latest the group's timeout). vLLM's ``PyNcclCommunicator``: ``destroy()``, ``ncclCommAbort``
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
