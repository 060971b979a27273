"""pipeline.regroup's rule (scheduler/regroup.py) and its moves on the membership (CarryOver.regroup)."""
import pytest

from asp_ascend.scheduler.carryover import CarryOver
from asp_ascend.scheduler.regroup import regroup_pairs


def _gen(order):
    return {k: i for i, k in enumerate(order)}.get


def test_the_mini_batch_closest_to_complete_takes_donors_from_the_least_generated():
    mbs = {0: ["a", "b", "c"], 1: ["d", "e", "f"], 2: ["g", "h", "i"]}
    # generated: a, b (mini-batch 0: one left), d, e (1: one left), g (2): the tie 0/1 goes to 0; its c
    # trades with the donor of the mini-batch with the fewest generated groups: 2 (g)
    assert regroup_pairs(mbs, [0, 1, 2], _gen("gdeab")) == [("c", "g")]
    # with 1 and 2 tied on generated groups (one each), the higher index gives first
    assert regroup_pairs(mbs, [0, 1, 2], _gen("abdg")) == [("c", "g")]
    # one donor from each: 2 (tied with 1 on one generated group, higher index) gives first, then 1
    assert regroup_pairs(mbs, [0, 1, 2], _gen("adg")) == [("b", "g"), ("c", "d")]
    # within a donor mini-batch the earliest generated group goes first
    four = {0: ["a", "b", "c", "d"], 1: ["e", "f", "g", "h"]}
    assert regroup_pairs(four, [0, 1], _gen("hbae")) == [("c", "h"), ("d", "e")]


def test_nothing_moves_when_a_mini_batch_is_complete_or_none_can_be_completed():
    mbs = {0: ["a", "b"], 1: ["c", "d"]}
    assert regroup_pairs(mbs, [0, 1], _gen("cd")) == []        # 1 is complete: the trainer takes it
    assert regroup_pairs(mbs, [0, 1], _gen("a")) == []         # one generated group: no mini-batch of two
    assert regroup_pairs(mbs, [1], _gen("c")) == []            # 0 trained: no donor within the iteration
    assert regroup_pairs(mbs, [0, 1], _gen("ac")) == [("b", "c")]


def test_a_forced_target_is_filled_as_far_as_donors_allow():
    mbs = {0: ["a", "b", "c"], 1: ["d", "e"]}
    assert regroup_pairs(mbs, [0, 1], _gen("d"), target=0) == [("a", "d")]
    with pytest.raises(ValueError, match="target mini-batch 2"):
        regroup_pairs(mbs, [0, 1], _gen("d"), target=2)


def test_carryover_regroup_keeps_sizes_iterations_and_exactly_once():
    co = CarryOver([(k, 0, m) for m, ks in enumerate(["ab", "cd"]) for k in ks] +
                   [(k, 1, m) for m, ks in enumerate(["ef", "gh"]) for k in ks], max_split=1)
    for k in ("a", "c", "e", "f", "g"):
        co.on_finish(k)
    (sw,) = co.regroup(0)
    assert (sw.deferred, sw.swapped_in, sw.iteration, sw.mini_batch, sw.to_iteration, sw.to_mini_batch) == \
        ("b", "c", 0, 0, 0, 1)
    assert co.members[(0, 0)] == ["a", "c"] and co.members[(0, 1)] == ["d", "b"]
    assert co.regroup(1) == []                                 # iteration 1's mini-batch 0 is complete
    assert co.lag_bound_of("b", 1) == 1 and co.lag_bound_of("c", 1) == 1   # no group changed its iteration
    trained = co.on_trained(0, 0)
    assert co.regroup(0) == []                                 # the trained mini-batch gives nothing
    for k in ("b", "d"):
        co.on_finish(k)
    trained += co.on_trained(0, 1)
    assert sorted(trained) == list("abcd") and co.regroups == [sw] and co.swaps == []


def test_heavy_first_takes_the_heaviest_generated_groups_into_the_step():
    from asp_ascend.scheduler.regroup import heavy_first_pairs

    mbs = {0: ["a", "b"], 1: ["c", "d"], 2: ["e", "f"]}
    w = {"a": 10, "b": 30, "c": 50, "d": 0, "e": 40, "f": 0}.__getitem__
    # 0 is complete (a, b), f is not generated: the step takes the two heaviest generated, c and e;
    # the lightest of 0 (a) trades with the heaviest (c), then b with e
    assert heavy_first_pairs(mbs, [0, 1, 2], 0, _gen("abce"), w) == [("a", "c"), ("b", "e")]
    # already the heaviest: nothing moves; every untrained group generated: nothing moves
    assert heavy_first_pairs(mbs, [0, 1, 2], 0, _gen("abd"), w) == []
    assert heavy_first_pairs(mbs, [0, 1], 0, _gen("abcd"), w) == []
    # equal weights: the earlier generated stays / comes first
    eq = (lambda k: 1.0)
    assert heavy_first_pairs(mbs, [0, 1, 2], 0, _gen("cabe"), eq) == [("b", "c")]
    with pytest.raises(ValueError, match="target mini-batch 3"):
        heavy_first_pairs(mbs, [0, 1, 2], 3, _gen("ab"), w)


def test_carryover_heavy_first_moves_within_the_iteration_only():
    co = CarryOver([(k, 0, m) for m, ks in enumerate(["ab", "cd"]) for k in ks] +
                   [(k, 1, m) for m, ks in enumerate(["ef", "gh"]) for k in ks], max_split=1)
    for k, wt in (("a", 1), ("b", 2), ("c", 9), ("e", 50), ("f", 60)):
        co.on_finish(k, wt)
    (sw,) = co.heavy_first(0, 0)             # e, f of iteration 1 are heavier, but not of iteration 0
    assert (sw.deferred, sw.swapped_in, sw.iteration, sw.mini_batch, sw.to_iteration, sw.to_mini_batch) == \
        ("a", "c", 0, 0, 0, 1)
    assert co.members[(0, 0)] == ["b", "c"] and co.members[(0, 1)] == ["d", "a"]
    assert co.regroups == [sw] and co.swaps == []


def test_the_generated_counts_give_the_same_pairs_as_asking_every_group():
    """regroup_pairs / heavy_first_pairs with ``counts`` (CarryOver's fast answers) against without,
    on random memberships, generation orders and targets; and CarryOver's counts stay exact across
    finishes and moves (regroup, heavy first, deferral)."""
    import random

    from asp_ascend.scheduler.regroup import heavy_first_pairs

    rng = random.Random(7)
    for _ in range(400):
        n_mb, size = rng.randint(1, 4), rng.randint(1, 4)
        keys = [f"k{i}" for i in range(n_mb * size)]
        mbs = {m: keys[m * size:(m + 1) * size] for m in range(n_mb)}
        todo = sorted(rng.sample(range(n_mb), rng.randint(1, n_mb)))
        done = rng.sample(keys, rng.randint(0, len(keys)))
        gen = _gen(done)
        counts = {m: sum(gen(k) is not None for k in mbs[m]) for m in todo}
        w = {k: rng.choice([1.0, 2.0, 5.0]) for k in keys}.__getitem__
        for target in (None, rng.choice(todo)):
            assert regroup_pairs(mbs, todo, gen, target, counts) == regroup_pairs(mbs, todo, gen, target)
        full = [m for m in todo if counts[m] == len(mbs[m])]    # heavy first's target is all generated
        if full:
            t = rng.choice(full)
            assert heavy_first_pairs(mbs, todo, t, gen, w, counts) == heavy_first_pairs(mbs, todo, t, gen, w)

    for _ in range(50):
        slots = [(f"{i}{m}{j}", i, m) for i in range(3) for m in range(3) for j in range(3)]
        co = CarryOver(slots, max_split=1)
        for key, _, _ in rng.sample(slots, len(slots)):
            co.on_finish(key, rng.random())
            i = rng.randrange(3)
            full = [m for m in range(3) if all(k in co.finished for k in co.members[(i, m)])]
            ops = [lambda: co.regroup(i), lambda: co.regroup(i, rng.randrange(3)), lambda: co.defer(i, co.unfinished(i))]
            if full:
                ops.append(lambda: co.heavy_first(i, rng.choice(full)))
            rng.choice(ops)()
            for slot, members in co.members.items():
                assert co.n_finished.get(slot, 0) == sum(k in co.finished for k in members)
