"""The adaptive re-planners (asp train's, pipeline/planning.replanner; verl's VerlSchedule.plan_epoch)
plan a later epoch with every key ``asp schedule`` plans the first with: one call,
scheduler/run.plan_one_epoch. Before, they called the planner with their own argument list and left
out rollout.tail_concurrency and speculative decoding, so the run's epochs 1.. had no tail rooms."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.pipeline.planning import replanner
from asp_ascend.scheduler.run import inputs_from_config, plan_epochs

N = 1024


def _config(tmp_path, *extra):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "w " * (i % 9 + 1)}) + "\n" for i in range(N)))
    rng = np.random.default_rng(5)
    # busy instances (about 700 tokens a sample) and one 8000-token prompt in 64: those set their
    # iterations' floor, and a light trainer leaves the tail to decide the iteration time
    means = np.where(np.arange(N) % 64 == 7, 8000, rng.lognormal(6.5, 0.4, N).astype(int))
    rows = [{"epoch": 0, "prompt_id": f"q{i}", "sample": s, "response_length": int(means[i] * rng.uniform(0.7, 1.3))}
            for i in range(N) for s in range(4)]
    hist = tmp_path / "h.csv"
    pd.DataFrame(rows).to_csv(hist, index=False)
    return load_config(None, [f"data.path={data}", f"lengths.path={hist}", "lengths.max_response_length=8192",
                              "train.group_size=4", "train.global_batch_size=128", "train.mini_batch_size=32",
                              "rollout.num_instances=16", "rollout.max_num_seqs=256", "cost.train_per_token=1e-7",
                              "cost.logprob_per_token=0", "cost.train_per_step=0.01", "cost.sync_s=0.1",
                              "data.prompt_length=words", *extra]), rows


@pytest.mark.parametrize("extra", [["rollout.tail_concurrency=48"], ["rollout.tail_concurrency=auto"],
                                   ["rollout.tail_concurrency=48", "rollout.speculative=ngram",
                                    "rollout.speculative_max_batch=auto"]])
def test_replanned_epoch_is_planned_as_asp_schedule_plans_it(tmp_path, extra):
    cfg, rows = _config(tmp_path, *extra)
    inp = inputs_from_config(cfg, None, pd.DataFrame(rows))
    want = plan_epochs(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=2)), inp)
    first = want[want["epoch"] == 0]
    replan = replanner(cfg, None, 1, tmp_path, first.reset_index(drop=True))
    replan(1, rows, int(first["iteration"].max()) + 1)
    got = pd.read_parquet(tmp_path / "schedule.parquet")
    assert (want["room"] > 0).any(), "the case must give some group a tail room, or it tests nothing"
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)
