"""scheduler.concurrency: asp's admission concurrency, decided offline from the predicted work."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.scheduler.concurrency import MARGIN, admission_concurrency
from asp_ascend.scheduler.cost import CostModel

COST = CostModel(decode_a=0.02, decode_b=2e-8, decode_c=1e-4, prefill_per_token=0.0, train_per_token=1e-6,
                 train_per_step=0.05, logprob_per_token=0.0, sync_s=0.5)


def _choose(R, pred, plen=100.0, S=256, B=64):
    pred = np.asarray(pred, dtype=float)
    return admission_concurrency(pred, np.full(pred.size, plen), group_size=8, global_batch_size=B, mini_batch_size=16,
                                 num_instances=R, max_num_seqs=S, lag_bound=1, cost=COST)


def _throughput_ok(n, R, tokens, period, ctx):
    return R * n / COST.step(n, n * ctx) * period >= MARGIN * tokens


def test_hand_computed_choice_is_the_fewest_that_keep_twice_the_work():
    # 64 prompts per iteration, one iteration: every prompt 1,000 tokens but one of 8,000
    pred = np.full(64, 1000.0)
    pred[0] = 8000.0
    R = 16
    n = _choose(R, pred)
    tokens = 8 * pred.sum()
    train = COST.train_time(8 * (pred + 100.0).sum() * 1.11, 4) + COST.sync_s
    solo = COST.group_latency(100.0, 8000.0, 8)
    period = max(train, solo / 2)
    ctx = float(np.mean(100.0 + pred / 2))
    assert n % 8 == 0 and 16 <= n < 256
    assert _throughput_ok(n, R, tokens, period, ctx)
    assert not _throughput_ok(n - 8, R, tokens, period, ctx) or n == 16


def test_no_spare_capacity_keeps_max_num_seqs():
    # two instances for 64 x 8 sequences of 4,000 tokens: every slot is needed
    assert _choose(2, np.full(64, 4000.0)) == 256


def test_more_instances_never_raise_the_choice():
    pred = np.r_[np.full(63, 800.0), 8000.0]
    got = [_choose(R, pred) for R in (2, 4, 8, 16, 32, 64)]
    assert got == sorted(got, reverse=True)


@pytest.mark.parametrize("S", [8, 16])
def test_small_max_num_seqs_is_kept(S):
    assert _choose(32, np.full(64, 500.0), S=S) == S


def test_the_simulator_runs_asp_at_the_planned_concurrency():
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    over = ["workload.type=synthetic", "workload.num_prompts=128", "workload.epochs=2", "sim.epochs=1",
            "lengths.max_response_length=2048", "train.group_size=4", "train.global_batch_size=32",
            "train.mini_batch_size=8", "rollout.max_num_seqs=64", "sim.total_devices=24", "sim.rollout_devices=16",
            "sim.infer_tp=1", "scheduler.concurrency=auto"]
    cfg = load_config(None, over)
    w = workload_from_config(cfg)
    asp = simulate_system(cfg, w, "asp", record_samples=False).summary
    fifo = simulate_system(cfg, w, "fully_async_fifo", record_samples=False).summary
    assert 8 <= asp["admission_concurrency"] < 64      # 16 instances for 32 x 4 sequences: capacity to spare
    assert fifo["admission_concurrency"] == 64           # baselines run as configured
    full = simulate_system(load_config(None, over[:-1]), w, "asp", record_samples=False).summary
    assert full["admission_concurrency"] == 64
    assert asp["policy_lag_max"] <= 1
