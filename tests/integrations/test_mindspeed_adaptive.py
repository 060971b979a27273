"""``asp.scheduler.adaptive`` on the MindSpeed-RL async path: the entry plans epoch 0, the driver's
sample source re-plans each later epoch from the lengths its instances returned (asp train's re-planner,
scheduler/run.plan_epoch_frame), appends it to schedule.parquet and feeds the instances by it. The lengths of
each iteration it hands to the trainer go to lengths/iteration_<i>.parquet first, so a run resumed before the
last epoch is planned re-plans from those of the iterations trained before its checkpoint."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.integrations.mindspeed_rl.entry import ensure_schedule
from asp_ascend.lengths.parts import LengthParts
from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource, source_state
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.run import inputs_from_config, plan_epoch_frame

from .scripted_instances import LengthInstance

N, GBS, K = 24, 6, 1
LENGTHS = {str(p): 2 + (p * 7) % 11 for p in range(N)}     # decode steps = response tokens per sample


def _tokenizer(tmp_path):
    """megatron_training.tokenizer_name_or_path (the bridge's model.path): the entry and the re-planner count the
    prompts' tokens with it (a tiny Qwen2-format tokenizer, "w" one token)."""
    from asp_ascend.engines.tiny_model import build_tokenizer, task_vocabulary

    d = tmp_path / "tokenizer"
    build_tokenizer(task_vocabulary(["w"])).save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return d


def _config(tmp_path, adaptive=True, unit="words"):
    """The run's config; ``unit``: how the entry and the re-planner count the prompts (words: the plans the
    resume tests below were worked out on; tokens: the tokenizer of model.path, test_adaptive_replans...)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "prompt": "w " * (i % 5 + 1)}) + "\n" for i in range(N)))
    return load_config(None, [f"data.path={data}", f"output_dir={tmp_path / 'out'}", "train.epochs=2",
                              f"model.path={_tokenizer(tmp_path)}", f"data.prompt_length={unit}",
                              f"scheduler.adaptive={str(adaptive).lower()}", "scheduler.policy=asp",
                              "pipeline.mode=async", f"pipeline.lag_bound={K}", "train.group_size=2",
                              f"train.global_batch_size={GBS}", "train.mini_batch_size=3", "rollout.num_instances=2",
                              "rollout.max_num_seqs=4", "lengths.predictor=mean", "lengths.max_response_length=64"])


def _source(cfg, path, start=0):
    """The source as build_async_rollout wires it (source_state: the length record, the re-planner and the
    resumed history), over in-process instances."""
    sched = pd.read_parquet(path)
    settings = ExecutionSettings.from_config(cfg)
    plan = ExecutionPlan.from_schedule(sched, settings, start=start)
    state = source_state(cfg, sched, path, start, settings.lag_bound)
    replan = state.pop("replan")
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
                           replan=observed if replan is not None else None, **state)
    return src, seen


def _publish(src, version):
    """The weight push: every instance holds ``version``, then the source opens admission up to it + k."""
    for inst in src.instances:
        inst.version = version
    src.on_published(version)


def test_adaptive_replans_the_next_epoch_from_the_observed_lengths(tmp_path):
    cfg = _config(tmp_path, unit="tokens")   # the entry and the driver count model.path's tokens
    path = ensure_schedule(cfg)                     # the entry's ASP pass: epoch 0 alone
    assert sorted(pd.read_parquet(path)["epoch"].unique()) == [0]
    assert json.loads((path.parent / "schedule_report.json").read_text())["prompt_length"]["unit"] == "tokens"
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
    from asp_ascend.integrations.prompt_tokens import counter_for

    count = counter_for(cfg)                        # the tokenizer of model.path, as the driver counts
    want = plan_epoch_frame(cfg, inputs_from_config(cfg, None, pd.DataFrame(history), count), 1, offset, lag_bound=K)
    got = sched[sched["epoch"] == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    for pid in {h["prompt_id"] for h in history}:   # its forecasts are the observed lengths, not the prior
        assert got.loc[got["prompt_id"] == pid, "predicted_length"].item() == pytest.approx(LENGTHS[pid])
    # and the instances were fed by it: each iteration of epoch 1 trained the re-planned prompts
    for i, rows in got.groupby("iteration"):
        assert trained[i] == sorted(rows["prompt_id"])
    assert sorted(p for i in trained if i >= offset for p in trained[i]) == sorted(map(str, range(N)))


def _train(src, start, end):
    """What AsyncGRPOLoop asks for, iteration by iteration, each followed by its weight push."""
    trained = {}
    for i in range(start, end):
        groups = src.get_groups(i, GBS)
        assert all(0 <= i - g.admission_version <= K for g in groups)
        trained[i] = sorted(g.prompt_id for g in groups)
        _publish(src, i + 1)
    return trained


def _key(h):
    return h["epoch"], h["prompt_id"]


@pytest.mark.parametrize("checkpoint, goes_on", [(1, True), (2, True), (3, False)])
def test_a_run_stopped_in_epoch_0_resumes_and_replans_epoch_1_from_the_lengths_up_to_its_checkpoint(tmp_path,
                                                                                                 checkpoint, goes_on):
    """Killed in epoch 0 (iterations 0..3), resumed from the checkpoint of version ``checkpoint``: the resumed
    source re-plans epoch 1 with the uninterrupted run's re-planner from the lengths of every iteration trained
    before the checkpoint (its parts, written as they were handed out) plus what its own instances finish; none
    of the killed attempt's lengths after the checkpoint. (It was refused: the lengths were not saved.)
    ``goes_on``: the attempt hands out the next iteration before it dies (at version 3 that would re-plan
    epoch 1 before the kill, which a resume then replays: test_resume_replays_the_planned_epochs)."""
    iters = 2 * N // GBS
    whole = _config(tmp_path / "whole")             # the uninterrupted run
    src, seen = _source(whole, ensure_schedule(whole))
    _train(src, 0, iters)
    (_, full, offset), = seen

    cfg = _config(tmp_path / "cut")
    path = ensure_schedule(cfg)
    src, seen = _source(cfg, path)
    _train(src, 0, checkpoint)                      # the trainer saved version `checkpoint` here, then ...
    for inst in src.instances:                      # ... the attempt goes on (new weights: other lengths)
        inst.lengths = {p: n + 40 for p, n in LENGTHS.items()}
    if goes_on:
        src.get_groups(checkpoint, GBS)             # handed out (its part written), killed before training it
        assert LengthParts(path.parent / "lengths", "iteration").path(checkpoint).is_file()
    else:
        src.fill(), src.collect()                   # groups finish after the checkpoint, then the kill
    assert seen == []
    epoch0 = pd.read_parquet(path)
    src, seen = _source(cfg, path, start=checkpoint)    # the resume (MindSpeed-RL loads version `checkpoint`)
    assert not LengthParts(path.parent / "lengths", "iteration").path(checkpoint).is_file()
    trained = _train(src, checkpoint, iters)
    (epoch, history, got_offset), = seen
    assert (epoch, got_offset) == (1, offset)

    # the history: the rows of iterations < checkpoint exactly as the uninterrupted run had them, then the groups
    # this attempt finished; nothing the killed attempt generated after its checkpoint (lengths + 40), no repeat
    before = {(e, p) for e, p, i in zip(epoch0["epoch"], epoch0["prompt_id"], epoch0["iteration"]) if i < checkpoint}
    rows = lambda hs: sorted((h["epoch"], h["prompt_id"], h["sample"], h["response_length"]) for h in hs)  # noqa: E731
    assert rows(history[:2 * GBS * checkpoint]) == rows(h for h in full if _key(h) in before)
    assert len({(*_key(h), h["sample"]) for h in history}) == len(history)
    assert all(h["response_length"] == LENGTHS[h["prompt_id"]] for h in history)
    # The difference from the uninterrupted run, precisely: groups of iterations >= checkpoint that it had
    # finished when it re-planned, but the resumed run (its instances start empty at the checkpoint) had not yet.
    # The re-plan is that of the uninterrupted run's history less those groups.
    missing = {_key(h) for h in full} - {_key(h) for h in history}
    assert {_key(h) for h in history} <= {_key(h) for h in full}
    assert missing and not missing & before         # here prompts 3 and 23 of iteration 3 (3 alone from version 3)
    seen_both = pd.DataFrame([h for h in full if _key(h) not in missing])
    want = plan_epoch_frame(cfg, inputs_from_config(cfg, None, seen_both), 1, offset, lag_bound=K)
    got = pd.read_parquet(path)
    got = got[got["epoch"] == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    for i, rows_i in got.groupby("iteration"):      # and the resumed run trained it as re-planned
        assert trained[i] == sorted(rows_i["prompt_id"])


def test_resume_replays_the_planned_epochs(tmp_path):
    cfg = _config(tmp_path)
    path = ensure_schedule(cfg)
    src, seen = _source(cfg, path)                   # a fresh start plans epoch 1 during the run ...
    _train(src, 0, 2 * N // GBS)
    planned = pd.read_parquet(path)
    src, seen = _source(cfg, path, start=5)         # ... which a resume replays as written, re-planning nothing
    trained = _train(src, 5, 2 * N // GBS)
    for i in range(5, 2 * N // GBS):
        assert trained[i] == sorted(planned.loc[planned["iteration"] == i, "prompt_id"])
    assert seen == []
    pd.testing.assert_frame_equal(pd.read_parquet(path), planned)


def test_an_adaptive_resume_without_the_trained_lengths_is_refused(tmp_path):
    """The parts of the iterations before the checkpoint are what the re-plan needs: one gone is a ConfigError
    naming the folder, the iteration and the fix, before any instance starts."""
    cfg = _config(tmp_path)
    path = ensure_schedule(cfg)
    src, _ = _source(cfg, path)
    _train(src, 0, 3)
    LengthParts(path.parent / "lengths", "iteration").path(1).unlink()
    with pytest.raises(ConfigError, match=r"resume at iteration 3: asp.scheduler.adaptive=true .*lengths has no "
                                          r"part of iteration\(s\) 1 .*resume with asp.scheduler.adaptive=false"):
        _source(cfg, path, start=3)


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
