"""Weight syncs in flight (pipeline/sync_retry.py) over real Ray actors and the real WeightSync.

The instance and trainer actors are small real fakes: their ``update_weights`` / ``publish`` /
``send_weights`` answer like the real ones (engines/rollout.py, engines/trainer.py) without a
model, and fail when told to, so each way a sync can end is driven through Ray's own errors.
"""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from asp_ascend.errors import AspError  # noqa: E402
from asp_ascend.pipeline.sync_retry import SYNC_TRIES, PendingSyncs, TrainerHung  # noqa: E402
from asp_ascend.pipeline.weight_sync import WeightSync  # noqa: E402


@ray.remote(num_cpus=0)
class Instance:
    def __init__(self, failures: int, hang_s: float = 0.0):
        self.failures, self.calls, self.hang_s = failures, 0, hang_s

    def update_weights(self, ticket, group=None):
        self.calls += 1
        time.sleep(self.hang_s)                     # a receive that hangs (longer than any test)
        if self.calls <= self.failures:
            raise RuntimeError(f"broadcast group broken (call {self.calls})")
        return {"version": ticket["version"], "t_end": time.time()}


class _Trainer:
    def publish(self, version, transport):
        return {"version": version, "transport": transport}

    def send_weights(self, version, group):
        return {"version": version}

    def node_ip(self):
        return "127.0.0.1"

    def open_group(self, gen, world, port, timeout_s):
        return 29500 + gen


Trainer = ray.remote(num_cpus=0)(_Trainer)


@ray.remote(num_cpus=0)
class SlowTrainer(_Trainer):
    """``send_weights`` takes ``send_s`` seconds (a trainer hung in its broadcast: longer than any test)."""

    def __init__(self, send_s: float):
        self.send_s = send_s

    def send_weights(self, version, group):
        time.sleep(self.send_s)
        return {"version": version}


@pytest.fixture(scope="module")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


class Run:
    """The loop's side: live instances, the trainer's version, what the callbacks saw."""

    def __init__(self, failures: list[int], transport: str = "object_store", holds: bool = True,
                 send_s: float | None = None, stall_s: float = 300.0, slack_s: float = 30.0, hang: tuple = ()):
        self.instances = [Instance.remote(f, 600.0 if r in hang else 0.0) for r, f in enumerate(failures)]
        trainer = Trainer.remote() if send_s is None else SlowTrainer.remote(send_s)
        self.wsync = WeightSync(trainer, self.instances, transport, "cpu", stall_timeout_s=stall_s)
        self.alive = list(range(len(failures)))
        self.holds = holds
        self.lines: list[str] = []
        self.synced: list[tuple[int, int]] = []
        self.dead: list[int] = []
        self.hung: list[int] = []
        self.done: list = []
        self.syncs = PendingSyncs(self.wsync, lambda: list(self.alive), lambda v: self.holds, self.lines.append,
                                  send_slack_s=slack_s)

    def on_dead(self, r, exc):
        self.dead.append(r)
        if r in self.alive:
            self.alive.remove(r)

    def on_hung(self, r, exc):
        """What the orchestrator does (Fleet.kill): kill it; its pending call then ends as a dead one's."""
        self.hung.append(r)
        ray.kill(self.instances[r], no_restart=True)

    def drive(self, version: int = 1, within_s: float = 60.0) -> None:
        self.syncs.add(self.wsync.start(version, list(self.alive), 0.0))
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            self.syncs.finish(ray, 0.0, on_synced=lambda r, v: self.synced.append((r, v)), on_dead=self.on_dead,
                              on_done=self.done.append, on_hung=self.on_hung)
            if not self.syncs:
                return
            ray.wait(self.syncs.waiting(), num_returns=len(self.syncs.waiting()), timeout=0.2)
        raise AssertionError("the sync never ended")


def test_failed_update_is_sent_again_until_it_lands(ray_session):
    run = Run([0, SYNC_TRIES - 1])
    run.drive()
    assert sorted(run.synced) == [(0, 1), (1, 1)]
    assert [s.version for s in run.done] == [1] and run.done[0].tries == SYNC_TRIES
    assert run.done[0].synced == {0, 1}
    assert sum("sending it again to instance(s) [1]" in line for line in run.lines) == SYNC_TRIES - 1


def test_sync_failing_every_try_stops_the_run_naming_the_way_on(ray_session):
    run = Run([0, SYNC_TRIES])
    with pytest.raises(RuntimeError, match=f"failed {SYNC_TRIES} times.*resume=true"):
        run.drive()
    assert run.done == [] and (0, 1) in run.synced


def test_broadcast_ends_without_instances_once_the_trainer_moved_on(ray_session):
    run = Run([0, 5], transport="broadcast", holds=False)
    assert run.syncs.broadcasting is False
    run.syncs.add(run.wsync.start(1, [0, 1], 0.0))
    assert run.syncs.broadcasting        # no optimizer step may start while it is in flight
    run.syncs.pending.clear()
    run.drive()
    assert run.synced == [(0, 1)] and run.done[0].tries == 1 and run.done[0].synced == {0}
    assert any("the trainer has moved on" in line for line in run.lines)


def test_dead_instance_ends_the_sync_without_it_and_syncs_finish_in_order(ray_session):
    run = Run([0, 0])
    ray.kill(run.instances[1])
    run.syncs.add(run.wsync.start(1, [0, 1], 0.0))
    run.drive(version=2)
    assert set(run.dead) == {1} and run.alive == [0]
    assert [s.version for s in run.done] == [1, 2]
    assert sorted(run.synced) == [(0, 1), (0, 2)]


def test_a_trainer_hung_in_its_broadcast_stops_the_run_after_the_stall_timeout(ray_session):
    """Both instances' receives fail (as they do on a hung sender: SenderStalled after the stall
    timeout) while the trainer's send_weights never returns. The sync would stay in flight forever
    (no optimizer step starts while a broadcast is, and a retry would queue behind the hung call);
    instead the run stops with TrainerHung once the send has stayed stall timeout + slack (here
    1 + 0.5 s) past the last receive, naming the version, resume=true and the key to raise."""
    run = Run([SYNC_TRIES, SYNC_TRIES], transport="broadcast", send_s=600.0, stall_s=1.0, slack_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(TrainerHung) as info:
        run.drive(within_s=30.0)
    took = time.monotonic() - t0
    text = str(info.value)
    assert "weight sync of version 1: the trainer's send_weights has not returned" in text, text
    assert "resume=true" in text and "raise weight_sync.send_slack_s (now 0.5 s) or weight_sync.stall_timeout_s" in text, \
        text
    assert "broadcast group broken" in text, text  # the instances' error is named
    assert isinstance(info.value, AspError)   # the CLI prints the message, not a traceback
    assert 1.5 <= took <= 10.0, took
    assert run.done == [] and run.synced == []


def test_a_slow_send_that_returns_within_the_bound_is_not_cut(ray_session):
    """The instances receive at once; the trainer's send returns 1 s later, within the 1 + 0.5 s
    bound: the sync ends normally (a slow trainer is not taken for a hung one)."""
    run = Run([0, 0], transport="broadcast", send_s=1.0, stall_s=1.0, slack_s=0.5)
    run.drive(within_s=30.0)
    assert sorted(run.synced) == [(0, 1), (1, 1)] and [s.version for s in run.done] == [1]


def test_an_instance_whose_receive_outlives_the_send_is_failed_over_as_hung(ray_session):
    """Instance 1's update_weights never returns (its receive hangs) while the trainer's send and
    instance 0's receive end at once. After stall + slack (1 + 0.5 s) past the send it is reported
    hung (once), killed, and the sync ends without it (instance 0 holds the version); without the
    check the sync would wait on it for ever."""
    run = Run([0, 0], transport="broadcast", stall_s=1.0, slack_s=0.5, hang=(1,))
    t0 = time.monotonic()
    run.drive(within_s=30.0)
    took = time.monotonic() - t0
    assert run.hung == [1] and run.dead == [1] and run.alive == [0]
    assert run.synced == [(0, 1)] and [s.version for s in run.done] == [1] and run.done[0].tries == 1
    assert 1.5 <= took <= 10.0, took
