"""One schedule, three executors, with what only the runtime has: an instance that dies, one that
Ray restarts, a run resumed from its checkpoint, an epoch re-planned from observed lengths, and
admission by unfinished sequences.

The runtime side is the real loop on a real Ray cluster with the real trainer and scripted
rollout instances (scripted_runtime.py); the simulator and MindSpeed-RL's source execute the same
schedule (for re-planning: the schedule the run ended with).

Where the three must agree, whatever failed or restarted: every iteration trains exactly the
schedule's groups (membership), every sample once (exactly-once), every group within the lag
bound k. Real vLLM instances under failures and restarts: tests/reliability (slow). The trainer's
own mechanisms (streamed steps, regrouping) on the same harness: test_execution_streaming.py.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from exec_common import G, R, assert_agree, runtime_trained, schedule_and_lengths

# the trainer needs torch + transformers; no vLLM (the instances are Ray actors)
pytestmark = [pytest.mark.runtime, pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in
                                                         ("torch", "transformers")), reason="torch/transformers missing")]

ray = pytest.importorskip("ray")

from asp_ascend.pipeline import checkpoint  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan, jobs_from_schedule  # noqa: E402
from asp_ascend.scheduler.planner import plan  # noqa: E402
from scripted_runtime import cluster, trainer  # noqa: E402,F401 (the fixtures)
from scripted_runtime import (EPOCHS, K, instance_events, lengths_of, others,  # noqa: E402
                              release_when, run_loop, settings_for, start_trainer)


@pytest.mark.parametrize("restarts", [0, 1])
def test_instance_dies_and_ray_restarts_it(cluster, trainer, tmp_path, restarts):
    """Instance 1 crashes after handing back two groups: its unfinished prompts move to instance
    0 (``restarts=0``), or Ray restarts it and it rejoins after receiving the newest weights.
    However long the restart takes (it was a race with the run's end), the run cannot end before
    it: the second epoch's groups are held until the restarted instance 1 has a group in flight.
    It gets one: the first epoch trains meanwhile, so the second's first iterations are
    admissible, and instance 1 (its queue moved to instance 0 when it failed) takes one of
    instance 0's queued groups."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    lengths = lengths_of(sched, resp)

    def rejoined_and_working(orch):
        release_when(orch, lambda: orch.feeder.inflight[1] > 0 and any(
            ev["state"] == "up" for ev in orch.timeline.events["instance"]))
    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths, tmp_path,
                    die_after=(0, 2), restarts=restarts, held={g for g in lengths if g.startswith("1:")} if restarts
                    else (), on_orch=rejoined_and_working if restarts else None)
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    events = instance_events(orch)
    assert [(r, s) for r, s, _ in events] == [(1, "down")] + ([(1, "up")] if restarts else [])
    req = orch.timeline.frame("request")
    t_down = events[0][2]
    after = req[req["t_admit"] > t_down]
    planned_on_1 = set(sched.loc[sched["instance"] == 1, "prompt_id"])
    assert (after[after["instance"] == 0]["prompt_id"].isin(planned_on_1)).any()   # the survivor took over
    if restarts:
        assert (req[(req["instance"] == 1) & (req["t_admit"] > events[1][2])]).shape[0] > 0  # it works again
    else:
        assert (after["instance"] == 0).all()


def test_resume_from_checkpoint(cluster, trainer, tmp_path):
    """Four iterations, a checkpoint every two; then a new trainer from the newest checkpoint and
    new instances train the rest. Both attempts together train the schedule exactly once."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    lengths = lengths_of(sched, resp)
    first = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings, max_iterations=4), lengths,
                     tmp_path / "a1", checkpoint_every=2)
    assert sorted(p.name for p in (tmp_path / "a1" / "checkpoints").glob("iter_*")) == ["iter_000002", "iter_000004"]
    res = checkpoint.load(checkpoint.find_latest(tmp_path / "a1" / "checkpoints"))
    assert res.version == 4 and len(res.history) == 4 * 6 * G   # the lengths of the trained iterations
    resumed = start_trainer(res.path)
    assert ray.get(resumed.load_checkpoint.remote(str(res.path))) == 4
    second = run_loop(resumed, ExecutionPlan.from_schedule(sched, settings, start=4), lengths, tmp_path / "a2",
                      version=4, history=res.history)
    assert {st["iteration"] for st in first.timeline.events["step"]} == set(range(4))
    assert {st["iteration"] for st in second.timeline.events["step"]} == set(range(4, 8))
    trained, lags, times = runtime_trained([first.timeline, second.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    assert len(second.history) == len(sched) * G
    ray.kill(resumed)


def test_adaptive_replanning(cluster, trainer, tmp_path):
    """``scheduler.adaptive``: epoch 1 is planned during the run from epoch 0's observed lengths;
    the simulator and MindSpeed-RL's source then execute the schedule the run ended with."""
    sched0, resp0 = schedule_and_lengths("asp", K, epochs=1)
    truth = {p: row for p, row in zip(sched0["prompt_id"], resp0)}
    lengths = {**lengths_of(sched0, resp0), **{f"1:{p}": [int(x) for x in row] for p, row in truth.items()}}
    planned = []

    def replan(epoch: int, history: list[dict], offset: int):
        seen = pd.DataFrame(history).groupby("prompt_id")["response_length"].mean()   # a prior for the unseen
        ids = np.array(sorted(truth), dtype=object)
        df = plan(ids, np.array([seen.get(p, 20.0) for p in ids]), np.full(len(ids), 3.0), policy="asp", group_size=G,
                  global_batch_size=6, mini_batch_size=3, num_instances=R, max_num_seqs=4, lag_bound=K, epoch=epoch,
                  iteration_offset=offset, seed=1)
        planned.append(df)
        return jobs_from_schedule(df)

    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched0, settings_for(adaptive=True)), lengths, tmp_path,
                    replan=replan)
    assert len(planned) == 1 and int(planned[0]["iteration"].min()) == 4
    observed = {h["prompt_id"] for h in orch.history if h["epoch"] == 0}
    assert len(observed) == len(truth)
    from_seen = [pred == pytest.approx(np.mean(truth[p])) for p, pred in zip(planned[0]["prompt_id"],
                                                                           planned[0]["predicted_length"])]
    assert sum(from_seen) >= len(from_seen) // 2     # planned from what was seen (a prior for the rest)
    sched = pd.concat([sched0, planned[0]], ignore_index=True)
    resp = np.array([truth[p] for p in sched["prompt_id"]])
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings_for()))

def test_adaptive_resume_before_the_last_epoch_is_planned(cluster, trainer, tmp_path):
    """``scheduler.adaptive`` stopped in epoch 0 (checkpoint at version 2), resumed with a new trainer and
    new instances: the resumed loop re-plans epoch 1 (``plan.next_epoch``) from the checkpoint's length
    history (the trained iterations' rows) and what it observes after; both attempts together train the
    schedule the run ended with exactly once, as the simulator and MindSpeed-RL's source do."""
    sched0, resp0 = schedule_and_lengths("asp", K, epochs=1)
    truth = {p: row for p, row in zip(sched0["prompt_id"], resp0)}
    lengths = {**lengths_of(sched0, resp0), **{f"1:{p}": [int(x) for x in row] for p, row in truth.items()}}
    planned, given = [], []

    def replan(epoch: int, history: list[dict], offset: int):
        given.append(list(history))
        seen = pd.DataFrame(history).groupby("prompt_id")["response_length"].mean()
        ids = np.array(sorted(truth), dtype=object)
        df = plan(ids, np.array([seen.get(p, 20.0) for p in ids]), np.full(len(ids), 3.0), policy="asp", group_size=G,
                  global_batch_size=6, mini_batch_size=3, num_instances=R, max_num_seqs=4, lag_bound=K, epoch=epoch,
                  iteration_offset=offset, seed=1)
        planned.append((epoch, df))
        return jobs_from_schedule(df)

    settings = settings_for(adaptive=True)
    first = run_loop(trainer, ExecutionPlan.from_schedule(sched0, settings, max_iterations=2), lengths,
                     tmp_path / "a1", replan=replan, checkpoint_every=2)
    assert planned == []                                # killed before epoch 0 was dispatched
    res = checkpoint.load(checkpoint.find_latest(tmp_path / "a1" / "checkpoints"))
    assert res.version == 2 and len(res.history) == 2 * 6 * G
    resumed = start_trainer(res.path)
    assert ray.get(resumed.load_checkpoint.remote(str(res.path))) == 2
    plan2 = ExecutionPlan.from_schedule(sched0, settings, start=2)
    assert plan2.next_epoch == 1 and plan2.end == 8
    second = run_loop(resumed, plan2, lengths, tmp_path / "a2", version=2, history=res.history, replan=replan)
    (epoch, df), = planned
    assert epoch == 1 and int(df["iteration"].min()) == 4
    assert given[0][:len(res.history)] == res.history   # the checkpoint's rows, then what the resumed run saw
    sched = pd.concat([sched0, df], ignore_index=True)
    resp = np.array([truth[p] for p in sched["prompt_id"]])
    trained, lags, times = runtime_trained([first.timeline, second.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings_for()))
    ray.kill(resumed)


def test_sequence_admission(cluster, trainer, tmp_path):
    """``rollout.admission: sequences``: an instance takes another group while its unfinished
    samples (the last poll's count, plus G per group sent since) are fewer than max_num_seqs.
    Exactly-once, membership and the lag bound hold as with group slots (the simulator and
    MindSpeed-RL's source run the schedule by group slots: the same groups per iteration); no
    group was admitted where max_num_seqs samples were already unfinished (at most one group
    over), and an instance did hold more groups than its two slots (finished samples no longer
    hold room): each instance keeps the last sample of its first two groups unfinished until it
    has received a third group, which the rule admits once their first samples are done."""
    settings = settings_for(admission="sequences")
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths_of(sched, resp), tmp_path,
                    hold_last_of_first=2)
    assert orch.feeder.by_sequences
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings_for()))
    req = orch.timeline.frame("request")
    most = 0
    for _, g in req.groupby(["epoch", "prompt_id"]):
        r, t = int(g["instance"].iloc[0]), float(g["t_admit"].iloc[0])
        on = req[(req["instance"] == r) & (req["t_admit"] < t)]
        assert int((on["t_finish"] > t).sum()) < settings.max_num_seqs
        groups = on[on["t_finish"] > t].groupby(["epoch", "prompt_id"]).ngroups
        most = max(most, groups + 1)
    assert most > settings.group_slots
