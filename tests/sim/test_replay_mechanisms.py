"""The replay (sim/replay.py) re-enacts what a run recorded beyond its jobs: the tail caps of its
``tail`` events and the planner's admission concurrency from ``schedule_report.json``."""
from __future__ import annotations

import json

import pytest

from asp_ascend.metrics.timeline import Timeline
from asp_ascend.sim.replay import recorded_caps, replay, run_settings

FIT = {"decode_a": 0.01, "decode_b": 0.0, "decode_c": 0.0, "prefill_per_token": 0.0}


def _req(pid, sample, t_admit, t_first, t_finish, length):
    return dict(epoch=0, iteration=0, instance=0, prompt_id=pid, sample=sample, admission_version=0,
                t_admit=t_admit, t_first_token=t_first, t_finish=t_finish, prompt_length=4,
                response_length=length)


def _run(lift: bool) -> Timeline:
    """Two groups of 2 samples on one instance; p0 (100 and 50 tokens) was admitted first with a
    room of 2 sequences (a tail: nothing else may run beside it); with ``lift``, re-estimation
    lifted the room when p0's shorter sample finished (t = 0.5: 50 + 50 tokens generated)."""
    tl = Timeline()
    for ev in (_req("p0", 0, 0.0, 0.01, 1.0, 100), _req("p0", 1, 0.0, 0.01, 0.5, 50),
               _req("p1", 0, 1.0, 1.01, 1.1, 10), _req("p1", 1, 1.0, 1.01, 1.1, 10)):
        tl.add("request", **ev)
    tl.add("tail", t=0.0, instance=0, epoch=0, prompt_id="p0", iteration=0, room=2, cap=2, reason="measured")
    if lift:
        tl.add("tail", t=0.5, instance=0, epoch=0, prompt_id="p0", iteration=0, room=0, cap=8,
               reason="reestimate", remaining=50.0)
    return tl


def test_recorded_caps_read_rooms_and_the_tokens_of_each_change():
    rooms, changes = recorded_caps(_run(lift=True))
    assert rooms == {(0, "p0"): 2}
    tokens, room = changes[(0, "p0")]
    # at t = 0.5 sample 0 had 1 + 99 * (0.49 / 0.99) = 50 tokens, sample 1 its 50: 100
    assert tokens.tolist() == pytest.approx([100.0])
    assert room.tolist() == [0]
    assert recorded_caps(Timeline()) == ({}, {})


def _admit_p1(tl: Timeline, **kw) -> float:
    out = replay(tl, FIT, max_num_seqs=8, lag_bound=1, **kw).frame("request")
    return float(out.loc[out["prompt_id"] == "p1", "t_admit"].min())


def test_replay_holds_the_recorded_cap_until_the_recorded_lift():
    """10 ms per decode step: p0's samples finish at steps 50 and 100 (0.5 s, 1.0 s). Without the
    caps p1 starts beside p0 at once; with p0's room of 2 it waits for p0 (1.0 s); with the lift
    recorded at 100 tokens it starts when p0 has generated them (step 50, 0.5 s)."""
    assert _admit_p1(_run(lift=False), tail_caps=False) == pytest.approx(0.0)
    assert _admit_p1(_run(lift=False)) == pytest.approx(1.0)
    assert _admit_p1(_run(lift=True)) == pytest.approx(0.5)


def test_run_settings_replay_the_planned_admission_concurrency(tmp_path):
    """An asp run's dispatcher admits at most the planner's ``admission_concurrency`` sequences per
    instance (schedule_report.json): the replay's max_num_seqs is that, not rollout.max_num_seqs."""
    (tmp_path / "config.yaml").write_text("rollout:\n  max_num_seqs: 128\n")
    assert run_settings(tmp_path)["max_num_seqs"] == 128
    (tmp_path / "schedule_report.json").write_text(json.dumps({"admission_concurrency": 48}))
    assert run_settings(tmp_path)["max_num_seqs"] == 48
    (tmp_path / "schedule_report.json").write_text(json.dumps({"policy": "fifo"}))
    assert run_settings(tmp_path)["max_num_seqs"] == 128
    (tmp_path / "schedule_report.json").write_text("{")
    from asp_ascend.errors import DataError

    with pytest.raises(DataError, match="schedule_report.json"):
        run_settings(tmp_path)


def test_run_settings_replay_the_run_admission_rule(tmp_path):
    """A run made with ``rollout.admission: sequences`` replays under the simulator's sequence rule
    (``group_slots=False``); one made with group slots under the slot rule."""
    (tmp_path / "config.yaml").write_text("rollout:\n  admission: sequences\n")
    assert run_settings(tmp_path)["group_slots"] is False
    (tmp_path / "config.yaml").write_text("rollout:\n  admission: groups\n")
    assert run_settings(tmp_path)["group_slots"] is True
