"""benchmarks/bench_tail.py --combo-only beyond sweep: robustness --chain and bound take one
combination of sweep's changes (tail_combos.combo_cells), run as sweep runs the cell, its floors
priced on the combination's true costs (an unplanned-cost change's Mismatch)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_combos  # noqa: E402
from tail_common import OFF  # noqa: E402

UNPLANNED = "train.group_size=4 + decode b x10, unplanned"
SMALL = ["--prompts", "768", "--devices", "32", "--workloads", "bimodal"]


@pytest.mark.parametrize("argv", [["robustness", "--chain"], ["bound"], ["sweep"]])
def test_combo_only_reaches_chain_bound_and_sweep(monkeypatch, argv):
    seen = []     # sweep --combo-only runs combo_sweep
    monkeypatch.setattr(bench_tail, {"sweep": "combo_sweep"}.get(argv[0], argv[0]), seen.append)
    assert bench_tail.main(argv + ["--combo-only", UNPLANNED]) == 0
    assert seen[0].combo_only == UNPLANNED


@pytest.mark.parametrize("argv, says", [
    (["robustness"], "--combo-only applies to sweep (without --more), robustness --chain and bound only (got "
                     "robustness)"),
    (["robustness", "--floor"], "(got robustness --floor)"),
    (["ablation"], "(got ablation)"),
    (["sweep", "--more"], "(got sweep --more)"),
    (["robustness", "--chain", "--cells", "decode b x10"], "--combo-only and --cells: give one of them"),
    (["bound", "--combos", "3"], "--combos applies to sweep only")])
def test_combo_only_elsewhere_is_refused(capsys, argv, says):
    with pytest.raises(SystemExit):
        bench_tail.main(argv + ["--combo-only", UNPLANNED])
    assert says in capsys.readouterr().err


def _args(label, what="bound"):
    import argparse

    return argparse.Namespace(what=what, combo_only=label, data=Path("unused"), prompts=768, devices=[32],
                              workloads=["bimodal"], set=["pipeline.regroup=off"], plan_seeds=[0])


def test_a_cell_is_the_combination_on_its_true_costs():
    (D, wl, label, run, cost), = tail_combos.combo_cells(_args(UNPLANNED))
    assert (D, wl, label) == (32, "bimodal", UNPLANNED)
    res, cfg = run("fully_async_fifo", OFF, 0)
    assert cfg.train.group_size == 4 and cfg.pipeline.regroup == "off"        # the set change, and --set
    planned, true = res.costs.instance, cost(res)
    assert true.decode_b == pytest.approx(10 * planned.decode_b) and true.decode_a == planned.decode_a
    (*_, cost2), = tail_combos.combo_cells(_args("train.group_size=4 + workload.drift=0.1"))
    assert cost2(res) is None                                                 # no unplanned change: planned costs


def test_a_label_that_does_not_parse_stops_before_anything_runs():
    with pytest.raises(SystemExit, match=r"bench_tail.py bound: --combo-only: 'decode q x3' is not a change of "
                                         r"sweep's lists on this workload .* \(workload bimodal, 32 devices\)"):
        next(tail_combos.combo_cells(_args("train.group_size=4 + decode q x3")))


def test_chain_and_bound_print_the_combination(capsys):
    assert bench_tail.main(["robustness", "--chain", "--combo-only", UNPLANNED, *SMALL]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| bimodal |")]
    assert [r.split(" | ")[2:4] for r in rows] == [[UNPLANNED, "fifo"], [UNPLANNED, "asp"]]
    assert bench_tail.main(["bound", "--combo-only", UNPLANNED, *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"bound --combo-only {UNPLANNED!r}")
    assert len([r for r in out.splitlines() if r.startswith("| bimodal | 32 |")]) == 3
