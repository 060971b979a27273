"""Partial rollout with carry-over: deferral and swap keep every group trained exactly once."""
import pytest

from asp_ascend.scheduler.carryover import CarryOver


def two_iterations():
    # iteration 0: a, b (mini-batch 0), c, d (mini-batch 1); iteration 1: e, f (0), g, h (1)
    return CarryOver([(k, i, m) for k, i, m in [("a", 0, 0), ("b", 0, 0), ("c", 0, 1), ("d", 0, 1),
                                                 ("e", 1, 0), ("f", 1, 0), ("g", 1, 1), ("h", 1, 1)]], max_split=1)


def test_a_deferral_and_swap_that_keeps_exactly_once():
    co = two_iterations()
    for k in ("a", "b", "c", "g", "e"):      # e finishes after g
        co.on_finish(k)
    # iteration 0 waits only on d: it is deferred, g (the first finished of iteration 1) takes its slot
    (sw,) = co.defer(0, ["d"])
    assert (sw.deferred, sw.swapped_in, sw.iteration, sw.mini_batch, sw.to_iteration, sw.to_mini_batch) == \
        ("d", "g", 0, 1, 1, 1)
    assert co.ready(0, 1) and co.iteration_of("d") == 1 and co.iteration_of("g") == 0
    trained = co.on_trained(0, 0) + co.on_trained(0, 1)
    assert sorted(trained) == ["a", "b", "c", "g"]
    for k in ("f", "h", "d"):
        co.on_finish(k)
    trained += co.on_trained(1, 0) + co.on_trained(1, 1)
    assert sorted(trained) == list("abcdefgh")
    # lag: d was planned for 0 and is trained in 1 -> at most k + 1
    assert co.lag_bound_of("d", 1) == 2 and co.lag_bound_of("g", 1) == 1


def test_no_deferral_unless_the_iteration_waits_only_on_late_groups():
    co = two_iterations()
    co.on_finish("a")
    co.on_finish("e")
    assert co.defer(0, ["d"]) == []            # b, c unfinished and not late
    assert co.defer(0, ["b", "c", "d"]) != []  # now every unfinished group is late; one swap (only e is done)
    assert len(co.swaps) == 1 and co.swaps[0].swapped_in == "e"


def test_max_split_bounds_the_lag():
    co = CarryOver([("a", 0, 0), ("b", 1, 0), ("c", 2, 0), ("d", 3, 0)], max_split=1)
    co.on_finish("b")
    co.on_finish("c")
    assert [s.deferred for s in co.defer(0, ["a"])] == ["a"]   # a: 0 -> 1
    assert co.defer(1, ["a"]) == []                             # 1 -> 2 would exceed S = 1
    with pytest.raises(ValueError):
        co.on_trained(1, 0)                                     # a is not finished yet


def test_bookkeeping_errors():
    co = two_iterations()
    co.on_finish("a")
    with pytest.raises(ValueError):
        co.on_finish("a")
    with pytest.raises(KeyError):
        co.on_finish("zz")
    with pytest.raises(ValueError):
        CarryOver([("a", 0, 0), ("a", 1, 0)], 1)
    with pytest.raises(ValueError):
        CarryOver([], 0)
