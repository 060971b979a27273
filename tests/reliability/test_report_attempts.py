"""`asp report` on a resumed run covers every attempt (the earlier ones under previous/)."""
import json

from asp_ascend.config import load_config, save_resolved
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.report.run import run_report
from asp_ascend.sim.run import simulate_system

SMALL = ["workload.type=synthetic", "workload.num_prompts=32", "workload.epochs=2", "lengths.max_response_length=512",
         "workload.body_median=100", "workload.tail_scale=300", "train.group_size=2", "train.global_batch_size=8",
         "train.mini_batch_size=8", "rollout.max_num_seqs=8", "sim.total_devices=4", "sim.rollout_devices=2",
         "sim.infer_tp=1", "pipeline.mode=async", "scheduler.policy=fifo", "rollout.num_instances=2"]


def _rows(its):
    return "".join(json.dumps({"iteration": i, "policy_version": i + 1, "iteration_time_s": 1.0, "reward_mean": 0.1 * i,
                               "policy_lag_max": 1}) + "\n" for i in its)


def test_report_of_a_resumed_run_covers_previous_attempts(tmp_path):
    cfg = load_config(None, SMALL)
    res = simulate_system(cfg, workload_from_config(cfg), "fully_async_fifo")
    run = tmp_path / "run"
    res.timeline.write_jsonl(run / "timeline.jsonl")
    save_resolved(cfg, run)
    (run / "metrics.jsonl").write_text(_rows(range(5, 8)))
    for n, its in ((1, range(0, 3)), (2, range(3, 5))):
        d = run / "previous" / f"attempt_{n}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(_rows(its))
    assert run_report(run) == 0
    md = (run / "report.md").read_text()
    assert "## Attempts" in md and "resumed 2 time(s)" in md
    assert "| 1 | `previous/attempt_1` | 0-2 | 3 |" in md and "| 3 | `.` | 5-7 | 3 |" in md
    assert "8 iterations in metrics.jsonl (3 attempts)." in md
