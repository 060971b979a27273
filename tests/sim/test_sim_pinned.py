"""`asp simulate` results pinned: same seed, same summary numbers, across refactors of the engine.

The golden file ``data/pinned_summaries.json`` was written by the engine before its event
loop was split into instances / trainer / loop (and before the tail mechanisms were wired in,
which are turned off here explicitly, so the file keeps describing the engine with those
mechanisms off; the one exception is the ``kv_guided`` setup, which turns guided dispatch on to
pin stealing, without re-estimation). A change of the simulator's behaviour shows up here as a
changed number.
Regenerate only for an intended change of behaviour: ``ASP_REPIN=1 pytest tests/sim/test_sim_pinned.py``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asp_ascend.config import load_config
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.metrics import summarize
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.bounds import lower_bounds
from asp_ascend.sim.engine import Engine, TrainerSpec
from asp_ascend.sim.trainer import micro_batch_table
from asp_ascend.sim.run import build_jobs, run_points, system_for

GOLDEN = Path(__file__).parent / "data" / "pinned_summaries.json"
KEYS = ("throughput", "iteration_time_mean", "iteration_time_p50", "iteration_time_p99", "padding_bubble",
        "skew_bubble", "sorting_bubble", "lower_bound_ratio", "policy_lag_max", "queue_occupancy_cv",
        "run_time_s", "preemptions", "stolen_groups")
POLICIES = ["sync_colocated", "single_instance", "one_step_off", "fully_async_fifo", "async_sorted",
            "async_random", "async_balanced", "asp", "asp_adaptive"]
# every tail mechanism off, and streaming (asp's default since 2026-12-03), and prefix caching (on
# by default since f99eda5): the engine as it was before they were wired in (prefix caching off
# must give the old numbers exactly), and the planner's dispatch of the first iteration ahead of later ones
# (scheduler.fill_first, asp's default since 2026-12-04) and its rule for which groups it pulls forward
# (scheduler.pull_forward: needed, asp's default since 2026-12-04; rounded before)
OFF = {"scheduler.dispatch": "static", "scheduler.reestimate": "false", "rollout.tail_concurrency": "off",
       "rollout.speculative": "none", "rollout.partial_rollout": "false", "pipeline.regroup": "off",
       "pipeline.stream_groups": "off", "rollout.prefix_caching": "false", "scheduler.fill_first": "false",
       "scheduler.pull_forward": "rounded"}

SETUPS = {
    "small": {"workload.type": "synthetic", "workload.num_prompts": 96, "workload.epochs": 3, "workload.drift": 0.1,
              "lengths.max_response_length": 2048, "workload.body_median": 200, "workload.tail_scale": 600,
              "train.group_size": 4, "train.global_batch_size": 16, "train.mini_batch_size": 4,
              "train.micro_batch_size": 4, "rollout.max_num_seqs": 16, "pipeline.lag_bound": 2,
              "sim.micro_batching": "padded",
              "sim.total_devices": 8, "sim.rollout_devices": 4, "sim.infer_tp": 1, "sim.epochs": 2},
    # KV pressure (preemptions), no pause during syncs, guided dispatch (stealing), sorted micro-batches
    "kv_guided": {"workload.type": "synthetic", "workload.num_prompts": 128, "workload.epochs": 2,
                  "lengths.max_response_length": 3000, "workload.body_median": 300, "workload.tail_scale": 900,
                  "train.group_size": 4, "train.global_batch_size": 32, "train.mini_batch_size": 8,
                  "train.micro_batch_size": 8, "rollout.max_num_seqs": 32, "pipeline.lag_bound": 1,
                  "sim.model_class": "custom", "rollout.kv_cache_tokens": 12000, "sim.rollout_sync_pause": "false",
                  "sim.micro_batching": "sorted", "sim.total_devices": 12, "sim.rollout_devices": 6,
                  "sim.infer_tp": 1, "sim.epochs": 1, "scheduler.dispatch": "guided"},
}


def _cfg(setup: dict):
    over = {**OFF, **setup}
    return load_config(None, [f"{k}={v}" for k, v in over.items()])


def _pick(s: dict) -> dict:
    return {k: s[k] for k in KEYS if k in s}


def _replay_summary(cfg, workload) -> dict:
    """The calibration replay's path: group slots, runtime overheads (publish, step and admission latency)."""
    spec = system_for(cfg, "asp")
    cm = CostModel(decode_a=0.02, decode_b=3e-8, decode_c=2e-4, prefill_per_token=5e-5)
    jobs = build_jobs(workload, cfg, spec, cm)
    tr = TrainerSpec(2e-5, 0.3, 1.5, 8, "padded", publish_s=0.4, step_latency_s=0.05, admit_latency_s=0.2)
    st = ExecutionSettings(policy="asp", lag_bound=1, group_size=jobs.group_size, max_num_seqs=16,
                           num_instances=spec.num_instances)
    eng = Engine(jobs, st, cost=cm, kv_capacity=0, trainer=tr, group_slots=True)
    tl = eng.run()
    lb = lower_bounds(jobs, micro_batch_table(jobs, 8, "padded"), tr.train_per_token, tr.train_per_step, cm,
                      spec.num_instances, 16, 0, 1)
    s = summarize(tl, num_instances=spec.num_instances, max_num_seqs=16, lag_bound=1, lower_bounds=lb)
    s["preemptions"] = int(sum(eng.preemptions))
    return _pick(s)


def _current(tmp_path) -> dict:
    out = {}
    for name, setup in SETUPS.items():
        cfg = _cfg(setup)
        w = workload_from_config(cfg)
        d = tmp_path / name
        d.mkdir()
        run_points(cfg, w, POLICIES, d, write_timelines=False, echo=lambda *_: None)
        summ = json.loads((d / "summary.json").read_text())
        out[name] = {p: _pick(s) for p, s in summ.items() if isinstance(s, dict)}
    cfg = _cfg(SETUPS["small"])
    out["replay_overheads"] = _replay_summary(cfg, workload_from_config(cfg))
    return out


def test_sim_summaries_match_the_pinned_numbers(tmp_path):
    got = _current(tmp_path)
    if os.environ.get("ASP_REPIN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for setup, rows in want.items():
        for name, row in rows.items():
            if not isinstance(row, dict):      # replay_overheads: one flat summary
                assert got[setup][name] == pytest.approx(row, rel=1e-9, abs=1e-12), (setup, name)
                continue
            assert got[setup][name] == pytest.approx(row, rel=1e-9, abs=1e-12), (setup, name)
