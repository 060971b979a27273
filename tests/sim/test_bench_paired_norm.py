"""benchmarks/bench_runtime.py paired: a pair's tokens/s at equal engine step time, from the
``costs`` events' running totals of each run (hand-made timelines, no run)."""
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_runtime  # noqa: E402


def write_costs(d: Path, steps_per_s: float, batch: float, step_ms: float, t_end: float = 20.0) -> None:
    """A timeline whose ``costs`` events (every 2 s from t = 2) count ``steps_per_s`` engine steps
    per second of ``batch`` sequences, each ``step_ms`` inside the step."""
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for t in range(2, int(t_end) + 1, 2):
        steps = steps_per_s * t
        rows.append({"kind": "costs", "t": float(t), "decode_a": 0.01, "decode_b": 0.0, "decode_c": 0.0,
                     "steps": steps, "seq_steps": steps * batch, "busy_s": steps * step_ms / 1e3, "train_s": 0.5})
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_decode_steps_reads_the_step_time_from_the_costs_totals(tmp_path):
    write_costs(tmp_path, steps_per_s=50.0, batch=40.0, step_ms=12.0)
    st = bench_runtime.decode_steps(tmp_path, 3.0, 19.0)   # events at 4 .. 18 inside
    assert math.isclose(st["steps_s"], 50.0)
    assert math.isclose(st["batch"], 40.0)
    assert math.isclose(st["step_ms"], 12.0)


def test_pair_at_equal_step_time_takes_out_a_slower_engine(tmp_path):
    """B drew 0.8x A's tokens/s, but its engine stepped at 15 ms where A's stepped at 12 ms (the
    machine ran B's run 1.25x slower): at equal step time the two are level."""
    write_costs(tmp_path / "A", 60.0, 50.0, 12.0)
    write_costs(tmp_path / "B", 60.0, 50.0, 15.0)
    ra = {"tokens_s_1": 4000.0, "iter_time_1": 1.0, "tokens_1": 4000.0, "other_cores": 0.02,
          "step_ms": bench_runtime.decode_steps(tmp_path / "A", 1.0, 20.0)["step_ms"], "steps_iter": 60.0}
    rb = {"tokens_s_1": 3200.0, "iter_time_1": 1.25, "tokens_1": 4000.0, "other_cores": 0.15,
          "step_ms": bench_runtime.decode_steps(tmp_path / "B", 1.0, 20.0)["step_ms"], "steps_iter": 60.0}
    p = bench_runtime.pair_ratios(ra, rb)
    assert math.isclose(p["tok"], 0.8)
    assert math.isclose(p["it"], 0.8)
    assert math.isclose(p["step_ms"], 1.25)
    assert math.isclose(p["tok_norm"], 1.0)
    assert not p["clean"] and math.isclose(p["load"], 0.15)
    # the same B without decode-step figures: no normalised ratio, not a wrong one
    q = bench_runtime.pair_ratios(ra, {k: v for k, v in rb.items() if k not in ("step_ms", "steps_iter")})
    assert math.isnan(q["tok_norm"]) and math.isnan(q["steps"]) and math.isclose(q["tok"], 0.8)
