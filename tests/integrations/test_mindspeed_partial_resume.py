"""Resuming a partial-rollout run on the MindSpeed-RL async path (DESIGN 9 e).

Carry-over defers a late group of iteration i to i + 1 and swaps a finished group of i + 1 into i's slot.
The trainer's checkpoint of version v knows nothing of that: the source writes the carry-over state
(pipeline/checkpoint.carry_state, asp train's ``carry_over``) to carry_over/iter_<v>.json first and a resume
restores it (source_plan -> checkpoint.carried_plan). From the schedule alone, the deferred group would never be
trained (its planned iteration is before the checkpoint) and the swapped-in one twice."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource, source_plan, source_state
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.tail_control import TailOptions

from .scripted_instances import LengthInstance

N, GBS, G, K, S = 12, 4, 2, 1, 1
LENGTHS = {str(p): (40 if p == 1 else 2 + p % 2) for p in range(N)}   # prompt 1 is late in iteration 0


def _run(tmp_path):
    """(config, schedule path): 3 iterations of 4 prompts, written where the entry writes schedule.parquet."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "prompt": "w " * (i % 5 + 1)}) + "\n" for i in range(N)))
    cfg = load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'out'}", "scheduler.policy=asp",
                             "pipeline.mode=async", f"pipeline.lag_bound={K}", f"train.group_size={G}",
                             f"train.global_batch_size={GBS}", "train.mini_batch_size=2", "rollout.num_instances=2",
                             f"rollout.max_num_seqs={4 * G}", "rollout.partial_rollout=true",
                             f"rollout.max_split={S}", "lengths.max_response_length=64"])
    rows = [dict(epoch=0, prompt_id=str(p), iteration=p // GBS, mini_batch=(p % GBS) // 2, instance=p % 2,
                 dispatch_rank=p, predicted_length=float(LENGTHS[str(p)])) for p in range(N)]
    path = tmp_path / "out" / "schedule.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path)
    return cfg, path


def _source(cfg, path, start):
    """The source as build_async_rollout wires it (source_plan, source_state), over in-process instances
    holding the trainer's version ``start`` (wire_source's first push)."""
    sched = pd.read_parquet(path)
    settings = ExecutionSettings.from_config(cfg)
    state = source_state(cfg, sched, path, start, settings.lag_bound)
    plan = source_plan(cfg, sched, settings, path, start)
    insts = [LengthInstance(0, LENGTHS), LengthInstance(1, LENGTHS)]
    for inst in insts:
        inst.version = start
    return DispatcherSource(plan, insts, lambda pid: ([int(pid), 1], {}),
                            sampling={"max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0,
                                      "stop_token_ids": []}, poll_interval_s=0.0,
                            tail=TailOptions(reestimate=True, partial_rollout=True, max_split=S), max_tokens=64,
                            **state)


def _train(src, start, end, checkpoint_at=None):
    """What AsyncGRPOTrainer.fit does per iteration: the groups (lag bound k + deferral <= k + S checked as
    the loop does), the weight push, and at ``checkpoint_at`` the source's state before the trainer's save."""
    trained = {}
    for i in range(start, end):
        groups = src.get_groups(i, GBS)
        for g in groups:
            late = i - g.planned_iteration                      # < 0: swapped in ahead of its plan
            assert g.iteration == i and late <= S
            assert 0 <= i - g.admission_version <= K + max(0, late)
        trained[i] = [g.prompt_id for g in groups]
        for inst in src.instances:
            inst.version = i + 1
        src.on_published(i + 1)
        if i + 1 == checkpoint_at:
            src.checkpoint(i + 1)
    return trained


@pytest.mark.parametrize("checkpoint", [1, 2])
def test_a_resumed_partial_rollout_run_trains_every_group_exactly_once(tmp_path, checkpoint):
    cfg, path = _run(tmp_path)
    first = _source(cfg, path, 0)
    before = _train(first, 0, checkpoint, checkpoint_at=checkpoint)   # then the run is killed
    assert "1" not in before[0] and [e for e, _ in first.tail_events].count("defer") == 1   # deferred to 1
    swapped = [p for p in before[0] if int(p) >= GBS]                  # a group of iteration 1 took its slot
    assert len(swapped) == 1
    saved = json.loads((path.parent / "carry_over" / f"iter_{checkpoint:06d}.json").read_text())
    assert saved["version"] == checkpoint

    if checkpoint == 1:   # what the schedule alone resumes: prompt 1 never again, the swapped-in group twice
        old = ExecutionPlan.from_schedule(pd.read_parquet(path), ExecutionSettings.from_config(cfg), start=1)
        later = [k[1] for mbs in old.iterations.values() for keys in mbs.values() for k in keys]
        assert "1" not in later and swapped[0] in later
        assert saved["deferred"] == [[0, "1", 0, 1]] and saved["trained_ahead"] == [[0, swapped[0], 1, 0]]

    second = _source(cfg, path, checkpoint)                           # resumed at the checkpoint's version
    if checkpoint == 1:   # the restored deferral keeps counting from its planned iteration (S = 1: no further)
        assert second.tail.carry.planned[(0, "1")] == 0 and second.plan.carried == {(0, "1"): 0}
    after = _train(second, checkpoint, N // GBS)
    got = [p for t in (before, after) for i in sorted(t) for p in t[i]]
    assert sorted(got, key=int) == [str(p) for p in range(N)]          # the schedule, each group exactly once
    assert all(len(t) == GBS for t in (*before.values(), *after.values()))


def test_a_partial_rollout_resume_without_the_carry_over_state_is_refused(tmp_path):
    cfg, path = _run(tmp_path)
    _train(_source(cfg, path, 0), 0, 1)                                # no state written (as before the fix)
    with pytest.raises(ConfigError, match=r"resume at iteration 1: asp.rollout.partial_rollout=true .*"
                                          r"carry_over/iter_000001.json .* does not exist"):
        _source(cfg, path, 1)


def test_a_carry_over_state_refuses_a_resume_without_partial_rollout(tmp_path):
    cfg, path = _run(tmp_path)
    _train(_source(cfg, path, 0), 0, 1, checkpoint_at=1)
    off = load_config(None, [f"data.path={tmp_path / 'prompts.jsonl'}", f"output_dir={tmp_path / 'out'}",
                             "pipeline.mode=async", f"train.group_size={G}", f"train.global_batch_size={GBS}",
                             "train.mini_batch_size=2", "rollout.num_instances=2"])
    with pytest.raises(ConfigError, match="holds carry-over state .* resume with rollout.partial_rollout=true"):
        source_plan(off, pd.read_parquet(path), ExecutionSettings.from_config(off), path, 1)
