"""benchmarks/bench_tail_rooms.py: per relief setting one row whose capped groups by iteration add
up to the run's capped groups, from a real simulated run."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail_rooms  # noqa: E402


def test_rows_count_the_runs_capped_groups_by_iteration(capsys):
    bench_tail_rooms.main(["--prompts", "512", "--devices", "32", "--workloads", "bimodal"])
    rows = [r.strip("|").split("|") for r in capsys.readouterr().out.splitlines()[2:]]
    assert [r[3].strip() for r in rows] == ["shipped", "0"]
    for r in rows:
        first, later, capped = int(r[4]), float(r[5]), int(r[6])
        iterations = 512 // 256           # one epoch of 512 prompts, B = 256
        assert first > 0 and first + later * (iterations - 1) == capped
        assert r[7].strip().endswith("%") and r[8].strip().endswith("%")
