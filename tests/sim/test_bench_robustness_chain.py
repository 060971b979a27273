"""benchmarks/bench_tail.py robustness --chain: per cell and planner seed, asp's defaults and fifo
beside the publish floor of their own iterations on the cell's true costs, and that floor over random
orders of the same iterations (bimodal workload, 512 prompts, 32 devices, decode a x10)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_robustness  # noqa: E402


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


@pytest.fixture(scope="module")
def rows():
    import contextlib
    import io

    a = argparse.Namespace(workloads=["bimodal"], devices=[32], prompts=512, data=None, plan_seeds=[0, 1],
                           cells=["decode a x10"], set=[], combo_only=None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tail_robustness.robustness_chain(a)
    return [_cells(line) for line in out.getvalue().splitlines() if line.startswith("| bimodal")]


def test_fifo_first_then_asp_per_seed(rows):
    assert [(r[3], r[4]) for r in rows] == [("fifo", "-"), ("asp", "0"), ("asp", "1")]
    assert rows[0][6] == "+0.0%"
    fifo = float(rows[0][5])
    for r in rows[1:]:
        assert r[6] == f"{100 * (float(r[5]) / fifo - 1):+.1f}%"


def test_no_run_publishes_before_its_floor(rows):
    """The publish floor bounds every lossless run of the same iterations: each run is at or above it,
    and the printed gap is the run's time over the floor; the random orders' percentiles are ordered."""
    for r in rows:
        t, floor = float(r[5]), float(r[7])
        assert t >= floor - 0.05
        assert r[8] == f"{100 * (t / floor - 1):+.1f}%"
        p5, p50, p95 = (float(x) for x in r[9].split(" / "))
        assert p5 <= p50 <= p95
        assert 0 <= int(r[10].rstrip(" %")) <= 100


def test_chain_refused_elsewhere(capsys):
    with pytest.raises(SystemExit):
        bench_tail.main(["ablation", "--chain"])
    assert "--chain applies to robustness only" in capsys.readouterr().err
