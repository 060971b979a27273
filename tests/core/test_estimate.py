"""The analytic estimate's latency terms on hand-made schedules with hand-computed outcomes."""
import numpy as np
import pytest

from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.estimate import estimate

# one decode step costs 1 s whatever runs, a prompt token 0.01 s to prefill; the trainer and the
# weight sync are free, so an iteration's time is its last group's finish
STEP_AND_PREFILL = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.01, train_per_token=0.0,
                             train_per_step=0.0, logprob_per_token=0.0, sync_s=0.0)


def test_a_group_waits_for_the_prefill_of_the_sequences_admitted_with_it():
    # one instance with room for both one-sample groups; each decodes a single token. The
    # instance prefills both prompts (100 + 1,000 tokens: 11 s) before its first decode step
    # (1 s), so both finish at 12 s. Before the full-instance bound counted its prefill, the
    # short-prompt group finished at 2 s and the iteration at 11 s (the long prompt's own prefill
    # and step).
    e = estimate([0, 0], [0, 0], [0, 0], [0, 1], [1.0, 1.0], [100.0, 1000.0], group_size=1, num_instances=1,
                 max_num_seqs=2, lag_bound=0, micro_batch_size=2, cost=STEP_AND_PREFILL, micro_batching="packed")
    assert e["iteration_time_mean"] == pytest.approx(12.0)


# a decode step costs 1 s + 0.5 s per running sequence; no prefill, free trainer and sync
PER_SEQ = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.5, prefill_per_token=0.0, train_per_token=0.0,
                    train_per_step=0.0, logprob_per_token=0.0, sync_s=0.0)


def test_a_shared_queue_window_lands_on_the_instances_free_at_its_admission():
    # two instances of two slots, one-sample groups, lag bound 1. Iterations 0 and 1 (1 + 2 and
    # 4 + 2 tokens) start at 0 s; iteration 0 is done at 4 s, when iteration 2 (two groups of 6
    # tokens) becomes admissible. Iteration 1's 4-token group still runs on one instance then, so
    # from one shared queue both new groups go to the other, free one and run beside each other
    # (the event simulator: both finish at 16 s, the last version at 16 s). The estimate: the pool's
    # capacity frees at (1 + 2 + 4 + 2) x (0.5 + 0.5) / 2 = 4.5 s; each group's solo latency is
    # 6 x 1.5 = 9 s plus the other's 6 x 0.5 = 3 s beside it: 16.5 s. Planned on their own queues
    # (one group per instance) the other group's steps count half: 15 s.
    args = ([0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1], [0] * 6, list(range(6)), [1.0, 2.0, 4.0, 2.0, 6.0, 6.0], [0.0] * 6)
    kw = dict(group_size=1, num_instances=2, max_num_seqs=2, lag_bound=1, micro_batch_size=2, cost=PER_SEQ,
              micro_batching="packed")
    shared = estimate(*args, **kw, shared_queue=True)
    own = estimate(*args, **kw, shared_queue=False)
    assert shared["run_time_s"] == pytest.approx(16.5)
    assert own["run_time_s"] == pytest.approx(15.0)


def test_a_group_whose_spread_reaches_the_cap_is_trained_on_its_cut_samples():
    # one group of 8 samples whose mean (16,384 tokens) is the length cap, spread 0.3 (the samples
    # mean x lognormal(0, 0.3), each cut at the cap, as the workloads draw them). Half of the samples
    # would run past the cap, so their mean is 2 x Phi(-0.15) x 16,384 = 0.88076 x 16,384 = 14,430.4
    # tokens, not 16,384. Decode and sync are free and a trainer token costs 1 ms, so the iteration
    # is the trainer's time on 8 x 14,430.4 tokens (x the packed token's cost).
    from statistics import NormalDist

    from asp_ascend.scheduler.estimate import capped_sample_mean
    from asp_ascend.scheduler.microbatch import PACKED_TOKEN_COST
    from asp_ascend.scheduler.group_max import group_max_factor

    gmf = group_max_factor(0.3, 8)
    cut = 2.0 * NormalDist().cdf(-0.15) * 16384.0
    assert cut == pytest.approx(14430.4, abs=0.1)
    assert capped_sample_mean([16384.0], 16384.0, gmf, 8)[0] == pytest.approx(cut)
    # the same from the samples themselves
    rng = np.random.default_rng(0)
    drawn = np.minimum(16384.0 * np.exp(0.3 * rng.standard_normal(400_000) - 0.045), 16384.0).mean()
    assert capped_sample_mean([16384.0], 16384.0, gmf, 8)[0] == pytest.approx(drawn, rel=2e-3)
    # far below the cap, without spread or without a cap: the mean itself
    assert capped_sample_mean([1000.0, 16384.0, 16384.0], 16384.0, [gmf, 1.0, 1.0], 8) == pytest.approx(
        [1000.0, 16384.0, 16384.0])
    assert capped_sample_mean([16384.0], np.inf, gmf, 8)[0] == 16384.0
    trainer = CostModel(decode_a=0.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0, train_per_token=1e-3,
                        train_per_step=0.0, logprob_per_token=0.0, sync_s=0.0)
    e = estimate([0], [0], [0], [0], [16384.0], [0.0], group_size=8, num_instances=1, max_num_seqs=8, lag_bound=0,
                 micro_batch_size=8, cost=trainer, group_max_factor=gmf, micro_batching="packed",
                 max_response_length=16384)
    assert e["iteration_time_mean"] == pytest.approx(PACKED_TOKEN_COST * 8 * cut * 1e-3)


def test_a_group_pulled_forward_runs_beside_what_is_admitted_with_it_not_its_windows_earlier_work():
    # one instance, one-sample groups, lag bound 1, a step costs 1 s + 0.5 s per running sequence.
    # On the instance in rank order: a (iteration 0, 6 tokens), x (iteration 2, 4 tokens), b
    # (iteration 1, 2 tokens), y (iteration 2, 1 token): x is ranked before iteration 1's b, so it
    # is dispatched with iteration 1's window, but it waits for version 1. a finishes at 10 s = V_1
    # (6 steps of 1.5 s, b's 0.5 s beside two of them).
    # Window 1 starts when the pool frees at 6 s: b runs 6-9 s alone (x is admitted at 10 s, after
    # it); x starts at 10 s beside y (admitted at 10 s too): one step of both (2 s), then 3 steps
    # alone (4.5 s): 16.5 s, as an event simulation runs it. Before, the estimate counted x beside a
    # and b (both done before x is admitted) and b beside x: a 12, b 11, x 19.5 s.
    e = estimate([0, 2, 1, 2], [0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3], [6.0, 4.0, 2.0, 1.0], [0.0] * 4,
                 group_size=1, num_instances=1, max_num_seqs=8, lag_bound=1, micro_batch_size=1, cost=PER_SEQ,
                 micro_batching="packed", groups=True)
    assert e["groups"]["finish"] == pytest.approx([10.0, 16.5, 9.0, 12.0])
    assert e["versions"] == pytest.approx([0.0, 10.0, 10.0, 16.5])


# a decode step costs 1 s whatever runs; a group's forward/backward 0.1 s per token (packed), an
# optimizer update 1 s, the weight sync is free
def _trainer_cost():
    from asp_ascend.scheduler.microbatch import PACKED_TOKEN_COST

    return CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0,
                     train_per_token=0.1 / PACKED_TOKEN_COST, train_per_step=1.0, logprob_per_token=0.0, sync_s=0.0)


@pytest.mark.parametrize("regroup,stream,end", [(False, False, 46.0), (True, False, 48.0), (True, True, 45.0)])
def test_the_trainer_takes_groups_as_regroup_and_streaming_run_it(regroup, stream, end):
    # one iteration of four one-sample groups of 10, 20, 30 and 40 tokens, generated at 10, 20, 30
    # and 40 s, forward/backward 1, 2, 3 and 4 s; planned mini-batches {10, 40} and {20, 30}.
    # As planned: {20, 30} once 30 is generated, 30 + 5 + 1 = 36 s, then {10, 40} at 40 s: 46 s.
    # regroup (the generated groups first): {10, 20} at 20 s, 20 + 3 + 1 = 24 s; {30, 40} at 40 s:
    # 48 s. regroup and streaming (each group's pass once it is generated, the update after a step's
    # last group): 10 + 1 = 11, 20 + 2 = 22, + 1 = 23; 30 + 3 = 33, 40 + 4 = 44, + 1 = 45 s.
    e = estimate([0] * 4, [0] * 4, [0, 1, 1, 0], [0, 1, 2, 3], [10.0, 20.0, 30.0, 40.0], [0.0] * 4, group_size=1,
                 num_instances=1, max_num_seqs=8, lag_bound=1, micro_batch_size=2, cost=_trainer_cost(),
                 micro_batching="packed", regroup=regroup, stream=stream)
    assert e["run_time_s"] == pytest.approx(end)
