"""benchmarks/bench_tail.py breakdown: a run too small for a steady iteration (from k + 1 on) prints
its iteration time and bound, n/a in the steady columns and why under the table, never nan; the
size the note names has steady iterations (sim_7b: 2 simulated epochs of 256 prompts an iteration)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402


def _rows(out: str, setup: str) -> list[list[str]]:
    return [[c.strip() for c in x.strip().strip("|").split("|")] for x in out.splitlines()
            if x.startswith(f"| {setup} |")]


def test_no_steady_iteration_prints_na_and_the_size_that_has_one(capsys):
    assert bench_tail.main(["breakdown", "--prompts", "256", "--devices", "32", "--plan-seeds", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    rows = _rows(out, "sim_7b (32)")
    assert [r[1] for r in rows] == ["0", "1", "mean"]
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0           # iteration time, bound
        assert all("n/a" in c for c in r[4:-1])
        assert float(r[-1]) >= 0                              # heavy_first moves: the run's own
    assert out.count("n/a: no steady iteration: sim_7b at 256 prompts runs 2 iteration(s)") == 1
    assert "needs --prompts >= 512" in out
    # sim_32b has steady iterations at this size: figures, no note
    assert all("n/a" not in c for r in _rows(out, "sim_32b (32)") for c in r[2:12])
    assert "sim_32b at" not in out

    assert bench_tail.main(["breakdown", "--prompts", "512", "--devices", "32"]) == 0
    out = capsys.readouterr().out
    assert "no steady iteration" not in out and "nan" not in out
    (r,) = _rows(out, "sim_7b (32)")
    assert all(float(c) == float(c) for c in r[2:11])


def test_mean_line_counts_the_seeds_steady_iterations():
    """The mean line's "critical = longest ... of n": n is the mean steady-iteration count of the
    seeds whose figures it averages (it printed the last seed's count). By hand: half of 2 and all
    of 4 steady iterations: 75 % of 3; a third seed without steady iterations (last, so the old
    line said "of 0") is in neither the percentage nor the count; equal counts print as before."""
    import tail_floor

    def row(critical):          # breakdown's 19 values; only the critical = longest share varies
        return [100.0, 80.0, *([1.0] * 7), critical, 5.0, 0.5, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 3]

    none = [100.0, 80.0, *([None] * 16), 3]
    values, n = tail_floor.breakdown_mean([(row(0.5), 2), (row(1.0), 4), (none, 0)])
    assert n == 3
    cells = [c.strip() for c in tail_floor._breakdown_row("s", "mean", values, n).strip().strip("|").split("|")]
    assert cells[11] == "75 % of 3"
    values, n = tail_floor.breakdown_mean([(row(0.5), 3), (row(1.0), 4)])
    assert tail_floor._breakdown_row("s", "mean", values, n).count("| 75 % of 3.5 |") == 1
    values, n = tail_floor.breakdown_mean([(row(0.5), 14), (row(1.0), 14)])
    assert tail_floor._breakdown_row("s", "mean", values, n).count("| 75 % of 14 |") == 1
    assert tail_floor.breakdown_mean([(none, 0), (none, 0)])[1] == 0
