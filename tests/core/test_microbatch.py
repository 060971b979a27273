"""Property tests of the micro-batch planner (asp_ascend/scheduler/microbatch.py).

Whatever the lengths, budget, mode and rank count: every sequence is planned exactly once,
every micro-batch of two or more sequences fits the budget, every rank gets the same number
of micro-batches (unless every micro-batch is a single sequence and their count does not divide), packed micro-batches carry no
padding, and the ranks' work differs by at most one micro-batch's spread (one sequence when
packed). Sorting never pads more than arrival order at the same budget and count cap.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_ascend.scheduler.microbatch import MODES, partition_equal, plan_step, slots

lengths_st = st.lists(st.integers(1, 300), min_size=0, max_size=120)


def _flat(plan):
    return sorted(i for rank in plan.ranks for mb in rank for i in mb)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(lengths_st, st.sampled_from(MODES), st.integers(1, 2000), st.integers(1, 8), st.integers(0, 16))
def test_plan_invariants(lengths, mode, budget, world, max_seqs):
    plan = plan_step(lengths, mode=mode, max_tokens=budget, max_seqs=max_seqs, world=world)
    assert len(plan.ranks) == world
    assert _flat(plan) == list(range(len(lengths)))
    for mb in plan.micro_batches:
        assert mb, "no empty micro-batch is planned"
        if len(mb) > 1:
            assert slots(lengths, mb, mode) <= budget
        if mode != "packed" and max_seqs:
            assert len(mb) <= max_seqs
    counts = {len(rank) for rank in plan.ranks}
    if len(counts) > 1:  # only when no micro-batch can be split further
        assert all(len(mb) == 1 for mb in plan.micro_batches), [len(r) for r in plan.ranks]
        assert max(counts) - min(counts) == 1
    if mode == "packed":
        assert plan.padded_tokens == 0
    per_rank = plan.rank_slots()
    costs = [slots(lengths, mb, mode) for mb in plan.micro_batches]
    if costs and len(counts) == 1:
        assert max(per_rank) - min(per_rank) <= max(costs) - min(costs)
    for rank in plan.ranks:  # heaviest first, so pass j is alike on every rank
        c = [slots(lengths, mb, mode) for mb in rank]
        assert c == sorted(c, reverse=True)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=120), st.integers(1, 2000), st.integers(1, 8))
def test_packed_ranks_within_one_sequence(lengths, budget, world):
    plan = plan_step(lengths, mode="packed", max_tokens=budget, world=world)
    if len({len(r) for r in plan.ranks}) == 1:
        tok = plan.rank_slots()
        assert max(tok) - min(tok) <= max(lengths)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=120), st.integers(1, 4000))
def test_packed_uses_few_micro_batches(lengths, budget):
    """At most one micro-batch more than twice the lower bound ceil(total / budget) when no
    single sequence exceeds the budget (LPT keeps bins within one sequence of each other)."""
    if max(lengths) > budget:
        return
    plan = plan_step(lengths, mode="packed", max_tokens=budget)
    lower = -(-sum(lengths) // budget)
    assert len(plan.micro_batches) <= 2 * lower + 1


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=120), st.integers(1, 64))
def test_sorted_pads_no_more_than_arrival_order(lengths, micro):
    """With the historical count cap and a budget that never binds, sorting by length can only
    reduce the pad slots of the same number of micro-batches."""
    budget = micro * max(lengths)
    padded = plan_step(lengths, mode="padded", max_tokens=budget, max_seqs=micro)
    srt = plan_step(lengths, mode="sorted", max_tokens=budget, max_seqs=micro)
    assert len(srt.micro_batches) == len(padded.micro_batches)
    assert srt.padded_tokens <= padded.padded_tokens


def test_padded_is_the_historical_cut():
    """Consecutive slices of max_seqs sequences when the budget does not bind."""
    lengths = [5, 9, 3, 7, 2, 8, 4]
    plan = plan_step(lengths, mode="padded", max_tokens=10 ** 6, max_seqs=3)
    assert sorted(plan.micro_batches) == [[0, 1, 2], [3, 4, 5], [6]]


def test_overlong_sequence_gets_its_own_micro_batch():
    for mode in MODES:
        plan = plan_step([50, 3, 4], mode=mode, max_tokens=20)
        assert [0] in plan.micro_batches
        assert _flat(plan) == [0, 1, 2]


def test_fewer_sequences_than_ranks():
    plan = plan_step([7, 3], mode="packed", max_tokens=100, world=4)
    assert sorted(len(r) for r in plan.ranks) == [0, 0, 1, 1]


def test_partition_equal_counts_and_spread():
    costs = [100, 90, 10, 9, 8, 7, 50, 50]
    parts = partition_equal(costs, 2)
    assert [len(p) for p in parts] == [4, 4]
    sums = [sum(costs[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max(costs) - min(costs)
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))


@pytest.mark.parametrize("bad, msg", [({"mode": "pack"}, "train.micro_batching"),
                                      ({"max_tokens": 0}, "train.max_tokens_per_micro_batch"),
                                      ({"world": 0}, "train.devices")])
def test_bad_arguments_name_the_key(bad, msg):
    kw = {"mode": "packed", "max_tokens": 10, "world": 1, **bad}
    with pytest.raises(ValueError, match=msg):
        plan_step([1, 2], **kw)
