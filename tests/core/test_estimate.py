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
