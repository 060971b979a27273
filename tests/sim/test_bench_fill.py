"""benchmarks/bench_fill.py: its two measurement variants change exactly what they say (iteration 1's
placement off the chosen instances; later iterations' admissions before the first publish) and leave
the library as it was; the probe's figures on a small run."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_fill as bf  # noqa: E402


def _setup(devices: int, seed: int = 0):
    from asp_ascend.lengths.workloads import workload_from_config

    cfg = bf._cfg("bimodal", None, 768, devices, {**bf.ASP_DEFAULTS, "seed": seed})
    return cfg, workload_from_config(cfg)


def _jobs(cfg, w):
    from asp_ascend.sim import run as sr

    spec = sr.system_for(cfg, "asp", None, None)
    costs = sr.costs_for(cfg, spec)
    return sr.build_jobs(w, cfg, spec, sr.planning_cost(costs))


def test_steered_moves_only_iteration_1_off_the_chosen_instances():
    from asp_ascend.sim import run as sr

    cfg, w = _setup(64)
    plain_build = sr.build_jobs
    before = _jobs(cfg, w)
    with bf.steered({0, 3}):
        after = _jobs(cfg, w)
    assert sr.build_jobs is plain_build          # restored
    moved = (before.iteration == 1) & np.isin(before.instance, [0, 3])
    assert moved.sum() > 0
    assert not np.isin(after.instance[before.iteration == 1], [0, 3]).any()
    # every other job keeps its instance, and the membership, ranks and mini-batches are the plan's
    assert (after.instance[~moved] == before.instance[~moved]).all()
    for col in ("iteration", "mini_batch", "dispatch_rank", "prompt_id"):
        assert (getattr(after, col) == getattr(before, col)).all()
    # the moved groups go to the other instances in turn
    R = int(before.instance.max()) + 1
    others = [r for r in range(R) if r not in (0, 3)]
    assert after.instance[moved].tolist() == [others[i % len(others)] for i in range(int(moved.sum()))]


def test_fill_cap_holds_later_iterations_back_until_the_first_publish():
    from asp_ascend.sim.engine import Engine
    from asp_ascend.sim.run import simulate_system

    cfg, w = _setup(64)
    plain = simulate_system(cfg, w, "asp", record_samples=True)
    has_room = Engine._has_room
    with bf.fill_cap(0.5):
        capped = simulate_system(cfg, w, "asp", record_samples=True)
    assert Engine._has_room is has_room          # restored
    r0, r1 = plain.timeline.frame("request"), capped.timeline.frame("request")
    # the 16 instances can hold two iterations: without the cap most of iteration 1 starts at once; with it
    # an instance takes iteration 1's groups at 0 only below half its room, the rest waits for room
    at0 = [r[(r.iteration == 1) & (r.t_admit == 0)] for r in (r0, r1)]
    assert len(at0[1]) < 0.75 * len(at0[0])
    assert at0[1].groupby("instance").size().max() <= 0.5 * cfg.rollout.max_num_seqs
    assert (r1[r1.iteration == 1].t_admit > 0).any()
    # lossless either way: every sample trained once, lag <= k
    assert capped.summary["policy_lag_max"] <= 1
    assert len(r1) == len(r0) == 768 * 8


def test_probe_rows_on_a_small_run():
    from asp_ascend.sim.run import simulate_system

    cfg, w = _setup(64)
    res = simulate_system(cfg, w, "asp", record_samples=True)
    rows = bf.probe_rows(res, bf._predicted(w, cfg), w.group_size)
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        assert r["latency"] >= r["solo"] - 1e-6        # beside others a group is never faster than alone
        assert 1 <= r["predicted rank"] <= 256
        assert r["published"] > r["latency"]          # admitted at 0 in the fill: published after it finished
    assert rows[0]["idle"] >= rows[0]["first step"] - 1e-9   # the fill is part of iteration 0's idle time
    assert rows[0]["same"] >= 0 and rows[0]["next"] >= 0 and rows[0]["even"] > 0
