"""The simulator memoises guided dispatch's remaining-work questions for a whole run
(``Dispatcher.memo_running``): every decision must be the one asked afresh would give. A run
with the memo switched off (every steal attempt asks every victim anew) must give the same
timeline, steal for steal (and the steal test's partial sums, SimProgress.remaining_reaches,
the decisions of the exact sums)."""
from __future__ import annotations

import pytest

from asp_ascend.config import load_config
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.admission import Dispatcher
from asp_ascend.sim.mechanisms import SimProgress
from asp_ascend.sim.run import simulate_system

# small, heavy-tailed, many instances (many thieves per pass), guided dispatch with re-estimation
SETUP = {"workload.type": "synthetic", "workload.num_prompts": 256, "workload.epochs": 2,
         "lengths.max_response_length": 4096, "workload.body_median": 300, "workload.tail_scale": 1500,
         "train.group_size": 4, "train.global_batch_size": 64, "train.mini_batch_size": 16,
         "train.micro_batch_size": 8, "rollout.max_num_seqs": 32, "pipeline.lag_bound": 1,
         "sim.total_devices": 32, "sim.rollout_devices": 16, "sim.infer_tp": 1, "sim.epochs": 1,
         "scheduler.dispatch": "guided", "scheduler.reestimate": "true", "rollout.speculative": "none"}


def _run(policy: str, **over):
    cfg = load_config(None, [f"{k}={v}" for k, v in {**SETUP, **over}.items()])
    res = simulate_system(cfg, workload_from_config(cfg), policy, record_samples=True)
    req = res.timeline.frame("request").sort_values(["prompt_id", "sample"], kind="stable").reset_index(drop=True)
    return res.summary, req


@pytest.mark.parametrize("policy,tail", [("asp", "off"), ("asp_partial", "off"), ("asp", "reactive")])
def test_memoised_steal_decisions_equal_fresh_ones(policy, tail, monkeypatch):
    # with the memo the steal test asks SimProgress.remaining_reaches, which answers a thief's
    # reports only as far as the test needs (reactive caps: thieves ask at every boundary)
    asked = []
    reaches = SimProgress.remaining_reaches
    monkeypatch.setattr(SimProgress, "remaining_reaches", lambda self, keys, enough: asked.append(1) or reaches(
        self, keys, enough))
    memo_summary, memo_req = _run(policy, **{"rollout.tail_concurrency": tail})
    assert memo_summary["stolen_groups"] > 0 and asked          # the memo was exercised
    if tail == "reactive":
        assert memo_summary["tail_capped_groups"] > 0
    monkeypatch.setattr(Dispatcher, "memo_running", lambda self, on: None)   # never memoise
    fresh_summary, fresh_req = _run(policy, **{"rollout.tail_concurrency": tail})
    assert fresh_summary["stolen_groups"] == memo_summary["stolen_groups"]
    assert fresh_summary["iteration_time_mean"] == memo_summary["iteration_time_mean"]
    cols = ["prompt_id", "sample", "instance", "t_admit", "t_finish"]
    assert fresh_req[cols].equals(memo_req[cols])
