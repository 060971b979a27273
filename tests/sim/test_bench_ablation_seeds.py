"""benchmarks/bench_tail.py ablation --plan-seeds: every row simulated per planner seed on one
workload, the systems that draw nothing from the seed simulated once, and with one seed the table
over seeds says what the single-seed table says (bimodal workload, 512 prompts, 32 devices)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_ablation  # noqa: E402
import tail_common  # noqa: E402

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def run():
    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=512, data=None)  # synthetic: no trace
    ((D, wl, run),) = tail_common.plan_seed_cells(a, workloads_outer=True)
    assert (D, wl) == (32, "bimodal")
    return run


@pytest.fixture(scope="module")
def counted(run):
    calls = []

    def counting(name, over, s):
        calls.append((name, tuple(sorted(over.items())), s))
        return run(name, over, s)
    return tail_ablation.ablation_runs(counting, SEEDS), calls


@pytest.fixture(scope="module")
def one_seed(run):
    return tail_ablation.ablation_runs(run, [0])


def test_seed_free_rows_run_once_the_others_per_seed(counted, one_seed):
    res, calls = counted
    for label, name, over in tail_ablation.ABLATION:
        seeds = [s for n, o, s in calls if (n, o) == (name, tuple(sorted(over.items())))]
        assert seeds == ([0] if name in tail_common.SEED_FREE else SEEDS), label
        assert len(res[label]) == len(SEEDS)
        # more seeds leave seed 0's figures as they were
        assert res[label][0]["iteration_time_mean"] == one_seed[label][0]["iteration_time_mean"], label
    # as shipped, + regroup, + regroup heaviest first, + that and streaming, + speculative, + partial
    assert sum(n == "fully_async_fifo" for n, _, _ in calls) == 6
    free = sum(name in tail_common.SEED_FREE for _, name, _ in tail_ablation.ABLATION)
    assert len(calls) == free + (len(tail_ablation.ABLATION) - free) * len(SEEDS)


def test_seed_free_systems_draw_nothing_from_the_seed(run, counted):
    """What lets ablation_runs simulate them once: seed 1 gives seed 0's run, while asp's plan moves."""
    res, _ = counted
    for label, name, over in tail_ablation.ABLATION:
        if name in tail_common.SEED_FREE:
            other = run(name, over, 1)
            for k in ("iteration_time_mean", "throughput", "length_mix_ks_max", "policy_lag_max"):
                assert other[k] == res[label][0][k], (label, k)
    static = res["asp, static plan (before DESIGN 9)"]
    assert static[0]["iteration_time_mean"] != static[1]["iteration_time_mean"]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_one_seed_over_seeds_says_what_the_single_seed_table_says(one_seed):
    for label, name, over in tail_ablation.ABLATION:
        single = _cells(tail_ablation.ablation_row("bimodal", 32, label, over, one_seed))
        seeds = _cells(tail_ablation.ablation_seeds_row("bimodal", 32, label, name, over, one_seed))
        assert seeds[:3] == single[:3]
        for col in (3, 4):                                   # iteration time, vs fifo
            figures = seeds[col].replace("(", " ").replace(")", " ").replace("..", " ").split()
            want = single[col]
            if name in tail_common.SEED_FREE:
                assert figures == [want, "run", "once"], (label, seeds[col])
            else:                                            # mean (min .. max) of one seed
                assert [f.rstrip("%") for f in figures] == [want.rstrip("%")] * 3, (label, seeds[col])
        assert seeds[5:12] == single[5:12], label               # throughput, KS, lag, stolen, capped, deferred, regrouped


@pytest.mark.parametrize("argv, message", [
    (["seed", "--plan-seeds", "1"], "--plan-seeds applies to ablation, robustness, breakdown, bound and sweep only"),
    (["ablation", "--plan-seeds", "0", "0"], "names a seed twice"),
    (["admission", "--set", "seed=1"], "--set applies to ablation, bound, breakdown, robustness, seed, speed, sweep "
                                       "only, not to admission"),
    (["breakdown", "--set", "lengths.predictor"], "is not KEY=VALUE"),
])
def test_bad_plan_seeds_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_tail.main(argv)
    assert message in capsys.readouterr().err
