"""Cost terms the out-of-sample calibration needed (benchmarks/bench_calibration.py --cross): a weight
sync that starts while an instance decodes takes longer than one on idle instances, and a packed
trainer's steps are fitted in the simulator's slot units."""
from __future__ import annotations

from pathlib import Path

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


# ---------------------------------------------------------------- cost.sync_busy_s in `asp simulate`
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["sim.model_class=custom", "cost.sync_s=0.05", "workload.num_prompts=256", "sim.sweep_devices=[]",
         "workload.body_median=50", "workload.tail_scale=100", "cost.train_per_token=1e-6"]


def _sim_syncs(busy: float, name: str):
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    cfg = load_config(ROOT / "configs" / "sim_tiny.yaml", [*SMALL, f"cost.sync_busy_s={busy}"])
    res = simulate_system(cfg, workload_from_config(cfg), name)
    return _sync_durations(res.timeline), res.summary["iteration_time_mean"]


def test_cost_sync_busy_s_lengthens_the_simulated_syncs_that_start_while_decoding():
    idle, t_idle = _sim_syncs(0.0, "fully_async_fifo")
    busy, t_busy = _sim_syncs(0.3, "fully_async_fifo")
    assert np.allclose(idle, 0.05)
    # async: the instances decode the next iteration during some syncs, not during others
    assert np.isclose(busy, 0.35).any() and np.isclose(busy, 0.05).any()
    assert np.isclose(busy, 0.05).sum() + np.isclose(busy, 0.35).sum() == busy.size
    assert t_busy > t_idle
    # sync_colocated: rollout and training take turns, no sync starts while an instance decodes
    assert np.allclose(_sim_syncs(0.3, "sync_colocated")[0], 0.05)


def test_cost_sync_busy_s_is_validated(empty_yaml):
    from asp_ascend.config import load_config
    from asp_ascend.errors import ConfigError

    assert load_config(empty_yaml, []).cost.sync_busy_s == 0.0
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["cost.sync_busy_s=-0.1"])
    assert "cost.sync_busy_s: -0.1 must be >= 0; use e.g. cost.sync_busy_s=0.0" in str(ei.value)


def test_simulate_calibrate_fits_and_uses_sync_busy_s(tmp_path):
    import json

    from asp_ascend.cli import main

    run = tmp_path / "run"
    _run(False, 0.3).write_jsonl(run / "timeline.jsonl")   # an async run: busy syncs take 0.3 s longer
    (run / "config.yaml").write_text("rollout:\n  max_num_seqs: 32\npipeline:\n  lag_bound: 1\n"
                                     "train:\n  micro_batch_size: 64\n")
    out = tmp_path / "sim"
    rc = main(["simulate", str(ROOT / "configs" / "sim_tiny.yaml"), f"output_dir={out}", *SMALL[2:],
               "sim.policies=[fully_async_fifo]", "--calibrate", str(run)])
    assert rc == 0
    cal = json.loads((out / "calibration.json").read_text())
    assert cal["sync_s"] == pytest.approx(0.05, abs=1e-9) and cal["sync_busy_s"] == pytest.approx(0.3, abs=1e-9)
    used = json.loads((out / "simulation.json").read_text())["systems"]["fully_async_fifo"]
    assert used["sync_s"] == pytest.approx(cal["sync_s"]) and used["sync_busy_s"] == pytest.approx(cal["sync_busy_s"])
    import yaml

    assert yaml.safe_load((out / "config.yaml").read_text())["cost"]["sync_busy_s"] == pytest.approx(0.3, abs=1e-9)
