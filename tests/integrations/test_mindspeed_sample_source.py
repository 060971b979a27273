"""DispatcherSource: schedule-driven feeding of instances under the lag bound."""
from __future__ import annotations

import pandas as pd
import pytest

from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings

from .scripted_instances import LengthInstance, StepInstance


def schedule(num=24, gbs=6, r=2):
    rows = [dict(epoch=0, prompt_id=str(p), iteration=p // gbs, mini_batch=(p % gbs) // 3, instance=p % r,
                 dispatch_rank=p, predicted_length=1.0) for p in range(num)]
    return pd.DataFrame(rows)


def plan(k, group_size, slots, start=None, r=2, policy="asp"):
    s = ExecutionSettings(policy=policy, lag_bound=k, group_size=group_size, max_num_seqs=slots * group_size,
                          num_instances=r)
    return ExecutionPlan.from_schedule(schedule(r=r), s, start=start)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_feeds_by_schedule_within_the_lag_bound(k):
    sched, gbs, n = schedule(), 6, 3
    insts = [StepInstance(0), StepInstance(1)]
    src = DispatcherSource(plan(k, n, 2), insts, lambda pid: ([int(pid), 1], {"labels": int(pid)}),
                           sampling={"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0,
                                     "stop_token_ids": []}, poll_interval_s=0.0)
    seen = []
    for i in range(4):
        groups = src.get_groups(i, gbs)
        assert sorted(g.prompt_id for g in groups) == sorted(sched[sched.iteration == i].prompt_id)
        for g in groups:
            assert 0 <= i - g.admission_version <= k
            assert g.instance == int(g.prompt_id) % 2            # the schedule's placement
            assert len(g.responses) == n and all(len(r) == len(lp) for r, lp in zip(g.responses, g.rollout_log_probs))
            assert g.extras == {"labels": int(g.prompt_id)}
        seen += [g.prompt_id for g in groups]
        for inst in insts:           # the weight push: every instance holds version i + 1
            inst.version = i + 1
        src.on_published(i + 1)
    assert sorted(seen, key=int) == [str(p) for p in range(24)]
    assert all(inst.max_running <= 2 for inst in insts)


def test_resume_skips_done_iterations():
    src = DispatcherSource(plan(1, 2, 4, start=2), [StepInstance(0), StepInstance(1)], lambda pid: ([1], {}),
                           sampling={}, poll_interval_s=0.0)
    assert src.plan.dispatcher.total == 12 and src.plan.dispatcher.adm.instance_version == [2, 2]


def test_shared_queue_and_guided_dispatch_reach_the_instances():
    """fifo-style policies pull from one queue (any instance may run any prompt); with
    guided dispatch an idle instance takes the busy one's next job."""
    sampling = {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0, "stop_token_ids": []}
    one_sided = schedule().assign(instance=0)                          # every prompt planned on instance 0

    def source(policy, dispatch):
        s = ExecutionSettings(policy=policy, lag_bound=1, group_size=2, max_num_seqs=4, num_instances=2,
                              dispatch=dispatch)
        return DispatcherSource(ExecutionPlan.from_schedule(one_sided, s), [StepInstance(0), StepInstance(1)],
                                lambda pid: ([int(pid)], {}), sampling=sampling, poll_interval_s=0.0)

    assert {g.instance for g in source("asp", "static").get_groups(0, 6)} == {0}
    assert {g.instance for g in source("fifo", "static").get_groups(0, 6)} == {0, 1}    # one shared queue
    # stealing: instance 0 takes its own first two groups (2 slots of G = 2 in max_num_seqs 4); instance 1,
    # nothing of its own (work 0), takes instance 0's next one as 0 + 1 < 22: the 22 groups of 1 predicted
    # token still queued there (no estimator here: running groups count nothing)
    assert {g.instance for g in source("asp", "guided").get_groups(0, 6)} == {0, 1}


def test_starved_source_times_out_with_state():
    from asp_ascend.errors import AspError

    class Dead(StepInstance):
        def poll(self):
            return {"groups": []}

    sampling = {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0, "stop_token_ids": []}
    src = DispatcherSource(plan(0, 2, 1), [Dead(0), Dead(1)], lambda pid: ([1], {}),
                           sampling=sampling, poll_interval_s=0.0, timeout_s=0.05)
    with pytest.raises(AspError, match="iteration 0: 0/6 groups"):
        src.get_groups(0, 6)


SAMPLING = {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0, "stop_token_ids": []}


class VersionedInstance(StepInstance):
    def __init__(self, idx, log):
        super().__init__(idx)
        self.log = log

    def submit(self, group_id, *a, **kw):
        self.log.append(("submit", self.idx, self.version))
        return super().submit(group_id, *a, **kw)


def test_resume_pushes_the_trainer_weights_before_the_first_admission():
    """wire_source: the plan starts at the checkpointed iteration and the instances (on dummy weights)
    get the trainer's weights as that version before any prompt is admitted."""
    from asp_ascend.integrations.mindspeed_rl.sample_source import wire_source

    log = []
    insts = [VersionedInstance(0, log), VersionedInstance(1, log)]

    def push(version):
        log.append(("push", version))
        for inst in insts:
            inst.version = version

    src, publish = wire_source(plan(1, 2, 2, start=2), insts, lambda pid: ([int(pid)], {}), sampling=SAMPLING,
                               push=push, poll_interval_s=0.0)
    assert log[0] == ("push", 2) and all(e[2] == 2 for e in log if e[0] == "submit")
    groups = src.get_groups(2, 6)
    assert sorted(int(g.prompt_id) for g in groups) == list(range(12, 18))
    assert all(g.admission_version == 2 for g in groups)
    publish(3)
    assert len(src.get_groups(3, 6)) == 6


def test_a_plan_from_the_first_iteration_stalls_a_resumed_trainer():
    """What happened before: the plan started at iteration 0 with no push, so a trainer resumed at
    iteration 3 (k = 1) waits on groups no instance may admit, until the timeout."""
    from asp_ascend.errors import AspError

    src = DispatcherSource(plan(1, 2, 2), [StepInstance(0), StepInstance(1)], lambda pid: ([int(pid)], {}),
                           sampling=SAMPLING, poll_interval_s=0.0, timeout_s=0.05)
    with pytest.raises(AspError, match="iteration 3: 0/6 groups"):
        src.get_groups(3, 6)


def test_partial_rollout_carries_a_late_group_over_exactly_once_within_k_plus_s():
    """DESIGN 9 e on the MindSpeed-RL path: iteration 0 waits only on prompt 1 (40 decode steps, predicted 40);
    it is deferred to iteration 1 and a finished group of iteration 1 takes its slot; every group is handed
    out exactly once, each within lag k + its deferral <= k + S."""
    from asp_ascend.integrations.mindspeed_rl.async_loop import AsyncGRPOLoop, LoopPorts, LoopSettings
    from asp_ascend.scheduler.admission import LagViolation
    from asp_ascend.scheduler.tail_control import TailOptions

    gbs, n, k, S = 4, 2, 1, 1
    lengths = {str(p): (40 if p == 1 else 2 + p % 2) for p in range(12)}
    rows = [dict(epoch=0, prompt_id=str(p), iteration=p // gbs, mini_batch=(p % gbs) // 2, instance=p % 2,
                 dispatch_rank=p, predicted_length=float(lengths[str(p)])) for p in range(12)]
    s = ExecutionSettings(policy="asp", lag_bound=k, group_size=n, max_num_seqs=4 * n, num_instances=2)
    p = ExecutionPlan.from_schedule(pd.DataFrame(rows), s)
    insts = [LengthInstance(0, lengths), LengthInstance(1, lengths)]
    src = DispatcherSource(p, insts, lambda pid: ([int(pid), 1], {}),
                           sampling={"max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0, "stop_token_ids": []},
                           poll_interval_s=0.0, tail=TailOptions(reestimate=True, partial_rollout=True, max_split=S),
                           max_tokens=64)
    trained = []
    for i in range(3):
        groups = src.get_groups(i, gbs)
        for g in groups:
            late = i - g.planned_iteration
            assert g.iteration == i and late <= S
            assert 0 <= i - g.admission_version <= k + max(0, late)
        trained.append(sorted(g.prompt_id for g in groups))
        for inst in insts:
            inst.version = i + 1
        src.on_published(i + 1)
    assert "1" not in trained[0] and "1" in trained[1]                 # carried over one iteration
    assert len(trained[0]) == gbs and any(int(x) >= gbs for x in trained[0])   # a group of iteration 1 took its slot
    assert sorted(x for t in trained for x in t) == sorted(str(q) for q in range(12))   # exactly once
    assert [e for e, _ in src.tail_events].count("defer") == 1

    # the loop holds the carried-over group to max_split (checked before anything is written)
    g = groups[0]
    g.planned_iteration = 0
    one = type("One", (), {"get_groups": lambda self, i, c: [g] * c})()
    loop = AsyncGRPOLoop(LoopPorts(actor=None, store=None, samples=one, compute_rewards=None,
                                   compute_advantage=None, publish_weights=None),
                         LoopSettings(global_batch_size=1, group_size=n, lag_bound=k, iterations=3, start_iteration=2,
                                      max_split=S))
    with pytest.raises(LagViolation, match="2 iterations late, rollout.max_split allows 1"):
        loop.run_iteration(2)
