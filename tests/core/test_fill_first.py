"""scheduler.fill_first: the run's first window is iteration 0's alone. Hand-computed plan and admissions,
then the simulator: every group of iteration 0 starts before any of iteration 1 where the instances hold
one iteration, and the trainer's first step comes no later."""
import numpy as np

from asp_ascend.scheduler.admission import AdmissionController, Dispatcher
from asp_ascend.scheduler.execution import jobs_from_schedule
from asp_ascend.scheduler.planner import plan

# B = 2: three iterations, each one prompt of the long stratum {1000, 900, 800} and one of the short {10, 10, 10}.
# The lightest floor goes first: iteration 0 = {800, 10}. A long group's latency alone is many times the
# period's work (one instance), so it is pulled forward by k = 1; a 10-token group is not.
PRED = np.array([1000.0, 900.0, 800.0, 10.0, 10.0, 10.0])


def _plan(fill_first: bool, seed: int = 0, offset: int = 0):
    return plan(np.arange(6).astype(str), PRED, policy="asp", global_batch_size=2, mini_batch_size=1,
                num_instances=1, max_num_seqs=64, lag_bound=1, seed=seed, iteration_offset=offset,
                fill_first=fill_first)


def _order(df):
    d = df.sort_values("dispatch_rank")
    return list(zip(d["iteration"], d["predicted_length"]))


def test_fill_first_keeps_later_groups_out_of_the_first_window_by_hand():
    for seed in range(4):
        on, off = _plan(True, seed), _plan(False, seed)
        for df in (on, off):       # the same membership either way
            assert df.set_index("prompt_id")["iteration"].to_dict() == on.set_index("prompt_id")["iteration"].to_dict()
        long1 = float(on.loc[(on.iteration == 1) & (on.predicted_length > 100), "predicted_length"].item())
        long2 = float(on.loc[(on.iteration == 2) & (on.predicted_length > 100), "predicted_length"].item())
        # without it: window 0 holds iteration 1's long group (pulled forward) ahead of iteration 0's 800 and its 10;
        # window 1 iteration 2's long group ahead of iteration 1's 10; window 2 the last 10
        assert _order(off) == [(1, long1), (0, 800.0), (0, 10.0), (2, long2), (1, 10.0), (2, 10.0)], seed
        # with it: iteration 0's two groups first; iteration 1's long group in window 1 beside iteration 2's, longest first
        w1 = sorted([(1, long1), (2, long2)], key=lambda x: -x[1])
        assert _order(on) == [(0, 800.0), (0, 10.0), *w1, (1, 10.0), (2, 10.0)], seed


def test_fill_first_leaves_a_later_epoch_alone():
    # a later epoch's first window follows the previous epoch's last iterations: nothing changes there
    assert _order(_plan(True, 0, offset=3)) == _order(_plan(False, 0, offset=3))


def test_the_first_admissions_are_iteration_0s():
    """One instance with room for two groups takes the first two of its queue: with fill_first both of
    iteration 0 (the trainer's first step needs them), without it iteration 1's long group and iteration 0's 800."""
    for fill_first, want in ((True, [0, 0]), (False, [1, 0])):
        jobs = jobs_from_schedule(_plan(fill_first))
        disp = Dispatcher(jobs, 1, AdmissionController(1, 1), dispatch="guided")
        got = [disp.next_for(0)[0].iteration for _ in range(2)]
        assert got == want


def test_sim_starts_iteration_0_first_where_the_instances_hold_one_iteration():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from tail_common import ASP_DEFAULTS, _cfg

    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    # 32 devices: 8 instances x 256 sequences = one iteration of 256 groups x G = 8
    out = {}
    for fill_first in (True, False):
        cfg = _cfg("reasoning", None, 768, 32, {**ASP_DEFAULTS, "scheduler.fill_first": fill_first})
        res = simulate_system(cfg, workload_from_config(cfg), "asp", record_samples=True)
        req, st = res.timeline.frame("request"), res.timeline.frame("step")
        out[fill_first] = (req, float(st[st.iteration == 0].t_start.min()), res.summary)
    req, first_on, s_on = out[True]
    assert (req[req.iteration == 0].t_admit == 0).all()
    assert req[req.iteration == 1].t_admit.min() > 0
    req_off, first_off, _ = out[False]
    assert (req_off[req_off.iteration == 1].t_admit == 0).any()        # the pull-forward it replaces
    assert first_on <= first_off
    assert s_on["policy_lag_max"] <= 1 and len(req) == 768 * 8
