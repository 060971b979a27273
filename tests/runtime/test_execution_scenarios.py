"""One schedule, three executors, with what only the runtime has: an instance that dies, one that
Ray restarts, a run resumed from its checkpoint, and an epoch re-planned from observed lengths.

The runtime side is the real loop (``Orchestrator.run``) on a real Ray cluster with the real
trainer (``TrainerEngine`` on a tiny Qwen2 model built here), the real weight sync (object
store), fleet, sample queue and checkpoints. Its rollout instances are Ray actors that answer
the ``RolloutInstance`` contract like the vLLM actor does (poll, update_weights, ready), with
each group's samples at the schedule's true lengths, finished after a time proportional to
their length; one can be told to crash its process. The simulator and MindSpeed-RL's source
execute the same schedule (for re-planning: the schedule the run ended with).

Where the three must agree, whatever failed or restarted: every iteration trains exactly the
schedule's groups (membership), every sample once (exactly-once), every group within the lag
bound k. Real vLLM instances under failures and restarts: tests/reliability (slow).
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
import time

import numpy as np
import pandas as pd
import pytest

from exec_common import G, R, assert_agree, run_mindspeed, runtime_trained, schedule_and_lengths, sim_trained, simulate

# the trainer needs torch + transformers; no vLLM (the instances are Ray actors)
pytestmark = [pytest.mark.runtime, pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in
                                                         ("torch", "transformers")), reason="torch/transformers missing")]

ray = pytest.importorskip("ray")

from asp_ascend.algos.grpo import LossConfig  # noqa: E402
from asp_ascend.pipeline import checkpoint  # noqa: E402
from asp_ascend.pipeline.logger import RunLogger  # noqa: E402
from asp_ascend.pipeline.orchestrator import FleetOptions, Orchestrator, Prompts, RunOutputs, Sampling, Task  # noqa: E402
from asp_ascend.pipeline.weight_sync import WeightSync  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings, jobs_from_schedule  # noqa: E402
from asp_ascend.scheduler.planner import plan  # noqa: E402

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
    group. A held sample finishes at the later of its scripted time and its release."""

    def __init__(self, r: int, lengths: dict, die_after: int = 0, tick: float = TICK, held=(),
                 hold_last_of_first: int = 0):
        self.r, self.lengths, self.version, self.running, self.delivered = r, lengths, 0, [], 0
        self.tick, self.held = tick, set(held)
        self.hold_first, self.first_held, self.groups_in = hold_last_of_first, {}, 0   # group id -> its scripted end
        self.received, self.last_poll = 0, time.time()
        self.die_after = 0 if ray.get_runtime_context().was_current_actor_reconstructed else die_after

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

    async def update_weights(self, ticket, group=None) -> dict:
        self.version = int(ticket.version)
        return {"t_end": time.time(), "version": self.version}

    async def ready(self) -> int:
        return self.version

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


def start_trainer(model_dir):
    from asp_ascend.engines.trainer import trainer_actor_class

    return trainer_actor_class().options(num_cpus=0).remote(
        str(model_dir), lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=8, temperature=1.0, seed=0,
        micro_batching="padded")


def settings_for(adaptive: bool = False, admission: str = "groups") -> ExecutionSettings:
    return ExecutionSettings(policy="asp", lag_bound=K, group_size=G, max_num_seqs=4, num_instances=R, dispatch="guided",
                             adaptive=adaptive, epochs=EPOCHS, queue_capacity=6 * (K + 1), admission=admission)


def lengths_of(sched, resp) -> dict:
    return {f"{e}:{p}": [int(x) for x in row] for e, p, row in zip(sched["epoch"], sched["prompt_id"], resp)}


def run_loop(trainer, plan_, lengths: dict, out, *, version: int = 0, die_after=(0, 0), restarts: int = 0,
             replan=None, history=None, checkpoint_every: int = 0, tick: float = TICK,
             stream_start: str | None = None, tail=None, on_orch=None, held=(),
             hold_last_of_first: int = 0) -> Orchestrator:
    """The runtime's loop over fresh instances, from ``version`` (the trainer's weights pushed first);
    ``held``, ``hold_last_of_first``: what the instances keep unfinished, and until when (``ScriptedInstance``)."""
    insts = [ScriptedInstance.options(max_restarts=restarts).remote(r, lengths, die_after[r], tick, held,
                                                                    hold_last_of_first) for r in range(R)]
    ray.get([i.ready.remote() for i in insts])
    wsync = WeightSync(trainer, insts, "object_store", "cpu")
    first = wsync.start(version, list(range(R)))
    ray.get(first.waiting())
    ids = sorted({k.split(":")[1] for k in lengths})
    task = Task(Prompts({p: [3 + i % len(WORDS), 4, 5] for i, p in enumerate(ids)}, {p: "a b" for p in ids}),
                lambda text, answer: float(len(text) % 3), lambda t: " ".join(map(str, t)),
                Sampling(G, 40, 1.0, 1.0, [1], 0))
    out.mkdir(parents=True, exist_ok=True)
    logger = RunLogger(out, tensorboard=False, wandb_project=None, progress=False, total_iterations=0)
    orch = Orchestrator(insts, trainer, plan_, task,
                        RunOutputs(out / "timeline.jsonl", logger, time.time(), checkpoint_every, out / "checkpoints"),
                        weight_sync=wsync, ticket=first.ticket, fleet=FleetOptions(poll_s=0.02, max_restarts=restarts),
                        replan=replan, stream_start=stream_start, tail=tail)
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
    thread.join(RUN_TIMEOUT_S)
    hold = "; instances hold samples until the mechanism under test acts" if held or hold_last_of_first else ""
    assert not thread.is_alive(), (f"the loop did not finish in {RUN_TIMEOUT_S} s: trainer at iteration "
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


@pytest.fixture(scope="module")
def trainer(cluster):
    return start_trainer(cluster)


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


@pytest.mark.parametrize("restarts", [0, 1])
def test_instance_dies_and_ray_restarts_it(cluster, trainer, tmp_path, restarts):
    """Instance 1 crashes after handing back two groups: its unfinished prompts move to instance
    0 (``restarts=0``), or Ray restarts it and it rejoins after receiving the newest weights.
    However long the restart takes (it was a race with the run's end), the run cannot end before
    it: the second epoch's groups are held until the restarted instance 1 has a group in flight.
    It gets one: the first epoch trains meanwhile, so the second's first iterations are
    admissible, and instance 1 (its queue moved to instance 0 when it failed) takes one of
    instance 0's queued groups."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    lengths = lengths_of(sched, resp)

    def rejoined_and_working(orch):
        release_when(orch, lambda: orch.feeder.inflight[1] > 0 and any(
            ev["state"] == "up" for ev in orch.timeline.events["instance"]))
    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths, tmp_path,
                    die_after=(0, 2), restarts=restarts, held={g for g in lengths if g.startswith("1:")} if restarts
                    else (), on_orch=rejoined_and_working if restarts else None)
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    events = instance_events(orch)
    assert [(r, s) for r, s, _ in events] == [(1, "down")] + ([(1, "up")] if restarts else [])
    req = orch.timeline.frame("request")
    t_down = events[0][2]
    after = req[req["t_admit"] > t_down]
    planned_on_1 = set(sched.loc[sched["instance"] == 1, "prompt_id"])
    assert (after[after["instance"] == 0]["prompt_id"].isin(planned_on_1)).any()   # the survivor took over
    if restarts:
        assert (req[(req["instance"] == 1) & (req["t_admit"] > events[1][2])]).shape[0] > 0  # it works again
    else:
        assert (after["instance"] == 0).all()


def test_resume_from_checkpoint(cluster, trainer, tmp_path):
    """Four iterations, a checkpoint every two; then a new trainer from the newest checkpoint and
    new instances train the rest. Both attempts together train the schedule exactly once."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    lengths = lengths_of(sched, resp)
    first = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings, max_iterations=4), lengths,
                     tmp_path / "a1", checkpoint_every=2)
    assert sorted(p.name for p in (tmp_path / "a1" / "checkpoints").glob("iter_*")) == ["iter_000002", "iter_000004"]
    res = checkpoint.load(checkpoint.find_latest(tmp_path / "a1" / "checkpoints"))
    assert res.version == 4 and len(res.history) == 4 * 6 * G   # the lengths of the trained iterations
    resumed = start_trainer(res.path)
    assert ray.get(resumed.load_checkpoint.remote(str(res.path))) == 4
    second = run_loop(resumed, ExecutionPlan.from_schedule(sched, settings, start=4), lengths, tmp_path / "a2",
                      version=4, history=res.history)
    assert {st["iteration"] for st in first.timeline.events["step"]} == set(range(4))
    assert {st["iteration"] for st in second.timeline.events["step"]} == set(range(4, 8))
    trained, lags, times = runtime_trained([first.timeline, second.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    assert len(second.history) == len(sched) * G
    ray.kill(resumed)


def test_adaptive_replanning(cluster, trainer, tmp_path):
    """``scheduler.adaptive``: epoch 1 is planned during the run from epoch 0's observed lengths;
    the simulator and MindSpeed-RL's source then execute the schedule the run ended with."""
    sched0, resp0 = schedule_and_lengths("asp", K, epochs=1)
    truth = {p: row for p, row in zip(sched0["prompt_id"], resp0)}
    lengths = {**lengths_of(sched0, resp0), **{f"1:{p}": [int(x) for x in row] for p, row in truth.items()}}
    planned = []

    def replan(epoch: int, history: list[dict], offset: int):
        seen = pd.DataFrame(history).groupby("prompt_id")["response_length"].mean()   # a prior for the unseen
        ids = np.array(sorted(truth), dtype=object)
        df = plan(ids, np.array([seen.get(p, 20.0) for p in ids]), np.full(len(ids), 3.0), policy="asp", group_size=G,
                  global_batch_size=6, mini_batch_size=3, num_instances=R, max_num_seqs=4, lag_bound=K, epoch=epoch,
                  iteration_offset=offset, seed=1)
        planned.append(df)
        return jobs_from_schedule(df)

    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched0, settings_for(adaptive=True)), lengths, tmp_path,
                    replan=replan)
    assert len(planned) == 1 and int(planned[0]["iteration"].min()) == 4
    observed = {h["prompt_id"] for h in orch.history if h["epoch"] == 0}
    assert len(observed) == len(truth)
    from_seen = [pred == pytest.approx(np.mean(truth[p])) for p, pred in zip(planned[0]["prompt_id"],
                                                                           planned[0]["predicted_length"])]
    assert sum(from_seen) >= len(from_seen) // 2     # planned from what was seen (a prior for the rest)
    sched = pd.concat([sched0, planned[0]], ignore_index=True)
    resp = np.array([truth[p] for p in sched["prompt_id"]])
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings_for()))


def held_until_streamed(sched, iteration: int) -> tuple[set, object]:
    """A streamed step, whatever the machine's speed: one group of ``iteration``'s mini-batch 0 is
    held (on either instance) until the trainer has finished a streamed part of that mini-batch.
    The trainer cannot train it whole, so it must stream it (its other groups finish); the held
    group then finishes after the step's first part. Returns (``held``, ``on_orch``) for
    :func:`run_loop`."""
    row = sched[(sched["iteration"] == iteration) & (sched["mini_batch"] == 0)].iloc[0]

    def part_trained(orch):
        release_when(orch, lambda: orch.streamed is not None and orch.streamed.sent and orch.train_call is None
                     and orch.iteration == iteration and orch.streamed.mini_batch == 0)
    return {f"{row['epoch']}:{row['prompt_id']}"}, part_trained


@pytest.mark.parametrize("rule", ["fewest_left", "half_generated"])
def test_stream_groups(cluster, trainer, tmp_path, rule):
    """``pipeline.stream_groups``: the trainer takes a mini-batch's groups as they are generated
    (``accumulate``) and steps after its last. Exactly-once, membership and the lag bound hold
    as without it; some steps really were streamed (their first part started before their
    mini-batch's last group was generated: one group of iteration 1 is held for that,
    ``held_until_streamed``); a step's record counts the trainer's busy seconds (``t_start`` =
    ``t_end`` - busy, at or after ``t_first``); one step per planned mini-batch."""
    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    held, on_orch = held_until_streamed(sched, 1)
    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths_of(sched, resp), tmp_path,
                    stream_start=rule, held=held, on_orch=on_orch)
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    steps = orch.timeline.events["step"]
    assert sorted((st["iteration"], st["mini_batch"]) for st in steps) == sorted(
        {(int(i), int(m)) for i, m in zip(sched["iteration"], sched["mini_batch"])})
    req = orch.timeline.frame("request")
    done = {(int(e), str(p)): t for (e, p), t in req.groupby(["epoch", "prompt_id"])["t_finish"].max().items()}
    streamed = [st for st in steps if st.get("parts", 1) > 1]
    assert streamed, "no step was streamed"
    for st in streamed:
        assert st["t_first"] <= st["t_start"] <= st["t_end"]
    early = [st for st in streamed
             if st["t_first"] < max(done[(int(e), str(p))] for e, p, _ in st["samples"])]
    assert early, "every streamed step started after its mini-batch was complete"
    assert orch.streamed is None


def test_streamed_run_makes_the_whole_step_runs_updates(cluster, tmp_path):
    """The loop with ``pipeline.stream_groups`` and the loop without, each with a fresh trainer
    from the same weights, on the same schedule of one mini-batch per iteration (as the CPU
    default: with two, which one a run trains first depends on which is generated first, and
    the order changes the update): the scripted instances' samples depend only on their group,
    so both runs train the same samples in the same steps, and every optimizer step must be the
    same update up to float summation order, although the streamed run split steps into parts
    (iteration 1's for sure: one of its groups is held until a part was trained, ``held_until_streamed``).
    Per iteration the loss and the pre-clip gradient norm (which a wrong step denominator
    scales, e.g. a streamed step divided by its last part's tokens) agree, and so do the weights
    at the end."""
    import json

    import torch

    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS, mini_batch_size=6)
    assert set(sched["mini_batch"]) == {0}
    rows, weights, parts = {}, {}, {}
    for name, rule in (("whole", None), ("stream", "fewest_left")):
        tr = start_trainer(cluster)
        held, on_orch = held_until_streamed(sched, 1) if rule else ((), None)
        orch = run_loop(tr, ExecutionPlan.from_schedule(sched, settings), lengths_of(sched, resp), tmp_path / name,
                        stream_start=rule, held=held, on_orch=on_orch)
        rows[name] = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
        weights[name] = dict(ray.get(tr.full_weights.remote()))
        parts[name] = [st.get("parts", 1) for st in orch.timeline.events["step"]]
        ray.kill(tr)
    assert max(parts["whole"]) == 1 and max(parts["stream"]) > 1, parts   # one run really streamed
    assert len(parts["whole"]) == len(parts["stream"]) == len(rows["whole"]) == int(sched["iteration"].max()) + 1
    for a, b in zip(rows["whole"], rows["stream"]):
        assert (a["iteration"], a["tokens"], a["reward_mean"]) == (b["iteration"], b["tokens"], b["reward_mean"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), a["iteration"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7), a["iteration"]
    start = dict(ray.get(start_trainer(cluster).full_weights.remote()))
    assert any(not torch.equal(start[k], v) for k, v in weights["whole"].items())   # the steps moved the weights
    for k, v in weights["whole"].items():
        assert float((weights["stream"][k] - v).abs().max()) < 1e-5, k


def test_stream_groups_refuses_the_sync_mode(cluster, trainer):
    sched, _ = schedule_and_lengths("asp", 0, epochs=1)
    settings = ExecutionSettings(policy="asp", lag_bound=0, group_size=G, max_num_seqs=4, num_instances=R,
                                 sync_mode=True)
    with pytest.raises(ValueError, match="pipeline.stream_groups.*pipeline.mode=async"):
        Orchestrator([], trainer, ExecutionPlan.from_schedule(sched, settings), None, None, weight_sync=None,
                     stream_start="fewest_left")


def _fill_checker(orch, missed: list) -> None:
    """Wraps the loop's trainer phase: each time it leaves the trainer idle on the current iteration
    (no call in flight, no broadcast, nothing streamed), the iteration's untrained mini-batches
    must not hold, together, a mini-batch's worth of generated groups (else a swap within the
    iteration would have made one ready). Records the iteration and the counts where they did."""
    start = orch._start_train_step

    def checked():
        start()
        i = orch.iteration
        planned = orch.plan.iterations.get(i)
        if (orch.train_call is not None or orch.streamed is not None or i >= orch.last_iteration
                or orch.syncs.broadcasting or planned is None):
            return
        it = orch.progress.get(i)
        mbs = orch.tail.members(i, planned)
        todo = [m for m in mbs if it is None or m not in it.done]
        generated = sum(k in orch.queue for m in todo for k in mbs[m])
        if todo and generated >= min(len(mbs[m]) for m in todo):
            missed.append((i, generated))
    orch._start_train_step = checked


@pytest.mark.parametrize("stream", [None, "fewest_left"])
def test_regroup(cluster, trainer, tmp_path, stream):
    """``pipeline.regroup``: when the trainer is ready and no mini-batch of its iteration is
    generated, one is completed from the iteration's generated groups. Exactly-once, membership per
    iteration and the lag bound hold (the simulator and MindSpeed-RL's source run the plan as
    composed: the same groups per iteration), every step keeps the mini-batch's size, groups did
    move (``regroup`` events), and the trainer never stood idle while the iteration's generated,
    untrained groups could fill a mini-batch. Without regroup the same schedule leaves it idle so.

    The situation is made by state, not by timing: one group of each mini-batch of iteration
    ``hold`` stays unfinished until the trainer, ready for that iteration, regrouped (on) or
    stood idle (off), while its other groups (more than a mini-batch's worth) finish."""
    from asp_ascend.scheduler.tail_control import TailOptions

    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    plan_ = ExecutionPlan.from_schedule(sched, settings)
    hold = 2
    mbs = plan_.iterations[hold]
    held = {f"{e}:{p}" for keys in mbs.values() for e, p in keys[:1]}
    assert len(held) == len(mbs) >= 2 and sum(map(len, mbs.values())) - len(held) >= max(map(len, mbs.values()))
    runs = {}
    for on in (True, False) if stream is None else (True,):
        missed: list = []

        def wrap(o, missed=missed):
            # held until the trainer, ready for ``hold``, regrouped (on) or stood idle (off: a miss)
            _fill_checker(o, missed)
            release_when(o, lambda: any(ev["iteration"] == hold for ev in o.timeline.events["regroup"])
                         or any(i == hold for i, _ in missed))
        orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths_of(sched, resp),
                        tmp_path / str(on), stream_start=stream, tail=TailOptions(regroup=on), on_orch=wrap,
                        held=held)
        runs[on] = (orch, missed)
    orch, missed = runs[True]
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings))
    steps = orch.timeline.events["step"]
    size = sched.groupby(["iteration", "mini_batch"]).size()
    assert all(len(st["samples"]) == size[(st["iteration"], st["mini_batch"])] * G for st in steps)
    moved = orch.timeline.events["regroup"]
    assert all(set(ev) >= {"iteration", "mini_batch", "from_mini_batch", "replaces"} for ev in moved)
    assert any(ev["iteration"] == hold for ev in moved), "the held iteration's groups were not regrouped"
    assert missed == []
    if False in runs:
        assert any(i == hold for i, _ in runs[False][1]), \
            "without regroup the trainer never waited with a mini-batch's worth generated"
        assert not runs[False][0].timeline.events["regroup"]


def _heavy_scenario(plan_, weight, hold: int) -> tuple:
    """Iteration ``hold``'s mini-batches as the heavy_first test needs them: (the mini-batch the
    trainer takes first, its planned groups, the group held back: the lightest of the highest-indexed
    mini-batch, the other groups (generated when the trainer reaches the iteration))."""
    mbs = plan_.iterations[hold]
    first, last = min(mbs), max(mbs)
    held = min(mbs[last], key=weight)
    rest = [k for m in sorted(mbs) for k in mbs[m] if k != held]
    return first, list(mbs[first]), held, rest


def test_regroup_heavy(cluster, trainer, tmp_path):
    """``pipeline.regroup_heavy``: when the trainer is about to train a mini-batch all of whose groups
    are generated while a group of its iteration's other untrained mini-batch is not, the step
    takes the heaviest generated groups of the iteration (tokens: responses + G x prompt), its
    lightest going to the other mini-batch (``regroup`` events with ``rule: heavy_first``).
    Exactly-once, membership per iteration and the lag bound hold; every step keeps its size.
    Without the key the same schedule's step trains the planned mini-batch.

    The situation is made by state, not by timing: in iteration ``hold`` the lightest group of
    its last mini-batch is held until the trainer regrouped heaviest-first (on) or trained a step
    of the iteration (off), and the trainer does not start the iteration until all its other
    groups are generated (a trainer slower than generation, forced by state), so its first
    mini-batch is complete and the other mini-batch holds two generated groups and the held one."""
    from asp_ascend.metrics.timeline import Timeline
    from asp_ascend.scheduler.tail_control import TailOptions

    settings = settings_for()
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    lengths = lengths_of(sched, resp)
    plen = 3                                           # run_loop's prompts: three token ids each
    weight = lambda k: sum(lengths[f"{k[0]}:{k[1]}"]) + G * plen   # noqa: E731
    hold = 2
    first, planned, held, rest = _heavy_scenario(ExecutionPlan.from_schedule(sched, settings), weight, hold)
    heaviest = sorted(rest, key=weight, reverse=True)[:len(planned)]
    # the rule has something to do, and the heaviest are one set (no tie at the boundary)
    assert set(heaviest) != set(planned) and weight(heaviest[-1]) > max(
        weight(k) for k in rest if k not in heaviest)
    runs = {}
    for on in (True, False):
        def wrap(o):
            release_when(o, lambda: any(ev["iteration"] == hold and ev.get("rule") == "heavy_first"
                                        for ev in o.timeline.events["regroup"])
                         or any(st["iteration"] == hold for st in o.timeline.events["step"]))
            start, gate = o._start_train_step, [True]

            def gated():   # the trainer reaches iteration ``hold`` only once all but the held group are generated
                if gate[0] and o.iteration == hold:
                    if not all(k in o.queue for k in rest):
                        return
                    gate[0] = False
                start()
            o._start_train_step = gated
        run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths, tmp_path / str(on),
                 tail=TailOptions(regroup=True, regroup_heavy=on), on_orch=wrap,
                 held={f"{held[0]}:{held[1]}"})
        tl = Timeline.read_jsonl(tmp_path / str(on) / "timeline.jsonl")
        trained, lags, times = runtime_trained([tl])
        assert set(times.values()) == {1} and len(times) == len(sched) * G       # every sample once
        assert_agree(sched, K, (trained, lags))                                  # membership, lag <= k
        size = sched.groupby(["iteration", "mini_batch"]).size()
        assert all(len(st["samples"]) == size[(st["iteration"], st["mini_batch"])] * G for st in tl.events["step"])
        tokens = {}                                    # each trained group's tokens, from its requests
        for rq in tl.events["request"]:
            key = (int(rq["epoch"]), str(rq["prompt_id"]))
            tokens[key] = tokens.get(key, 0) + int(rq["response_length"]) + int(rq["prompt_length"])
        assert all(tokens[k] == weight(k) for k in rest + [held])
        step = next(st for st in tl.events["step"] if st["iteration"] == hold)
        runs[on] = (step["mini_batch"], {(int(e), str(p)) for e, p, _ in step["samples"]},
                    [ev for ev in tl.events["regroup"] if ev["iteration"] == hold])
    m, took, moved = runs[True]
    assert [ev.get("rule") for ev in moved] == ["heavy_first"] * len(set(heaviest) - set(planned)), moved
    assert all(ev["mini_batch"] == first for ev in moved)
    assert m == first and took == set(heaviest), (sorted(map(weight, took)), sorted(map(weight, heaviest)))
    m, took, moved = runs[False]
    assert m == first and took == set(planned) and not moved, "without the key the planned mini-batch trains"


def test_sequence_admission(cluster, trainer, tmp_path):
    """``rollout.admission: sequences``: an instance takes another group while its unfinished
    samples (the last poll's count, plus G per group sent since) are fewer than max_num_seqs.
    Exactly-once, membership and the lag bound hold as with group slots (the simulator and
    MindSpeed-RL's source run the schedule by group slots: the same groups per iteration); no
    group was admitted where max_num_seqs samples were already unfinished (at most one group
    over), and an instance did hold more groups than its two slots (finished samples no longer
    hold room): each instance keeps the last sample of its first two groups unfinished until it
    has received a third group, which the rule admits once their first samples are done."""
    settings = settings_for(admission="sequences")
    sched, resp = schedule_and_lengths("asp", K, epochs=EPOCHS)
    orch = run_loop(trainer, ExecutionPlan.from_schedule(sched, settings), lengths_of(sched, resp), tmp_path,
                    hold_last_of_first=2)
    assert orch.feeder.by_sequences
    trained, lags, times = runtime_trained([orch.timeline])
    assert set(times.values()) == {1} and len(times) == len(sched) * G
    assert_agree(sched, K, (trained, lags), *others(sched, resp, settings_for()))
    req = orch.timeline.frame("request")
    most = 0
    for _, g in req.groupby(["epoch", "prompt_id"]):
        r, t = int(g["instance"].iloc[0]), float(g["t_admit"].iloc[0])
        on = req[(req["instance"] == r) & (req["t_admit"] < t)]
        assert int((on["t_finish"] > t).sum()) < settings.max_num_seqs
        groups = on[on["t_finish"] > t].groupby(["epoch", "prompt_id"]).ngroups
        most = max(most, groups + 1)
    assert most > settings.group_slots
