"""The runtime side of the execution-scenario tests: the real loop over scripted instances.

``run_loop`` runs the runtime's loop (``Orchestrator.run``) on a real Ray cluster with the real
trainer (``TrainerEngine`` on a tiny Qwen2 model), the real weight sync (object store), fleet,
sample queue and checkpoints. Its rollout instances (:class:`ScriptedInstance`) are Ray actors that answer the ``RolloutInstance`` contract like the
vLLM actor does (poll, update_weights, ready), with each group's samples at the schedule's true
lengths, finished after a time proportional to their length; one can be told to crash its
process, or to hold groups until a scenario's moment (``release_when``). ``others`` runs the
simulator and MindSpeed-RL's source on the same schedule (exec_common.py). The module-scoped
fixtures ``cluster`` (a Ray session and the model directory) and ``trainer`` are imported by
test_execution_scenarios.py and test_execution_streaming.py, after they skipped where ray is missing.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import ray

from asp_ascend.algos.grpo import LossConfig
from asp_ascend.pipeline.logger import RunLogger
from asp_ascend.pipeline.orchestrator import FleetOptions, Orchestrator, Prompts, RunOutputs, Sampling, Task
from asp_ascend.pipeline.train_watch import TrainerBounds
from asp_ascend.pipeline.weight_sync import WeightSync
from asp_ascend.scheduler.execution import ExecutionSettings
from exec_common import G, R, run_mindspeed, sim_trained, simulate

K, EPOCHS, TICK = 1, 2, 0.006    # lag bound; epochs of 4 iterations; seconds per generated token
RUN_TIMEOUT_S = 600               # a loop that lost a group would wait for it forever (a slow machine: minutes)
WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


@ray.remote(num_cpus=0)
class ScriptedInstance:
    """A rollout instance: a group's samples have their true lengths (``lengths[group_id]``) and
    each finishes ``tick`` s per token after admission; versions are what the weight syncs set.
    A poll reports the unfinished samples and those received, and with ``wake_below`` returns
    once a sample's finish leaves fewer unfinished (as the vLLM actor does).
    ``die_after``: the process exits at the first poll after it handed back that many groups
    (its first life only: once Ray restarted it, it lives). ``held``: group ids that do not
    finish, whatever their length, until ``release`` is called (a scenario made by state, not
    by how fast this machine is). ``hold_last_of_first``: the last sample of each of the first
    that many groups the instance receives does not finish until it has received one more
    group. A held sample finishes at the later of its scripted time and its release.
    Weights: over ``broadcast`` (a ``group`` given) the instance joins the trainer's gloo group and
    receives every bucket for real (platforms/transport.py), as the vLLM worker does.
    ``hang_sync``: from its that-many-th ``update_weights`` on (the first push counts; first life
    only) the call never returns once the buckets are in (loading them hangs)."""

    def __init__(self, r: int, lengths: dict, die_after: int = 0, tick: float = TICK, held=(),
                 hold_last_of_first: int = 0, hang_sync: int = 0):
        self.r, self.lengths, self.version, self.running, self.delivered = r, lengths, 0, [], 0
        self.tick, self.held = tick, set(held)
        self.hold_first, self.first_held, self.groups_in = hold_last_of_first, {}, 0   # group id -> its scripted end
        self.received, self.last_poll = 0, time.time()
        first_life = not ray.get_runtime_context().was_current_actor_reconstructed
        self.die_after, self.hang_sync = (die_after, hang_sync) if first_life else (0, 0)
        self.syncs, self.comm = 0, None    # update_weights calls; (gen, communicator) of the broadcast group

    async def submit(self, group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta,
                     **kw):
        now = time.time()
        ends = [now + self.tick * x for x in self.lengths[group_id]]
        self.groups_in += 1
        if self.groups_in <= self.hold_first:
            self.first_held[group_id], ends[-1] = ends[-1], float("inf")
        self.running.append((max(ends), group_id, meta, now, self.version, ends))
        self.received += n
        return 0

    async def submit_many(self, groups):
        return [await self.submit(**g) for g in groups]

    def _unfinished(self, now: float) -> int:
        return sum(e > now or g[1] in self.held for g in self.running for e in g[5])

    def _done(self, g, now: float) -> bool:
        return g[0] <= now and g[1] not in self.held

    def _finishing(self, held, new_ends) -> None:
        """The running groups of ``held`` (ids) finish at ``new_ends(group)``."""
        for i, g in enumerate(self.running):
            if g[1] in held:
                ends = new_ends(g)
                self.running[i] = (max(ends), *g[1:5], ends)

    async def release(self) -> None:
        now = time.time()
        self._finishing(self.held, lambda g: [max(e, now) for e in g[5]])
        self.held.clear()

    def _woken(self, wake_below: int) -> bool:
        now = time.time()
        if self.first_held and self.groups_in > self.hold_first:
            self._finishing(self.first_held, lambda g: g[5][:-1] + [max(self.first_held[g[1]], now)])
            self.first_held = {}
        return any(self._done(g, now) for g in self.running) or (
            wake_below > 0 and any(self.last_poll < e <= now for g in self.running for e in g[5])
            and self._unfinished(now) < wake_below)

    async def poll(self, wait_s: float = 0.0, wake_below: int = 0) -> dict:
        if self.die_after and self.delivered >= self.die_after:
            os._exit(1)
        deadline = time.time() + wait_s
        while not self._woken(wake_below) and time.time() < deadline:
            await asyncio.sleep(0.005)
        now = self.last_poll = time.time()
        done = [g for g in self.running if self._done(g, now)]
        self.running = [g for g in self.running if not self._done(g, now)]
        self.delivered += len(done)
        return {"groups": [self._group(*g) for g in done], "busy_s": 0.0, "running": self._unfinished(now),
                "received": self.received}

    def _group(self, t_done, group_id, meta, t_admit, v, ends) -> dict:
        samples = [{"sample": s, "token_ids": [3 + (s + j) % len(WORDS) for j in range(n)], "logprobs": [-2.0] * n,
                    "t_first_token": t_admit, "t_finish": ends[s], "version_first": v, "version_last": v,
                    "segments": [[0, v]], "finish_reason": "stop"} for s, n in enumerate(self.lengths[group_id])]
        return {"meta": meta, "instance": self.r, "admission_version": v, "t_admit": t_admit, "samples": samples}

    def _receive(self, ticket, group: dict) -> int:
        from asp_ascend.platforms.communicators import close_communicator, create_communicator
        from asp_ascend.platforms.transport import BroadcastTransport

        if self.comm is None or self.comm[0] != group["gen"]:
            if self.comm is not None:
                close_communicator(self.comm[1])
            self.comm = None
            self.comm = (group["gen"], create_communicator("cpu", group["host"], int(group["port"]), int(group["rank"]),
                                                           int(group["world"]), 0, float(group["timeout_s"])))
        try:
            return len(list(BroadcastTransport(self.comm[1], 1, stall_s=float(group["stall_timeout_s"])).recv(ticket)))
        except BaseException:
            self.comm = None   # a broken group is never reused
            raise

    async def update_weights(self, ticket, group=None) -> dict:
        self.syncs += 1
        if group is not None:
            await asyncio.to_thread(self._receive, ticket, group)
        if self.hang_sync and self.syncs >= self.hang_sync:
            await asyncio.Event().wait()   # never set: the call never returns (its polls still answer)
        self.version = int(ticket.version)
        return {"t_end": time.time(), "version": self.version}

    async def ready(self) -> int:
        return self.version

    async def workers(self) -> list:
        return []   # no vLLM workers (warm_up logs them to instances.jsonl)

    async def warm_up(self, prompts, num_seqs: int, max_tokens: int, temperature: float = 1.0,
                      top_p: float = 1.0) -> dict:
        return {"tokens": 0, "seconds": 0.0}   # no engine to warm (warm_up logs the figures)

    async def shutdown(self) -> None:
        pass



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray session and a tiny model directory."""
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    model = build_tiny_model(task_vocabulary([" ".join(WORDS)]), tmp_path_factory.mktemp("model"), hidden_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1, max_positions=128)
    yield model
    if started:
        ray.shutdown()


def start_trainer(model_dir, actor_class=None):
    """The real trainer actor on the tiny model (``actor_class``: a Ray actor class of a subclass)."""
    from asp_ascend.engines.trainer import trainer_actor_class

    return (actor_class or trainer_actor_class()).options(num_cpus=0).remote(
        str(model_dir), lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=8, temperature=1.0, seed=0,
        micro_batching="padded")


def hanging_trainer_class(hang_from: int):
    """A Ray actor class of the real trainer whose ``send_weights`` from version ``hang_from`` on
    joins the group (the instances then wait for its buckets) and never returns: alive, no progress."""
    from asp_ascend.engines.trainer import TrainerEngine

    class HangingTrainer(TrainerEngine):
        def send_weights(self, version: int, group: dict) -> dict:
            if version >= hang_from:
                self._sender.comm({**group, "platform": self.platform.name})
                time.sleep(3600)
            return super().send_weights(version, group)

    return ray.remote(HangingTrainer)


def hanging_step_trainer_class(hang_at: int):
    """A Ray actor class of the real trainer whose ``hang_at``-th ``train_step`` (from 1) never
    returns, as one stuck in a collective or on a wedged device: alive, no progress."""
    from asp_ascend.engines.trainer import TrainerEngine

    class HangingStepTrainer(TrainerEngine):
        steps = 0

        def train_step(self, *args, **kwargs) -> dict:
            self.steps += 1
            if self.steps == hang_at:
                time.sleep(3600)
            return super().train_step(*args, **kwargs)

    return ray.remote(HangingStepTrainer)


def hanging_save_trainer_class(hang_at: int):
    """A Ray actor class of the real trainer whose ``hang_at``-th ``save_checkpoint`` (from 1) writes
    its files and then never returns, as one whose file system blocks in the final flush."""
    from asp_ascend.engines.trainer import TrainerEngine

    class HangingSaveTrainer(TrainerEngine):
        saves = 0

        def save_checkpoint(self, *args, **kwargs):
            self.saves += 1
            got = super().save_checkpoint(*args, **kwargs)
            if self.saves == hang_at:
                time.sleep(3600)
            return got

    return ray.remote(HangingSaveTrainer)


def hanging_publish_trainer_class(version: int, transport: str | None = None):
    """A Ray actor class of the real trainer whose ``publish`` of ``version`` (``transport``: only
    that transport's; None: any) never returns, as one whose gather of its weights never completes
    on a rank: alive, no progress."""
    from asp_ascend.engines.trainer import TrainerEngine

    class HangingPublishTrainer(TrainerEngine):
        def publish(self, v: int, how: str = "object_store"):
            if v == version and transport in (None, how):
                time.sleep(3600)
            return super().publish(v, how)

    return ray.remote(HangingPublishTrainer)


def hanging_call_trainer_class(call: str):
    """A Ray actor class of the real trainer whose ``call`` (a method name: ``node_ip``,
    ``load_checkpoint``) never returns, as one whose file system blocks or whose actor is stuck."""
    from asp_ascend.engines.trainer import TrainerEngine

    def hang(self, *args, **kwargs):
        time.sleep(3600)
        return getattr(TrainerEngine, call)(self, *args, **kwargs)

    return ray.remote(type(f"Hanging_{call}_Trainer", (TrainerEngine,), {call: hang}))


def hanging_group_trainer_class(hang_at: int):
    """A Ray actor class of the real trainer whose ``hang_at``-th ``open_group`` (from 1) never
    returns, as one stuck closing its previous group or starting the new group's store."""
    from asp_ascend.engines.trainer import TrainerEngine

    class HangingGroupTrainer(TrainerEngine):
        groups = 0

        def open_group(self, *args, **kwargs) -> int:
            self.groups += 1
            if self.groups == hang_at:
                time.sleep(3600)
            return super().open_group(*args, **kwargs)

    return ray.remote(HangingGroupTrainer)


@pytest.fixture(scope="module")
def trainer(cluster):
    return start_trainer(cluster)


def settings_for(adaptive: bool = False, admission: str = "groups") -> ExecutionSettings:
    return ExecutionSettings(policy="asp", lag_bound=K, group_size=G, max_num_seqs=4, num_instances=R, dispatch="guided",
                             adaptive=adaptive, epochs=EPOCHS, queue_capacity=6 * (K + 1), admission=admission)


def lengths_of(sched, resp) -> dict:
    return {f"{e}:{p}": [int(x) for x in row] for e, p, row in zip(sched["epoch"], sched["prompt_id"], resp)}


def run_loop(trainer, plan_, lengths: dict, out, *, version: int = 0, die_after=(0, 0), restarts: int = 0,
             replan=None, history=None, checkpoint_every: int = 0, tick: float = TICK,
             stream_start: str | None = None, tail=None, on_orch=None, held=(),
             hold_last_of_first: int = 0, hang_sync=(0, 0), transport: str = "object_store",
             stall_timeout_s: float = 300.0, send_slack_s: float | None = None,
             step_timeout: tuple[float, float] | None = None, run_timeout_s: float = RUN_TIMEOUT_S) -> Orchestrator:
    """The runtime's loop over fresh instances, from ``version`` (the trainer's weights pushed first);
    ``held``, ``hold_last_of_first``, ``hang_sync``: what the instances keep unfinished, and until
    when, and which sync never returns (``ScriptedInstance``). ``transport``, ``stall_timeout_s``:
    weight_sync's; ``send_slack_s``: the hung-sync bound's slack beyond the stall timeout
    (``weight_sync.send_slack_s``; None: its default); ``step_timeout``: (``train.step_timeout_s``,
    ``train.step_timeout_factor``), the hung-step bound (None: the defaults)."""
    insts = [ScriptedInstance.options(max_restarts=restarts).remote(r, lengths, die_after[r], tick, held,
                                                                    hold_last_of_first, hang_sync[r])
             for r in range(R)]
    ray.get([i.ready.remote() for i in insts])
    wsync = WeightSync(trainer, insts, transport, "cpu", stall_timeout_s=stall_timeout_s)
    first = wsync.start(version, list(range(R)))
    ray.get(first.waiting())
    ids = sorted({k.split(":")[1] for k in lengths})
    task = Task(Prompts({p: [3 + i % len(WORDS), 4, 5] for i, p in enumerate(ids)}, {p: "a b" for p in ids}),
                lambda text, answer: float(len(text) % 3), lambda t: " ".join(map(str, t)),
                Sampling(G, 40, 1.0, 1.0, [1], 0))
    out.mkdir(parents=True, exist_ok=True)
    bounds = TrainerBounds()
    if send_slack_s is not None:
        bounds.send_slack_s = float(send_slack_s)
    if step_timeout is not None:
        bounds.step_timeout_s, bounds.step_timeout_factor = map(float, step_timeout)
    logger = RunLogger(out, tensorboard=False, wandb_project=None, progress=False, total_iterations=0)
    logger.said, say = [], logger.say      # the run's log lines, for the tests (orch.log.said)
    logger.say = lambda msg: (logger.said.append(msg), say(msg))[1]
    orch = Orchestrator(insts, trainer, plan_, task,
                        RunOutputs(out / "timeline.jsonl", logger, time.time(), checkpoint_every, out / "checkpoints"),
                        weight_sync=wsync, ticket=first.ticket, fleet=FleetOptions(poll_s=0.02, max_restarts=restarts),
                        replan=replan, stream_start=stream_start, tail=tail, bounds=bounds)
    if on_orch is not None:
        on_orch(orch)
    if history is not None:
        orch.history = list(history)
    result: dict = {}

    def loop():
        try:
            result["done"] = orch.run()
        except BaseException as exc:  # re-raised below, in the test
            result["error"] = exc

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    thread.join(run_timeout_s)
    hold = "; instances hold samples until the mechanism under test acts" if held or hold_last_of_first else ""
    assert not thread.is_alive(), (f"the loop did not finish in {run_timeout_s:g} s: trainer at iteration "
                                   f"{orch.iteration} of {orch.last_iteration}, groups in flight "
                                   f"{orch.feeder.inflight}{hold}")
    if "error" in result:
        raise result["error"]
    logger.close()
    return orch


def others(sched, resp, settings) -> list:
    """The simulator and MindSpeed-RL's source on ``sched``, read as (trained, lags)."""
    return [sim_trained(simulate(sched, resp, settings)), run_mindspeed(sched, settings)]


def instance_events(orch) -> list[tuple[int, str, float]]:
    return [(e["instance"], e["state"], e["t"]) for e in orch.timeline.events["instance"]]


def release_when(orch, cond) -> None:
    """Wraps the loop's trainer phase: once ``cond()`` holds, every instance's held groups are
    released (``ScriptedInstance.release``)."""
    start, held = orch._start_train_step, [True]

    def released():
        if held[0] and cond():
            held[0] = False
            ray.get([inst.release.remote() for inst in orch.instances])
        start()
    orch._start_train_step = released
