"""The runtime on CUDA: vLLM instances on their own GPU, the trainer on another, weights over NCCL.

Runs wherever at least two CUDA GPUs and the CUDA stack (torch CUDA build, vllm, ray) exist;
skips cleanly elsewhere (NCCL refuses two ranks on one device).
"""
import json

import pytest
from rt_common import CONFIG, SMALL, stack_missing

pytestmark = [pytest.mark.runtime, pytest.mark.gpu,
              pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing()))]


def _gpus() -> int:
    from asp_ascend.platforms import CudaPlatform

    p = CudaPlatform()
    return p.device_count() if p.is_available() else 0


@pytest.mark.parametrize("transport", ["broadcast", "object_store"])
def test_cuda_run_syncs_weights_that_match_the_trainer(tmp_path, transport):
    if _gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs (one rollout instance + the trainer)")
    from asp_ascend.config import load_config
    from asp_ascend.metrics import Timeline
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, SMALL + ["platform=cuda", "pipeline.mode=sync", "scheduler.policy=fifo",
                                       "rollout.num_instances=1", "train.eval_every=0", "train.epochs=1",
                                       f"weight_sync.transport={transport}", "weight_sync.bucket_mb=1",
                                       f"output_dir={tmp_path}"])
    assert run_train(cfg) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["logprob_diff_max"] for r in rows]
    assert None not in diffs and max(diffs) < 1e-2  # float32 on both sides; GPU kernels differ slightly
    syncs = Timeline.read_jsonl(tmp_path / "timeline.jsonl").events["sync"]
    assert [e["version"] for e in syncs] == list(range(1, len(rows) + 1))


@pytest.mark.parametrize("speculative", ["none", "ngram"])
def test_speculative_decoding_keeps_the_target_models_logprobs(tmp_path, speculative):
    """rollout.speculative=ngram (vLLM's speculative_config): the behaviour log-probs vLLM records
    equal the trainer's forward pass of the target model, with speculation on or off, and the
    timeline holds each group's tokens per engine step (the CPU twin: test_runtime_tail.py)."""
    if _gpus() < 2:
        pytest.skip("needs 2 CUDA GPUs (one rollout instance + the trainer)")
    from asp_ascend.config import load_config
    from asp_ascend.metrics import Timeline
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, SMALL + ["platform=cuda", "pipeline.mode=sync", "scheduler.policy=fifo",
                                       "rollout.num_instances=1", "train.eval_every=0", "train.epochs=1",
                                       f"rollout.speculative={speculative}", "rollout.num_speculative_tokens=3",
                                       "rollout.speculative_max_batch=always", f"output_dir={tmp_path}"])
    assert run_train(cfg) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["logprob_diff_max"] for r in rows]
    assert None not in diffs and max(diffs) < 1e-2
    spec = Timeline.read_jsonl(tmp_path / "timeline.jsonl").events["speculative"]
    assert bool(spec) == (speculative != "none")
    assert all(e["tokens_per_step"] >= 1.0 for e in spec)
