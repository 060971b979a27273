"""Metric functions on a hand-made timeline, against values computed by hand."""
import numpy as np
import pytest

from asp_ascend.metrics import (Timeline, combine_instance_splits, deferred_lags, instance_split, instance_split_entry,
                                sum_histograms, summarize, time_weighted_cv)
from asp_ascend.metrics.bubbles import iteration_lower_bounds, iteration_time_stats, padding_bubble


def hand_timeline() -> Timeline:
    tl = Timeline()
    req = dict(epoch=0, sample=0, t_first_token=None, prompt_length=1, response_length=1)
    tl.add("request", iteration=0, instance=0, prompt_id="a", admission_version=0, t_admit=0.0, t_finish=4.0, **req)
    tl.add("request", iteration=0, instance=0, prompt_id="b", admission_version=0, t_admit=0.0, t_finish=2.0, **req)
    tl.add("request", iteration=0, instance=1, prompt_id="c", admission_version=0, t_admit=0.0, t_finish=1.0, **req)
    tl.add("request", iteration=1, instance=1, prompt_id="d", admission_version=0, t_admit=5.0, t_finish=6.0, **req)
    tl.add("step", t_start=4.0, t_end=4.5, iteration=0, mini_batch=0, version=0, samples=[], tokens=30, padded_tokens=10)
    tl.add("step", t_start=6.0, t_end=7.0, iteration=1, mini_batch=0, version=1, samples=[], tokens=10, padded_tokens=0)
    tl.add("sync", t_start=4.5, t_end=5.0, version=1)
    tl.add("sync", t_start=7.0, t_end=8.0, version=2)
    tl.add("queue", t=0.0, op="put", size=2)
    tl.add("queue", t=4.0, op="get", size=0)
    return tl


def test_summary_hand_computed():
    s = summarize(hand_timeline(), num_instances=2, max_num_seqs=2, lag_bound=1, lower_bounds=[2.0, 2.0])
    assert s["run_time_s"] == 8.0
    assert s["throughput"] == pytest.approx(40 / 8)
    assert s["iteration_time_mean"] == pytest.approx(4.0)          # syncs end at 5 and 8
    assert s["iteration_time_p50"] == pytest.approx(4.0)
    assert s["padding_bubble"] == pytest.approx(10 / 50)
    # instance-time (16 s): useful 6 (occupancy >= 1), skew 4, lag-blocked 2, other 4
    rb = s["rollout_breakdown"]
    assert rb == pytest.approx({"useful": 6 / 16, "skew_bubble": 4 / 16, "lag_blocked": 2 / 16, "other": 4 / 16})
    assert s["skew_bubble"] == pytest.approx(0.25)
    # trainer (8 s): useful 0.375 + 1, padding 0.125, idle while generating 5, other 1.5
    tb = s["trainer_breakdown"]
    assert tb == pytest.approx({"useful": 1.375 / 8, "padding": 0.125 / 8, "sorting_bubble": 5 / 8, "other": 1.5 / 8})
    assert s["sorting_bubble"] == pytest.approx(5 / 8)
    assert s["policy_lag_max"] == 1
    assert s["policy_lag_hist"] == {"0": 3, "1": 1}
    assert s["queue_occupancy_cv"] == pytest.approx(1.0)  # 2 for 4 s then 0 for 4 s
    assert s["lower_bound_ratio"] == pytest.approx(2.0)
    assert sum(rb.values()) == pytest.approx(1.0) and sum(tb.values()) == pytest.approx(1.0)
    # per instance from the first sync end (5) to the last (8): only d (instance 1, 5 -> 6, 1 token) is in it
    split = s["instance_split"]
    assert split["window_s"] == 3.0
    assert split["instances"] == [{"instance": 0, "tokens": 0, "token_share": 0.0, "busy": 0.0},
                                  {"instance": 1, "tokens": 1, "token_share": 1.0, "busy": pytest.approx(1 / 3)}]


def test_timeline_jsonl_roundtrip(tmp_path):
    tl = hand_timeline()
    tl.write_jsonl(tmp_path / "timeline.jsonl")
    back = Timeline.read_jsonl(tmp_path / "timeline.jsonl")
    a = summarize(tl, num_instances=2, max_num_seqs=2, lag_bound=1)
    b = summarize(back, num_instances=2, max_num_seqs=2, lag_bound=1)
    assert a == b


def test_truncated_timeline_line_is_a_clear_error(tmp_path):
    from asp_ascend.errors import DataError

    p = tmp_path / "timeline.jsonl"
    p.write_text('{"kind": "sync", "t_start": 0, "t_end": 1, "version": 1}\n{"kind": "req')
    with pytest.raises(DataError, match="timeline.jsonl:2: not valid JSON"):
        Timeline.read_jsonl(p)


def test_primitives():
    assert padding_bubble(0, 0) == 0.0
    assert padding_bubble(75, 25) == 0.25
    st = iteration_time_stats([2.0, 3.0, 7.0], 0.0)
    assert st["iteration_time_mean"] == pytest.approx(7 / 3)
    assert time_weighted_cv([0, 1], [5, 5], 0, 2) == 0.0
    lb = iteration_lower_bounds([1, 5], [2, 1], [6, 2], lag_bound=1)
    assert lb.tolist() == [3.0, 5.0]


def test_deferred_lags_count_only_groups_trained_after_their_plan():
    # carry-over with k = 1: d (planned for iteration 0, admitted at v0) is deferred to iteration 1,
    # its newest tokens from v1; s (planned for 1, admitted at v0) was swapped into its slot and
    # trained in iteration 0; a trained as planned in 0, b in 1 (admitted at v1). Only d is deferred:
    # s moved earlier (lag 0), it counts under the lossless bound with a and b.
    trained = [1, 1, 0, 0, 0, 1]             # d (2 samples), s (2 samples), a, b
    planned = [0, 0, 1, 1, 0, 1]
    admitted = [0, 0, 0, 0, 0, 1]
    newest = [1, 1, 0, 0, 0, 1]
    out = deferred_lags(trained, planned, admitted, newest)
    assert out == {"deferred_samples": 2, "policy_lag_max_lossless": 0,
                   "deferred_lag_hist": {"1": 2}, "deferred_token_lag_hist": {"0": 2}}
    # nothing moved: no deferred sample, the lossless maximum over every sample
    assert deferred_lags([2, 3], [2, 3], [1, 3], [1, 3]) == {
        "deferred_samples": 0, "policy_lag_max_lossless": 1, "deferred_lag_hist": {}, "deferred_token_lag_hist": {}}


def split_timeline() -> Timeline:
    """Three instances: 0 runs a [0, 4] (10 tokens), b [1, 2] (4) and c [2, 3] (6; admitted as b
    finishes); 1 runs d [5, 6] (8 tokens, 3 of them kept from a failed instance) then e [6, 7] (2);
    2 runs nothing. The last sync ends at 8."""
    tl = Timeline()
    req = dict(epoch=0, iteration=0, sample=0, admission_version=0, t_first_token=None, prompt_length=1)
    for inst, pid, ta, tf, n in ((0, "a", 0.0, 4.0, 10), (0, "b", 1.0, 2.0, 4), (0, "c", 2.0, 3.0, 6),
                                 (1, "e", 6.0, 7.0, 2)):
        tl.add("request", instance=inst, prompt_id=pid, t_admit=ta, t_finish=tf, response_length=n, **req)
    tl.add("request", instance=1, prompt_id="d", t_admit=5.0, t_finish=6.0, response_length=8, resumed_at=3, **req)
    tl.add("sync", t_start=7.5, t_end=8.0, version=1)
    return tl


def test_instance_split_hand_computed():
    s = instance_split(split_timeline(), num_instances=3, few=2)   # window W = [0, 8]
    assert s["window_s"] == 8.0
    by = {r["instance"]: r for r in s["instances"]}
    assert sorted(by) == [0, 1, 2]
    # instance 0: busy [0, 4]; one request running over [0, 1) and [3, 4), two over [1, 3)
    assert by[0] == pytest.approx({"instance": 0, "samples": 3, "tokens": 20, "busy_s": 4.0, "few_s": 2.0,
                                   "token_share": 20 / 27, "busy": 0.5, "few": 0.25})
    # instance 1: busy [5, 7], one request at a time; d drew 8 - 3 = 5 tokens here
    assert by[1] == pytest.approx({"instance": 1, "samples": 2, "tokens": 7, "busy_s": 2.0, "few_s": 2.0,
                                   "token_share": 7 / 27, "busy": 0.25, "few": 0.25})
    assert by[2] == {"instance": 2, "samples": 0, "tokens": 0, "busy_s": 0.0, "few_s": 0.0,
                     "token_share": 0.0, "busy": 0.0, "few": 0.0}


def test_instance_split_window_and_runs_combined():
    tl = split_timeline()
    w = instance_split(tl, num_instances=2, t0=2.5, t1=6.5)
    assert w["window_s"] == 4.0
    by = {r["instance"]: r for r in w["instances"]}
    # finished inside [2.5, 6.5]: c and a on 0 (16 tokens), d on 1 (5); busy 1.5 s each
    assert by[0] == pytest.approx({"instance": 0, "samples": 2, "tokens": 16, "busy_s": 1.5,
                                   "token_share": 16 / 21, "busy": 1.5 / 4})
    assert by[1] == pytest.approx({"instance": 1, "samples": 1, "tokens": 5, "busy_s": 1.5,
                                   "token_share": 5 / 21, "busy": 1.5 / 4})
    both = combine_instance_splits([instance_split(tl, num_instances=2), w])
    assert both["window_s"] == 12.0
    by = {r["instance"]: r for r in both["instances"]}
    assert by[0] == pytest.approx({"instance": 0, "samples": 5, "tokens": 36, "busy_s": 5.5,
                                   "token_share": 36 / 48, "busy": 5.5 / 12})
    assert by[1] == pytest.approx({"instance": 1, "samples": 3, "tokens": 12, "busy_s": 3.5,
                                   "token_share": 12 / 48, "busy": 3.5 / 12})
    with pytest.raises(ValueError, match="t1=1.0 is before its start t0=2.0"):
        instance_split(tl, num_instances=2, t0=2.0, t1=1.0)


def test_summary_instance_split_leaves_out_iteration_0():
    tl = split_timeline()                     # one sync: no window after iteration 0
    assert instance_split_entry(tl, num_instances=2) is None
    tl.add("sync", t_start=2.0, t_end=2.5, version=0)
    e = instance_split_entry(tl, num_instances=3)
    full = instance_split(tl, num_instances=3, t0=2.5, t1=8.0)
    assert e["window_s"] == 5.5
    assert e["instances"] == [{k: r[k] for k in ("instance", "tokens", "token_share", "busy")}
                              for r in full["instances"]]
    assert sum(r["token_share"] for r in e["instances"]) == pytest.approx(1.0)
    assert summarize(tl, num_instances=3, max_num_seqs=2, lag_bound=1)["instance_split"] == e


def test_sum_histograms_adds_bins_in_numeric_order():
    out = sum_histograms([{"1": 3, "0": 1}, {"10": 1, "2": 1, "1": 1}, {}, None])
    assert out == {"0": 1, "1": 4, "2": 1, "10": 1}
    assert list(out) == ["0", "1", "2", "10"]
