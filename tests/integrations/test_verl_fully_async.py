"""Fully async verl with the ASP schedule: the admission gate (pure), then verl's real rollouter code on
CPU -- its ``_feed_samples`` and ``_create_continuous_iterator`` feeding our queue from a dataloader over
the ASP sampler, and its ``reset_staleness`` publishing versions to the gate."""
from __future__ import annotations

import asyncio
import collections
import time

import pytest

from asp_ascend.integrations.verl.fully_async import AdmissionQueue, LagGate
from asp_ascend.scheduler.admission import LagViolation


def test_gate_admits_iteration_i_only_from_version_i_minus_k():
    g = LagGate(prompts_per_version=2, lag_bound=1)
    g.on_sync()                               # the initial weights: version 0
    assert [g.take() for _ in range(4)] == [0, 0, 0, 0]    # iterations 0 and 1
    assert not g.admissible() and g.next_iteration == 2
    with pytest.raises(LagViolation):
        g.take()
    assert g.on_sync() == 1 and g.admissible()
    g.take()
    assert g.admitted[-1] == (2, 1)


def test_queue_blocks_until_the_next_sync_and_passes_the_end_signal():
    async def run():
        q = AdmissionQueue(LagGate(1, 0), maxsize=8)
        q.on_sync()
        for x in ("a", "b", None):
            q.put_nowait(x)
        assert await q.get() == "a"
        waiter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.01)
        assert not waiter.done()               # "b" is iteration 1, the rollouter holds version 0
        q.on_sync()
        assert await asyncio.wait_for(waiter, 1) == "b"
        assert await q.get() is None
    asyncio.run(run())


from verl_fixtures import HAVE_VERL, SKIP_REASON, base_overrides, compose, tokenizer, train_dataset  # noqa: E402

needs_verl = [pytest.mark.verl, pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)]


class _Queue:
    """The message queue client's one call reset_staleness makes."""

    async def get_queue_size(self):
        return 0


def _rollouter(tmp_path, k: int, per_version: int = 4):
    """Our AspRollouter over verl's real FullyAsyncRollouter class, its state set as verl's __init__ sets
    what _feed_samples, _create_continuous_iterator and reset_staleness read (the rest of __init__ starts
    Ray workers and servers)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    from asp_ascend.integrations.verl.config_bridge import translate
    from asp_ascend.integrations.verl.fully_async import asp_rollouter_class
    from asp_ascend.integrations.verl.lengths import IndexedDataset
    from asp_ascend.integrations.verl.plan import VerlSchedule, prompt_set_from_dataset

    overrides = base_overrides(tmp_path, n=24, batch=per_version, mini=per_version, epochs=1)
    cfg_verl = compose(overrides)
    raw = OmegaConf.to_container(cfg_verl, resolve=True)
    cfg, _ = translate(raw, [f"pipeline.lag_bound={k}", "pipeline.mode=async"])
    tok = tokenizer()
    ds = IndexedDataset(train_dataset(cfg_verl, tok))
    asp = VerlSchedule(cfg, prompt_set_from_dataset(ds, tok))
    cls = asp_rollouter_class()
    ro = cls.__new__(cls)
    ro.asp, ro.config = asp, cfg_verl
    ro.asp_lengths, ro.asp_routes = [], {}
    from asp_ascend.integrations.verl.fully_async import TrainedLengths

    ro.asp_trained = TrainedLengths()
    sampler = asp.sampler(len(ds), layout="dispatch")
    ro.train_dataloader = StatefulDataLoader(ds, batch_size=1, sampler=sampler, collate_fn=collate_fn)
    ro.asp_gate = LagGate(cfg.train.global_batch_size, k)
    ro.pending_queue = AdmissionQueue(ro.asp_gate, maxsize=128)
    ro.global_steps, ro.total_rollout_steps = 0, len(ro.train_dataloader)
    ro.lock, ro._resume_event, ro.paused, ro.active_tasks = asyncio.Lock(), asyncio.Event(), False, set()
    ro.message_queue_client = _Queue()
    ro.step_start_time = ro.idle_start_time = time.time()
    ro._step_generated_samples, ro._completed_steps = 0, 0
    ro._step_samples_history, ro._STEP_HISTORY_SIZE = collections.deque(maxlen=10), 10
    ro._active_count_history = [(time.time(), 0, 1)]
    ro.max_concurrent_samples = 1
    return ro, asp, sampler


@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_verls_feed_runs_in_schedule_order_and_admission_keeps_the_lag_bound(tmp_path, k):
    ro, asp, sampler = _rollouter(tmp_path, k)
    b = ro.asp_gate.b
    order = sampler.order(0)

    async def run():
        feeder = asyncio.ensure_future(ro._feed_samples())        # verl's own feed loop
        await ro.reset_staleness()                                # the sync before fit: version 0
        taken, version = [], 0
        while True:
            sample = await ro.pending_queue.get()                 # what verl's processor loop does
            if sample is None:
                break
            taken.append((sample, ro.asp_gate.admitted[-1]))
            # the trainer: once iteration `version` is complete and the next one is blocked, it trains and syncs
            done = sum(1 for _, (it, _v) in taken if it == version)
            if done == b and not ro.asp_gate.admissible() or ro.pending_queue.empty() and done == b:
                await ro.reset_staleness()
                version += 1
        await feeder
        return taken

    taken = asyncio.run(run())
    ids = [int(s.full_batch.non_tensor_batch["extra_info"][0]["asp_prompt_id"]) for s, _ in taken]
    assert ids == [int(p) for p in order]                 # the schedule's dispatch order, iteration by iteration
    assert len(ids) == len(order) and len(order) % b == 0
    lags = [it - v for _, (it, v) in taken]
    assert max(lags) == k and min(lags) >= 0              # the bound holds and, with k = 1, is used
    for n, (_, (it, _v)) in enumerate(taken):
        assert it == n // b
    assert all(len(s.full_batch) == ro.config.actor_rollout_ref.rollout.n for s, _ in taken)


def test_gate_restored_at_a_checkpoint_version_admits_from_that_version():
    g = LagGate(prompts_per_version=2, lag_bound=1)
    g.restore(3)
    assert g.next_iteration == 3
    assert not g.admissible()                 # nothing synced yet
    assert g.on_sync() == 3                   # verl's sync before fit holds the checkpoint's version
    assert [g.take() for _ in range(4)] == [3, 3, 3, 3]    # iterations 3 and 4
    assert not g.admissible() and g.next_iteration == 5
    assert g.on_sync() == 4 and g.admissible()
    with pytest.raises(RuntimeError):
        g.restore(1)


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_verls_resume_restores_the_gate_at_the_checkpoints_version(tmp_path):
    """verl's own FullyAsyncRollouter.load_checkpoint (global_step_2 folder + its dataloader state), then
    the gate: the first admitted prompt belongs to iteration 2 and is generated with version 2."""
    import torch
    from omegaconf import open_dict

    ro, asp, sampler = _rollouter(tmp_path, 1)
    b = ro.asp_gate.b
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_2").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    it = iter(ro.train_dataloader)
    for _ in range(2 * b):
        next(it)
    torch.save(ro.train_dataloader.state_dict(), ckpt / "global_step_2" / "data.pt")
    with open_dict(ro.config):
        ro.config.trainer.resume_mode = "auto"
        ro.config.trainer.default_local_dir = str(ckpt)
        ro.config.trainer.default_hdfs_dir = None
        ro.config.async_training = {"trigger_parameter_sync_step": 1}
    ro.required_samples = b
    ro.load_checkpoint()                                   # verl's resume, then ours
    assert ro.global_steps == 2 * b + 1
    assert ro.asp_gate.next_iteration == 2 and not ro.asp_gate.admissible()

    async def run():
        feeder = asyncio.ensure_future(ro._feed_samples())
        await ro.reset_staleness()                         # the sync before fit: version 2
        first = await ro.pending_queue.get()
        ro.pending_queue.put_nowait(None)
        feeder.cancel()
        return first

    first = asyncio.run(run())
    assert ro.asp_gate.admitted[0] == (2, 2)
    pid = int(first.full_batch.non_tensor_batch["extra_info"][0]["asp_prompt_id"])
    assert pid == int(sampler.order(0)[2 * b])             # the dataloader resumed where the checkpoint was


def test_trained_lengths_released_only_for_consumed_samples_in_either_order():
    from asp_ascend.integrations.verl.fully_async import TrainedLengths

    t = TrainedLengths()
    t.generated("a", 1)
    t.generated("b", 2)
    t.consumed("c")                 # the trainer took c before the rollouter kept its rows
    t.consumed("b")
    assert t.take() == [2] and t.take() == []
    t.generated("c", 3)
    assert t.take() == [3] and set(t.kept) == {"a"}     # a: never consumed (dropped), never released


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_lengths_follow_what_the_trainer_takes_from_verls_message_queue():
    """verl's real ``MessageQueue`` actor (2 places) drops its oldest samples when full; the trainer's
    queue client (ConsumptionClient) reports what it takes; only those samples' lengths are released."""
    import ray
    import ray.cloudpickle as cloudpickle
    from omegaconf import OmegaConf
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient

    from asp_ascend.integrations.verl.consumed import ConsumptionClient
    from asp_ascend.integrations.verl.fully_async import TrainedLengths

    class Rollouter:                # the rollouter's two ASP members the client and verl's producer drive
        def __init__(self):
            self.asp_trained = TrainedLengths()

        def asp_consumed(self, sample_ids):
            for sid in sample_ids:
                self.asp_trained.consumed(sid)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        ro = Rollouter()

        async def run():
            queue = MessageQueue.remote(OmegaConf.create({}), 2)
            producer, trainer = MessageQueueClient(queue), ConsumptionClient(queue, ro)
            ok = []
            for i in range(4):      # verl's _process_single_sample_streaming: put, then our rows are kept
                sample = RolloutSample(full_batch=None, sample_id=f"s{i}", epoch=0, rollout_status={})
                ok.append(await producer.put_sample(cloudpickle.dumps(sample)))
                ro.asp_trained.generated(f"s{i}", f"rows{i}")
            got = [cloudpickle.loads((await trainer.get_sample())[0]).sample_id for _ in range(2)]
            await producer.put_sample(cloudpickle.dumps(RolloutSample(None, "s4", 0, {})))
            got.append(cloudpickle.loads((await trainer.get_sample())[0]).sample_id)   # taken before its rows
            ro.asp_trained.generated("s4", "rows4")
            stats = await producer.get_statistics()
            return ok, got, stats

        ok, got, stats = asyncio.run(run())
    finally:
        ray.shutdown()
    assert ok == [True, True, False, False] and stats["dropped_samples"] == 2
    assert got == ["s2", "s3", "s4"]
    assert ro.asp_trained.take() == ["rows2", "rows3", "rows4"]        # s0, s1: dropped, never recorded
    assert set(ro.asp_trained.kept) == {"s0", "s1"}
