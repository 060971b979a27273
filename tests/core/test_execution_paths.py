"""One path from schedule to execution: the simulator, the runtime and the MindSpeed-RL source
admit the same jobs in the same order on the same events.

One schedule is run by the simulator under the runtime's admission rule (``group_slots``, no pause
at weight syncs); its :class:`~asp_ascend.scheduler.execution.Feeder` traces every admission and
every event that changes admission (a group finished, a version published or received). The
events are then fed, block by block, to the runtime's orchestrator (instance handles that answer
polls with the finished groups; a stand-in for Ray's ``wait``/``get``) and to the MindSpeed-RL
``DispatcherSource`` (in-process instance handles). After each block each executor must submit
exactly what the simulator admitted, in the same order. The trainer, which would empty the
runtime's sample queue, is not part of this, so the queue's backpressure is set out of reach.

Cases: every dispatch policy (shared queue or per-instance queues), static and guided dispatch,
k = 0, 1, 2, ``pipeline.mode: sync``, two-epoch schedules (the boundary between epochs), and
tail-aware concurrency (the planner's rooms through the shared TailControl).
Not here, because only the runtime has them: instance failures, restarts and rejoins
(``tests/runtime``, ``tests/reliability``), resume from a checkpoint, adaptive re-planning; and
re-estimation, whose input (the instances' progress reports) differs between a simulated and a
real instance by nature.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource
from asp_ascend.pipeline.logger import RunLogger
from asp_ascend.pipeline.orchestrator import Orchestrator, Prompts, RunOutputs, Sampling, Task
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.planner import plan
from asp_ascend.scheduler.tail_control import TailOptions
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.mechanisms import SimMechanisms

G, R = 2, 2
COST = CostModel(decode_a=0.01, decode_b=1e-5, decode_c=1e-3, prefill_per_token=1e-4)


def schedule_and_lengths(policy: str, k: int, seed: int = 1, epochs: int = 1, tail: str = "off",
                         max_num_seqs: int = 4):
    """``epochs`` epochs of 24 prompts, each planned on its own (as ``scheduler/run.plan_epochs``
    does), with true lengths that the predictions get wrong (so guided dispatch has work to do).
    ``tail`` (rollout.tail_concurrency): the planner sizes rooms for the groups that set their
    iteration's floor (the ``room`` column)."""
    rng = np.random.default_rng(seed)
    n = 24
    ids = np.array([f"p{i}" for i in range(n)], dtype=object)
    frames, resps, offset = [], [], 0
    for e in range(epochs):
        truth = rng.integers(1, 40, (n, G))
        predicted = truth.mean(axis=1) * rng.uniform(0.3, 3.0, n)
        sched = plan(ids, predicted, np.full(n, 4.0), policy=policy, group_size=G, global_batch_size=6,
                     mini_batch_size=3, num_instances=R, max_num_seqs=max_num_seqs, lag_bound=k, epoch=e,
                     iteration_offset=offset, seed=seed, **({} if tail == "off" else {"tail": tail, "cost": COST}))
        offset = int(sched["iteration"].max()) + 1
        rows = {p: i for i, p in enumerate(ids)}
        frames.append(sched)
        resps.append(truth[[rows[p] for p in sched["prompt_id"]]])
    return pd.concat(frames, ignore_index=True), np.concatenate(resps)


def rooms_of(sched) -> dict:
    capped = sched[sched["room"] > 0] if "room" in sched else sched.iloc[:0]
    return {(int(e), str(p)): int(n) for e, p, n in zip(capped["epoch"], capped["prompt_id"], capped["room"])}


def simulate(sched, resp, settings, tail: str = "off") -> list:
    jobs = SimJobs(epoch=sched["epoch"].to_numpy(np.int64), prompt_id=sched["prompt_id"].to_numpy(object),
                   iteration=sched["iteration"].to_numpy(np.int64), mini_batch=sched["mini_batch"].to_numpy(np.int64),
                   instance=sched["instance"].to_numpy(np.int64),
                   dispatch_rank=sched["dispatch_rank"].to_numpy(np.int64),
                   prompt_length=np.full(len(sched), 4, np.int64), resp=np.asarray(resp, np.int64),
                   predicted_length=sched["predicted_length"].to_numpy(float),
                   room=sched["room"].to_numpy(np.int64) if "room" in sched else None)
    trace: list = []
    Engine(jobs, settings, cost=COST, kv_capacity=0, trainer=TrainerSpec(1e-3, 0.05, 0.02, 4, "packed"),
           stream_train=not settings.sync_mode, sync_pause=False, group_slots=True, trace=trace,
           mechanisms=SimMechanisms(tail_concurrency=tail)).run()
    return trace


def blocks(trace: list) -> list[tuple[list, list]]:
    """The trace cut into (events, the admissions that followed them)."""
    out: list = [([], [])]
    for entry in trace:
        if entry[0] == "admit":
            out[-1][1].append(entry[1:4])
        else:
            if out[-1][1]:
                out.append(([], []))
            out[-1][0].append(entry)
    return out


def group(r: int, epoch: int, pid: str, version: int) -> dict:
    return {"meta": {"epoch": epoch, "prompt_id": pid}, "instance": r, "admission_version": version, "t_admit": 0.0,
            "samples": [{"sample": s, "token_ids": [1, 2], "logprobs": [-0.1, -0.1], "t_first_token": 0.0,
                         "t_finish": 0.0, "version_first": version, "version_last": version} for s in range(G)]}


class Ref:
    def __init__(self, fn):
        self.fn = fn


class RayStandIn:
    """Ray's ``wait``/``get`` over refs that are always ready."""
    class exceptions:
        RayActorError = type("RayActorError", (Exception,), {})

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs), []

    def get(self, ref):
        return ref.fn()


class RuntimeInstance:
    """A rollout actor handle: ``submit.remote`` is logged, ``poll.remote`` returns what finished."""

    def __init__(self, r: int, submitted: list):
        self.finished: list = []
        outer = self

        class _Submit:
            @staticmethod
            def remote(group_id, token_ids, n, max_tokens, temperature, top_p, seed, stop, meta):
                submitted.append((r, meta["epoch"], meta["prompt_id"]))
                return Ref(lambda: None)

        class _Poll:
            @staticmethod
            def remote(timeout):
                def answer():
                    done, outer.finished = outer.finished, []
                    return {"groups": done, "busy_s": 0.0}
                return Ref(answer)

        self.submit, self.poll = _Submit, _Poll


class MindSpeedInstance:
    def __init__(self, r: int, submitted: list):
        self.r, self.submitted, self.finished = r, submitted, []

    def submit(self, group_id, prompt_token_ids, n, meta=None, **sampling):
        self.submitted.append((self.r, meta["epoch"], meta["prompt_id"]))

    def poll(self):
        done, self.finished = self.finished, []
        return {"groups": [{**g, "meta": {**g["meta"], "iteration": 0, "mini_batch": 0, "prompt": [1], "extras": {},
                                          "version": g["admission_version"]}} for g in done]}


def replay_runtime(sched, settings, blks, versions, tmp_path, tail: str = "off") -> list[list]:
    submitted: list = []
    handles = [RuntimeInstance(r, submitted) for r in range(R)]
    ids = sched["prompt_id"].tolist()
    task = Task(Prompts({p: [1, 2, 3, 4] for p in ids}, {p: None for p in ids}), lambda text, answer: 0.0,
                lambda ids: "", Sampling(G, 8, 1.0, 1.0, [], 0))
    logger = RunLogger(tmp_path, tensorboard=False, wandb_project=None, progress=False, total_iterations=0)
    orch = Orchestrator(handles, None, ExecutionPlan.from_schedule(sched, settings), task,
                        RunOutputs(tmp_path / "timeline.jsonl", logger, 0.0), weight_sync=object(),
                        tail=TailOptions(tail_concurrency=tail, rooms=rooms_of(sched)))
    orch.ray = RayStandIn()
    for r in range(R):
        orch.poll_refs[r] = handles[r].poll.remote(0.0)
    got = []
    for events, _ in blks:
        for ev in events:
            if ev[0] == "finish":
                handles[ev[1]].finished.append(group(ev[1], ev[2], ev[3], versions[(ev[2], ev[3])]))
            elif ev[0] == "publish":       # what the orchestrator does when a sync starts / an instance holds it
                orch.feeder.published(ev[1])
            elif ev[0] == "synced":
                orch.feeder.synced(ev[1], ev[2])
        orch._collect_rollouts()
        n = len(submitted)
        orch._dispatch()
        got.append(submitted[n:])
    return got


def replay_mindspeed(sched, settings, blks, versions, tail: str = "off") -> list[list]:
    submitted: list = []
    insts = [MindSpeedInstance(r, submitted) for r in range(R)]
    src = DispatcherSource(ExecutionPlan.from_schedule(sched, settings), insts, lambda pid: ([1, 2, 3, 4], {}),
                           sampling={}, poll_interval_s=0.0,
                           tail=TailOptions(tail_concurrency=tail, rooms=rooms_of(sched)))
    got = []
    for events, _ in blks:
        published = [ev[1] for ev in events if ev[0] == "publish"]
        for ev in events:
            if ev[0] == "finish":
                insts[ev[1]].finished.append(group(ev[1], ev[2], ev[3], versions[(ev[2], ev[3])]))
        n = len(submitted)
        src._poll()
        if published:   # MindSpeed-RL pushes the weights to every instance at once
            assert sorted(ev[1] for ev in events if ev[0] == "synced") == sorted(list(range(R)) * len(published))
            for v in published:
                src.on_published(v)
        else:
            src._fill()
        got.append(submitted[n:])
    return got


@pytest.mark.parametrize("policy,dispatch,k,mode,epochs", [
    ("asp", "static", 1, "async", 1), ("fifo", "static", 1, "async", 1), ("asp", "guided", 1, "async", 1),
    ("balanced", "guided", 2, "async", 1), ("sorted", "static", 0, "async", 1),
    ("random", "static", 1, "async", 2),      # a shared queue across an epoch boundary
    ("asp", "guided", 1, "async", 2),         # per-instance queues and stealing across an epoch boundary
    ("asp", "static", 0, "sync", 2),          # pipeline.mode: sync (k = 0, the whole iteration, then train)
    ("fifo", "static", 0, "sync", 1),
])
def test_simulator_runtime_and_mindspeed_admit_alike(policy, dispatch, k, mode, epochs, tmp_path):
    sched, resp = schedule_and_lengths(policy, k, epochs=epochs)
    settings = ExecutionSettings(policy=policy, lag_bound=k, sync_mode=mode == "sync", group_size=G, max_num_seqs=4,
                                 num_instances=R, dispatch=dispatch, epochs=epochs, queue_capacity=10 ** 6)
    trace = simulate(sched, resp, settings)
    blks = blocks(trace)
    versions = {(e[2], e[3]): e[4] for e in trace if e[0] == "admit"}
    assert len(versions) == len(sched)                                  # every job admitted once
    want = [admits for _, admits in blks]
    assert sum(map(len, want)) == len(sched)
    assert replay_runtime(sched, settings, blks, versions, tmp_path) == want
    assert replay_mindspeed(sched, settings, blks, versions) == want
    if epochs > 1:   # the epoch boundary was crossed (a divergence there fails only these cases)
        assert {e for _, e, _ in sum(want, [])} == set(range(epochs))
    if dispatch == "guided":
        assert any(r != inst for r, (e, p) in ((a[0], a[1:]) for a in sum(want, []))
                   for inst in sched.loc[(sched.epoch == e) & (sched.prompt_id == p), "instance"])


@pytest.mark.parametrize("policy,dispatch,tail,epochs", [("asp", "static", "2", 1), ("asp", "guided", "2", 2),
                                                         ("asp", "static", "auto", 2)])
def test_tail_rooms_admit_alike(policy, dispatch, tail, epochs, tmp_path):
    """Tail-aware concurrency (rollout.tail_concurrency, DESIGN 9 c): the planner's rooms cap an
    instance running a floor-setting group, through the same TailControl in all three loops."""
    sched, resp = schedule_and_lengths(policy, 1, epochs=epochs, tail=tail, max_num_seqs=8)
    assert rooms_of(sched)
    settings = ExecutionSettings(policy=policy, lag_bound=1, group_size=G, max_num_seqs=8, num_instances=R,
                                 dispatch=dispatch, epochs=epochs, queue_capacity=10 ** 6)
    trace = simulate(sched, resp, settings, tail)
    blks = blocks(trace)
    versions = {(e[2], e[3]): e[4] for e in trace if e[0] == "admit"}
    want = [admits for _, admits in blks]
    assert sum(map(len, want)) == len(sched)
    assert replay_runtime(sched, settings, blks, versions, tmp_path, tail) == want
    assert replay_mindspeed(sched, settings, blks, versions, tail) == want
    uncapped = [e[1:4] for e in simulate(sched, resp, settings) if e[0] == "admit"]
    assert uncapped != sum(want, [])       # the rooms changed what was admitted when
