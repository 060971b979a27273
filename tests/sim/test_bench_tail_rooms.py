"""benchmarks/bench_tail_rooms.py: per relief setting one row whose capped groups by iteration add
up to the run's capped groups, from a real simulated run."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail_rooms  # noqa: E402


def test_rows_count_the_runs_capped_groups_by_iteration(capsys):
    # auto caps only groups that set their iteration's floor, priced at the sequences an instance runs
    # (scheduler/tail.py, TailModel.batch): with bimodal's own tail share (30 % of the prompts) it caps
    # nothing at 32 or 64 devices. With 1.5 % in the tail, a few long groups per iteration among short
    # ones on 16 instances: groups are capped in iteration 0 of both rows (3 with the relief, 7 without;
    # 2-4 and 5-7 with 1.4-1.6 %)
    bench_tail_rooms.main(["--prompts", "512", "--devices", "64", "--workloads", "bimodal",
                           "--set", "workload.tail_fraction=0.015"])
    rows = [r.strip("|").split("|") for r in capsys.readouterr().out.splitlines()[2:]]
    assert [r[3].strip() for r in rows] == ["shipped", "0"]
    for r in rows:
        first, later, capped = int(r[4]), float(r[5]), int(r[6])
        iterations = 512 // 256           # one epoch of 512 prompts, B = 256
        assert first > 0 and first + later * (iterations - 1) == capped
        assert r[7].strip().endswith("%") and r[8].strip().endswith("%")
