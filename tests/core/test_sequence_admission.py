"""``rollout.admission: sequences``: the Feeder's room rule counts unfinished samples (reported
by the instances, plus G per group admitted since), not group slots; hand-computed admissions
that the group-slot rule would not make, the tail governor's caps on top of it, and the config key."""
from __future__ import annotations

import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.metrics.timeline import Timeline
from asp_ascend.scheduler.admission import Job
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings
from asp_ascend.scheduler.tail_control import TailControl, TailOptions


def _plan(n, *, G, mns, admission, R=1):
    st = ExecutionSettings(policy="asp", lag_bound=1, group_size=G, max_num_seqs=mns, num_instances=R,
                           dispatch="static", admission=admission)
    return ExecutionPlan(st, [Job(0, i, f"p{i}", instance=i % R, predicted_length=10.0) for i in range(n)])


def _fill(feeder, room=None):
    return [job.prompt_id for _r, job, _v in feeder.fill(None, room)]


@pytest.mark.parametrize("admission", ["sequences", "groups"])
def test_unfinished_samples_decide_the_room(admission):
    # G = 4, max_num_seqs = 8: two groups fill the instance (8 sequences, 2 slots)
    feeder = _plan(6, G=4, mns=8, admission=admission).feeder()
    assert _fill(feeder) == ["p0", "p1"]
    seq = admission == "sequences"
    assert feeder.by_sequences is seq
    if seq:
        # p0 has 3 of its 4 samples finished: 1 + 4 unfinished < 8, room for one group (-> 9)
        feeder.unfinished(0, 5)
        assert _fill(feeder) == ["p2"] and feeder.held(0) == 9
        assert _fill(feeder) == []                  # 9 >= 8: nothing until the next report
        # the next report: 7 unfinished (p2's 4 queued in vLLM count): one group, 3 over, never two
        feeder.unfinished(0, 7)
        assert _fill(feeder) == ["p3"] and feeder.held(0) == 11
        feeder.finished(0, "p0")                    # a finished group changes nothing by itself
        assert _fill(feeder) == []
        feeder.unfinished(0, 0)                     # everything done: two groups (0 -> 4 -> 8)
        assert _fill(feeder) == ["p4", "p5"]
    else:
        feeder.unfinished(0, 5)                     # counts are ignored: both slots stay held
        assert _fill(feeder) == []
        assert feeder.seqs == [0]                   # no sequence count is kept under the slot rule
        feeder.finished(0, "p0")
        assert _fill(feeder) == ["p2"]


def test_never_more_than_one_group_over():
    feeder = _plan(40, G=4, mns=10, admission="sequences", R=2).feeder()
    for reported in (0, 9, 3, 7, 10, 1):
        for r in (0, 1):
            feeder.unfinished(r, reported)
        _fill(feeder)
        assert all(feeder.held(r) < 10 + 4 for r in (0, 1))
        assert all(feeder.held(r) >= 10 for r in (0, 1))   # and it fills up to the limit


def test_tail_caps_compose_with_the_sequence_rule():
    # G = 2, max_num_seqs = 8; "p0" is a tail with a room of 4 sequences: the instance holds at most 4
    plan = _plan(5, G=2, mns=8, admission="sequences")
    tl = Timeline()
    ctl = TailControl(plan, TailOptions(tail_concurrency="auto", rooms={(0, "p0"): 4}), max_tokens=200,
                      event=tl.add, now=lambda: 0.0)
    feeder = plan.feeder()
    room = ctl.room_rule(feeder)

    def fill():
        got = []
        for r, job, _v in feeder.fill(None, room):
            ctl.on_admit(r, job)
            got.append(job.prompt_id)
        return got

    assert fill() == ["p0", "p1"]                   # 2, 4: the cap
    feeder.finished(0, "p1")
    ctl.on_finish((0, "p1"), [3, 3])
    feeder.unfinished(0, 1)                         # p0 has one sample left: 1 -> 3 -> 5 (group slots: only p2)
    assert fill() == ["p2", "p3"]


def test_the_config_key_and_its_errors(empty_yaml):
    cfg = load_config(empty_yaml, ["rollout.admission=sequences"])
    assert cfg.rollout.admission == "sequences" and ExecutionSettings.from_config(cfg).admission == "sequences"
    with pytest.raises(ConfigError, match="rollout.admission: 'seqs' is not one of groups, sequences"):
        load_config(empty_yaml, ["rollout.admission=seqs"])
    with pytest.raises(ValueError, match="rollout.admission: 'slots'"):
        _plan(1, G=2, mns=4, admission="slots").feeder()
