"""benchmarks/bench_runtime.py: ``--history`` (the systems of HISTORY_SYSTEMS plan from a length
table, the other system of a pair does not) and ``plan_figures`` (the slot floor and the plan's
prediction correlation), on hand-made run directories; nothing is run or timed."""
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_runtime  # noqa: E402


def lengths_table(path: Path) -> Path:
    pd.DataFrame({"prompt_id": ["p0", "p0", "p1", "p1"], "epoch": [0] * 4, "sample": [0, 1, 0, 1],
                  "response_length": [5, 9, 30, 64]}).to_parquet(path)
    return path


def run_paired(monkeypatch, tmp_path, *args) -> list[tuple[str, list[str]]]:
    """main() on ``paired`` with _train and the figures stubbed: (run directory name, overrides) per run."""
    calls = []

    def fake_train(out, overrides, cpu=False):
        calls.append((out.name, overrides))
        return out

    monkeypatch.setattr(bench_runtime, "_train", fake_train)
    monkeypatch.setattr(bench_runtime, "run_row", lambda d, name: {"tokens_s_1": 1.0, "iter_time_1": 1.0})
    monkeypatch.setattr(bench_runtime, "paired_report", lambda out, systems: {})
    monkeypatch.setattr(sys, "argv", ["bench_runtime.py", "paired", "--out", str(tmp_path / "out"), *args])
    bench_runtime.main()
    return calls


def test_history_reaches_the_history_system_only(monkeypatch, tmp_path):
    table = lengths_table(tmp_path / "lengths.parquet")
    calls = run_paired(monkeypatch, tmp_path, "--systems", "async_fifo,async_asp_history", "--history", str(table),
                       "--history-quantile", "1.0", "train.lr=1e-12")
    assert [name for name, _ in calls] == ["b00_0_async_fifo", "b00_1_async_asp_history",
                                           "b00_2_async_asp_history", "b00_3_async_fifo"]
    for name, overrides in calls:
        keys = [o for o in overrides if o.startswith("lengths.")]
        if "history" in name:
            assert keys == [f"lengths.path={table.resolve()}", "lengths.predictor=quantile", "lengths.quantile=1.0"]
        else:
            assert keys == []
        assert overrides[-1] == "train.lr=1e-12"   # the command's keys after the system's
    # the series records each run's own keys (the history's for the history runs)
    rows = [json.loads(x) for x in (tmp_path / "out" / "paired.jsonl").read_text().splitlines()]
    assert rows[1]["overrides"][0] == f"lengths.path={table.resolve()}"
    assert rows[0]["overrides"] == ["train.lr=1e-12"]


def test_history_without_quantile_plans_on_the_mean(monkeypatch, tmp_path):
    table = lengths_table(tmp_path / "lengths.parquet")
    calls = run_paired(monkeypatch, tmp_path, "--systems", "async_fifo,async_asp_history", "--history", str(table),
                       "--order", "ab")
    assert "lengths.predictor=mean" in calls[1][1]


@pytest.mark.parametrize("args, message", [
    (["--systems", "async_fifo,async_asp_history"], "add --history PATH"),
    (["--systems", "async_fifo,async_asp_lossless", "--history", "TABLE"], "add one to --systems"),
    (["--history-quantile", "0.9"], "needs --history"),
    (["--systems", "async_fifo,async_asp_history", "--history", "TABLE", "--history-quantile", "1.5"], "in [0, 1]"),
    (["--systems", "async_fifo,async_asp_history", "--history", "MISSING"], "does not exist"),
])
def test_history_errors_before_any_run(monkeypatch, tmp_path, capsys, args, message):
    table = lengths_table(tmp_path / "lengths.parquet")
    args = [str(table) if a == "TABLE" else str(tmp_path / "missing.parquet") if a == "MISSING" else a for a in args]
    calls = []
    monkeypatch.setattr(bench_runtime, "_train", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(sys, "argv", ["bench_runtime.py", "paired", "--out", str(tmp_path / "out"), *args])
    with pytest.raises(SystemExit):
        bench_runtime.main()
    assert message in capsys.readouterr().err
    assert calls == []


def write_run(d: Path, groups: dict, *, predicted: dict, max_num_seqs=16, group_size=2, admission="groups") -> Path:
    """A run directory with one ``request`` event per sample (``groups``: (iteration, prompt) ->
    lengths), schedule.parquet with ``predicted`` per prompt (epoch 0) and a config.yaml."""
    d.mkdir(parents=True)
    rows = [{"kind": "request", "t": 1.0, "epoch": 0, "iteration": it, "prompt_id": p, "sample": s,
             "response_length": n} for (it, p), ns in groups.items() for s, n in enumerate(ns)]
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame({"epoch": [0] * len(predicted), "prompt_id": list(predicted),
                  "predicted_length": list(predicted.values())}).to_parquet(d / "schedule.parquet")
    (d / "config.yaml").write_text(f"rollout:\n  max_num_seqs: {max_num_seqs}\n  num_instances: 1\n"
                                   f"  admission: {admission}\ntrain:\n  group_size: {group_size}\n")
    return d


def test_plan_figures_slot_floor_and_correlation(tmp_path):
    # 16 sequences / G = 2: 8 group slots; iteration 0 is left out of the floor
    groups = {(0, "a"): [100, 100], (1, "b"): [10, 40], (1, "c"): [24, 8], (2, "d"): [64, 64], (2, "e"): [2, 6]}
    d = write_run(tmp_path / "run", groups, predicted={"a": 1.0, "b": 40.0, "c": 24.0, "d": 64.0, "e": 6.0})
    f = bench_runtime.plan_figures(d)
    # (40 + 24 + 64 + 6) slot-steps over 8 slots, 2 iterations
    assert math.isclose(f["slot_floor"], (40 + 24 + 64 + 6) / 8 / 2)
    # the prediction is each group's longest but for a: not a perfect correlation
    assert 0.0 < f["pred_r_longest"] < 1.0
    exact = write_run(tmp_path / "exact", {k: v for k, v in groups.items() if k[1] != "a"},
                      predicted={"b": 40.0, "c": 24.0, "d": 64.0, "e": 6.0})
    assert math.isclose(bench_runtime.plan_figures(exact)["pred_r_longest"], 1.0)


def test_plan_figures_has_no_slot_floor_under_sequence_admission(tmp_path):
    d = write_run(tmp_path / "run", {(1, "b"): [10, 40]}, predicted={"b": 3.0}, admission="sequences")
    f = bench_runtime.plan_figures(d)
    assert f["slot_floor"] is None
    assert math.isnan(f["pred_r_longest"])   # one group: no correlation
