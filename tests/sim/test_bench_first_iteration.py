"""benchmarks/bench_first_iteration.py: the publish floor of a membership without simulating it, by
hand and against the floor bench_tail.py bound computes from a simulated run of the same plan."""
import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_first_iteration  # noqa: E402
import tail_common  # noqa: E402
import tail_floor  # noqa: E402

from asp_ascend.sim.costs import PACKED_TOKEN_COST  # noqa: E402


def test_membership_floor_by_hand():
    """Two iterations of two groups, one optimizer step each (mini-batch 2), a packed token costing
    1 s, a step 1 s, the sync 0.5 s: busy = 5 + 1 + 0.5 = 6.5 s each; floors 10 + 0.5 and 30 + 0.5 s;
    the trainer starts after iteration 0's shortest group (2 s). k = 1: V_1 = max(2 + 6.5, 10.5) =
    10.5, V_2 = max(10.5 + 6.5, 30.5) = 30.5: 15.25 s per iteration; iteration 0's longest 10 s."""
    costs = SimpleNamespace(train_per_token=1.0 / PACKED_TOKEN_COST, train_per_step=1.0, sync_s=0.5)
    it = np.array([0, 0, 1, 1])
    solo = np.array([10.0, 2.0, 30.0, 4.0])
    tokens = np.array([3.0, 2.0, 1.0, 4.0])
    per_it, first = bench_first_iteration.membership_floor(it, solo, tokens, costs, 2, 1)
    assert per_it == pytest.approx(15.25) and first == 10.0


def test_membership_floor_matches_the_simulated_runs_bound():
    """The floor from the plan alone equals tail_floor.bound_terms' chain of a simulated run of the
    same asp plan (the trainer's steps and syncs as the simulator timed them), seed-0 workload."""
    a = argparse.Namespace(data=None, prompts=512, devices=32, workload_seeds=[0], plan_seeds=[0], relieve=[0.02])
    got = bench_first_iteration.draws("bimodal", a)[("asp", 0.02)][0][0]
    cfg = tail_common._cfg("bimodal", None, 512, 32, {**tail_common.ASP_DEFAULTS, "seed": 0})
    from asp_ascend.lengths.workloads import workload_from_config

    res, cfg = tail_common._run(cfg, workload_from_config(cfg), "asp", result=True)
    assert got == pytest.approx(tail_floor.bound_terms(res, cfg)["chain"], rel=1e-6)
