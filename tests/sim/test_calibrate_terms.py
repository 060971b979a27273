"""Cost terms the out-of-sample calibration needed (benchmarks/bench_calibration.py --cross): a weight
sync that starts while an instance decodes takes longer than one on idle instances, and a packed
trainer's steps are fitted in the simulator's slot units."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.calibrate import fit_sync, fit_timeline, run_micro_batching
from asp_ascend.sim.costs import PACKED_TOKEN_COST
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec

CM = CostModel(decode_a=0.01, decode_b=0.0, decode_c=3e-4, prefill_per_token=1e-4)


def _jobs(J=64, G=4, R=1, seed=0):
    rng = np.random.default_rng(seed)
    resp = rng.integers(2, 60, (J, G)).astype(np.int64)
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // 8, mini_batch=np.zeros(J, np.int64), instance=np.arange(J) % R,
                   dispatch_rank=np.arange(J), prompt_length=np.full(J, 5), resp=resp)


def _run(sync_mode: bool, busy: float, mode="packed"):
    jobs = _jobs()
    tr = TrainerSpec(2e-4, 0.01, 0.05, 64, mode, sync_busy_s=busy)
    st = ExecutionSettings(policy="asp", num_instances=1, max_num_seqs=32, lag_bound=0 if sync_mode else 1,
                           sync_mode=sync_mode, group_size=jobs.group_size)
    return Engine(jobs, st, cost=CM, kv_capacity=0, trainer=tr, stream_train=not sync_mode, group_slots=True).run()


def _sync_durations(tl):
    sy = tl.frame("sync")
    return (sy["t_end"] - sy["t_start"]).to_numpy()


def test_fit_sync_separates_syncs_during_decoding():
    req = pd.DataFrame({"t_admit": [0.0, 0.0, 5.0], "t_finish": [2.0, 3.0, 9.0]})
    syncs = pd.DataFrame({"t_start": [1.0, 4.0, 6.0, 10.0], "t_end": [1.5, 4.1, 6.5, 10.1]})  # busy, idle, busy, idle
    fit = fit_sync(req, syncs)
    assert fit["sync_s"] == pytest.approx(0.1) and fit["sync_busy_s"] == pytest.approx(0.4)
    # one kind only: the mean, no busy term
    fit = fit_sync(req, syncs.iloc[[1, 3]])
    assert fit["sync_s"] == pytest.approx(0.1) and fit["sync_busy_s"] == 0.0


def test_sync_busy_lengthens_only_syncs_that_start_while_decoding():
    # sync mode: every sync starts after the iteration is generated, nothing decodes
    assert np.allclose(_sync_durations(_run(True, 0.3)), 0.05)
    # async: the instance generates the next iteration while the trainer publishes
    d = _sync_durations(_run(False, 0.3))
    assert (np.isclose(d, 0.35)).any() and np.isclose(d, 0.05).sum() + np.isclose(d, 0.35).sum() == d.size
    # the fit recovers both terms from the simulated timeline
    fit = fit_timeline(_run(False, 0.3))
    if fit["sync_busy_s"]:   # both kinds present
        assert fit["sync_s"] == pytest.approx(0.05, abs=1e-9) and fit["sync_busy_s"] == pytest.approx(0.3, abs=1e-9)
    else:
        assert fit["sync_s"] == pytest.approx(0.35, abs=1e-9)


def test_a_packed_run_is_fitted_in_slot_units_and_replays_its_trainer_time():
    tl = _run(False, 0.0, mode="packed")
    steps = tl.frame("step")
    assert (steps["padded_tokens"] == 0).all() and run_micro_batching(steps) == "packed"
    assert run_micro_batching(steps, "sorted") == "sorted"
    fit = fit_timeline(tl)
    assert fit["micro_batching"] == "packed"
    assert fit["train_per_token"] == pytest.approx(2e-4, rel=1e-6)   # the simulator's per-slot cost
    # a padded run's steps are tokens + pads
    padded = fit_timeline(_run(False, 0.0, mode="padded"))
    assert padded["micro_batching"] == "sorted" and padded["train_per_token"] == pytest.approx(2e-4, rel=1e-6)
    assert PACKED_TOKEN_COST > 1
