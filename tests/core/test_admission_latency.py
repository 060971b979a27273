"""metrics/admission.py: from a finish that freed a slot of a full instance to its next admission,
and the split of that path over the poll and submit events (hand-made timelines)."""
import pytest

from asp_ascend.metrics import Timeline, admission_latency
from asp_ascend.metrics.admission import PARTS


def _group(tl: Timeline, pid: str, t_admit: float, t_finish: float, instance: int = 0) -> None:
    for s, late in enumerate((0.0, 0.5)):   # the group finishes with its slower sample
        tl.add("request", epoch=0, iteration=0, instance=instance, prompt_id=pid, sample=s, admission_version=0,
               t_admit=t_admit, t_first_token=t_admit, t_finish=t_finish - late if s == 0 else t_finish,
               prompt_length=3, response_length=4)


def test_only_finishes_of_a_full_instance_pair_with_the_next_admission():
    tl = Timeline()
    _group(tl, "a", 0.0, 1.0)
    _group(tl, "b", 0.0, 2.0)
    _group(tl, "c", 1.03, 3.0)       # a freed a slot of the full instance (2 of 2): 30 ms
    _group(tl, "d", 2.04, 5.0)       # b: 40 ms
    _group(tl, "e", 3.5, 6.0)        # c: but a weight sync ended at 3.2 - left out
    tl.add("sync", t_start=3.1, t_end=3.2, version=1)
    _group(tl, "x", 0.0, 0.7, instance=1)    # instance 1 never full (1 of 2 slots): no pair
    res = admission_latency(tl, slots=2)
    got = [(p["instance"], p["t_finish"], round(p["latency"], 6)) for p in res["pairs"]]
    assert got == [(0, 1.0, 0.03), (0, 2.0, 0.04)]
    assert res["latency"]["n"] == 2 and res["latency"]["median"] == pytest.approx(0.035)
    assert res["parts"]["add"]["n"] == 0          # no poll/submit events: no split
    # without slots: the most the instance held at once (2 on instance 0, 1 on instance 1)
    assert [p["t_finish"] for p in admission_latency(tl)["pairs"]] == [1.0, 2.0]


def test_the_split_adds_up_to_the_latency():
    tl = Timeline()
    _group(tl, "a", 0.0, 1.0)
    _group(tl, "b", 1.030, 2.0)
    tl.add("poll", instance=0, groups=["0:a"], t_call=0.9, t_wake=1.001, t_locked=1.012, t_return=1.013,
           t_got=1.015)
    tl.add("submit", instance=0, groups=["0:b"], t_sent=1.020, t_call=1.022, t_locked=1.028, t_done=1.031)
    res = admission_latency(tl, slots=1)
    (p,) = res["pairs"]
    assert sum(p[k] for k in PARTS) == pytest.approx(p["latency"]) == pytest.approx(0.030)
    assert p["no_poll"] == 0.0 and p["poll_lock"] == pytest.approx(0.011) and p["submit_lock"] == pytest.approx(0.006)
    assert p["driver"] == pytest.approx(0.005) and p["add"] == pytest.approx(0.002)


def test_a_submit_sent_before_the_poll_arrived_is_not_split():
    tl = Timeline()
    _group(tl, "a", 0.0, 1.0)
    _group(tl, "b", 1.030, 2.0)
    tl.add("poll", instance=0, groups=["0:a"], t_call=0.9, t_wake=1.001, t_locked=1.012, t_return=1.013,
           t_got=1.025)
    tl.add("submit", instance=0, groups=["0:b"], t_sent=1.020, t_call=1.022, t_locked=1.028, t_done=1.031)
    res = admission_latency(tl, slots=1)
    assert res["latency"]["n"] == 1 and res["parts"]["add"]["n"] == 0


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="no request events"):
        admission_latency(Timeline())
    tl = Timeline()
    _group(tl, "a", 0.0, 1.0)
    with pytest.raises(ValueError, match="slots=0"):
        admission_latency(tl, slots=0)
