"""The simulated trainer cuts micro-batches as the runtime's trainer does (scheduler/microbatch.plan_step
with the token budget; scheduler/microbatch.plan_micro_batches), and prices the MindSpeed-RL baseline's
padding as it ships (padded_to_dispatch)."""
import numpy as np
import pytest

from asp_ascend.scheduler.microbatch import plan_step
from asp_ascend.sim.engine import SimJobs
from asp_ascend.sim.trainer import micro_batch_table


def _jobs(resp, iteration, mini_batch, prompt_length):
    resp = np.asarray(resp, dtype=np.int64)
    J = resp.shape[0]
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.asarray(iteration, np.int64), mini_batch=np.asarray(mini_batch, np.int64),
                   instance=np.zeros(J, np.int64), dispatch_rank=np.arange(J, dtype=np.int64),
                   prompt_length=np.asarray(prompt_length, np.int64), resp=resp)


def _steps(jobs):
    """Each step's sequence lengths in schedule order (prompts by dispatch rank, samples in order)."""
    out = {}
    for j in np.lexsort((jobs.dispatch_rank, jobs.mini_batch, jobs.iteration)):
        key = (int(jobs.iteration[j]), int(jobs.mini_batch[j]))
        out.setdefault(key, []).extend((jobs.resp[j] + jobs.prompt_length[j]).tolist())
    return out


@pytest.mark.parametrize("mode", ["padded", "sorted", "packed"])
@pytest.mark.parametrize("max_tokens", [0, 40, 300])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_matches_plan_step(mode, max_tokens, seed):
    rng = np.random.default_rng(seed)
    J, G, micro = 30, 3, 4   # 9 sequences per 3-prompt step: not a multiple of micro
    jobs = _jobs(rng.integers(1, 60, size=(J, G)), np.repeat(np.arange(5), 6), np.tile(np.repeat([0, 1], 3), 5),
                 rng.integers(1, 20, size=J))
    rng.shuffle(jobs.dispatch_rank)
    table = micro_batch_table(jobs, micro, mode, max_tokens)
    for (i, m), lens in _steps(jobs).items():
        row = table[(table["iteration"] == i) & (table["mini_batch"] == m)].iloc[0]
        budget = max_tokens or micro * max(lens)
        plan = plan_step(lens, mode=mode, max_tokens=budget, max_seqs=micro)
        assert row["tokens"] == sum(lens) == plan.tokens
        assert row["padded_tokens"] == plan.padded_tokens
        assert row["groups"] == 3
    if mode == "packed":
        assert (table["padded_tokens"] == 0).all()


def test_token_budget_cuts_differently_from_count():
    # one step of lengths 10, 10, 10, 100 (prompt 0): by count (micro 4) one micro-batch padded to 100
    # (400 - 130 = 270 pad); a 200-slot budget closes padded micro-batches earlier: [10, 10, 10] then [100] -> no pad
    jobs = _jobs([[10, 10], [10, 100]], [0, 0], [0, 0], [0, 0])
    assert micro_batch_table(jobs, 4, "padded", 0)["padded_tokens"].tolist() == [270]
    assert micro_batch_table(jobs, 4, "padded", 200)["padded_tokens"].tolist() == [0]


def test_padded_to_dispatch_pads_every_sequence_to_the_iterations_longest():
    # iteration 0: steps {5+1, 3+1} and {9+1, 2+1}: longest 10 -> 4 x 10 = 40 slots for 6+4+10+3 = 23 tokens
    # iteration 1: one step {1+1, 1+1}: longest 2, no pad
    jobs = _jobs([[5, 3], [9, 2], [1, 1]], [0, 0, 1], [0, 1, 0], [1, 1, 1])
    t = micro_batch_table(jobs, 1, "padded_to_dispatch")
    assert t["tokens"].tolist() == [10, 13, 4]
    assert t["padded_tokens"].tolist() == [2 * 10 - 10, 2 * 10 - 13, 0]


def test_unknown_mode_is_refused():
    jobs = _jobs([[1, 1]], [0], [0], [1])
    with pytest.raises(ValueError, match="padded_to_dispatch"):
        micro_batch_table(jobs, 2, "bucketed")
