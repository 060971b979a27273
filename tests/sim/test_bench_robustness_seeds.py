"""benchmarks/bench_tail.py robustness --plan-seeds: asp and balanced simulated per planner seed on
one grid cell, fifo once, seed 0's figures those of the single-seed grid, and the count lines
(bimodal workload, 512 prompts, 32 devices, the grid's first two cells)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_common  # noqa: E402
import tail_robustness  # noqa: E402

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def cells():
    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=512, data=None)  # synthetic: no trace
    cells = tail_robustness._grid_cells(a, 32)
    return [next(cells), next(cells)]          # planned costs, decode a x0.1


@pytest.fixture(scope="module")
def counted(cells):
    out = []
    for wl, label, it in cells:
        calls = []

        def counting(name, over, s, it=it, calls=calls):
            calls.append((name, s))
            return it(name, over, s)
        out.append((label, tail_common.seed_runs(counting, SEEDS, tail_robustness.ROBUST_ROWS), calls))
    return out


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


def test_fifo_runs_once_asp_and_balanced_per_seed(counted):
    for label, res, calls in counted:
        assert calls == [("asp", 0), ("asp", 1), ("fully_async_fifo", 0), ("async_balanced", 0),
                         ("async_balanced", 1)], label
        assert res["fifo"][0] is res["fifo"][1]
    # the seed moves asp's plan somewhere on these cells (else the table over seeds says nothing)
    assert any(res["asp"][0]["iteration_time_mean"] != res["asp"][1]["iteration_time_mean"]
               for _, res, _ in counted)


def test_seed_zero_is_the_single_seed_grid(cells, counted):
    """What the robustness table at seed 0 prints: the same asp, fifo and balanced runs."""
    for (wl, label, it), (_, res, _) in zip(cells, counted):
        for key, name, over in tail_robustness.ROBUST_ROWS:
            assert it(name, over)["iteration_time_mean"] == res[key][0]["iteration_time_mean"], (label, key)
        one = {k: v[:1] for k, v in res.items()}
        row, f = tail_robustness.robustness_seeds_row(wl, 32, label, one)
        c = _cells(row)
        asp, fifo, bal = (res[k][0]["iteration_time_mean"] for k in ("asp", "fifo", "balanced"))
        assert c[:3] == [wl, "32", label]
        assert c[3] == f"{asp:.1f} ({asp:.1f} .. {asp:.1f})"
        vs_f, vs_b = 100 * (asp / fifo - 1), 100 * (asp / bal - 1)
        assert c[4] == f"{vs_f:+.1f}% ({vs_f:+.1f} .. {vs_f:+.1f})"
        assert c[5] == f"{vs_b:+.1f}% ({vs_b:+.1f} .. {vs_b:+.1f})"
        assert f == [pytest.approx(vs_f)]


def test_counts_read_the_rounded_figures():
    cells = [("w", "ahead always", [-1.0, -0.2, -0.5]),
             ("w", "mean ahead, one seed behind", [-2.0, +0.3, -0.1]),
             ("w", "level as printed", [-0.04, -0.04, -0.04]),     # prints -0.0: not strictly ahead
             ("w", "mean behind, one seed ahead", [+1.0, -0.3, +0.2]),
             ("w", "behind always", [+0.5, +0.1, +2.0])]
    mean, some = tail_robustness.robustness_counts(32, [0, 1, 2], cells)
    assert mean == ("32 devices: asp strictly ahead of fifo on the mean over seeds 0 1 2 in 2 of 5 cells, "
                    "for every seed in 1 of 5 (seed 0: 2, seed 1: 2, seed 2: 2)")
    assert some == ("32 devices: ahead for some seeds only (2): w / mean ahead, one seed behind "
                    "(-2.0 +0.3 -0.1); w / mean behind, one seed ahead (+1.0 -0.3 +0.2)")


def test_one_seed_prints_the_single_seed_table(monkeypatch, capsys):
    monkeypatch.setattr(tail_robustness, "GRID", tail_robustness.GRID[:1])
    argv = ["robustness", "--prompts", "64", "--workloads", "bimodal"]
    bench_tail.main(argv)
    plain = capsys.readouterr().out
    bench_tail.main(argv + ["--plan-seeds", "0"])
    assert capsys.readouterr().out == plain
    assert plain.splitlines()[0].startswith("| workload | devices | true costs (plan: configured) | asp iter. time")
    assert len(plain.splitlines()) == 3


def test_asp_regroups_and_set_reaches_every_row(monkeypatch, capsys):
    """asp's defaults on the grid include regroup and its heaviest-first take (pipeline.regroup and
    pipeline.regroup_heavy: auto are on for asp since 2026-12-03); ``--set pipeline.regroup=off``
    turns both off on every row (the earlier grids)."""
    from asp_ascend.config import regroup_heavy_of, regroup_of

    def fake(argv):
        seen = []

        def run(cfg, w, name, mismatch=None):
            assert regroup_heavy_of(cfg, name) == regroup_of(cfg, name), (name, argv)
            seen.append((name, regroup_of(cfg, name)))
            return {"iteration_time_mean": 1.0, "admission_concurrency": 256}
        monkeypatch.setattr(tail_common, "_run", run)
        monkeypatch.setattr(tail_robustness, "GRID", tail_robustness.GRID[:1])
        bench_tail.main(["robustness", "--prompts", "64", "--workloads", "bimodal"] + argv)
        capsys.readouterr()
        return seen

    for argv in ([], ["--plan-seeds", "0", "1"]):
        seen = fake(argv)
        assert ("asp", True) in seen and ("fully_async_fifo", False) in seen and ("async_balanced", False) in seen
        assert {ok for name, ok in seen if name != "asp"} == {False}
        assert set(fake(argv + ["--set", "pipeline.regroup=off"])) <= {("asp", False), ("fully_async_fifo", False),
                                                                       ("async_balanced", False)}
    # the single-seed table's asp columns (defaults, tail auto, full, auto) regroup; the static plan does not
    assert [ok for name, ok in fake([]) if name == "asp"] == [True, False, True, True, True]


def test_cells_restricts_the_grid_and_is_refused_elsewhere(capsys):
    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=64, data=None,
                           cells=["a, b, c x10", "planned costs"])
    got = [(wl, label) for wl, label, _ in tail_robustness._grid_cells(a, 32)]
    assert got == [("bimodal", "planned costs"), ("bimodal", "a, b, c x10")]     # the grid's order, not argv's
    for argv in (["ablation", "--cells", "planned costs"], ["robustness", "--cells", "decode a x3"],
                 ["ablation", "--floor"]):
        with pytest.raises(SystemExit):
            bench_tail.main(argv)
    capsys.readouterr()


def test_floor_prices_the_critical_group_on_the_true_costs():
    """robustness --floor: the plan is made on the configured costs in every cell, so each iteration's
    longest group is the same one at the planned costs and with every decode coefficient x10; priced
    on the true costs its latency alone is about 10x (prefill is not scaled: a little under), priced
    on the planned ones it would be the same figure in both cells."""
    from asp_ascend.sim.run import Mismatch

    def terms(mm):
        row, why = tail_robustness.robustness_floor_terms("bimodal", 32, None, 1024, "asp", tail_common.ASP_DEFAULTS,
                                                          0, Mismatch(**mm))
        assert why == ""                # 1024 prompts of 256 an iteration: iterations 2 and 3 are steady
        return row
    planned = terms({})
    slow = terms({"decode_a": 10.0, "decode_b": 10.0, "decode_c": 10.0})
    assert len(planned) == len(tail_robustness.FLOOR_COLUMNS)
    assert 9.0 < slow[1] / planned[1] <= 10.0
    # the iteration time is the robustness grid's own run of that cell
    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=1024, data=None, cells=["planned costs"])
    (_, _, it), = tail_robustness._grid_cells(a, 32)
    assert planned[0] == it("asp", tail_common.ASP_DEFAULTS)["iteration_time_mean"]


def test_floor_without_a_steady_iteration_prints_na_and_why(capsys):
    """robustness --floor at 512 prompts (256 an iteration: iterations 0 and 1, the steady ones
    start at k + 1 = 2): the iteration time prints, the steady terms n/a and why under the table,
    never nan (a mean over no iteration)."""
    assert bench_tail.main(["robustness", "--floor", "--prompts", "512", "--devices", "32", "--workloads", "bimodal",
                            "--cells", "planned costs"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    rows = [[c.strip() for c in x.strip().strip("|").split("|")] for x in out.splitlines()
            if x.startswith("| bimodal | 32 |")]
    assert [r[3] for r in rows] == ["asp", "balanced"]
    for r in rows:
        assert float(r[4]) > 0
        assert r[5:] == ["n/a"] * (len(tail_robustness.FLOOR_COLUMNS) - 1)
    assert out.count("n/a: no steady iteration: bimodal at 512 prompts runs 2 iteration(s)") == 1
    assert "needs --prompts >= 768" in out
