"""The hung-instance decision (pipeline/watchdog.py) and what follows from it in the dispatcher.

The decision is a pure function of poll answers and time; a real hung instance (a stopped
process) is tested end to end in test_faults_hang.py (slow).
"""
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_ascend.pipeline.watchdog import HangWatch
from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job


def test_idle_instance_is_never_hung():
    w = HangWatch(2, 5.0)
    assert w.hung(1000.0, [False, False]) == []
    w.on_submit(0, 0.0, had_work=False)
    assert w.hung(1000.0, [False, False]) == []  # its work came back: nothing to do, not hung


def test_no_progress_past_the_timeout_is_hung():
    w = HangWatch(2, 5.0)
    w.on_submit(0, 10.0, had_work=False)
    w.on_submit(1, 10.0, had_work=False)
    w.on_poll(0, 12.0, busy_s=0.5, finished_groups=0)   # decode steps ran
    w.on_poll(1, 12.0, busy_s=0.0, finished_groups=0)   # answered, but no step completed
    assert w.hung(15.0, [True, True]) == []
    assert w.hung(15.1, [True, True]) == [1]
    w.on_poll(0, 16.0, busy_s=0.5, finished_groups=0)   # answers, busy time frozen
    assert w.hung(16.9, [True, True]) == [1]
    assert w.hung(17.01, [True, False]) == [0]          # 12 -> 17.01: no progress on 0 either
    w.on_poll(0, 18.0, busy_s=0.5, finished_groups=1)   # a finished group is progress
    assert w.hung(22.9, [True, False]) == []


def test_silent_instance_is_hung_and_timeout_zero_disables():
    w = HangWatch(1, 3.0)
    w.on_submit(0, 0.0, had_work=False)
    w.on_submit(0, 2.9, had_work=True)   # more work does not restart the clock
    assert w.hung(3.1, [True]) == [0]
    assert HangWatch(1, 0.0).hung(1e9, [True]) == []
    w.forget(0)
    assert w.hung(1e9, [True]) == []     # a failed (forgotten) instance is not reported again


def test_new_work_on_an_idle_instance_restarts_the_clock():
    w = HangWatch(1, 5.0)
    w.on_submit(0, 0.0, had_work=False)
    w.on_poll(0, 1.0, busy_s=1.0, finished_groups=1)
    w.on_submit(0, 100.0, had_work=False)  # idle for 99 s, then given work
    assert w.hung(104.0, [True]) == []
    assert w.hung(105.5, [True]) == [0]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["submit", "poll_progress", "poll_idle", "tick"]),
                          st.integers(0, 2), st.floats(0.0, 4.0)), min_size=1, max_size=60),
       st.floats(0.5, 5.0))
def test_hung_exactly_when_silent_longer_than_timeout(ops, timeout):
    """Against a direct model: hung <=> has work and (now - last progress or idle->busy start) > timeout."""
    R = 3
    w = HangWatch(R, timeout)
    now, busy_s = 0.0, [0.0] * R
    work = [0] * R
    last = [None] * R
    for op, r, dt in ops:
        now += dt
        if op == "submit":
            if work[r] == 0 or last[r] is None:
                last[r] = now
            w.on_submit(r, now, had_work=work[r] > 0)
            work[r] += 1
        elif op == "poll_progress":
            busy_s[r] += 0.01
            done = 1 if work[r] else 0
            w.on_poll(r, now, busy_s[r], done)
            work[r] -= done
            last[r] = now
        elif op == "poll_idle":
            w.on_poll(r, now, busy_s[r], 0)
        expected = [i for i in range(R) if work[i] > 0 and last[i] is not None and now - last[i] > timeout]
        assert w.hung(now, [x > 0 for x in work]) == expected


def test_hung_instance_prompts_move_once_and_keep_their_iteration():
    """What the orchestrator does with a hung instance: Dispatcher.on_instance_failed, as for a dead one."""
    jobs = [Job(i, i * 4 + j, f"p{i}-{j}", instance=j % 2) for i in range(3) for j in range(4)]
    d = Dispatcher(jobs, 2, AdmissionController(1, 2))
    started = [d.next_for(1)[0], d.next_for(1)[0]]
    w = HangWatch(2, 2.0)
    w.on_submit(1, 0.0, had_work=False)
    assert w.hung(2.5, [False, True]) == [1]
    moved = d.on_instance_failed(1)
    assert {j.prompt_id for j in started} <= {j.prompt_id for j in moved}
    finished = []
    while (nxt := d.next_for(0)) is not None or d.pending():
        if nxt is None:  # lag-blocked: publish the next version
            d.adm.on_publish(d.adm.published + 1)
            d.adm.on_instance_synced(0, d.adm.published)
            continue
        finished.append(d.on_finish(nxt[0].prompt_id, nxt[0].epoch))
    assert sorted(j.prompt_id for j in finished) == sorted(j.prompt_id for j in jobs)
    assert all(j.iteration == int(j.prompt_id[1]) for j in finished)
    assert d.done


def test_jobs_planned_for_a_failed_instance_go_to_survivors():
    """An adaptive re-plan made for R instances after one failed: nothing is stranded on it."""
    d = Dispatcher([Job(0, 0, "a", instance=0)], 2, AdmissionController(1, 2))
    d.on_instance_failed(1)
    d.add([Job(1, 1, "b", epoch=1, instance=1), Job(1, 2, "c", epoch=1, instance=0)])
    assert d.pending(1) == 0 and d.pending(0) == 3
    got = []
    while (nxt := d.next_for(0)) is not None:
        got.append(nxt[0].prompt_id)
        d.on_finish(nxt[0].prompt_id, nxt[0].epoch)
    assert sorted(got) == ["a", "b", "c"] and d.done
