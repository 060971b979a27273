"""metrics/floor.py on a hand-made timeline (k = 1, two samples per group), against values computed by hand."""
import pandas as pd
import pytest

from asp_ascend.metrics.floor import beside, floor_breakdown


def hand_frames():
    rows = []

    def group(it, inst, pid, admit, finishes):
        for s, f in enumerate(finishes):
            rows.append(dict(epoch=0, iteration=it, instance=inst, prompt_id=pid, sample=s, t_admit=admit,
                             t_finish=f, prompt_length=1, response_length=1))
    group(0, 0, "A", 0.0, (8.0, 9.0))
    group(0, 1, "B", 0.0, (5.0, 5.0))
    group(1, 1, "C", 0.0, (18.0, 18.0))
    group(1, 0, "D", 1.0, (12.0, 12.0))
    group(2, 0, "E", 11.0, (30.0, 35.0))
    group(2, 1, "F", 10.0, (25.0, 25.0))
    req = pd.DataFrame(rows)
    syncs = pd.DataFrame({"t_start": [9.5, 19.0, 38.0], "t_end": [10.0, 20.0, 40.0], "version": [1, 2, 3]})
    solo = pd.Series({(0, "A"): 7.0, (0, "B"): 5.0, (0, "C"): 15.0, (0, "D"): 10.0, (0, "E"): 20.0, (0, "F"): 24.0})
    return req, syncs, solo


def test_floor_breakdown_hand_computed():
    req, syncs, solo = hand_frames()
    b = floor_breakdown(req, syncs, solo, lag_bound=1).set_index("iteration")
    assert list(b.index) == [0, 1, 2]
    # iteration 2: allowed at V_1 = 10; the floor group F (solo 24) is not the last to finish, E is
    r = b.loc[2]
    assert (r.allowed, r.floor_group_solo, r.floor_group_latency, r.floor_group_wait) == (10.0, 24.0, 15.0, 0.0)
    assert (r.critical_solo, r.critical_latency, r.critical_wait) == (20.0, 24.0, 1.0)
    assert not r.critical_is_floor_group
    assert r.critical_beside == pytest.approx(2.0 / 24.0)     # D's two samples from 11 to 12 on instance 0
    assert (r.last_finish, r.published, r.after, r.window) == (35.0, 40.0, 5.0, 30.0)
    assert r.window == r.critical_wait + r.critical_latency + r.after
    # iteration 1: admissible from the start (i - k = 0); C is both floor group and last
    r = b.loc[1]
    assert (r.allowed, r.critical_latency, r.critical_is_floor_group, r.after, r.window) == (0.0, 18.0, True, 2.0, 20.0)
    assert r.critical_beside == pytest.approx((2 * 5.0 + 2 * 8.0) / 18.0)   # B 0..5, F 10..18 (two samples each)
    r = b.loc[0]
    assert (r.floor_group_solo, r.critical_latency, r.after, r.window) == (7.0, 9.0, 1.0, 10.0)


def test_floor_breakdown_k0_and_missing_solo():
    req, syncs, solo = hand_frames()
    b = floor_breakdown(req, syncs, solo, lag_bound=0).set_index("iteration")
    assert b.loc[2, "allowed"] == 20.0 and b.loc[1, "allowed"] == 10.0    # V_2 and V_1
    with pytest.raises(ValueError, match="solo latency missing for 1 groups"):
        floor_breakdown(req, syncs, solo.drop((0, "E")), lag_bound=1)
    with pytest.raises(ValueError, match="lag_bound must be >= 0"):
        floor_breakdown(req, syncs, solo, lag_bound=-1)


def test_beside_empty_interval():
    req, _, _ = hand_frames()
    assert beside(req, 0, 5.0, 5.0, (0, "A")) == 0.0


def test_last_steps_hand_computed():
    """metrics/floor.last_steps: groups of iteration 2 finish at 25 (F) and 35 (E); with two steps of
    one group each, the last-but-one began at 26 (F generated, E not: 1 left = the last step's one
    group, forced), a streamed one's t_first (24: neither generated) counts over t_start."""
    from asp_ascend.metrics.floor import last_steps

    req, _, _ = hand_frames()
    steps = pd.DataFrame({"iteration": [2, 2, 1], "t_start": [26.0, 35.0, 20.0], "t_end": [30.0, 41.0, 22.0],
                          "tokens": [100, 300, 50]})
    r = last_steps(req, steps).set_index("iteration")
    assert list(r.index) == [2]                     # iteration 1 has one step only
    assert (r.loc[2, "steps"], r.loc[2, "left_at_last_but_one"], r.loc[2, "last_groups"]) == (2, 1, 1)
    assert (r.loc[2, "last_step_s"], r.loc[2, "last_tokens_share"]) == (6.0, 1.5)
    streamed = steps.assign(t_first=[24.0, float("nan"), float("nan")])
    assert last_steps(req, streamed).set_index("iteration").loc[2, "left_at_last_but_one"] == 2


def test_publish_floor_hand_computed():
    """metrics/floor.publish_floor: V_{i+1} = max(V_i + busy_i, V_{i-k} + floor_i), V_0 = fill for
    the trainer, admissions of iterations 0 .. k from 0."""
    from asp_ascend.metrics.floor import publish_floor

    # k = 1: V_1 = max(2 + 5, 1) = 7; V_2 = max(12, 0 + 20) = 20 (iteration 1 admitted from 0);
    # V_3 = max(25, V_1 + 1) = 25; V_4 = max(30, V_2 + 14) = 34
    assert publish_floor([5, 5, 5, 5], [1, 20, 1, 14], 1, fill=2.0).tolist() == [7.0, 20.0, 25.0, 34.0]
    # k = 0: each iteration's floor counts from the previous publish: 7, max(12, 27), max(32, 28), max(37, 46)
    assert publish_floor([5, 5, 5, 5], [1, 20, 1, 14], 0, fill=2.0).tolist() == [7.0, 27.0, 32.0, 46.0]
    with pytest.raises(ValueError, match="lag_bound must be >= 0"):
        publish_floor([1.0], [1.0], -1)
    with pytest.raises(ValueError, match="one entry per iteration"):
        publish_floor([1.0, 2.0], [1.0], 1)


def test_publish_floor_orders_hand_computed():
    """metrics/floor.publish_floor_orders: the same iterations in other orders. Two iterations with
    floor 10 and two with 0, the trainer 1 s per iteration, k = 1: side by side the two long floors
    overlap (generated together), one apart they add up."""
    from asp_ascend.metrics.floor import publish_floor_orders

    busy, floor = [1, 1, 1, 1], [10, 10, 0, 0]
    # [10, 10, 0, 0]: V_1 = 10, V_2 = max(11, 0 + 10) = 11, V_3 = 12, V_4 = 13
    # [10, 0, 10, 0]: V_1 = 10, V_2 = 11, V_3 = max(12, V_1 + 10) = 20, V_4 = 21
    # [0, 10, 0, 10]: V_1 = 1, V_2 = max(2, 0 + 10) = 10, V_3 = 11, V_4 = max(12, V_2 + 10) = 20
    got = publish_floor_orders(busy, floor, 1, [[0, 1, 2, 3], [0, 2, 1, 3], [2, 0, 3, 1]])
    assert got.tolist() == [13.0, 21.0, 20.0]
    # k = 0: every floor is paid after the previous publish, whatever the order: 10, 20, 21, 22 / 10, 11, 21, 22
    assert publish_floor_orders(busy, floor, 0, [[0, 1, 2, 3], [0, 2, 1, 3]]).tolist() == [22.0, 22.0]
    # fill delays the trainer's chain only: [0, 0, 10, 10] with fill 5: V_1 = 6, V_2 = 7, V_3 = max(8, 6 + 10) = 16,
    # V_4 = max(17, 7 + 10) = 17
    assert publish_floor_orders(busy, floor, 1, [[2, 3, 0, 1]], fill=5.0).tolist() == [17.0]
    with pytest.raises(ValueError, match="permutation of the 4 iterations"):
        publish_floor_orders(busy, floor, 1, [[0, 1, 1, 3]])


def test_corunning_hand_computed():
    """Critical group A (iteration 0, instance 0, 0..10 s); X (iteration 1) beside it from 5 s; Y
    (iteration 0) on the other instance. With c = 1, b = 0.1 each token of another sequence costs
    1 + 0.1 x its context (tokens spread evenly over a sequence's life)."""
    from asp_ascend.metrics.floor import corunning

    rows = [dict(epoch=0, iteration=0, instance=0, prompt_id="A", sample=s, t_admit=0.0, t_first_token=0.0,
                 t_finish=10.0, prompt_length=0, response_length=10) for s in (0, 1)]
    rows.append(dict(epoch=0, iteration=1, instance=0, prompt_id="X", sample=0, t_admit=5.0, t_first_token=5.0,
                     t_finish=15.0, prompt_length=0, response_length=10))
    rows.append(dict(epoch=0, iteration=0, instance=1, prompt_id="Y", sample=0, t_admit=0.0, t_first_token=0.0,
                     t_finish=8.0, prompt_length=10, response_length=16))
    c = corunning(pd.DataFrame(rows), decode_b=0.1, decode_c=1.0, num_instances=2).set_index("iteration")
    # iteration 0: X's first 5 tokens (context 0..5, mean 2.5) on A's instance; Y's 16 (context 10..26, mean 18)
    r = c.loc[0]
    assert (r.instance, r.latency) == (0, 10.0)
    assert r.on_instance == pytest.approx(5 * 1.25) and r.next == pytest.approx(5 * 1.25)
    assert r.previous == 0.0 and r.same == 0.0
    assert r.even == pytest.approx((5 * 1.25 + 16 * 2.8) / 2)
    # iteration 1: X is critical (5..15 s); A's two samples' last 5 tokens each (context 5..10) beside it
    r = c.loc[1]
    assert (r.instance, r.latency) == (0, 10.0)
    assert r.on_instance == pytest.approx(2 * 5 * 1.75) and r.previous == pytest.approx(2 * 5 * 1.75)
    # Y's tokens from 5 s to its finish at 8 s: the last 6 of 16 (context 20..26, mean 23)
    assert r.even == pytest.approx((2 * 5 * 1.75 + 6 * 3.3) / 2)
    assert (c["prefill"] == 0.0).all()
    # prefill: Y's 10 prompt tokens start in iteration 0's window (on the other instance: even only)
    p = corunning(pd.DataFrame(rows), decode_b=0.1, decode_c=1.0, num_instances=2,
                  prefill_per_token=0.5).set_index("iteration")
    assert p.loc[0, "prefill"] == 0.0 and p.loc[0, "on_instance"] == pytest.approx(5 * 1.25)
    assert p.loc[0, "even"] == pytest.approx((5 * 1.25 + 16 * 2.8 + 0.5 * 10) / 2)
    assert p.loc[1, "even"] == pytest.approx(c.loc[1, "even"])       # Y started before X's window
    # with prefix caching a request prefills only its share of the prompt: Y 4 of its 10 tokens
    q = corunning(pd.DataFrame(rows), decode_b=0.1, decode_c=1.0, num_instances=2, prefill_per_token=0.5,
                  prefill_tokens=[0, 0, 0, 4]).set_index("iteration")
    assert q.loc[0, "even"] == pytest.approx((5 * 1.25 + 16 * 2.8 + 0.5 * 4) / 2)
    with pytest.raises(ValueError, match="prefill_tokens: 3 values for 4 requests"):
        corunning(pd.DataFrame(rows), decode_b=0.1, decode_c=1.0, num_instances=2, prefill_tokens=[0, 0, 0])
    with pytest.raises(ValueError, match="num_instances"):
        corunning(pd.DataFrame(rows), decode_b=0.1, decode_c=1.0, num_instances=0)
