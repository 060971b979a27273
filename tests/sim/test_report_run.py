"""`asp simulate` end to end and `asp report` on simulation and training run directories."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asp_ascend.cli import main
from asp_ascend.config import load_config, save_resolved
from asp_ascend.errors import DataError
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.report.run import run_report
from asp_ascend.sim.run import simulate_system

SMALL = ["workload.type=synthetic", "workload.num_prompts=64", "workload.epochs=2", "lengths.max_response_length=1024",
         "workload.body_median=150", "workload.tail_scale=400", "train.group_size=4", "train.global_batch_size=16",
         "train.mini_batch_size=8", "rollout.max_num_seqs=16", "sim.total_devices=8", "sim.rollout_devices=4",
         "sim.infer_tp=1"]

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "sim_tiny.yaml")
DESIGN_KEYS = {"throughput", "iteration_time_mean", "iteration_time_p50", "iteration_time_p99", "padding_bubble",
               "skew_bubble", "sorting_bubble", "lower_bound_ratio", "policy_lag_max", "queue_occupancy_cv"}


def test_report_asp_simulate_cli_end_to_end(tmp_path):
    out = tmp_path / "sim"
    rc = main(["simulate", TINY, f"output_dir={out}", *SMALL, "sim.sweep_devices=[4,8]",
               "sim.sweep_rollout_devices=[2,6]"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary.pop("schema_version") == 1
    assert set(summary) == {"sync_colocated", "single_instance", "one_step_off", "fully_async_fifo", "async_sorted",
                            "asp", "asp_adaptive"}
    for entry in summary.values():
        assert DESIGN_KEYS <= set(entry)
        # per instance after iteration 0 (metrics.instance_split_entry): every instance, shares summing to 1
        split = entry["instance_split"]
        assert [r["instance"] for r in split["instances"]] == list(range(len(split["instances"])))
        assert sum(r["token_share"] for r in split["instances"]) == pytest.approx(1.0)
        assert all(0 < r["busy"] <= 1 for r in split["instances"]) and split["window_s"] > 0
    assert len(summary["asp"]["instance_split"]["instances"]) == 4      # 4 rollout devices, TP 1
    for png in ("bubbles.png", "policy_lag.png", "queue_occupancy.png", "gantt_asp.png", "scaling.png"):
        assert (out / png).stat().st_size > 1000, png
    for D in (4, 8):
        assert (out / "sweep" / f"devices_{D}" / "summary.json").is_file()
    for Dr in (2, 6):
        split = json.loads((out / "split" / f"rollout_{Dr}" / "summary.json").read_text())
        assert "sync_colocated" not in split and "asp" in split
    report = (out / "report.md").read_text()
    assert "| asp |" in report and "## Scaling" in report and "scaling.png" in report
    assert "## Per-instance split" in report and "| asp | 4 |" in report
    assert "## Rollout/trainer split" in report and (out / "split.png").is_file()
    assert (out / "config.yaml").is_file() and (out / "timeline_asp.jsonl").is_file()
    # `asp report` regenerates the report from the files alone
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert "| asp |" in (out / "report.md").read_text()


def test_report_training_run_directory(tmp_path):
    # a training run leaves timeline.jsonl, metrics.jsonl and config.yaml (DESIGN 6)
    cfg = load_config(None, SMALL + ["pipeline.mode=async", "scheduler.policy=fifo", "rollout.num_instances=4"])
    res = simulate_system(cfg, workload_from_config(cfg), "fully_async_fifo")
    run = tmp_path / "run"
    res.timeline.write_jsonl(run / "timeline.jsonl")
    save_resolved(cfg, run)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"iteration": i, "iteration_time_s": 1.0 + i, "reward_mean": 0.1 * i, "policy_lag_max": 1}) + "\n"
        for i in range(4)))
    assert run_report(run) == 0
    summary = json.loads((run / "summary.json").read_text())
    entry = summary["fully_async_fifo"]          # keyed by the simulator's name of the system
    assert DESIGN_KEYS <= set(entry)
    # the report computes the same figures from the file as the simulator did in memory
    assert entry["throughput"] == pytest.approx(res.summary["throughput"])
    assert entry["skew_bubble"] == pytest.approx(res.summary["skew_bubble"])
    for png in ("gantt.png", "queue_occupancy.png", "policy_lag.png", "bubbles.png", "iterations.png"):
        assert (run / png).stat().st_size > 1000, png
    assert "Training run report" in (run / "report.md").read_text()


def test_report_rejects_unknown_directory(tmp_path):
    with pytest.raises(DataError, match="neither simulation.json nor timeline.jsonl"):
        run_report(tmp_path)
    with pytest.raises(DataError, match="not a directory"):
        run_report(tmp_path / "missing")


def test_report_puts_a_run_beside_its_simulation(tmp_path, capsys):
    """`asp train` keys its summary by the simulator's name of its system (async + fifo ->
    fully_async_fifo); `asp simulate` adds the config's own system when sim.policies lacks it;
    `asp report RUN --sim SIM` puts the two rows side by side."""
    cfg = load_config(None, SMALL + ["pipeline.mode=async", "scheduler.policy=fifo", "rollout.num_instances=4"])
    run = tmp_path / "run"
    simulate_system(cfg, workload_from_config(cfg), "fully_async_fifo").timeline.write_jsonl(run / "timeline.jsonl")
    save_resolved(cfg, run)
    sim = tmp_path / "sim"
    args = SMALL + ["pipeline.mode=async", "scheduler.policy=fifo", "rollout.num_instances=4", "sim.policies=[asp]",
                    "sim.sweep_devices=[]", "sim.sweep_rollout_devices=[]", f"output_dir={sim}"]
    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "sim_tiny.yaml")
    assert main(["simulate", tiny, *args]) == 0
    assert "also simulating fully_async_fifo" in capsys.readouterr().out
    assert set(json.loads((sim / "summary.json").read_text())) >= {"asp", "fully_async_fifo"}
    assert main(["report", str(run), "--sim", str(sim)]) == 0
    report = (run / "report.md").read_text()
    assert "| fully_async_fifo (run) |" in report and "| fully_async_fifo (simulated) |" in report
    (sim / "summary.json").write_text(json.dumps({"asp": {}}))
    with pytest.raises(DataError, match="no entry 'fully_async_fifo'"):
        run_report(run, sim)


def _split_run(tmp_path) -> Path:
    """A hand-made training run on 3 instances, syncs ending at 2 and 8 (window [2, 8], 6 s): instance 0
    runs a [0, 4] (10 tokens) and b [1, 3] (6), instance 1 runs c [5, 8] (4), instance 2 nothing."""
    from asp_ascend.metrics import Timeline

    tl = Timeline()
    req = dict(epoch=0, sample=0, admission_version=0, t_first_token=None, prompt_length=3)
    for inst, pid, it, ta, tf, n in ((0, "a", 0, 0.0, 4.0, 10), (0, "b", 0, 1.0, 3.0, 6), (1, "c", 1, 5.0, 8.0, 4)):
        tl.add("request", instance=inst, prompt_id=pid, iteration=it, t_admit=ta, t_finish=tf, response_length=n, **req)
    tl.add("sync", t_start=1.5, t_end=2.0, version=1)
    tl.add("sync", t_start=7.5, t_end=8.0, version=2)
    run = tmp_path / "run"
    tl.write_jsonl(run / "timeline.jsonl")
    save_resolved(load_config(None, ["rollout.num_instances=3"]), run)
    return run


SPLIT_ROWS = ["| 0 | 16 | 80.0 % | 0.33 |", "| 1 | 4 | 20.0 % | 0.50 |", "| 2 | 0 | 0.0 % | 0.00 |"]


def test_report_tables_the_per_instance_split(tmp_path):
    run = _split_run(tmp_path)
    assert run_report(run) == 0
    summary = json.loads((run / "summary.json").read_text())
    summary.pop("schema_version")
    ((key, entry),) = summary.items()
    assert [r["tokens"] for r in entry["instance_split"]["instances"]] == [16, 4, 0]
    md = (run / "report.md").read_text()
    assert "## Per-instance split" in md and "(6.0 s, iteration 0 left out)" in md and "even: 33.3 %" in md
    table = md[md.index("| instance | tokens | token share | busy |"):].splitlines()
    assert table[2:5] == SPLIT_ROWS
    assert (run / "instances.png").stat().st_size > 1000
    # a summary.json written before the key existed: the report computes the split from the timeline
    entry.pop("instance_split")
    (run / "summary.json").write_text(json.dumps({key: entry}))
    assert run_report(run) == 0
    md = (run / "report.md").read_text()
    assert md[md.index("| instance |"):].splitlines()[2:5] == SPLIT_ROWS
    # one weight sync: no window after iteration 0
    entry["instance_split"] = None
    (run / "summary.json").write_text(json.dumps({key: entry}))
    assert run_report(run) == 0
    md = (run / "report.md").read_text()
    assert "no per-instance split" in md and "| instance |" not in md
