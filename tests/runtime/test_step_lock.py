"""The rollout instance's engine lock (engines/rollout.py: StepLock): the step loop takes it
again right after each engine step; a caller (submit, poll, a weight update) that waits for it
must get it before the loop's next step, not whenever the loop happens to let go."""
import threading
import time

from asp_ascend.engines.rollout import StepLock


def _order(lock, turn, caller_waits) -> list[str]:
    """The loop holds a turn while a caller asks for the lock; the loop ends its turn and at
    once asks for the next one. Returns who got the lock first after that."""
    order: list[str] = []
    first = turn()
    first.__enter__()

    def caller():
        with lock:
            order.append("caller")

    t = threading.Thread(target=caller)
    t.start()
    caller_waits()
    first.__exit__(None, None, None)
    with turn():
        order.append("loop")
    t.join(timeout=10)
    return order


def _until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        assert time.time() < deadline, "the caller never started waiting"
        time.sleep(0.001)


def test_a_waiting_caller_goes_before_the_loops_next_step():
    lock = StepLock()
    assert _order(lock, lock.for_step, lambda: _until(lambda: lock.waiting == 1)) == ["caller", "loop"]
    assert lock.waiting == 0


def test_callers_and_the_loop_never_hold_it_together():
    lock = StepLock()
    inside = [0]
    seen = []
    stop = threading.Event()

    def enter():
        inside[0] += 1
        seen.append(inside[0])
        time.sleep(0.0005)
        inside[0] -= 1

    def loop():
        while not stop.is_set():
            with lock.for_step():
                enter()

    def caller():
        for _ in range(50):
            with lock:
                enter()

    threads = [threading.Thread(target=loop, daemon=True)] + [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(timeout=30)
    stop.set()
    threads[0].join(timeout=5)
    assert seen and max(seen) == 1 and lock.waiting == 0
