"""benchmarks/bench_tail.py --set: which subcommands take it, and where its overrides land
(ablation: on top of every row's; sweep: on top of every row's, under the cell's own change)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_common  # noqa: E402
import tail_sweep  # noqa: E402


@pytest.mark.parametrize("what", ["ablation", "sweep", "robustness", "bound"])
def test_set_reaches_the_subcommands_that_take_it(monkeypatch, what):
    seen = []
    monkeypatch.setattr(bench_tail, what, seen.append)
    assert bench_tail.main([what, "--devices", "64", "--set", "scheduler.concentrate_tail=0.02",
                            "rollout.tail_concurrency=reactive"]) == 0
    (args,) = seen
    assert args.set == ["scheduler.concentrate_tail=0.02", "rollout.tail_concurrency=reactive"]
    assert tail_common.set_overrides(args.set) == {"scheduler.concentrate_tail": "0.02",
                                                   "rollout.tail_concurrency": "reactive"}


@pytest.mark.parametrize("argv, says", [
    (["admission", "--set", "scheduler.concentrate_tail=0.02"], "not to admission"),
    (["reestimate", "--set", "scheduler.concentrate_tail=0.02"], "not to reestimate"),
    (["ablation", "--set", "scheduler.concentrate_tail"], "scheduler.concentrate_tail is not KEY=VALUE"),
])
def test_set_refused_where_it_means_nothing(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        bench_tail.main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_ablation_runs_carry_the_overrides_over_each_rows():
    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=256, data=None,
                           set=["scheduler.concentrate_tail=0.02", "rollout.tail_concurrency=reactive"])
    ((_, _, run),) = tail_common.plan_seed_cells(a, workloads_outer=True)
    row = {**tail_common.ASP_DEFAULTS, "scheduler.concentrate_tail": 0.01}
    _, cfg = run("asp", row, 3, result=True)
    assert cfg.scheduler.concentrate_tail == 0.02          # --set replaces the row's own value
    assert cfg.rollout.tail_concurrency == "reactive"
    assert cfg.scheduler.dispatch == "guided" and cfg.seed == 3


def test_sweep_cell_change_wins_over_set():
    extra = tail_common.set_overrides(["rollout.max_num_seqs=512", "scheduler.concentrate_tail=0.02"])
    run = tail_sweep.sweep_run("bimodal", None, 256, 32, {"rollout.max_num_seqs": 32}, None, extra)
    res, cfg = run("asp", {**tail_common.ASP_DEFAULTS, "scheduler.concentrate_tail": 0.0}, 1, result=True)
    assert cfg.rollout.max_num_seqs == 32                  # what the cell varies
    assert cfg.scheduler.concentrate_tail == 0.02          # --set over the row's value
    assert cfg.seed == 1 and res.summary["policy_lag_max"] <= 1
    plain = tail_sweep.sweep_run("bimodal", None, 256, 32, {"rollout.max_num_seqs": 32}, None, {})
    shipped = tail_common._cfg("bimodal", None, 256, 32, {}).scheduler.concentrate_tail
    assert plain("asp", {**tail_common.ASP_DEFAULTS, "scheduler.concentrate_tail": 0.03}, 1,
                 result=True)[1].scheduler.concentrate_tail == 0.03 != shipped   # without --set the row's value


def test_set_shapes_the_workload_too():
    """--set workload.* / train.group_size reach the workload plan_seed_cells builds (they were
    applied to the runs' configs only, so a workload key changed nothing), with seed 0 whatever
    --set says of the seed."""
    def samples(kvs):
        a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=64, data=None, set=kvs)
        ((_, _, run),) = tail_common.plan_seed_cells(a, workloads_outer=True)
        res, cfg = run("fully_async_fifo", {}, 0, result=True)
        return res.summary, cfg

    base, _ = samples([])
    s, cfg = samples(["train.group_size=4", "workload.tail_fraction=0.02"])
    assert cfg.train.group_size == 4
    assert s["samples"] == base["samples"] // 2              # 64 prompts x 4 instead of x 8
    g4, _ = samples(["train.group_size=4"])
    assert s["run_time_s"] != g4["run_time_s"]               # the tail fraction (bimodal: 0.3) changed the lengths
    reseeded, _ = samples(["train.group_size=4", "workload.tail_fraction=0.02", "seed=5"])
    assert reseeded["run_time_s"] == s["run_time_s"]         # the same workload (seed 0); fifo draws nothing
