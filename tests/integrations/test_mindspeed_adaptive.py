"""``asp.scheduler.adaptive`` on the MindSpeed-RL async path: the entry plans epoch 0, the driver's
sample source re-plans each later epoch from the lengths its instances returned (asp train's re-planner,
scheduler/run.plan_epoch_frame), appends it to schedule.parquet and feeds the instances by it."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.integrations.mindspeed_rl.entry import ensure_schedule
from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource, adaptive_replanner
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.run import inputs_from_config, plan_epoch_frame

from .scripted_instances import LengthInstance

N, GBS, K = 24, 6, 1
LENGTHS = {str(p): 2 + (p * 7) % 11 for p in range(N)}     # decode steps = response tokens per sample


def _config(tmp_path, adaptive=True):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "prompt": "w " * (i % 5 + 1)}) + "\n" for i in range(N)))
    return load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'out'}", "train.epochs=2",
                              f"scheduler.adaptive={str(adaptive).lower()}", "scheduler.policy=asp",
                              "pipeline.mode=async", f"pipeline.lag_bound={K}", "train.group_size=2",
                              f"train.global_batch_size={GBS}", "train.mini_batch_size=3", "rollout.num_instances=2",
                              "rollout.max_num_seqs=4", "lengths.predictor=mean", "lengths.max_response_length=64"])


def _source(cfg, path, start=0):
    sched = pd.read_parquet(path)
    settings = ExecutionSettings.from_config(cfg)
    plan = ExecutionPlan.from_schedule(sched, settings, start=start)
    replan = adaptive_replanner(cfg, sched, path, start, settings.lag_bound)
    seen = []

    def observed(epoch, history, offset):        # what the re-planner was given, to re-plan it here
        seen.append((epoch, list(history), offset))
        return replan(epoch, history, offset)

    insts = [LengthInstance(0, LENGTHS), LengthInstance(1, LENGTHS)]
    for inst in insts:                              # the trainer's weights are pushed first (wire_source)
        inst.version = start
    src = DispatcherSource(plan, insts, lambda pid: ([int(pid), 1], {}),
                           sampling={"max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0,
                                     "stop_token_ids": []}, poll_interval_s=0.0,
                           replan=observed if replan is not None else None)
    return src, seen


def _publish(src, version):
    """The weight push: every instance holds ``version``, then the source opens admission up to it + k."""
    for inst in src.instances:
        inst.version = version
    src.on_published(version)


def test_adaptive_replans_the_next_epoch_from_the_observed_lengths(tmp_path):
    cfg = _config(tmp_path)
    path = ensure_schedule(cfg)                     # the entry's ASP pass: epoch 0 alone
    assert sorted(pd.read_parquet(path)["epoch"].unique()) == [0]
    src, seen = _source(cfg, path)
    trained = {}
    for i in range(2 * N // GBS):                   # what AsyncGRPOLoop asks for, iteration by iteration
        groups = src.get_groups(i, GBS)
        assert all(0 <= i - g.admission_version <= K for g in groups)
        trained[i] = sorted(g.prompt_id for g in groups)
        _publish(src, i + 1)
    sched = pd.read_parquet(path)
    assert sorted(sched["epoch"].unique()) == [0, 1] and len(sched) == 2 * N
    # epoch 1 was planned once, by scheduler/run.plan_epoch_frame, from the lengths observed by then
    (epoch, history, offset), = seen
    assert (epoch, offset) == (1, N // GBS) and history
    assert all(h["response_length"] == LENGTHS[h["prompt_id"]] and h["epoch"] == 0 for h in history)
    want = plan_epoch_frame(cfg, inputs_from_config(cfg, None, pd.DataFrame(history)), 1, offset, lag_bound=K)
    got = sched[sched["epoch"] == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    for pid in {h["prompt_id"] for h in history}:   # its forecasts are the observed lengths, not the prior
        assert got.loc[got["prompt_id"] == pid, "predicted_length"].item() == pytest.approx(LENGTHS[pid])
    # and the instances were fed by it: each iteration of epoch 1 trained the re-planned prompts
    for i, rows in got.groupby("iteration"):
        assert trained[i] == sorted(rows["prompt_id"])
    assert sorted(p for i in trained if i >= offset for p in trained[i]) == sorted(map(str, range(N)))


def test_resume_replays_the_planned_epochs_and_refuses_one_before_the_last_is_planned(tmp_path):
    cfg = _config(tmp_path)
    path = ensure_schedule(cfg)
    with pytest.raises(ConfigError, match=r"resume: asp.scheduler.adaptive=true and .*schedule.parquet holds 1 of 2 "
                                          r"epochs.*resume with asp.scheduler.adaptive=false"):
        _source(cfg, path, start=2)
    src, seen = _source(cfg, path)                   # a fresh start plans epoch 1 during the run ...
    for i in range(2 * N // GBS):
        src.get_groups(i, GBS)
        _publish(src, i + 1)
    planned = pd.read_parquet(path)
    src, seen = _source(cfg, path, start=5)         # ... which a resume replays as written, re-planning nothing
    for i in range(5, 2 * N // GBS):
        groups = src.get_groups(i, GBS)
        assert all(0 <= i - g.admission_version <= K for g in groups)
        got = sorted(g.prompt_id for g in groups)
        assert got == sorted(planned.loc[planned["iteration"] == i, "prompt_id"])
        _publish(src, i + 1)
    assert seen == []
    pd.testing.assert_frame_equal(pd.read_parquet(path), planned)


def test_a_schedule_planned_up_front_is_refused_not_silently_replayed(tmp_path):
    """A schedule.parquet of every epoch that this run did not re-plan (planned with adaptive off) would make
    the key do nothing: refused with the fix."""
    import dataclasses

    cfg = _config(tmp_path)
    path = ensure_schedule(dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, adaptive=False)))
    assert sorted(pd.read_parquet(path)["epoch"].unique()) == [0, 1]
    with pytest.raises(ConfigError, match=r"asp.scheduler.adaptive: true, but .*schedule.parquet holds all 2 epochs, "
                                          r"planned before the run .*move it away"):
        _source(cfg, path)
