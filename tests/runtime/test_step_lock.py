"""The rollout instance's engine lock (engines/rollout.py: StepLock): the step loop takes it
again right after each step, yet a caller waiting for it gets in after at most the step in
progress (with a plain lock it could wait many steps)."""
import threading
import time

from asp_ascend.engines.rollout import StepLock


def _run(lock, turn, calls: int = 20, step_s: float = 0.002) -> list[int]:
    """A loop holding ``lock`` for one 'step' at a time (``turn()`` is its way in) and a caller
    that takes it ``calls`` times; returns how many steps each caller call waited."""
    steps = [0]
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            with turn():
                time.sleep(step_s)   # the engine step, lock held
                steps[0] += 1

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    waited = []
    try:
        for _ in range(calls):
            time.sleep(step_s * 1.5)
            asked = steps[0]
            with lock:
                waited.append(steps[0] - asked)
    finally:
        stop.set()
        t.join(timeout=5)
    return waited


def test_a_caller_waits_for_at_most_the_step_in_progress():
    lock = StepLock()
    waited = _run(lock, lock.for_step)
    # the step in progress, plus one the loop may start between the caller reading the counter
    # and registering
    assert max(waited) <= 2, waited
    assert lock.waiting == 0


def test_a_plain_lock_starves_the_caller():
    """What StepLock is for: the same loop and caller with threading.Lock."""
    plain = threading.Lock()
    waited = _run(plain, lambda: plain, calls=5)
    assert max(waited) > 2, waited


def test_callers_and_the_loop_never_hold_it_together():
    lock = StepLock()
    inside = [0]
    seen = []
    stop = threading.Event()

    def enter(tag):
        inside[0] += 1
        seen.append(inside[0])
        time.sleep(0.0005)
        inside[0] -= 1

    def loop():
        while not stop.is_set():
            with lock.for_step():
                enter("loop")

    def caller():
        for _ in range(50):
            with lock:
                enter("caller")

    threads = [threading.Thread(target=loop, daemon=True)] + [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(timeout=30)
    stop.set()
    threads[0].join(timeout=5)
    assert seen and max(seen) == 1
