"""Shared small end-to-end runs of `asp train` (real Ray + vLLM-CPU), one per session.

Skipped cleanly when the runtime stack (torch, ray, vllm, transformers) is not installed.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # rt_common.py lives next to the tests
from rt_common import CONFIG, SMALL, stack_missing  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Qwen2 (hidden 32, one layer) over the words a..p, for the trainer's own tests
    (torch + transformers; no Ray, no vLLM). A module may define its own ``tiny`` instead."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary

    return build_tiny_model(task_vocabulary(["a b c d e f g h i j k l m n o p"]),
                            tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1, num_heads=2,
                            num_kv_heads=1, max_positions=64, seed=0)


def _run(out: Path, overrides: list[str]):
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, SMALL + overrides + [f"output_dir={out}"])
    assert run_train(cfg) == 0
    return out, cfg


@pytest.fixture(scope="session")
def async_run(tmp_path_factory):
    """Async, k = 1, ASP schedule, two instances, 2 epochs = 8 iterations, 2 optimizer steps each;
    epoch 1 re-planned from the lengths observed in epoch 0 (scheduler.adaptive)."""
    if stack_missing():
        pytest.skip(stack_missing())
    return _run(tmp_path_factory.mktemp("async_run"),
                ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", "train.epochs=2",
                 "scheduler.adaptive=true",
                 "rollout.num_instances=2", "rollout.num_cpus=0.5", "train.num_cpus=1", "train.checkpoint_every=4"])


@pytest.fixture(scope="session")
def sync_run(tmp_path_factory):
    """The synchronous baseline on the same code path: fifo (shared queue), one instance; weights
    reach the instance by the bucketed broadcast (gloo on CPU) instead of the object store, and
    the rollout samples from a top-p nucleus (the trainer must score the same distribution); the
    instance runs vLLM with tensor parallelism 2 (two CPU workers, each receiving the broadcast)."""
    if stack_missing():
        pytest.skip(stack_missing())
    return _run(tmp_path_factory.mktemp("sync_run"),
                ["pipeline.mode=sync", "pipeline.lag_bound=1", "scheduler.policy=fifo", "train.epochs=1",
                 "rollout.num_instances=1", "rollout.num_cpus=1", "train.num_cpus=1", "train.eval_every=0",
                 "weight_sync.transport=broadcast", "weight_sync.bucket_mb=1", "rollout.top_p=0.9",
                 "rollout.devices_per_instance=2"])
