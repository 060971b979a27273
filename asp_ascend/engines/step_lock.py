"""The rollout instance's engine lock: its step loop against the callers (``submit``, weight
updates), fair to the callers. (``poll`` does not take it: it reads the instance's bookkeeping
under a lock of its own, ``RolloutEngine._state``.) Also the step loop's wait for the engine
core's output without the lock (:func:`await_core`)."""
from __future__ import annotations

import threading
from typing import Callable


class StepLock:
    """The engine's lock, fair to callers: the step loop holds it for one engine step at a time
    and takes it again right after, so with a plain lock a caller (``submit``, a weight
    update) woken by the release finds it taken again and can wait several steps (on the 2-core
    tail benchmark the 16 admissions of one iteration reached their instances over up to 0.9 s,
    up to 0.4 s with this lock). Here a caller registers before it waits, and the loop
    (:meth:`for_step`) lets every registered caller through before its next step: a caller
    waits for at most the step in progress. ``with lock:`` is the callers' way in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting = 0
        self._gate = threading.Condition(threading.Lock())

    def __enter__(self) -> "StepLock":
        with self._gate:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._gate:
                self._waiting -= 1
                if not self._waiting:
                    self._gate.notify_all()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def for_step(self) -> "_LoopTurn":
        """``with lock.for_step():`` the loop's turn: after the callers waiting now."""
        return _LoopTurn(self)

    @property
    def waiting(self) -> int:
        return self._waiting


class _LoopTurn:
    def __init__(self, lock: StepLock):
        self.lock = lock

    def __enter__(self) -> StepLock:
        g = self.lock._gate
        with g:
            while self.lock._waiting:
                g.wait(timeout=0.05)
        self.lock._lock.acquire()
        return self.lock

    def __exit__(self, *exc) -> None:
        self.lock._lock.release()


def core_outputs(engine):
    """The queue ``engine``'s core step outputs arrive in when the core runs in its own process
    (vLLM V1's ``SyncMPClient.outputs_queue``), else None (then ``engine.step()`` waits for them
    under the engine lock)."""
    import queue

    q = getattr(getattr(engine, "engine_core", None), "outputs_queue", None)
    return q if isinstance(q, queue.Queue) else None


def await_core(q, engine, stopped: Callable[[], bool]) -> None:
    """The step loop's wait, without the engine lock, until the engine core has queued a step's
    output in ``q`` (:func:`core_outputs`; or nothing is unfinished, or ``stopped()``). The core
    computes a step while this process waits for it, so a ``submit`` (or a weight update) goes in
    meanwhile: its requests reach the core during that step and join the next, instead of waiting
    for the step's output and joining the one after (the core runs a step ahead of this process).
    ``engine.step()``, which then returns at once, and every other engine call stay under the
    engine lock. A wake-up this wait consumed is passed on, so a caller reading the same queue
    (``llm.generate`` of ``RolloutEngine.warm_up`` under the engine lock) is not left waiting for a
    later output. (``q._qsize``: ``qsize()`` would take the queue's mutex, held here.)"""
    with q.not_empty:
        while not q._qsize() and not stopped() and engine.has_unfinished_requests():
            q.not_empty.wait(timeout=0.005)
        if q._qsize():
            q.not_empty.notify()
