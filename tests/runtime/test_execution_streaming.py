"""One schedule, three executors, with the trainer side's mechanisms: steps streamed as their groups
are generated (``pipeline.stream_groups``) and mini-batches regrouped from an iteration's generated
groups (``pipeline.regroup``, ``pipeline.regroup_heavy``).

The runtime side is the real loop on a real Ray cluster with the real trainer and scripted
rollout instances (scripted_runtime.py), each situation made by state (held groups released at
the scenario's moment), not by timing; the simulator and MindSpeed-RL's source execute the same
schedule. Exactly-once, membership per iteration and the lag bound hold in every run. Failures,
restarts, resume and re-planning on the same harness: test_execution_scenarios.py.
"""
from __future__ import annotations

import importlib.util

import pytest

from exec_common import G, R, assert_agree, runtime_trained, schedule_and_lengths

# the trainer needs torch + transformers; no vLLM (the instances are Ray actors)
pytestmark = [pytest.mark.runtime, pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in
                                                         ("torch", "transformers")), reason="torch/transformers missing")]

ray = pytest.importorskip("ray")

from asp_ascend.pipeline.orchestrator import Orchestrator  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings  # noqa: E402
from scripted_runtime import cluster, trainer  # noqa: E402,F401 (the fixtures)
from scripted_runtime import (K, EPOCHS, lengths_of, others, release_when,  # noqa: E402
                              run_loop, settings_for, start_trainer)


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


