"""The bound on a trainer hung in a train step, a checkpoint save or load, a publish (a catch-up
copy too), a node_ip or an open_group (pipeline/train_watch.py) and its config keys:
``train.step_timeout_s``, ``train.step_timeout_factor`` and ``weight_sync.send_slack_s`` (the hung
broadcast's slack, pipeline/sync_retry.py). The bound through the real loop (a real trainer whose
train step never returns): tests/runtime/test_execution_hangs.py."""
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import AspError, ConfigError
from asp_ascend.pipeline.rundir import is_safe
from asp_ascend.pipeline.sync_retry import TrainerHung
from asp_ascend.pipeline.train_watch import (CheckpointLoadHung, CheckpointSaveHung, GroupOpenHung, PublishHung,
                                             StepWatch, TrainerBounds, TrainStepHung, group_hung_message, hung_message,
                                             load_hung_message, publish_hung_message, save_hung_message)


def test_the_first_call_has_the_floor_only_then_the_bound_follows_the_slowest_call():
    w = StepWatch(timeout_s=100.0, factor=10.0)
    assert w.overdue(1e9) is None                    # nothing out
    w.sent(0.0)
    assert w.bound_s() == 100.0                      # nothing measured: the floor (a first step compiles)
    assert w.overdue(100.0) is None and w.overdue(100.5) == pytest.approx(100.5)
    assert w.done(30.0) == 30.0                      # a slow first call (compilation) is measured too
    w.sent(40.0)
    assert w.bound_s() == 300.0                      # 10 x 30 s > the floor
    assert w.overdue(340.0) is None and w.overdue(341.0) == pytest.approx(301.0)
    w.done(42.0)
    assert w.bound_s() == 300.0                      # a faster call does not lower it: the slowest counts
    assert w.calls == 2 and w.slowest == 30.0


def test_between_calls_nothing_is_overdue():
    """A checkpoint save, a wait for groups: no trainer call of a step is out, no clock runs."""
    w = StepWatch(timeout_s=5.0, factor=2.0)
    w.sent(0.0)
    w.done(1.0)
    assert w.overdue(1e6) is None
    w.sent(1e6)
    assert w.overdue(1e6 + 4.0) is None and w.overdue(1e6 + 6.0) == pytest.approx(6.0)


def test_timeout_zero_turns_the_bound_off():
    w = StepWatch(timeout_s=0.0, factor=10.0)
    w.sent(0.0)
    assert w.bound_s() == 0.0 and w.overdue(1e9) is None


def test_the_message_names_the_step_the_seconds_the_keys_and_the_way_on():
    w = StepWatch(timeout_s=1800.0, factor=10.0)
    w.sent(0.0, "train_step", 512)
    msg = hung_message("train_step", 7, 1, 512, 1900.0, w, "/runs/a/checkpoints/iter_000006")
    assert msg.startswith("iteration 7 (policy version 7), mini-batch 1: the trainer's train_step of 512 sample(s) "
                          "has not returned 1900 s after it was sent, past its bound of 1800 s"), msg
    assert "train.step_timeout_s = 1800 s and no trainer call measured yet: this is the first" in msg, msg
    assert "resume from its newest checkpoint, /runs/a/checkpoints/iter_000006, with resume=true" in msg, msg
    assert "raise train.step_timeout_s or train.step_timeout_factor" in msg, msg
    w.done(60.0)
    w.sent(100.0)
    msg = hung_message("accumulate", 9, 0, 0, 700.0, w, None)
    assert "train.step_timeout_factor 10 x the slowest of 1 trainer call(s) so far, 60.0 s" in msg, msg
    assert "the trainer's accumulate has not returned 700 s" in msg, msg
    assert "no checkpoint was written" in msg and "overwrite=true" in msg, msg


def test_a_hung_step_is_a_hung_trainer_the_cli_prints_without_a_traceback():
    assert issubclass(TrainStepHung, TrainerHung) and issubclass(TrainStepHung, AspError)
    assert issubclass(CheckpointSaveHung, TrainerHung) and issubclass(CheckpointSaveHung, AspError)


def test_the_save_message_names_the_version_the_seconds_the_keys_and_the_complete_checkpoint():
    w = StepWatch(timeout_s=100.0, factor=10.0)
    w.sent(0.0, "save_checkpoint")
    msg = save_hung_message(4, "out/checkpoints/iter_000004.tmp-7", 101.0, w, "out/checkpoints/iter_000002")
    assert msg.startswith("checkpoint of policy version 4: the trainer's save_checkpoint into "
                          "out/checkpoints/iter_000004.tmp-7 has not returned 101 s"), msg
    assert "bound of 100 s" in msg and "no checkpoint save measured yet" in msg, msg
    assert "out/checkpoints/iter_000002, with resume=true" in msg and "train.step_timeout_factor" in msg, msg
    w.done(30.0)
    w.sent(40.0, "save_checkpoint")
    msg = save_hung_message(6, "t", 400.0, w, None)
    assert "bound of 300 s" in msg and "10 x the slowest of 1 checkpoint save(s) so far, 30.0 s" in msg, msg
    assert "no complete checkpoint exists" in msg and "overwrite=true" in msg, msg


def test_the_publish_and_open_group_messages_name_the_call_the_seconds_the_keys_and_the_checkpoint():
    w = StepWatch(timeout_s=100.0, factor=10.0)
    w.sent(0.0, "publish")
    msg = publish_hung_message(5, "object_store", 101.0, w, "out/checkpoints/iter_000004")
    assert msg.startswith("policy version 5: the trainer's publish of version 5 (object_store: "), msg
    assert "not returned 101 s" in msg and "bound of 100 s" in msg and "no publish call measured yet" in msg, msg
    assert "out/checkpoints/iter_000004, with resume=true" in msg and "train.step_timeout_factor" in msg, msg
    w.done(2.0)
    w.sent(3.0, "open_group")
    msg = group_hung_message(7, 3, [0, 2], 150.0, w, None, 120.0)
    assert msg.startswith("weight sync of policy version 7: the trainer's open_group of weight-sync group 3 (the "
                          "trainer and the workers of instance(s) 0, 2) has not returned 150 s"), msg
    assert "10 x the slowest of 1 open_group call(s) so far, 2.0 s" in msg and "train.step_timeout_s = 100 s" in msg
    assert "weight_sync.timeout_s = 120 s bounds the group's rendezvous after this call, not the call" in msg, msg
    assert "no complete checkpoint exists" in msg and "overwrite=true" in msg, msg
    assert all(issubclass(e, TrainerHung) and issubclass(e, AspError) for e in (PublishHung, GroupOpenHung))


def test_the_load_node_ip_and_catch_up_messages_name_the_call_the_seconds_the_keys_and_what_to_do():
    w = StepWatch(timeout_s=100.0, factor=10.0)
    w.sent(0.0, "load_checkpoint")
    msg = load_hung_message("out/checkpoints/iter_000004", 101.0, w)
    assert msg.startswith("resume from out/checkpoints/iter_000004: the trainer's load_checkpoint (its optimizer state, "
                          "RNG states and KL reference read back) has not returned 101 s after it was sent, past its "
                          "bound of 100 s (the larger of train.step_timeout_s = 100 s and no checkpoint load measured "
                          "yet: this is the first)"), msg
    assert "checkpoint untouched; check that its file system answers (e.g. ls -l out/checkpoints/iter_000004), then " \
           "run the same command with resume=true again" in msg and "train.step_timeout_factor" in msg, msg
    w.sent(0.0, "node_ip")
    msg = group_hung_message(0, 0, [0, 1], 101.0, w, None, 120.0, "node_ip")
    assert msg.startswith("weight sync of policy version 0: the trainer's node_ip (the host its store will listen on) "
                          "of weight-sync group 0 (the trainer and the workers of instance(s) 0, 1) has not returned "
                          "101 s"), msg
    assert "(its actor stuck, its node's address not found, or in the publish queued before it)" in msg, msg
    assert "weight_sync.timeout_s = 120 s" in msg and "overwrite=true" in msg, msg
    w.sent(0.0, "publish")
    msg = publish_hung_message(3, "object_store", 101.0, w, "out/checkpoints/iter_000002", catch_up=1)
    assert msg.startswith("policy version 3: the trainer's publish of version 3 (object_store: its weights gathered and "
                          "put in Ray's object store, a catch-up copy for restarted instance 1, which rejoins once it "
                          "holds it) has not returned 101 s"), msg
    assert "instance 1 never receives version 3" in msg and "iter_000002, with resume=true" in msg, msg
    assert "the instances never receive" in publish_hung_message(3, "object_store", 101.0, w, None)
    assert issubclass(CheckpointLoadHung, TrainerHung) and issubclass(CheckpointLoadHung, AspError)


def test_the_keys_reach_the_bounds_and_may_change_on_resume(empty_yaml):
    cfg = load_config(empty_yaml, ["train.step_timeout_s=600", "train.step_timeout_factor=4",
                                   "weight_sync.transport=broadcast", "weight_sync.send_slack_s=0"])
    assert TrainerBounds.from_config(cfg) == TrainerBounds(600.0, 4.0, 0.0)
    d = load_config(empty_yaml, [])
    assert TrainerBounds.from_config(d) == TrainerBounds()
    assert (d.train.step_timeout_s, d.train.step_timeout_factor, d.weight_sync.send_slack_s) == (1800.0, 10.0, 30.0)
    # the error says to raise them and resume: a resume must accept them
    assert all(is_safe(k) for k in ("train.step_timeout_s", "train.step_timeout_factor", "weight_sync.send_slack_s"))


@pytest.mark.parametrize("over, needle", [
    ("train.step_timeout_s=0.5", "train.step_timeout_s: 0.5 must be 0 (no bound) or >= 1"),
    ("train.step_timeout_s=-1", "train.step_timeout_s: -1.0 must be 0 (no bound) or >= 1"),
    ("train.step_timeout_s=.nan", "train.step_timeout_s: nan must be a finite number"),
    ("train.step_timeout_factor=0.5", "train.step_timeout_factor: 0.5 must be >= 1; use e.g. "
                                      "train.step_timeout_factor=10.0 (the default)"),
    ("weight_sync.send_slack_s=-1", "weight_sync.send_slack_s: -1.0 must be >= 0; use e.g. "
                                    "weight_sync.send_slack_s=30.0 (the default)"),
])
def test_bad_values_are_refused_naming_the_key_and_the_fix(empty_yaml, over, needle):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, [over, "weight_sync.transport=broadcast"])
    assert needle in str(ei.value) and len(ei.value.problems) == 1, str(ei.value)


def test_keys_nothing_reads_in_the_mode_are_refused(empty_yaml):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["train.step_timeout_s=0", "train.step_timeout_factor=3"])
    assert ("train.step_timeout_factor: 3.0 has no effect: train.step_timeout_s is 0, which turns the bound on a "
            "hung trainer call (a train step, a save, a publish, ...) off") in str(ei.value)
    for over in (["weight_sync.transport=object_store"], ["platform=cpu"]):
        with pytest.raises(ConfigError) as ei:
            load_config(empty_yaml, over + ["weight_sync.send_slack_s=10"])
        assert "weight_sync.send_slack_s: 10.0 has no effect" in str(ei.value), str(ei.value)
    # where a broadcast may run, they load
    load_config(empty_yaml, ["train.step_timeout_s=0"])
    load_config(empty_yaml, ["weight_sync.send_slack_s=10"])                  # platform auto: decided at start
    load_config(empty_yaml, ["platform=cpu", "weight_sync.transport=broadcast", "weight_sync.send_slack_s=10"])


@pytest.mark.parametrize("framework", ["MindSpeed-RL", "verl"])
def test_the_framework_bridges_refuse_the_keys_their_loops_do_not_read(empty_yaml, framework):
    from asp_ascend.integrations.train_only import train_only_problems

    assert train_only_problems(load_config(empty_yaml, []), framework) == []     # the defaults: nothing set
    cfg = load_config(empty_yaml, ["train.step_timeout_s=600", "train.step_timeout_factor=3",
                                   "weight_sync.transport=broadcast", "weight_sync.send_slack_s=5"])
    got = train_only_problems(cfg, framework)
    assert [p.split(":")[0] for p in got] == ["asp.train.step_timeout_s", "asp.train.step_timeout_factor",
                                              "asp.weight_sync.send_slack_s"], got
    assert got[0] == (f"asp.train.step_timeout_s: 600 is not supported with {framework} (only asp train's loop "
                      f"bounds a hung trainer call; {framework}'s trainer runs in its own loop, which has no such "
                      f"bound); remove asp.train.step_timeout_s")
