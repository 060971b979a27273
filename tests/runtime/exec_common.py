"""One schedule, three executors: the pieces the execution-path tests share.

The simulator (``sim/engine.Engine``), the runtime's loop (``pipeline/orchestrator.Orchestrator``)
and MindSpeed-RL's ``DispatcherSource`` each execute an ``ExecutionPlan`` of the same schedule.
This module makes the schedule, runs the simulator and the MindSpeed-RL source through their
public calls, and reads back what each executor trained: per iteration the (epoch, prompt_id)
groups, and each group's lag.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionPlan
from asp_ascend.scheduler.planner import plan
from asp_ascend.scheduler.tail_control import TailOptions
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.mechanisms import SimMechanisms

G, R = 2, 2
COST = CostModel(decode_a=0.01, decode_b=1e-5, decode_c=1e-3, prefill_per_token=1e-4)


BATCH = 6                 # groups an iteration trains
TAIL_PROMPT = 4000        # prompt tokens of every group in a ``busy_tail`` setup


def schedule_and_lengths(policy: str, k: int, seed: int = 1, epochs: int = 1, tail: str = "off",
                         max_num_seqs: int = 4, n: int = 24, mini_batch_size: int = 3, busy_tail: bool = False):
    """``epochs`` epochs of ``n`` prompts, each planned on its own (as ``scheduler/run.plan_epochs``
    does), with true lengths that the predictions get wrong (so guided dispatch has work to do).
    ``tail`` (rollout.tail_concurrency): the planner sizes rooms for the groups that set their
    iteration's floor (the ``room`` column). ``busy_tail``: a setup with such groups (simulate it
    with ``prompt_length=TAIL_PROMPT``): long prompts (TAIL_PROMPT tokens, so a decode step's cost
    grows with the sequences it holds and a room speeds a group up), short responses (10-19 tokens)
    that keep the instances busy, and one group per iteration ten times longer (100-109 tokens),
    predicted within 20 %. Returns (schedule, true lengths [rows, G])."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"p{i}" for i in range(n)], dtype=object)
    frames, resps, offset = [], [], 0
    for e in range(epochs):
        if busy_tail:
            truth = rng.integers(10, 20, (n, G))
            truth[rng.choice(n, n // BATCH, replace=False)] += 90
            predicted = truth.mean(axis=1) * rng.uniform(0.8, 1.2, n)
        else:
            truth = rng.integers(1, 40, (n, G))
            predicted = truth.mean(axis=1) * rng.uniform(0.3, 3.0, n)
        plen = float(TAIL_PROMPT if busy_tail else 4)
        sched = plan(ids, predicted, np.full(n, plen), policy=policy, group_size=G, global_batch_size=BATCH,
                     mini_batch_size=mini_batch_size, num_instances=R, max_num_seqs=max_num_seqs, lag_bound=k, epoch=e,
                     iteration_offset=offset, seed=seed, **({} if tail == "off" else {"tail": tail, "cost": COST}))
        offset = int(sched["iteration"].max()) + 1
        rows = {p: i for i, p in enumerate(ids)}
        frames.append(sched)
        resps.append(truth[[rows[p] for p in sched["prompt_id"]]])
    return pd.concat(frames, ignore_index=True), np.concatenate(resps)


def rooms_of(sched) -> dict:
    capped = sched[sched["room"] > 0] if "room" in sched else sched.iloc[:0]
    return {(int(e), str(p)): int(n) for e, p, n in zip(capped["epoch"], capped["prompt_id"], capped["room"])}


def simulate(sched, resp, settings, tail: str = "off", trace: list | None = None, prompt_length: int = 4):
    """The simulator under the runtime's admission rule (``group_slots``, no pause at weight
    syncs); returns its timeline. ``trace``: the Feeder's record of admissions and events;
    ``prompt_length``: every group's prompt tokens (as planned)."""
    jobs = SimJobs(epoch=sched["epoch"].to_numpy(np.int64), prompt_id=sched["prompt_id"].to_numpy(object),
                   iteration=sched["iteration"].to_numpy(np.int64), mini_batch=sched["mini_batch"].to_numpy(np.int64),
                   instance=sched["instance"].to_numpy(np.int64),
                   dispatch_rank=sched["dispatch_rank"].to_numpy(np.int64),
                   prompt_length=np.full(len(sched), prompt_length, np.int64), resp=np.asarray(resp, np.int64),
                   predicted_length=sched["predicted_length"].to_numpy(float),
                   room=sched["room"].to_numpy(np.int64) if "room" in sched else None)
    return Engine(jobs, settings, cost=COST, kv_capacity=0, trainer=TrainerSpec(1e-3, 0.05, 0.02, 4, "packed"),
                  stream_train=not settings.sync_mode, sync_pause=False, group_slots=True, trace=trace,
                  mechanisms=SimMechanisms(tail_concurrency=tail)).run()


def group(r: int, epoch: int, pid: str, version: int, lengths=(2,) * G) -> dict:
    """A finished group as a rollout instance's ``poll`` returns it."""
    return {"meta": {"epoch": epoch, "prompt_id": pid}, "instance": r, "admission_version": version, "t_admit": 0.0,
            "samples": [{"sample": s, "token_ids": [4] * int(n), "logprobs": [-1.0] * int(n), "t_first_token": 0.0,
                         "t_finish": 0.0, "version_first": version, "version_last": version,
                         "finish_reason": "stop"} for s, n in enumerate(lengths)]}


class MindSpeedInstance:
    """An in-process rollout instance as MindSpeed-RL's source drives it (``submit``/``poll``):
    every submitted group is finished at the next poll, or when the caller says (``hold``)."""

    def __init__(self, r: int, submitted: list, hold: bool = False):
        self.r, self.submitted, self.finished, self.hold = r, submitted, [], hold
        self.version = 0

    def submit(self, group_id, prompt_token_ids, n, meta=None, **sampling):
        self.submitted.append((self.r, meta["epoch"], meta["prompt_id"]))
        if not self.hold:
            self.finished.append({**group(self.r, meta["epoch"], meta["prompt_id"], int(meta["version"])), "meta": meta})

    def poll(self):
        done, self.finished = self.finished, []
        return {"groups": [{**g, "meta": {"iteration": 0, "mini_batch": 0, "prompt": [1], "extras": {},
                                          "version": g["admission_version"], **g["meta"]}} for g in done]}


def mindspeed_source(sched, settings, insts, tail: str = "off") -> DispatcherSource:
    return DispatcherSource(ExecutionPlan.from_schedule(sched, settings), insts, lambda pid: ([1, 2, 3, 4], {}),
                            sampling={}, poll_interval_s=0.0, tail=TailOptions(tail_concurrency=tail,
                                                                               rooms=rooms_of(sched)))


def run_mindspeed(sched, settings) -> tuple[dict, list]:
    """MindSpeed-RL's loop over the source: per iteration ``get_groups`` (the schedule's count),
    then the weights of the next version pushed to every instance (``on_published``).
    Returns (iteration -> trained (epoch, prompt_id) keys, [(key, lag)])."""
    submitted: list = []
    src = mindspeed_source(sched, settings, [MindSpeedInstance(r, submitted) for r in range(R)])
    per_iter = sched.groupby("iteration").size()
    trained, lags = {}, []
    for i, count in per_iter.items():
        i = int(i)
        got = src.get_groups(i, int(count))
        trained[i] = [(g.epoch, g.prompt_id) for g in got]
        lags += [((g.epoch, g.prompt_id), i - g.admission_version) for g in got]
        src.on_published(i + 1)
    return trained, lags


def sim_trained(tl) -> tuple[dict, list]:
    """The simulator's timeline read the same way: (iteration -> keys, [(key, lag)])."""
    steps = tl.frame("step")
    trained: dict = {}
    for i, samples in zip(steps["iteration"], steps["samples"]):
        trained.setdefault(int(i), []).extend({(int(e), str(p)) for e, p, _ in samples})
    req = tl.frame("request")
    lags = [((int(e), str(p)), int(i) - int(v)) for e, p, i, v in
            zip(req["epoch"], req["prompt_id"], req["iteration"], req["admission_version"])]
    return trained, lags


def runtime_trained(tls) -> tuple[dict, list, Counter]:
    """The runtime's timelines (one per attempt of a resumed run) read the same way, plus how
    many times each (epoch, prompt_id, sample) was trained."""
    trained: dict = {}
    times: Counter = Counter()
    lags = []
    for tl in tls:
        for st in tl.events["step"]:
            trained.setdefault(int(st["iteration"]), []).extend({(int(e), str(p)) for e, p, _ in st["samples"]})
            times.update((int(e), str(p), int(s)) for e, p, s in st["samples"])
        for rq in tl.events["request"]:
            lags.append(((int(rq["epoch"]), str(rq["prompt_id"])), int(rq["iteration"]) - int(rq["admission_version"])))
    return trained, lags, times


def membership(sched) -> dict:
    """What every executor must train: iteration -> the schedule's (epoch, prompt_id) keys."""
    return {int(i): sorted((int(e), str(p)) for e, p in zip(g["epoch"], g["prompt_id"]))
            for i, g in sched.groupby("iteration")}


def assert_agree(sched, k: int, *executors: tuple[dict, list]) -> None:
    """Each executor trained exactly the schedule's groups in each iteration (membership), each
    group once (exactly-once), every group within the lag bound k."""
    want = membership(sched)
    for trained, lags in executors:
        assert {i: sorted(keys) for i, keys in trained.items()} == want
        assert max(lag for _, lag in lags) <= k and min(lag for _, lag in lags) >= 0
