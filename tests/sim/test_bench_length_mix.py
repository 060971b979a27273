"""benchmarks/bench_length_mix.py: the per-iteration KS of a plan, computed without simulating, is
the simulator's figure; the stratified Monte-Carlo membership and the KS helper on hand-computed
cases."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_length_mix as blm  # noqa: E402


def test_iteration_ks_by_hand():
    # four groups of one sample, lengths 1..4; the run's CDF steps by 1/4 at each
    L = np.array([[1.0], [2.0], [3.0], [4.0]])
    # {1, 2} and {3, 4}: at 2 the first iteration's CDF is 1, the run's 1/2 (and the mirror for the second)
    assert blm.iteration_ks(np.array([0, 0, 1, 1]), L).tolist() == [0.5, 0.5]
    # {1, 4} and {2, 3}: |1/2 - 1/4| just after 1 (and just before 4); {2, 3}: 1/4 at 1 and at 3
    assert blm.iteration_ks(np.array([0, 1, 1, 0]), L).tolist() == [0.25, 0.25]


def test_stratified_draw_takes_one_prompt_per_stratum_per_iteration():
    # keys 10, 9 (the long stratum) and 2, 1 (the short one), B = 2: two iterations of one of each
    key = np.array([2.0, 10.0, 1.0, 9.0])
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(20):
        it = blm.stratified_draw(key, 2, rng)
        assert it[1] != it[3] and it[0] != it[2]
        assert sorted(it.tolist()) == [0, 0, 1, 1]
        seen.add(tuple(it.tolist()))
    assert len(seen) == 4          # every pairing of the two strata's prompts is drawn
    with pytest.raises(ValueError, match="multiple of the global batch"):
        blm.stratified_draw(np.arange(5.0), 2, rng)


def test_plan_ks_is_the_simulated_runs():
    """With the lossless mechanisms an iteration trains the plan's groups: the KS computed from the
    plan equals the simulated summary's (bimodal, 512 prompts, two iterations)."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    cfg = blm._cfg("bimodal", None, 512, 32, {**blm.ASP, "seed": 1})
    w = workload_from_config(cfg)
    jobs = blm._plan(cfg, w)
    ks = blm.iteration_ks(jobs.iteration, jobs.resp.astype(float))
    s = simulate_system(cfg, w, "asp", record_samples=False).summary
    assert ks.size == 2
    assert ks.max() == pytest.approx(s["length_mix_ks_max"], abs=1e-12)
    assert ks.mean() == pytest.approx(s["length_mix_ks_mean"], abs=1e-12)
