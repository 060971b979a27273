"""benchmarks/bench_tail_corun.py: a run too small for a steady iteration prints n/a and why, never
nan; one with steady iterations prints finite figures whose on-instance cost is its parts' sum."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail_corun  # noqa: E402


def _rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in x.strip().strip("|").split("|")] for x in out.splitlines()
            if x.startswith("| reasoning | 32 |")]


def test_no_steady_iteration_prints_na_and_why(capsys):
    # 512 prompts of 256 an iteration: iterations 0 and 1, the steady ones start at k + 1 = 2
    assert bench_tail_corun.main(["--prompts", "512", "--devices", "32", "--plan-seeds", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    rows = _rows(out)
    assert [r[2] for r in rows] == ["0", "1", "mean"]
    for r in rows:
        assert float(r[3]) > 0 and float(r[4]) > 0      # the run's own figures still print
        assert r[5:] == ["n/a"] * 8
    assert "runs 2 iteration(s)" in out and "needs --prompts >= 768" in out


def test_steady_iterations_print_finite_figures(capsys):
    assert bench_tail_corun.main(["--prompts", "768", "--devices", "32"]) == 0
    out = capsys.readouterr().out
    assert "n/a" not in out and "nan" not in out
    (r,) = _rows(out)
    x = [float(c) for c in r[3:]]
    assert all(math.isfinite(v) for v in x)
    on_instance, previous, same, later, prefill = x[4:9]
    assert on_instance == pytest.approx(previous + same + later + prefill, abs=0.25)    # printed to 0.1
