"""The engine's fast path for systems without tail mechanisms (sim/engine.py, ``Engine.plain``)
admits exactly what the general path (the feeder's room rule and gate, the mechanism glue)
admits: same timeline, same summary, for every such system policy."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.mechanisms import SimMechanisms
from asp_ascend.sim.run import simulate_system

OFF = {"scheduler.dispatch": "static", "scheduler.reestimate": "false", "rollout.tail_concurrency": "off",
       "rollout.partial_rollout": "false"}
BASE = {"workload.type": "synthetic", "workload.num_prompts": 160, "workload.epochs": 3, "workload.drift": 0.1,
        "lengths.max_response_length": 3000, "workload.body_median": 250, "workload.tail_scale": 900,
        "train.group_size": 4, "train.global_batch_size": 32, "train.mini_batch_size": 8,
        "train.micro_batch_size": 4, "rollout.max_num_seqs": 24, "pipeline.lag_bound": 1,
        "sim.total_devices": 12, "sim.rollout_devices": 6, "sim.infer_tp": 1, "sim.epochs": 2}
SETUPS = {
    "plain": {},
    # KV pressure (preemptions), instances decoding through the weight syncs, speculative decoding
    "kv_nopause_spec": {"sim.model_class": "custom", "rollout.kv_cache_tokens": 9000,
                        "sim.rollout_sync_pause": "false", "rollout.speculative": "ngram"},
}
PLAIN = ["sync_colocated", "single_instance", "fully_async_fifo", "async_sorted", "async_random", "async_balanced",
         "asp", "asp_adaptive"]


@pytest.mark.parametrize("setup", list(SETUPS))
def test_fast_path_gives_the_general_paths_results(setup):
    cfg = load_config(None, [f"{k}={v}" for k, v in {**BASE, **OFF, **SETUPS[setup]}.items()])
    w = workload_from_config(cfg)
    preempted = 0
    for name in PLAIN:
        fast = simulate_system(cfg, w, name, record_samples=True)
        general = simulate_system(cfg, w, name, record_samples=True, fast_path=False)
        assert fast.summary == general.summary, name
        for kind in ("request", "step", "sync", "queue"):
            pd.testing.assert_frame_equal(fast.timeline.frame(kind), general.timeline.frame(kind), obj=f"{name} {kind}")
        preempted += fast.preemptions
    if setup == "kv_nopause_spec":
        assert preempted > 0           # the KV path was exercised


def _engine(dispatch: str, mech, fast_path: bool = True):
    jobs = SimJobs(epoch=np.zeros(4, np.int64), prompt_id=np.array([f"p{i}" for i in range(4)], dtype=object),
                   iteration=np.array([0, 0, 1, 1]), mini_batch=np.zeros(4, np.int64), instance=np.array([0, 1, 0, 1]),
                   dispatch_rank=np.arange(4), prompt_length=np.ones(4, np.int64),
                   resp=np.array([[3, 5], [2, 2], [4, 1], [6, 2]]), predicted_length=np.array([4.0, 2.0, 3.0, 4.0]))
    settings = ExecutionSettings(policy="asp", num_instances=2, max_num_seqs=2, lag_bound=1, group_size=2,
                                 dispatch=dispatch)
    tr = TrainerSpec(train_per_token=0.0, train_per_step=1.0, sync_s=0.5)
    eng = Engine(jobs, settings, cost=CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0),
                 kv_capacity=0, trainer=tr, mechanisms=mech, fast_path=fast_path)
    return eng, eng.run()


def test_fast_path_is_taken_only_without_mechanisms():
    eng, fast = _engine("static", None)
    assert eng.plain
    eng, general = _engine("static", None, fast_path=False)
    assert not eng.plain
    pd.testing.assert_frame_equal(fast.frame("request"), general.frame("request"))
    assert not _engine("guided", None)[0].plain
    assert not _engine("static", SimMechanisms(reestimate=True))[0].plain
    assert not _engine("static", SimMechanisms(tail_concurrency="auto"))[0].plain
