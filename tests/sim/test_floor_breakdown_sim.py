"""benchmarks/bench_tail.py breakdown's terms on a simulated asp run (bimodal workload, 2,048 prompts,
32 devices): per iteration the k + 1 periods split exactly into the critical group's wait, its latency
and the trainer's time after it, and no group runs faster than alone (the floor holds); bound's
publish floor is never after the run's publishes, and the trainer's busy time is the same for asp and
fifo (packed micro-batches price tokens and steps, not how mini-batches are composed)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tail_common  # noqa: E402
import tail_floor  # noqa: E402


@pytest.fixture(scope="module")
def terms():
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    cfg = tail_common._cfg("bimodal", None, 2048, 32, tail_common.LOSSLESS)
    res = simulate_system(cfg, workload_from_config(cfg), "asp", record_samples=False)
    return tail_floor.floor_terms(res, cfg), cfg, res


def test_window_splits_into_wait_latency_after(terms):
    (b, t), cfg, res = terms
    assert len(b) == len(t) > 2        # every iteration has its publish
    np.testing.assert_allclose(b["window"], b["critical_wait"] + b["critical_latency"] + b["after"], atol=1e-9)
    assert (b["critical_wait"] >= -1e-9).all() and (b["after"] > 0).all()
    # the lag floor: k + 1 periods are never shorter than the iteration's longest group alone
    assert (b["window"] >= b["floor_group_solo"] - 1e-6).all()
    assert (b["critical_latency"] >= b["critical_solo"] - 1e-6).all()
    assert (b["floor_group_solo"] >= b["critical_solo"] - 1e-9).all()
    assert (b["critical_beside"] >= 0).all()


def test_bound_terms_match_the_summary(terms):
    """The three terms give back the run's lower bound (DESIGN 5: LB_i = max of them, summed over the
    iterations = run time / lower-bound ratio): the trainer term from the simulated steps, the decode
    term from the request frame, the floor from the breakdown's longest group alone."""
    (b, t), cfg, res = terms
    floor = b.set_index("iteration")["floor_group_solo"] / (cfg.pipeline.lag_bound + 1)
    lb = np.maximum(np.maximum(t["decode"].to_numpy(), t["train"].to_numpy())[floor.index], floor.to_numpy())
    s = res.summary
    assert lb.sum() == pytest.approx(s["run_time_s"] / s["lower_bound_ratio"], rel=1e-6)


def test_publish_floor_holds_and_trainer_busy_is_schedule_free(terms):
    """bench_tail.py bound on the run: the publish floor (metrics/floor.publish_floor) is at or below
    the run's last publish and at or above sum LB_i's trainer part; fifo, whose iterations and
    mini-batches differ, keeps the trainer just as busy (steps + syncs) with packed micro-batches."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    (b, t), cfg, res = terms
    s = res.summary
    bt = tail_floor.bound_terms(res, cfg)
    assert bt["busy"] <= bt["chain"] <= s["run_time_s"] / s["iterations"] + 1e-9
    assert bt["time"] == s["iteration_time_mean"] and bt["fill"] > 0 and bt["idle"] >= -1e-9
    fcfg = tail_common._cfg("bimodal", None, 2048, 32, tail_common.OFF)
    assert str(fcfg.sim.micro_batching) == "auto" and str(fcfg.train.micro_batching) in ("auto", "packed")
    fifo = simulate_system(fcfg, workload_from_config(fcfg), "fully_async_fifo", record_samples=False)
    fb = tail_floor.bound_terms(fifo, fcfg)
    assert fb["busy"] == pytest.approx(bt["busy"], rel=1e-9)
    assert fb["chain"] <= fb["time"] + 1e-9
