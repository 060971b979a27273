"""DispatcherSource: schedule-driven feeding of instances under the lag bound."""
from __future__ import annotations

import pandas as pd
import pytest

from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings


class StepInstance:
    """An in-process instance with the runtime engine's submit/poll: a group finishes after
    ``length`` polls (decode steps); tokens are deterministic, log-probs recorded per token."""

    def __init__(self, idx: int):
        self.idx, self.version, self.running, self.max_running = idx, 0, [], 0

    def submit(self, group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta=None):
        length = 1 + (sum(prompt_token_ids) % 5)
        self.running.append({"group_id": group_id, "meta": meta, "left": length, "n": n, "len": length,
                             "version": self.version, "t": float(len(self.running))})
        self.max_running = max(self.max_running, len(self.running))
        return self.version

    def poll(self):
        done = []
        for g in list(self.running):
            g["left"] -= 1
            if g["left"] <= 0:
                self.running.remove(g)
                done.append({"group_id": g["group_id"], "meta": g["meta"], "instance": self.idx,
                             "admission_version": g["version"], "t_admit": g["t"],
                             "samples": [{"token_ids": [s] * g["len"], "logprobs": [-0.5] * g["len"],
                                          "t_finish": g["t"] + g["len"]} for s in range(g["n"])]})
        return {"groups": done}


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
    assert {g.instance for g in source("asp", "guided").get_groups(0, 6)} == {0, 1}     # stealing


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
