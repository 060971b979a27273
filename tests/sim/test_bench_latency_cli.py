"""benchmarks/bench_runtime.py latency: it only reads the run directories it is given, so it
creates no ``--out`` folder (the figures themselves: tests/core/test_admission_latency.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_runtime  # noqa: E402


def test_latency_creates_no_out_folder(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(bench_runtime, "latency", seen.append)
    out = tmp_path / "never"
    monkeypatch.setattr(sys, "argv", ["bench_runtime.py", "latency", "--out", str(out), str(tmp_path / "run0")])
    bench_runtime.main()
    assert seen == [[tmp_path / "run0"]]
    assert not out.exists()
