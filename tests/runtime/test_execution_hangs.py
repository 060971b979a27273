"""The hung-trainer and hung-sync bounds through the real loop: an instance whose weight receive
never returns, a trainer whose broadcast never returns (pipeline/sync_retry.py), and a trainer
whose train step, checkpoint save, publish or open_group never returns (pipeline/train_watch.py,
pipeline/trainer_waits.py).

The runtime side is scripted_runtime.py's: ``Orchestrator.run`` on Ray with the real trainer on a
tiny model, the real broadcast weight sync (a gloo group; the scripted instances receive every
bucket for real), fleet and sample queue. The bound (``weight_sync.stall_timeout_s`` + the slack
``PendingSyncs.send_slack_s``, 300 + 30 s by default) is cut to seconds here. Without the bound
the first run never ends (its sync waits on the hung instance for ever) and the second blocks
until the run timeout (the trainer's send never returns). The hung step's bound
(``train.step_timeout_s``, 1800 s by default) is cut to 3 s, for the save, the publish and the
open_group too; without it the loop waits on the call until the run timeout.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import time

import pytest

from exec_common import G, assert_agree, runtime_trained, schedule_and_lengths

pytestmark = [pytest.mark.runtime, pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in
                                                         ("torch", "transformers")), reason="torch/transformers missing")]

ray = pytest.importorskip("ray")

from asp_ascend.metrics import Timeline  # noqa: E402
from asp_ascend.pipeline.actors import kill_trainer  # noqa: E402
from asp_ascend.pipeline.checkpoint import clean_stale_saves, find_latest, is_valid  # noqa: E402
from asp_ascend.pipeline.sync_retry import TrainerHung  # noqa: E402
from asp_ascend.pipeline.train_watch import CheckpointSaveHung, GroupOpenHung, PublishHung, TrainStepHung  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan  # noqa: E402
from scripted_runtime import cluster  # noqa: E402,F401 (the fixture)
from scripted_runtime import (K, hanging_group_trainer_class, hanging_publish_trainer_class,  # noqa: E402
                              hanging_save_trainer_class, hanging_step_trainer_class, hanging_trainer_class,
                              instance_events, lengths_of, others, run_loop, settings_for, start_trainer)

STALL_S, SLACK_S = 4.0, 2.0   # a receiver's (and sender's) stall timeout; the bound's slack beyond it
RUN_S = 240                    # a run that outlives this hangs
STEP_S, STEP_FACTOR = 3.0, 2.0  # train.step_timeout_s, train.step_timeout_factor
STEP_RUN_S = 60                 # the hung-step run stops within the bound, seconds into the run


def test_instance_whose_receive_never_returns_is_failed_over_as_hung(cluster, tmp_path):
    """Instance 1 receives its third broadcast (the first push counts) but its ``update_weights``
    never returns. Once the trainer's send has ended, the loop waits ``stall + slack`` s, kills it
    and fails it over as hung; the sync ends with instance 0 and the run finishes on it: every
    sample trained once, the schedule's membership and lag bound kept."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=2)
    lengths = lengths_of(sched, resp)
    trainer = start_trainer(cluster)
    try:
        orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths, tmp_path, hang_sync=(0, 3),
                        transport="broadcast", stall_timeout_s=STALL_S, send_slack_s=SLACK_S, run_timeout_s=RUN_S)
    finally:
        ray.kill(trainer)
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    assert [(r, s) for r, s, _ in instance_events(orch)] == [(1, "down")]
    reason = orch.timeline.events["instance"][0]["reason"]      # the run's files say why, not only the log line
    assert "it hangs" in reason and f"{STALL_S + SLACK_S:g} s" in reason, reason
    hung = [m for m in orch.log.said if "instance 1" in m and "it hangs" in m]
    assert len(hung) == 1 and f"{STALL_S + SLACK_S:g} s" in hung[0] and "treating it as failed" in hung[0], \
        orch.log.said
    req = orch.timeline.frame("request")
    assert (req[req["t_admit"] > instance_events(orch)[0][2]]["instance"] == 0).all()   # the survivor took over


@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_trainer_whose_send_never_returns_stops_the_run(cluster, tmp_path, checkpoint_every):
    """The trainer's broadcast of version 2 never returns; the instances give up on it after the
    stall timeout. ``stall + slack`` s later the run stops with TrainerHung naming the version and
    resume=true, whether the loop was waiting on its syncs or (``checkpoint_every=2``) on the
    trainer's checkpoint of version 2, which queues behind the hung send."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=2)
    lengths = lengths_of(sched, resp)
    trainer = start_trainer(cluster, hanging_trainer_class(hang_from=2))
    try:
        with pytest.raises(TrainerHung) as err:
            run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths, tmp_path, transport="broadcast",
                     stall_timeout_s=STALL_S, send_slack_s=SLACK_S, run_timeout_s=RUN_S,
                     checkpoint_every=checkpoint_every)
    finally:
        ray.kill(trainer)
    msg = str(err.value)
    assert "weight sync of version 2:" in msg and "resume=true" in msg and "weight_sync.stall_timeout_s" in msg
    waited = float(re.search(r"has not returned (\d+) s after", msg).group(1))
    assert STALL_S + SLACK_S - 1 <= waited <= STALL_S + SLACK_S + 15, msg


def _run_until_hung(cluster, tmp_path, trainer_class, error, checkpoint_every: int = 1, **loop):
    """(trainer, the raised ``error``'s ExceptionInfo, seconds to it, the orchestrators seen) of the real
    loop over one epoch (a checkpoint every ``checkpoint_every`` iterations, the hung-step bounds) with a
    trainer of ``trainer_class`` that hangs (``loop``: more of ``run_loop``'s arguments); ``asp train``'s
    teardown (``kill_trainer``) ends the hung actor."""
    sched, resp = schedule_and_lengths("asp", K, epochs=1)
    lengths = lengths_of(sched, resp)
    trainer = start_trainer(cluster, trainer_class)
    seen: list = []
    t0 = time.monotonic()
    try:
        with pytest.raises(error) as err:
            run_loop(trainer, ExecutionPlan.from_schedule(sched, settings_for()), lengths, tmp_path,
                     checkpoint_every=checkpoint_every, step_timeout=(STEP_S, STEP_FACTOR), run_timeout_s=STEP_RUN_S,
                     on_orch=seen.append, **loop)
        took = time.monotonic() - t0
    finally:
        kill_trainer(trainer)      # the hung actor goes, its call with it
    return trainer, err, took, seen


def _assert_stopped(tmp_path, seen, took, call: str, slack_s: float, said: str, label: str, **fields) -> dict:
    """What every hung-trainer stop leaves: the timeline's one ``trainer`` event (state hung, ``call``,
    ``fields``) sent ``waited_s`` past a bound >= train.step_timeout_s by at most ``slack_s``, the run
    stopped within its timeout, and the log line starting with ``said``. Returns the event."""
    (ev,) = Timeline.read_jsonl(tmp_path / "timeline.jsonl").events["trainer"]
    assert ev["state"] == "hung" and ev["call"] == call and all(ev[k] == v for k, v in fields.items()), ev
    assert ev["bound_s"] >= STEP_S and ev["bound_s"] < ev["waited_s"] <= ev["bound_s"] + slack_s, ev
    print(f"{label}: stopped {ev['waited_s']:.2f} s after it was sent, bound {ev['bound_s']:.2f} s")
    assert took < STEP_RUN_S, took
    assert [m for m in seen[0].log.said if m.startswith(said)], seen[0].log.said
    return ev


def test_trainer_whose_train_step_never_returns_stops_the_run(cluster, tmp_path):
    """The trainer's fifth ``train_step`` (iteration 2's first mini-batch; two per iteration) never
    returns. Once it has been out max(train.step_timeout_s, factor x the slowest step so far) the
    run stops with TrainStepHung naming the iteration, the call, the seconds, the keys and the
    checkpoint to resume from; the checkpoints written before (one per iteration) are all
    complete, the newest is version 2, and the timeline's last event says why. ``asp train``'s
    teardown (``kill_trainer``) ends the hung actor."""
    trainer, err, took, seen = _run_until_hung(cluster, tmp_path, hanging_step_trainer_class(hang_at=5), TrainStepHung)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(trainer.ready.remote(), timeout=30)
    msg = str(err.value)
    assert isinstance(err.value, TrainerHung)      # one type to catch for a hung trainer
    assert msg.startswith("iteration 2 (policy version 2), mini-batch "), msg
    assert "the trainer's train_step of 6 sample(s) has not returned" in msg, msg
    assert "train.step_timeout_s = 3 s" in msg and "train.step_timeout_factor 2 x the slowest of 4" in msg, msg
    assert f"{tmp_path / 'checkpoints' / 'iter_000002'}, with resume=true" in msg, msg
    _assert_stopped(tmp_path, seen, took, "train_step", 2.0, "trainer hung: its train_step of iteration 2",
                    "hung train step", iteration=2)
    ck = tmp_path / "checkpoints"
    assert find_latest(ck).name == "iter_000002"
    assert sorted(p.name for p in ck.iterdir()) == ["iter_000001", "iter_000002", "latest"]   # nothing half-written
    assert all(is_valid(ck / n) for n in ("iter_000001", "iter_000002"))


def test_trainer_whose_checkpoint_save_never_returns_stops_the_run(cluster, tmp_path):
    """The trainer's second ``save_checkpoint`` (version 2; one per iteration) writes its files and
    never returns. Once it has been out max(train.step_timeout_s, factor x the slowest save so far)
    the run stops with CheckpointSaveHung naming the version, the seconds, the keys and the newest
    complete checkpoint, version 1; the half-written folder of version 2 is never renamed, nor
    named by ``latest``, nor taken for a resume; the timeline's last event says why. The next attempt's
    start removes it (``clean_stale_saves``), but not a folder a live process may still be writing."""
    _, err, took, seen = _run_until_hung(cluster, tmp_path, hanging_save_trainer_class(hang_at=2), CheckpointSaveHung)
    msg = str(err.value)
    assert isinstance(err.value, TrainerHung), type(err.value)
    assert msg.startswith("checkpoint of policy version 2: the trainer's save_checkpoint into "), msg
    assert "train.step_timeout_s = 3 s" in msg and "the slowest of 1 checkpoint save(s)" in msg, msg
    assert f"{tmp_path / 'checkpoints' / 'iter_000001'}, with resume=true" in msg, msg
    _assert_stopped(tmp_path, seen, took, "save_checkpoint", 1.0, "trainer hung: its save_checkpoint of version 2",
                    "hung checkpoint save", version=2)
    ck = tmp_path / "checkpoints"
    names = sorted(p.name for p in ck.iterdir())
    assert names[:2] == ["iter_000001", "iter_000002.tmp-" + names[1].split("-")[-1]] and names[2:] == ["latest"], names
    assert (ck / "latest").read_text().strip() == "iter_000001" and find_latest(ck).name == "iter_000001"
    assert (ck / names[1] / "model.safetensors").is_file() and not is_valid(ck / names[1])   # written, never used
    # the next attempt's start (pipeline/run.py, before its first save) removes that folder, but keeps one
    # whose name carries the pid of a live process (a save that may still be writing it) until it is gone
    writer = subprocess.Popen(["sleep", "120"])
    busy = f"iter_000003.tmp-{writer.pid}"
    try:
        (ck / busy).mkdir()
        said: list[str] = []
        assert [p.name for p in clean_stale_saves(ck, said.append)] == [names[1]]
        assert sorted(p.name for p in ck.iterdir()) == ["iter_000001", busy, "latest"]
        assert said[0] == f"checkpoints: removed {names[1]}, left by a save that did not finish (never used for a resume)"
        assert said[1].startswith(f"checkpoints: kept {busy}, left by a save that did not finish: process {writer.pid} "
                                  "is alive on this host and may still be writing it"), said
    finally:
        writer.kill()
        writer.wait()
    assert [p.name for p in clean_stale_saves(ck, said.append)] == [busy]   # once its process is gone
    assert said[2].startswith(f"checkpoints: removed {busy}"), said
    assert sorted(p.name for p in ck.iterdir()) == ["iter_000001", "latest"] and find_latest(ck).name == "iter_000001"


@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_trainer_whose_publish_of_the_last_version_never_returns_stops_the_run(cluster, tmp_path, checkpoint_every):
    """The trainer's ``publish`` of version 4, the run's last (one epoch of 4 iterations, object store),
    never returns: no train step follows to time it. Once it has been out max(train.step_timeout_s,
    factor x the slowest publish so far) the run stops with PublishHung naming the version, the seconds,
    the keys and the newest complete checkpoint, whether the loop was waiting on the version's sync
    (``checkpoint_every=0``) or on the checkpoint of version 4, queued behind the publish (``1``)."""
    _, err, took, seen = _run_until_hung(cluster, tmp_path, hanging_publish_trainer_class(4), PublishHung,
                                         checkpoint_every)
    msg = str(err.value)
    assert isinstance(err.value, TrainerHung), type(err.value)
    assert msg.startswith("policy version 4: the trainer's publish of version 4 (object_store: "), msg
    assert "train.step_timeout_s = 3 s" in msg and "2 x the slowest of 3 publish call(s) so far" in msg, msg
    ck = tmp_path / "checkpoints"
    if checkpoint_every:
        assert f"{ck / 'iter_000003'}, with resume=true" in msg and find_latest(ck).name == "iter_000003", msg
    else:
        assert "no complete checkpoint exists" in msg and not ck.exists(), msg
    _assert_stopped(tmp_path, seen, took, "publish", 1.0, "trainer hung: its publish of version 4 is out",
                    f"hung publish (checkpoint_every={checkpoint_every})", version=4)


def test_trainer_whose_open_group_never_returns_stops_the_run(cluster, tmp_path):
    """Broadcast over gloo; instance 1's process exits after it handed back 7 groups, so the next sync
    forms a new group for instance 0 alone: the trainer's second ``open_group`` (the first formed the
    run's first group) never returns, while the loop waits for the port its store listens on. Once it
    has been out max(train.step_timeout_s, factor x the slowest open_group so far) the run stops with
    GroupOpenHung naming the version, the group, the seconds, the keys and the newest complete
    checkpoint; the timeline's last event says why."""
    _, err, took, seen = _run_until_hung(cluster, tmp_path, hanging_group_trainer_class(hang_at=2), GroupOpenHung,
                                         transport="broadcast", die_after=(0, 7), stall_timeout_s=STALL_S,
                                         send_slack_s=SLACK_S)
    msg = str(err.value)
    assert isinstance(err.value, TrainerHung), type(err.value)
    m = re.match(r"weight sync of policy version (\d+): the trainer's open_group of weight-sync group 1 \(the trainer "
                 r"and the workers of instance\(s\) 0\) has not returned", msg)
    assert m, msg
    v = int(m.group(1))
    assert "train.step_timeout_s = 3 s" in msg and "no open_group call measured yet" in msg, msg
    assert "weight_sync.timeout_s = 120 s bounds the group's rendezvous" in msg, msg
    ck = tmp_path / "checkpoints"   # one per iteration: the newest is version v - 1's (none if v is 1)
    newest = f"iter_{v - 1:06d}"
    if v > 1:
        assert f"{ck / newest}, with resume=true" in msg and find_latest(ck).name == newest, msg
    else:
        assert "no complete checkpoint exists" in msg and find_latest(ck) is None, msg
    _assert_stopped(tmp_path, seen, took, "open_group", 1.0, "trainer hung: its open_group of weight-sync group 1 is out",
                    f"hung open_group (version {v})", version=v)
    assert [(e["instance"], e["state"]) for e in seen[0].timeline.events["instance"]] == [(1, "down")]
