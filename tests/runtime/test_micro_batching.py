"""The trainer's micro-batching (train.micro_batching, train.max_tokens_per_micro_batch) on the
tiny Qwen2 model in float32.

- The same optimizer steps (with pi_prox, the KL reference and several micro-batches of unequal
  token counts) give the same gradient whether the micro-batches are padded in arrival order,
  sorted or packed: the loss normaliser does not depend on the grouping.
- The trainer's packed forward (its platform's varlen attention) gives every response token the
  log-prob of the padded forward.
- ``auto`` packs on the CPU; a model whose attention mixes packed sequences makes ``auto`` sort
  and ``packed`` an error naming the key.
- With two ranks, every rank gets the same number of micro-batches and nearly equal tokens.
"""
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from asp_ascend.algos.grpo import LossConfig  # noqa: E402
from asp_ascend.engines.fsdp_trainer import split_micro_batches  # noqa: E402
from asp_ascend.engines.packing import build_micro_batch, micro_batch_logprobs  # noqa: E402
from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary  # noqa: E402
from asp_ascend.engines.trainer import TrainerEngine  # noqa: E402
from asp_ascend.platforms.attention import VARLEN_SDPA  # noqa: E402
from rt_common import ignores_positions  # noqa: E402

WORDS = " ".join(str(i) for i in range(40))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(task_vocabulary([WORDS]), tmp_path_factory.mktemp("mb") / "model", hidden_size=32,
                            num_layers=2, num_heads=4, num_kv_heads=2, max_positions=256, seed=0)


def _trainer(tiny, mode: str, max_tokens: int = 0, micro: int = 4) -> TrainerEngine:
    torch.set_num_threads(1)
    return TrainerEngine(str(tiny), lr=1e-3, weight_decay=0.0, micro_batch_size=micro, temperature=0.9, seed=0,
                         loss=LossConfig(kl_coef=0.05, off_policy="decoupled_ppo"), top_p=0.95,
                         micro_batching=mode, max_tokens_per_micro_batch=max_tokens)


def _samples(n: int, seed: int, version: int = 0) -> list[dict]:
    """Heavy-tailed response lengths (1..60 tokens) after 2..6 prompt tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(3, 40) for _ in range(rng.randrange(2, 7))]
        r = [rng.randrange(3, 40) for _ in range(min(60, int(rng.paretovariate(0.9))))]
        out.append({"prompt_ids": p, "response_ids": r, "behav_logprobs": [rng.uniform(-4, -3) for _ in r],
                    "advantage": rng.uniform(-1, 1), "version_first": version, "version_last": version})
    return out


def _grads(tr: TrainerEngine) -> dict:
    return {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}


def test_same_gradient_whatever_the_grouping(tiny):
    """Two optimizer steps of one iteration (the second against pi_prox, both with the KL term):
    padded, sorted and packed micro-batches under a budget that cuts each step several times."""
    batches = [_samples(11, 1), _samples(9, 2)]
    runs = {}
    for mode in ("padded", "sorted", "packed"):
        tr = _trainer(tiny, mode, max_tokens=96)
        assert tr.micro_batching == mode
        tr.begin_iteration(0, 2)
        runs[mode] = []
        for b in batches:
            n_mb = len(tr.micro_batches(b))
            st = tr.train_step(b)
            runs[mode].append((st, _grads(tr), n_mb))
    for step in range(len(batches)):
        ref_st, ref_g, n_pad = runs["padded"][step]
        assert n_pad >= 3  # several micro-batches with unequal token counts
        for mode in ("sorted", "packed"):
            st, g, _ = runs[mode][step]
            for k in ("loss", "grad_norm", "kl", "clip_frac", "is_weight_mean"):
                assert st[k] == pytest.approx(ref_st[k], rel=1e-4, abs=1e-7), (mode, step, k)
            assert st["tokens"] == ref_st["tokens"]
            for name, t in ref_g.items():
                torch.testing.assert_close(g[name], t, rtol=1e-4, atol=1e-7, msg=f"{mode} step {step} {name}")
    assert runs["packed"][0][0]["padded_tokens"] == 0
    assert runs["sorted"][0][0]["padded_tokens"] < runs["padded"][0][0]["padded_tokens"]


def test_trainer_packed_logprobs_equal_padded(tiny):
    tr = _trainer(tiny, "auto")
    assert tr.micro_batching == "packed" and tr.varlen
    assert tr.model.config._attn_implementation == VARLEN_SDPA
    samples = _samples(24, 5)
    seqs = [s["prompt_ids"] + s["response_ids"] for s in samples]
    offs = [len(s["prompt_ids"]) for s in samples]
    resp = [[1.0] * len(s["response_ids"]) for s in samples]
    with torch.no_grad():
        got = []
        for packed in (False, True):
            mb = build_micro_batch(seqs, packed=packed, pad_id=tr.pad_id, varlen=packed)
            lp = micro_batch_logprobs(tr.model, mb, tr.temperature, tr.top_p)
            got.append(lp[mb.per_token(resp, offs).bool()])
    assert got[0].numel() == sum(len(r) for r in resp)
    torch.testing.assert_close(got[1], got[0], rtol=0, atol=1e-5)


def test_auto_sorts_and_packed_refuses_when_attention_mixes_sequences(tiny):
    tr = _trainer(tiny, "padded")
    assert tr.micro_batching == "padded"
    bad = ignores_positions(tr.model)
    assert tr._resolve_micro_batching("auto", bad, "sdpa") == "sorted"
    with pytest.raises(ValueError, match="train.micro_batching: packed.*sorted"):
        tr._resolve_micro_batching("packed", bad, "sdpa")
    with pytest.raises(ValueError, match="train.micro_batching"):
        _trainer(tiny, "pack")


@pytest.mark.parametrize("mode", ["padded", "sorted", "packed"])
def test_two_ranks_get_equal_micro_batch_counts_and_near_equal_tokens(mode):
    samples = _samples(64, 9)
    for budget in (0, 120, 400):
        shares = split_micro_batches(samples, 2, mode, budget, 8)
        counts = [len(mbs) for _, mbs in shares]
        assert counts[0] == counts[1] >= 1
        seen = sorted(id(s) for sh, _ in shares for s in sh)
        assert seen == sorted(id(s) for s in samples)
        size = lambda s: len(s["prompt_ids"]) + len(s["response_ids"])  # noqa: E731
        slots = []
        spread = []
        for sh, mbs in shares:
            assert sorted(i for mb in mbs for i in mb) == list(range(len(sh)))
            cost = [sum(size(sh[i]) for i in mb) if mode == "packed" else len(mb) * max(size(sh[i]) for i in mb)
                    for mb in mbs]
            slots.append(sum(cost))
            spread += cost
        bound = max(size(s) for s in samples) if mode == "packed" else max(spread) - min(spread)
        assert abs(slots[0] - slots[1]) <= bound


@pytest.mark.runtime
def test_asp_train_packs_by_default_on_the_cpu(async_run):
    """The shared end-to-end run (conftest.async_run) leaves train.micro_batching at auto: on the
    CPU every optimizer step is packed, so the run's padding bubble is zero."""
    import json

    from asp_ascend.metrics import Timeline

    out, cfg = async_run
    assert cfg.train.micro_batching == "auto"
    steps = Timeline.read_jsonl(out / "timeline.jsonl").events["step"]
    assert steps and all(st["padded_tokens"] == 0 and st["tokens"] > 0 for st in steps)
    assert json.loads((out / "summary.json").read_text())["asp_adaptive"]["padding_bubble"] == 0.0
