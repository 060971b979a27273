"""The trainer's calls outside the loop's own waits, hung for real: before the loop (``warm_up``: a
resume's ``load_checkpoint``, the first ``publish``, ``node_ip`` and ``open_group`` of the first
broadcast group; pipeline/start_waits.py) and a restarted instance's catch-up publish in the loop
(pipeline/fleet.py, pipeline/trainer_waits.py).

Each runs ``asp train``'s own code (``actors.warm_up``, ``Orchestrator.run``) on Ray with the real
trainer on a tiny model whose call sleeps for an hour, and scripted instances (scripted_runtime.py;
over the broadcast they receive for real over gloo). ``train.step_timeout_s`` (1800 s by default)
is cut to 3 s: the run must stop within 1 s past the bound with the call's error, a ``trainer``
event in ``timeline.jsonl`` and a log line; ``asp train``'s teardown (``kill_trainer``,
``shutdown_instances``) then leaves no actor alive. Without the bounds each wait blocks until the
test's timeout.
"""
from __future__ import annotations

import importlib.util
import re
import threading
import time

import pytest

from exec_common import R, schedule_and_lengths

pytestmark = [pytest.mark.runtime, pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in
                                                         ("torch", "transformers")), reason="torch/transformers missing")]

ray = pytest.importorskip("ray")

from asp_ascend.config import load_config  # noqa: E402
from asp_ascend.data.datasets import prompts_from_config  # noqa: E402
from asp_ascend.metrics import Timeline  # noqa: E402
from asp_ascend.pipeline import checkpoint  # noqa: E402
from asp_ascend.pipeline.actors import kill_trainer, shutdown_instances, warm_up  # noqa: E402
from asp_ascend.pipeline.logger import RunLogger  # noqa: E402
from asp_ascend.pipeline.orchestrator import RunOutputs  # noqa: E402
from asp_ascend.pipeline.sync_retry import TrainerHung  # noqa: E402
from asp_ascend.pipeline.train_watch import CheckpointLoadHung, GroupOpenHung, PublishHung  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan  # noqa: E402
from scripted_runtime import cluster  # noqa: E402,F401 (the fixture)
from scripted_runtime import (ScriptedInstance, hanging_call_trainer_class, hanging_group_trainer_class,  # noqa: E402
                              hanging_publish_trainer_class, lengths_of, run_loop, settings_for, start_trainer)

STEP_S, STEP_FACTOR = 3.0, 2.0   # train.step_timeout_s, train.step_timeout_factor
RUN_S = 60                        # a wait that outlives this hangs
SLACK_S = 1.0                     # how far past its bound a hung call may stop the run


def _logger(out):
    """The run's logger, its lines also kept in ``logger.said``."""
    logger = RunLogger(out, tensorboard=False, wandb_project=None, progress=False, total_iterations=0)
    logger.said, say = [], logger.say
    logger.say = lambda msg: (logger.said.append(msg), say(msg))[1]
    return logger


def _in_thread(fn, timeout_s: float = RUN_S):
    """``fn()``'s result, or its error raised here; fails if it is still running after ``timeout_s``."""
    got: dict = {}

    def target():
        try:
            got["done"] = fn()
        except BaseException as exc:  # re-raised below, in the test
            got["error"] = exc
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still waiting after {timeout_s:g} s"
    if "error" in got:
        raise got["error"]
    return got["done"]


def _warm_up_until_hung(cluster, out, trainer_class, error, transport: str = "object_store", resume_at: int = 0):
    """(the raised ``error``'s ExceptionInfo, seconds to it, the run's log lines) of ``asp train``'s
    ``warm_up`` (``weight_sync.transport``: ``transport``; ``resume_at``: resume from a checkpoint of
    that version, which the trainer writes first; 0: a fresh run) with a trainer of ``trainer_class``
    and scripted instances; then ``asp train``'s teardown, after which no actor is left alive."""
    stall = ["weight_sync.stall_timeout_s=4", "weight_sync.send_slack_s=2"] if transport == "broadcast" else []
    cfg = load_config(None, [f"train.step_timeout_s={STEP_S:g}", f"train.step_timeout_factor={STEP_FACTOR:g}",
                             "train.warmup_sft_steps=0", f"weight_sync.transport={transport}", *stall,
                             f"rollout.num_instances={R}", "rollout.max_num_seqs=4", f"output_dir={out}"])
    train, _ = prompts_from_config(cfg)
    trainer = start_trainer(cluster, trainer_class)
    ray.get(trainer.ready.remote())   # constructed, as start_actors leaves it (its calls' clocks start after)
    insts = [ScriptedInstance.remote(r, {}) for r in range(R)]
    logger = _logger(out)
    resume = None
    if resume_at:   # the trainer holds version ``resume_at`` (its publish sets it), as after that iteration
        ray.get(trainer.publish.remote(resume_at))
        write = lambda tmp: ray.get(trainer.save_checkpoint.remote(str(tmp), {"iteration": resume_at}))  # noqa: E731
        resume = checkpoint.load(checkpoint.save(out / "checkpoints", resume_at, write,
                                                 checkpoint.run_state([], resume_at, 4)))
    t0 = time.monotonic()
    try:
        with pytest.raises(error) as err:
            _in_thread(lambda: warm_up(cfg, trainer, insts, train, None, {p: [3, 4, 5] for p in train.ids}, resume,
                                       RunOutputs(out / "timeline.jsonl", logger, time.time(), 0, out / "checkpoints")))
        took = time.monotonic() - t0
    finally:   # asp train's teardown (run._run)
        shutdown_instances(insts)
        kill_trainer(trainer)
    for actor in [trainer, *insts]:   # nothing left running: the hung call ended with its actor
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=30)
    logger.close()
    assert isinstance(err.value, TrainerHung), type(err.value)
    return err, took, logger.said


def _assert_stopped(out, took, said, call: str, version: int, log: str, label: str, iteration=None) -> dict:
    """The timeline's one ``trainer`` event (state hung, ``call``, ``version``, ``iteration``), sent
    ``waited_s`` past a bound of train.step_timeout_s (nothing measured) by at most SLACK_S; the
    run's log line starting with ``log``; the run stopped within RUN_S."""
    (ev,) = Timeline.read_jsonl(out / "timeline.jsonl").events["trainer"]
    assert (ev["state"], ev["call"], ev["version"], ev["iteration"], ev["mini_batch"]) == \
        ("hung", call, version, iteration, None), ev
    assert ev["bound_s"] == STEP_S and STEP_S < ev["waited_s"] <= STEP_S + SLACK_S, ev
    print(f"{label}: stopped {ev['waited_s']:.2f} s after it was sent, bound {ev['bound_s']:.2f} s")
    assert took < RUN_S, took
    assert [m for m in said if m.startswith(log)], said
    return ev


def _waited(msg: str) -> float:
    return float(re.search(r"has not returned (\d+) s after it was sent, past its bound of 3 s", msg).group(1))


def test_resume_whose_load_checkpoint_never_returns_stops_the_run(cluster, tmp_path):
    """A resume from the checkpoint of version 2: the trainer's ``load_checkpoint`` never returns (a
    file system that blocks). The run stops before its loop with CheckpointLoadHung naming the
    checkpoint, the seconds, the keys and what to check; the checkpoint is left as it was."""
    err, took, said = _warm_up_until_hung(cluster, tmp_path, hanging_call_trainer_class("load_checkpoint"),
                                          CheckpointLoadHung, resume_at=2)
    msg, ck = str(err.value), tmp_path / "checkpoints" / "iter_000002"
    assert msg.startswith(f"resume from {ck}: the trainer's load_checkpoint (its optimizer state"), msg
    assert "train.step_timeout_s = 3 s and no checkpoint load measured yet" in msg and _waited(msg) >= 3, msg
    assert f"ls -l {ck}), then run the same command with resume=true again" in msg, msg
    assert "raise train.step_timeout_s or train.step_timeout_factor" in msg, msg
    _assert_stopped(tmp_path, took, said, "load_checkpoint", 2, f"trainer hung: its load_checkpoint of checkpoint {ck}",
                    "hung load_checkpoint")
    assert checkpoint.find_latest(tmp_path / "checkpoints") == ck and checkpoint.is_valid(ck)


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_first_publish_that_never_returns_stops_the_run(cluster, tmp_path, transport):
    """The trainer's publish of version 0, the run's first, never returns. The run stops before its
    loop with PublishHung naming version 0 and ``overwrite=true`` (no checkpoint), whether ``warm_up``
    waits on the instances' receives (object store) or on ``node_ip`` queued behind the publish
    (broadcast: the publish's own clock started first and names it)."""
    err, took, said = _warm_up_until_hung(cluster, tmp_path, hanging_publish_trainer_class(0), PublishHung, transport)
    msg = str(err.value)
    assert msg.startswith(f"policy version 0: the trainer's publish of version 0 ({transport}: its weights gathered"), msg
    assert "train.step_timeout_s = 3 s and no publish call measured yet" in msg and _waited(msg) >= 3, msg
    assert "no complete checkpoint exists, so start it again with overwrite=true" in msg, msg
    _assert_stopped(tmp_path, took, said, "publish", 0, "trainer hung: its publish of version 0 is out",
                    f"hung first publish ({transport})")


@pytest.mark.parametrize("call", ["node_ip", "open_group"])
def test_first_group_whose_call_never_returns_stops_the_run(cluster, tmp_path, call):
    """Broadcast: the trainer's ``node_ip`` (asked once, before the first group) or its first
    ``open_group`` never returns. The run stops before its loop with GroupOpenHung naming the call,
    group 0 and both instances, the keys and ``weight_sync.timeout_s``."""
    trainer_class = hanging_call_trainer_class("node_ip") if call == "node_ip" else hanging_group_trainer_class(1)
    err, took, said = _warm_up_until_hung(cluster, tmp_path, trainer_class, GroupOpenHung, "broadcast")
    msg = str(err.value)
    what = "node_ip (the host its store will listen on)" if call == "node_ip" else "open_group"
    assert msg.startswith(f"weight sync of policy version 0: the trainer's {what} of weight-sync group 0 (the "
                          "trainer and the workers of instance(s) 0, 1) has not returned"), msg
    assert f"train.step_timeout_s = 3 s and no {call} call measured yet" in msg and _waited(msg) >= 3, msg
    assert "weight_sync.timeout_s = 120 s bounds the group's rendezvous" in msg, msg
    _assert_stopped(tmp_path, took, said, call, 0, f"trainer hung: its {call} of weight-sync group 0 is out",
                    f"hung first {call}")


def test_catch_up_publish_that_never_returns_stops_the_run(cluster, tmp_path):
    """Broadcast, ``rollout.max_restarts=1``: instance 1 is killed as the loop starts and Ray restarts
    it; every group is held (none finishes), so the trainer takes no step and still holds version 0,
    and the fleet sends the restarted instance one object-store copy of it: the trainer's
    ``publish(0, "object_store")``, which never returns. Before, only a train step queued behind it
    timed it (none comes here: the loop waited for ever). The run stops with PublishHung naming the
    catch-up copy for instance 1."""
    sched, resp = schedule_and_lengths("asp", 1, epochs=1)
    lengths = lengths_of(sched, resp)
    trainer = start_trainer(cluster, hanging_publish_trainer_class(0, "object_store"))
    seen: list = []

    def kill_one(orch):
        seen.append(orch)
        ray.kill(orch.instances[1], no_restart=False)
    t0 = time.monotonic()
    try:
        with pytest.raises(PublishHung) as err:
            run_loop(trainer, ExecutionPlan.from_schedule(sched, settings_for()), lengths, tmp_path, restarts=1,
                     held=set(lengths), transport="broadcast", stall_timeout_s=4.0, send_slack_s=2.0,
                     step_timeout=(STEP_S, STEP_FACTOR), run_timeout_s=RUN_S, on_orch=kill_one)
        took = time.monotonic() - t0
    finally:
        shutdown_instances(seen[0].instances if seen else [])
        kill_trainer(trainer)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(trainer.ready.remote(), timeout=30)
    msg = str(err.value)
    assert msg.startswith("policy version 0: the trainer's publish of version 0 (object_store: its weights gathered "
                          "and put in Ray's object store, a catch-up copy for restarted instance 1, which rejoins once "
                          "it holds it) has not returned"), msg
    assert "instance 1 never receives version 0" in msg and "no complete checkpoint exists" in msg, msg
    assert "train.step_timeout_s = 3 s and no publish call measured yet" in msg and _waited(msg) >= 3, msg
    _assert_stopped(tmp_path, took, seen[0].log.said, "publish", 0,
                    "trainer hung: its publish of version 0 (a catch-up copy for restarted instance 1) is out",
                    "hung catch-up publish", iteration=0)
    assert [(e["instance"], e["state"]) for e in seen[0].timeline.events["instance"]] == [(1, "down")]
