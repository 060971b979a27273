"""The admission/lag state machine shared by the simulator and the runtime."""
import random

import pytest

from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job, LagViolation


def jobs_for(n_iter, per_iter, R, interleave=False):
    out, rank = [], 0
    for it in range(n_iter):
        for j in range(per_iter):
            # optionally pull the first job of each iteration one iteration forward
            r = rank - (per_iter + 1) if interleave and j == 0 and it > 0 else rank
            out.append(Job(it, r, f"p{it}-{j}", instance=j % R))
            rank += 1
    return out


def run(k, R, n_iter=6, per_iter=8, interleave=False, shared=False, seed=0):
    """Drive the state machine with random finish order; train iteration i once all its
    jobs are done (trainer holds version i, publishes i + 1, every instance syncs)."""
    rng = random.Random(seed)
    adm = AdmissionController(k, R)
    d = Dispatcher(jobs_for(n_iter, per_iter, R, interleave), R, adm, shared=shared)
    running, done_by_iter, lags, trained = [], {}, [], 0
    while trained < n_iter:
        for inst in range(R):
            while (nxt := d.next_for(inst)) is not None:
                running.append((nxt[0], nxt[1]))
        if running and rng.random() < 0.8:
            job, v = running.pop(rng.randrange(len(running)))
            d.on_finish(job.prompt_id, job.epoch)
            done_by_iter.setdefault(job.iteration, []).append(v)
        elif len(done_by_iter.get(trained, [])) == per_iter:
            lags += [trained - v for v in done_by_iter[trained]]
            trained += 1
            adm.on_publish(trained)
            for inst in range(R):
                adm.on_instance_synced(inst, trained)
        elif not running:
            raise AssertionError("deadlock: nothing running and the next iteration is incomplete")
    assert d.done and d.pending() == 0
    return lags


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_lag_never_exceeds_k(k, interleave, shared):
    for seed in range(5):
        lags = run(k, R=3, interleave=interleave, shared=shared, seed=seed)
        assert len(lags) == 6 * 8  # every job trained once
        assert max(lags) <= k
        if k == 0:
            assert set(lags) == {0}


def test_admission_rule_and_violation():
    adm = AdmissionController(1, 2)
    assert adm.admissible(0, 1) and not adm.admissible(0, 2)
    with pytest.raises(LagViolation):
        adm.on_admit(0, 2)
    with pytest.raises(ValueError):
        adm.on_instance_synced(0, 1)  # not published yet
    adm.on_publish(1)
    adm.on_instance_synced(0, 1)
    assert adm.on_admit(0, 2) == 1
    with pytest.raises(ValueError):
        AdmissionController(-1, 1)


def test_interleaved_job_waits_without_blocking():
    adm = AdmissionController(1, 1)
    jobs = [Job(2, 0, "long-of-2"), Job(1, 1, "a-of-1"), Job(1, 2, "b-of-1")]
    d = Dispatcher(jobs, 1, adm)
    # iteration 2 needs version 1: the instance takes the admissible jobs meanwhile
    assert d.next_for(0)[0].prompt_id == "a-of-1"
    adm.on_publish(1)
    adm.on_instance_synced(0, 1)
    # now the pulled-forward job goes first (lower rank)
    assert d.next_for(0)[0].prompt_id == "long-of-2"
    assert d.next_for(0)[0].prompt_id == "b-of-1"
    assert d.next_for(0) is None


def test_blocked_by_lag_and_failover():
    adm = AdmissionController(0, 2)
    jobs = [Job(0, 0, "a", instance=0), Job(0, 1, "b", instance=0), Job(1, 2, "c", instance=1)]
    d = Dispatcher(jobs, 2, adm)
    assert d.blocked_by_lag(1) and not d.blocked_by_lag(0)
    job, v = d.next_for(0)
    moved = d.on_instance_failed(0)
    assert {j.prompt_id for j in moved} == {"a", "b"}
    # the survivor gets them, in rank order, and nothing is lost or duplicated
    got = [d.next_for(1)[0].prompt_id, d.next_for(1)[0].prompt_id]
    assert got == ["a", "b"] and d.next_for(1) is None
    with pytest.raises(ValueError):
        Dispatcher([Job(0, 0, "x", instance=5)], 2, AdmissionController(1, 2))


def test_finish_twice_is_an_error():
    adm = AdmissionController(1, 1)
    d = Dispatcher([Job(0, 0, "a")], 1, adm)
    d.next_for(0)
    d.on_finish("a")
    with pytest.raises(ValueError):
        d.on_finish("a")


def test_guided_takes_the_most_loaded_instances_next_job():
    """No estimator: an instance's remaining work is its queued jobs' predicted lengths."""
    adm = AdmissionController(1, 3)
    jobs = [Job(0, 0, "a", instance=0, predicted_length=100), Job(0, 1, "b", instance=0, predicted_length=50),
            Job(0, 2, "c", instance=1, predicted_length=10), Job(1, 3, "d", instance=1, predicted_length=900)]
    d = Dispatcher(jobs, 3, adm, dispatch="guided")
    # instance 2 has no jobs: own jobs only -> nothing
    assert d.next_for(2, steal=False) is None and d.peek(2, steal=False) is None
    # work: instance 0 = 100 + 50 = 150, instance 1 = 10 + 900 = 910, instance 2 = 0. The victim is
    # instance 1 (910 > 150), its highest-priority admissible job "c" (rank 2): 0 + 10 < 910, taken
    job, v = d.next_for(2)
    assert job.prompt_id == "c" and d.stolen == 1 and d.steals[-1][1:] == (1, 2)
    # now instance 1 = 900 ("d"), instance 0 = 150, instance 2 = 0 (a running group counts nothing
    # without an estimator). Victim instance 1, its job "d" (iteration 1, admissible at version 0
    # with k = 1): 0 + 900 >= 900, refused -- instance 2 would end where instance 1 would have
    assert d.peek(2) is None and d.next_for(2) is None and d.stolen == 1
    assert [d.next_for(0)[0].prompt_id, d.next_for(0)[0].prompt_id] == ["a", "b"]
    assert d.next_for(1)[0].prompt_id == "d"
    assert d.next_for(1) is None and d.next_for(2) is None
    # instance 1 clearly heavier: a second 900-token job "e" behind "d". After "c" is taken,
    # instance 1 = 900 + 900 = 1800: 0 + 900 < 1800, so instance 2 takes "d" (iteration 1 is
    # admissible at version 0 with k = 1); then instance 1 = 900 ("e") against 0 + 900: refused
    d3 = Dispatcher([*jobs, Job(1, 4, "e", instance=1, predicted_length=900)], 3, AdmissionController(1, 3),
                    dispatch="guided")
    assert [d3.next_for(2)[0].prompt_id, d3.next_for(2)[0].prompt_id] == ["c", "d"]
    assert d3.next_for(2) is None and [s[1:] for s in d3.steals] == [(1, 2), (1, 2)]
    # static: an instance only ever takes its own jobs
    d2 = Dispatcher(jobs, 3, AdmissionController(1, 3))
    assert d2.next_for(2) is None
    with pytest.raises(ValueError):
        Dispatcher(jobs, 3, AdmissionController(1, 3), dispatch="greedy")


def test_guided_prefers_own_work_and_respects_the_thiefs_version():
    adm = AdmissionController(0, 2)
    jobs = [Job(0, 0, "a", instance=0, predicted_length=5), Job(0, 1, "b", instance=1, predicted_length=500),
            Job(1, 2, "c", instance=1, predicted_length=500)]
    d = Dispatcher(jobs, 2, adm, dispatch="guided")
    assert d.next_for(0)[0].prompt_id == "a"          # own first, though instance 1 has more work
    assert d.next_for(0)[0].prompt_id == "b"          # then the other's admissible job
    assert d.next_for(0) is None                      # "c" (iteration 1) is not admissible at v0 with k = 0
    assert d.blocked_by_lag(1) and not d.blocked_by_lag(0)


class _Remaining:
    def __init__(self, left):
        self.left = left

    def remaining(self, key):
        return self.left[key]


def test_a_misprediction_guided_dispatch_must_correct():
    """Both instances were planned 2 x 100 tokens; instance 0's running group turns out to
    have 5,000 tokens left (re-estimated), instance 1's 10. Instance 2 has no plan of its own:
    it takes instance 0's next group, the one that would wait longest there, but not instance
    1's, which would end later on instance 2 than where it is."""
    adm = AdmissionController(1, 3)
    jobs = [Job(0, 0, "x0", instance=0, predicted_length=100), Job(0, 1, "x1", instance=0, predicted_length=100),
            Job(0, 2, "y0", instance=1, predicted_length=100), Job(0, 3, "y1", instance=1, predicted_length=100)]
    est = _Remaining({(0, "x0"): 5000.0, (0, "y0"): 10.0, (0, "x1"): 100.0})
    d = Dispatcher(jobs, 3, adm, dispatch="guided", remaining=est)
    assert d.next_for(0, steal=False)[0].prompt_id == "x0"
    assert d.next_for(1, steal=False)[0].prompt_id == "y0"
    assert d.remaining_work(0) == 5100 and d.remaining_work(1) == 110 and d.remaining_work(2) == 0
    # victim instance 0 (5100 = x1 queued 100 + x0 running 5000), its job x1: 0 + 100 < 5100, taken
    job, _ = d.next_for(2)
    assert job.prompt_id == "x1"
    # running groups never move: nothing of instance 0 is left to take. Instance 1 = y1 queued 100
    # + y0 running 10 = 110; instance 2 = x1 running 100: 100 + 100 = 200 >= 110, refused (y1 ends
    # at 110 on instance 1, at 200 on instance 2)
    assert d.remaining_work(2) == 100 and d.peek(2) is None and d.next_for(2) is None
    # x1 re-estimated at 5 tokens left: 5 + 100 = 105 < 110, taken
    est.left[(0, "x1")] = 5.0
    assert d.next_for(2)[0].prompt_id == "y1" and d.next_for(2) is None
    assert d.running[(0, "x0")][0] == 0 and [s[1:] for s in d.steals] == [(0, 2), (1, 2)]


def test_a_steal_must_lower_the_later_finish_boundary():
    """The rule alone: thief 0's remaining work W_t, the victim's best admissible job of length L,
    the victim's work W_v (the job included): taken iff W_t + L < W_v. Thief 0 runs a group with
    50 tokens left (estimator) and queues a job of iteration 2, not admissible at version 0 with
    k = 1 (it counts: 30 tokens). Victim 1 queues v0 (100, rank 1, taken first) and v1 (X), so
    W_t = 50 + 30 = 80, L = 100, W_v = 100 + X: taken iff 180 < 100 + X, i.e. X > 80."""
    def thief_and_victim(x):
        jobs = [Job(0, 0, "run", instance=0, predicted_length=50), Job(2, 3, "later", instance=0, predicted_length=30),
                Job(0, 1, "v0", instance=1, predicted_length=100), Job(0, 2, "v1", instance=1, predicted_length=x)]
        d = Dispatcher(jobs, 2, AdmissionController(1, 2), dispatch="guided",
                       remaining=_Remaining({(0, "run"): 50.0}))
        assert d.next_for(0)[0].prompt_id == "run"
        assert d.remaining_work(0) == 80 and d.remaining_work(1) == 100 + x
        return d

    d = thief_and_victim(80.0)              # 80 + 100 = 180 >= 180: a tie is refused
    assert d.peek(0) is None and d.next_for(0) is None and d.stolen == 0
    assert d.may_take(0)                    # the cheap test does not ask the rule; peek decides
    d = thief_and_victim(80.5)              # 180 < 180.5: taken
    assert d.peek(0).prompt_id == "v0"
    assert d.next_for(0)[0].prompt_id == "v0" and d.steals[-1][1:] == (1, 0)
    # a victim with more work than the thief, by less than the job: refused (the thief would end
    # at 80 + 100 = 180, past the victim's present 100)
    d = thief_and_victim(0.0)               # W_t = 80 < W_v = 100, but 180 >= 100
    assert d.next_for(0) is None


def test_without_an_estimator_running_groups_count_their_prediction():
    """No re-estimator: a running group counts its planned length in full until it finishes.
    Victim 1 runs "long" (1000) and queues "v" (100): W_v = 1100. Thief 0 runs "own" (900) and has
    nothing queued: W_t = 900, 900 + 100 = 1000 < 1100, taken. Thief 2 runs "big" (1050):
    1050 + 100 = 1150 >= 1100, refused (before, running groups counted nothing: 0 + 100 < 100 + 0
    was false for the victim's last queued job, but a thief running 1050 tokens was seen as idle)."""
    def dispatcher():
        jobs = [Job(0, 0, "long", instance=1, predicted_length=1000), Job(0, 1, "v", instance=1, predicted_length=100),
                Job(0, 2, "own", instance=0, predicted_length=900), Job(0, 3, "big", instance=2, predicted_length=1050),
                Job(0, 4, "w", instance=1, predicted_length=10)]
        d = Dispatcher(jobs, 3, AdmissionController(1, 3), dispatch="guided")
        assert [d.next_for(i, steal=False)[0].prompt_id for i in (1, 0, 2)] == ["long", "own", "big"]
        assert [d.remaining_work(i) for i in range(3)] == [900, 1110, 1050]
        return d

    d = dispatcher()
    # thief 2: victim 1 (1110, its best job "v"): 1050 + 100 = 1150 >= 1110, refused
    assert d.peek(2) is None and d.next_for(2) is None and d.stolen == 0
    # thief 0: 900 + 100 = 1000 < 1110, taken; the job now counts on the thief while it runs
    assert d.next_for(0)[0].prompt_id == "v" and d.steals[-1][1:] == (1, 0)
    assert d.remaining_work(0) == 1000 and d.remaining_work(1) == 1010
    # "own" finishes: thief 0 holds only "v" (100); victim 1's last queued job "w" (10): 110 < 1010, taken
    d.on_finish("own")
    assert d.remaining_work(0) == 100 and d.next_for(0)[0].prompt_id == "w" and d.remaining_work(1) == 1000
    # every finish and a failure take the running work off
    d.on_finish("v")
    d.on_finish("w")
    assert d.remaining_work(0) == 0.0
    moved = d.on_instance_failed(1)
    assert [j.prompt_id for j in moved] == ["long"] and d.remaining_work(1) == 0.0
    # the estimator, where there is one, replaces the predictions of running groups
    d = Dispatcher([Job(0, 0, "r", instance=0, predicted_length=500)], 1, AdmissionController(1, 1),
                   dispatch="guided", remaining=_Remaining({(0, "r"): 7.0}))
    d.next_for(0)
    assert d.remaining_work(0) == 7.0


def test_guided_steals_only_under_the_planned_concurrency():
    """The plan assumed 2 groups of G = 4 per instance (8 sequences); the instances can really
    hold more. Instance 0 runs its own long group and its own next-iteration group (8 sequences,
    the planned room): taking instance 1's queued group would slow both, so it steals nothing
    until one of its groups finished. Instance 1's own jobs are never refused."""
    adm = AdmissionController(1, 2)
    jobs = [Job(0, 0, "long", instance=0, predicted_length=5000), Job(1, 1, "next", instance=0, predicted_length=100),
            Job(0, 2, "b0", instance=1, predicted_length=100), Job(0, 3, "b1", instance=1, predicted_length=100),
            Job(0, 4, "b2", instance=1, predicted_length=100)]
    d = Dispatcher(jobs, 2, adm, dispatch="guided", steal_room=8, group_size=4)
    assert [d.next_for(0)[0].prompt_id, d.next_for(0)[0].prompt_id] == ["long", "next"]
    assert d.next_for(1)[0].prompt_id == "b0"
    assert not d.may_steal(0) and d.peek(0) is None and d.next_for(0) is None   # 2 groups x 4 = 8 held
    assert d.stolen == 0
    # 4 held once "long" finished: room under the plan's (and the finish rule, running groups counted
    # by their predictions: thief "next" 100 + b1 100 = 200 < victim b0 100 + b1 100 + b2 100 = 300)
    d.on_finish("long")
    assert d.may_steal(0) and d.next_for(0)[0].prompt_id == "b1" and d.stolen == 1
    assert d.next_for(1)[0].prompt_id == "b2"                                    # own jobs: no such limit
    # the executor's exact count replaces groups x G (the simulator's instances: running + waiting sequences)
    d.held = {0: 3, 1: 8}.__getitem__
    assert d.may_steal(0) and not d.may_steal(1)
    # steal_room 0: no limit (the Dispatcher alone, as before)
    assert Dispatcher(jobs, 2, AdmissionController(1, 2), dispatch="guided").may_steal(0)


@pytest.mark.parametrize("shared", [False, True])
def test_a_new_instance_past_the_last_joins(shared):
    """An index past the starting count joins (a server added to the run): it is alive, holds
    the version it was synced to, and takes admissible work; before, it raised IndexError."""
    jobs = [Job(0, 0, "a", instance=0), Job(0, 1, "b", instance=0), Job(1, 2, "c", instance=0)]
    adm = AdmissionController(0, 1)
    d = Dispatcher(jobs, 1, adm, shared=shared)
    d.on_instance_restarted(2)
    assert d.alive == [True, False, True] and len(adm.instance_version) == 3
    assert d.peek(1) is None                       # never joined: takes nothing
    if shared:
        assert d.next_for(2)[0].prompt_id == "a"   # the shared queue's head
    else:
        moved = d.on_instance_failed(0)            # per-instance queues: instance 0's jobs move
        assert {j.prompt_id for j in moved} == {"a", "b", "c"}
        assert d.next_for(2)[0].prompt_id == "a"
    # lag bound 0: iteration 1 waits until the new instance holds version 1
    assert [d.next_for(2)[0].prompt_id] == ["b"] and d.next_for(2) is None
    adm.on_publish(1)
    adm.on_instance_synced(2, 1)
    assert d.next_for(2)[0].prompt_id == "c"


def test_guided_counts_every_steal_and_keeps_only_the_latest():
    """``stolen`` counts the run's steals; ``steals`` keeps the latest (STEAL_RECORD, here 4), and
    ``steals_since`` reads them in order, or refuses once more were made than it kept."""
    from collections import deque

    jobs = [Job(0, i, f"v{i}", instance=0, predicted_length=10) for i in range(12)]
    d = Dispatcher(jobs, 2, AdmissionController(0, 2), dispatch="guided")
    d.steals = deque(maxlen=4)
    taken = []
    while (nxt := d.next_for(1)) is not None:          # instance 1 has no jobs of its own: it steals
        taken.append(nxt[0].prompt_id)
        d.on_finish(nxt[0].prompt_id)
    assert d.stolen == len(taken) >= 6 and len(d.steals) == 4
    assert [j.prompt_id for j, _, _ in d.steals_since(d.stolen - 4)] == taken[-4:]
    assert [s[1:] for s in d.steals_since(d.stolen - 1)] == [(0, 1)] and d.steals_since(d.stolen) == []
    with pytest.raises(RuntimeError, match="more than the 4 the dispatcher keeps"):
        d.steals_since(d.stolen - 5)
