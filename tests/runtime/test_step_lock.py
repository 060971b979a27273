"""The rollout instance's engine lock (engines/step_lock.py: StepLock): the step loop takes it
again right after each engine step; a caller (submit, poll, a weight update) that waits for it
must get it before the loop's next step, not whenever the loop happens to let go."""
import threading
import time

import pytest

from asp_ascend.engines.step_lock import StepLock


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


class _Recorded(StepLock):
    """The engine lock, writing every caller's hold into ``log``."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __enter__(self):
        super().__enter__()
        self.log.append(("hold",))
        return self

    def __exit__(self, *exc):
        self.log.append(("release",))
        super().__exit__(*exc)


class _Engine:
    """vLLM's engine as the step loop drives it: requests stay unfinished, every step is logged."""

    def __init__(self, log: list):
        self.log, self.requests = log, []

    def add_request(self, rid, prompt, params):
        self.requests.append(rid)
        self.log.append(("add", rid))

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        self.log.append(("step",))
        time.sleep(0.001)
        return []


def _instance(log: list):
    """A RolloutEngine (its real submit paths, lock and step loop) over :class:`_Engine`."""
    from asp_ascend.engines.rollout import RolloutEngine

    eng = object.__new__(RolloutEngine)
    eng.engine, eng.instance, eng.version, eng._labels, eng.speculative = _Engine(log), 0, 3, False, {}
    eng._start_loop(0, _Recorded(log))   # the constructor's loop state and thread, as a real instance has them
    return eng


def _group(i: int) -> dict:
    return dict(group_id=f"0:p{i}", prompt_token_ids=[1, 2, 3], n=2, max_tokens=8, temperature=1.0, top_p=1.0,
                seed=i, stop_token_ids=[], meta={"epoch": 0, "prompt_id": f"p{i}"})


def test_a_burst_submitted_at_once_enters_the_engine_between_two_steps():
    """submit_many adds every group of a burst in one hold of the lock: no engine step (and no
    release of the lock) between the first group added and the last, while the loop is stepping
    (one submit per group lets the loop step between them)."""
    pytest.importorskip("vllm")
    log: list = []
    eng = _instance(log)
    try:
        eng.submit(**_group(0))                       # the loop is stepping on a running group
        _until(lambda: eng._steps >= 3)
        burst = [_group(i) for i in range(1, 17)]
        assert eng.submit_many(burst) == [3] * 16
        adds = [k for k, e in enumerate(log) if e[0] == "add" and not e[1].startswith("0:p0#")]
        assert len(adds) == 16 * 2
        between = [e[0] for e in log[adds[0]:adds[-1] + 1] if e[0] != "add"]
        assert between == [], f"the burst entered the engine across {between}"
        _until(lambda: ("step",) in log[adds[-1]:])   # and the loop steps on with the burst
        stamps = [eng._groups[g["group_id"]].t_admit for g in burst]
        assert stamps == sorted(stamps)               # each group stamped when it was added
        with pytest.raises(TypeError, match="group 0 is a list"):
            eng.submit_many([["0:p99"]])
    finally:
        eng._stop = True
        eng._wake.set()
        eng._thread.join(timeout=10)


class _Output:
    """One request's output of an engine step, as the step loop reads vLLM's."""

    def __init__(self, rid: str, finished: bool):
        from types import SimpleNamespace

        self.request_id, self.finished, self.num_cached_tokens = rid, finished, 0
        self.outputs = [SimpleNamespace(token_ids=[7], logprobs=None, finish_reason="stop" if finished else None)]


class _GatedEngine(_Engine):
    """Each engine step waits until the test lets one through (``go``) and says when it began
    (``began``); every step draws one token per request; the requests of ``finish`` (group ids)
    finish at the first step."""

    def __init__(self, log: list, finish: set):
        super().__init__(log)
        self.finish, self.began, self.go, self.steps = finish, threading.Semaphore(0), threading.Semaphore(0), 0

    def step(self):
        self.began.release()
        assert self.go.acquire(timeout=30), "the test never let the step through"
        self.steps += 1
        out = [_Output(rid, self.steps == 1 and rid.rpartition("#")[0] in self.finish) for rid in self.requests]
        self.requests = [rid for rid, o in zip(self.requests, out) if not o.finished]
        return out


def test_a_poll_returns_while_an_engine_step_is_in_progress():
    """A poll takes the instance's bookkeeping lock, not the engine lock: while an engine step runs
    (here: held inside the step until the test lets it end) a poll returns the group the step
    before it finished, and the instance's status and running count; the group is handed over once.
    Under the engine lock the poll waited for the step in progress (and the admission it
    triggered for one more)."""
    pytest.importorskip("vllm")
    log: list = []
    eng = object.__new__(__import__("asp_ascend.engines.rollout", fromlist=["RolloutEngine"]).RolloutEngine)
    gated = _GatedEngine(log, finish={"0:p0"})
    eng.engine, eng.instance, eng.version, eng._labels, eng.speculative = gated, 0, 3, False, {}
    eng._start_loop(0)
    try:
        eng.submit_many([_group(0), _group(1)])       # p0 finishes at the first step, p1 runs on
        assert gated.began.acquire(timeout=30)         # step 1 began
        gated.go.release()                             # ... and ends
        assert gated.began.acquire(timeout=30)         # step 2 is in progress, holding the engine lock
        got: dict = {}
        returned = threading.Event()

        def poll():
            got.update(eng.poll(0.0))
            got["status"] = eng.status()
            returned.set()

        threading.Thread(target=poll, daemon=True).start()
        assert returned.wait(timeout=10), "the poll waited for the engine step in progress"
        assert gated.steps == 1                        # step 2 had not ended when the poll returned
        assert [g["group_id"] for g in got["groups"]] == ["0:p0"]
        assert got["running"] == 2 and got["received"] == 4 and got["status"]["running"] == 2
        assert [len(s["token_ids"]) for s in got["groups"][0]["samples"]] == [1, 1]
        assert got["meter"]["steps"] == 1
        gated.go.release()                             # step 2 ends
        assert gated.began.acquire(timeout=30)         # step 3 began: step 2's tokens are collected
        again = eng.poll(0.0)
        assert again["groups"] == [] and again["meter"]["steps"] == 2   # the group was handed over once
    finally:
        eng._stop = True
        for _ in range(4):
            gated.go.release()
        eng._thread.join(timeout=10)


class _CoreEngine(_Engine):
    """vLLM V1's engine with its core in its own process: the core's step outputs arrive in
    ``engine_core.outputs_queue`` (here: put by the test) and ``step()`` takes the next one."""

    def __init__(self, log: list):
        import queue
        from types import SimpleNamespace

        super().__init__(log)
        self.engine_core = SimpleNamespace(outputs_queue=queue.Queue())

    def step(self):
        out = self.engine_core.outputs_queue.get()
        self.log.append(("step",))
        done = {o.request_id for o in out if o.finished}
        self.requests = [rid for rid in self.requests if rid not in done]
        return out


def _core_instance():
    from asp_ascend.engines.rollout import RolloutEngine

    eng = object.__new__(RolloutEngine)
    eng.engine, eng.instance, eng.version, eng._labels, eng.speculative = _CoreEngine([]), 0, 3, False, {}
    eng._start_loop(0)
    return eng, eng.engine.engine_core.outputs_queue


def _stop(eng, q) -> None:
    eng._stop = True
    eng._wake.set()
    for _ in range(3):
        q.put([])
    eng._thread.join(timeout=10)


def test_a_submit_goes_in_while_the_engine_core_computes_a_step():
    """While the engine core computes a step (no output queued yet) the loop waits for it without
    the engine lock, so a submit adds its requests at once: they reach the core during that step
    and join the next. (With the lock held across ``engine.step()``, the submit waited for the
    step's output and its requests joined the step after.)"""
    pytest.importorskip("vllm")
    eng, q = _core_instance()
    try:
        eng.submit(**_group(0))
        _until(lambda: len(q.not_empty._waiters) == 1)   # the loop waits for the core's first output
        returned = threading.Event()
        threading.Thread(target=lambda: (eng.submit_many([_group(1)]), returned.set()), daemon=True).start()
        assert returned.wait(timeout=10), "the submit waited for the engine core's step"
        assert eng._steps == 0 and eng.engine.requests == ["0:p0#0", "0:p0#1", "0:p1#0", "0:p1#1"]
        q.put([_Output("0:p0#0", True), _Output("0:p0#1", True), _Output("0:p1#0", False)])
        got = eng.poll(10.0)
        assert [g["group_id"] for g in got["groups"]] == ["0:p0"] and got["meter"]["steps"] == 1
        assert got["running"] == 2 and eng.engine.requests == ["0:p1#0", "0:p1#1"]
    finally:
        _stop(eng, q)


def test_a_caller_reading_the_core_queue_under_the_lock_is_not_left_waiting():
    """``llm.generate`` (warm-up) steps the engine itself under the engine lock, reading the same
    queue as the loop's wait: the wake-up of an output that the loop's wait took is passed on."""
    pytest.importorskip("vllm")
    eng, q = _core_instance()
    try:
        eng.submit(**_group(0))
        _until(lambda: len(q.not_empty._waiters) == 1)   # the loop waits (first in line)
        got = []

        def generate():
            with eng._lock:
                got.append(eng.engine.step())

        t = threading.Thread(target=generate, daemon=True)
        t.start()
        _until(lambda: len(q.not_empty._waiters) == 2)   # the caller waits in the queue's get
        q.put([_Output("0:p0#0", False)])                 # one output: its wake-up goes to the loop first
        t.join(timeout=10)
        assert not t.is_alive(), "the caller under the lock never got the queued output"
        assert [o.request_id for o in got[0]] == ["0:p0#0"]
    finally:
        _stop(eng, q)
