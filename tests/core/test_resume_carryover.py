"""A checkpoint taken while partial rollout has groups deferred: the resume trains what the
uninterrupted run trains (pipeline/checkpoint.py carry_state / resume_plan, scheduler/carryover.py).

Without Ray or vLLM: the run's carry-over is driven through the runtime's own TailControl by hand
(finishes, a progress report, a deferral, trained mini-batches), checkpointed with the
orchestrator's driver_state, written and read back as a real checkpoint, then resumed with
resume_plan; the resumed TailControl is compared with the uninterrupted one.
"""
import json
from pathlib import Path

import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.metrics.timeline import Timeline
from asp_ascend.pipeline import checkpoint as ck
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.tail_control import TailControl, TailOptions

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu_tiny_grpo.yaml"
G = 2
# iteration -> mini-batch -> prompt: "z" of iteration 0 is the long one
LAYOUT = {0: {0: "a", 1: "z"}, 1: {0: "b", 1: "c"}, 2: {0: "d", 1: "e"}, 3: {0: "f", 1: "g"}}


def _cfg(*extra):
    return load_config(CONFIG, ["rollout.num_instances=2", "pipeline.lag_bound=1", f"train.group_size={G}",
                                "train.global_batch_size=2", "train.mini_batch_size=1", "train.epochs=1",
                                "rollout.partial_rollout=true", "rollout.max_split=1", *extra])


def _schedule() -> pd.DataFrame:
    rows = [{"epoch": 0, "prompt_id": p, "iteration": i, "mini_batch": m, "instance": m, "dispatch_rank": 2 * i + m,
             "predicted_length": 5.0 + 10 * i + m} for i, mbs in LAYOUT.items() for m, p in mbs.items()]
    return pd.DataFrame(rows)


def _control(plan, S=1):
    return TailControl(plan, TailOptions(reestimate=True, partial_rollout=True, max_split=S), max_tokens=200,
                       event=Timeline().add, now=lambda: 0.0)


def _finish(plan, ctl, feeder, pid, history):
    feeder.finished(0, pid)
    ctl.on_finish((0, pid), [4, 6])
    history += [{"epoch": 0, "prompt_id": pid, "sample": s, "response_length": n} for s, n in enumerate((4, 6))]


def _write_checkpoint(out: Path, state: dict) -> None:
    def trainer(tmp: Path):
        for name in ("config.json", "model.safetensors", "optimizer.pt", "rng.pt"):
            (tmp / name).write_bytes(b"{}" if name.endswith(".json") else b"\0" * 16)
        (tmp / "trainer_state.json").write_text(json.dumps({"schema_version": 1, "version": state["trained_iterations"]}))
    ck.save(out / "checkpoints", state["trained_iterations"], trainer, state)


def _run_until_checkpoint(tmp_path):
    """The uninterrupted run up to the checkpoint at version 1: z (iteration 0) runs long, b and c
    (iteration 1) finish, z is deferred to iteration 1 and b takes its slot; iteration 0 trains
    a and b. Returns (cfg, plan, control, saved driver state)."""
    cfg = _cfg()
    sched = _schedule()
    sched.to_parquet(tmp_path / "schedule.parquet")
    plan = ExecutionPlan.from_schedule(sched, ExecutionSettings.from_config(cfg))
    ctl = _control(plan)
    feeder = plan.feeder()
    for r, job, _v in feeder.fill(None, ctl.room_rule(feeder)):
        ctl.on_admit(r, job)
    history: list[dict] = []
    for pid in ("a", "b", "c"):
        _finish(plan, ctl, feeder, pid, history)
    ctl.on_progress([{"key": [0, "z"], "finished": {}, "tokens": [120, 150]}])
    swaps = ctl.maybe_defer(0)
    assert [(s.deferred, s.swapped_in) for s in swaps] == [((0, "z"), (0, "b"))]
    for m in (0, 1):
        ctl.on_trained(0, m)
    state = ck.driver_state(history, plan.iterations, 1, plan.end, ctl.carry)
    return cfg, plan, ctl, state


def test_resume_while_deferred_trains_the_uninterrupted_sequence(tmp_path):
    cfg, plan, ctl, state = _run_until_checkpoint(tmp_path)
    _write_checkpoint(tmp_path, state)
    res = ck.find_resume(tmp_path)
    assert res.version == 1 and res.carry is not None
    assert res.carry["deferred"] == [[0, "z", 0, 1]] and res.carry["trained_ahead"] == [[0, "b", 1, 0]]
    # the length history holds what was trained (a, and b swapped into iteration 0), not c (finished,
    # not trained: generated again after the resume)
    assert sorted({h["prompt_id"] for h in res.history}) == ["a", "b"]

    plan2 = ck.resume_plan(cfg, ExecutionSettings.from_config(cfg), tmp_path, res.version, res.carry)
    ctl2 = _control(plan2)
    for i in range(1, plan.end):
        want = ctl.members(i, plan.iterations[i])
        assert ctl2.members(i, plan2.iterations[i]) == want, i
        assert plan2.predicted[i] == plan.predicted[i]      # the loss normaliser of each iteration, as planned
    assert ctl2.members(1, plan2.iterations[1]) == {0: [(0, "z")], 1: [(0, "c")]}
    # every group trained exactly once: a, b before the checkpoint, the rest after
    after = [k for i in range(1, plan2.end) for keys in plan2.iterations[i].values() for k in keys]
    assert sorted(after + [(0, "a"), (0, "b")]) == sorted((0, p) for mbs in LAYOUT.values() for p in mbs.values())
    assert plan2.dispatcher.pending() == len(after)
    # z's bounds count from its planned iteration, as in the uninterrupted run: lag k + 1, and with
    # S = 1 it may not be deferred again
    assert ctl2.lag_bound((0, "z")) == ctl.lag_bound((0, "z")) == 2
    f2 = plan2.feeder()
    for r, job, _v in f2.fill(None, ctl2.room_rule(f2)):
        ctl2.on_admit(r, job)
    for pid in ("c", "d"):
        _finish(plan2, ctl2, f2, pid, [])
    ctl2.on_progress([{"key": [0, "z"], "finished": {}, "tokens": [190, 190]}])
    assert ctl2.maybe_defer(1) == []


def test_the_schedule_alone_would_train_b_twice_and_z_never(tmp_path):
    """What a resume without the carry-over state trains (the behaviour before the state was
    saved): the planned membership."""
    cfg, plan, ctl, state = _run_until_checkpoint(tmp_path)
    plan_old = ck.resume_plan(cfg, ExecutionSettings.from_config(cfg), tmp_path, 1)
    assert plan_old.iterations[1] == {0: [(0, "b")], 1: [(0, "c")]} != ctl.members(1, plan.iterations[1])


def test_a_carry_state_that_does_not_fit_is_refused(tmp_path):
    cfg, _plan, _ctl, state = _run_until_checkpoint(tmp_path)
    carry = state["carry_over"]
    settings = ExecutionSettings.from_config(cfg)
    with pytest.raises(ConfigError, match="rollout.partial_rollout=true"):
        ck.resume_plan(_cfg("rollout.partial_rollout=false"), settings, tmp_path, 1, carry)
    bad = dict(carry, members=[m for m in carry["members"] if m[0] != 2])
    with pytest.raises(ConfigError, match="carry-over state .* does not match"):
        ck.resume_plan(cfg, settings, tmp_path, 1, bad)
    with pytest.raises(ConfigError, match="does not match"):
        ck.resume_plan(cfg, settings, tmp_path, 2, carry)
    # a longer run on resume (train.max_iterations may change): iterations past the saved state's
    # end keep the schedule's membership
    short = dict(carry, end=3, members=[m for m in carry["members"] if m[0] < 3])
    plan = ck.resume_plan(cfg, settings, tmp_path, 1, short)
    assert plan.iterations[3] == {0: [(0, "f")], 1: [(0, "g")]}


def test_restore_planned_checks_the_split_bound():
    from asp_ascend.scheduler.carryover import CarryOver

    co = CarryOver([("z", 2, 0), ("y", 2, 1)], max_split=2)
    co.restore_planned({"z": 0})
    assert co.lag_bound_of("z", 1) == 3 and co.lag_bound_of("y", 1) == 1
    with pytest.raises(ValueError, match="max_split 2"):
        co.restore_planned({"y": -1})
    with pytest.raises(KeyError):
        co.restore_planned({"x": 1})
