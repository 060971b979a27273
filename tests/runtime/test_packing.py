"""Packed micro-batches (engines/packing.py) against padded ones on the tiny Qwen2 model, float32.

One packed row (position resets, no pad token) must give every sequence the log-probs of the
padded forward, for the plain distribution, with temperature and with the rollout's top-p
nucleus, and the same gradient of a token-sum loss, with transformers' dense SDPA/eager masks
and with the varlen SDPA the trainer uses on the CPU (platforms/attention.py). The probe that
decides whether a backend packs must accept these and refuse a model that ignores position resets.
"""
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from asp_ascend.engines.packing import build_micro_batch, micro_batch_logprobs, packing_supported  # noqa: E402
from asp_ascend.platforms.attention import VARLEN_SDPA, length_classes, register_varlen_sdpa  # noqa: E402
from rt_common import ignores_positions  # noqa: E402

VOCAB = 48


def _model(attn: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    register_varlen_sdpa()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=0)
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).float()


def _seqs(n: int = 7, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 6))]
        r = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        out.append((p, r))
    return out


def _response_logprobs(model, seqs, packed: bool, temperature=1.0, top_p=1.0):
    varlen = packed and model.config._attn_implementation == VARLEN_SDPA
    mb = build_micro_batch([p + r for p, r in seqs], packed=packed, pad_id=0, varlen=varlen)
    lp = micro_batch_logprobs(model, mb, temperature, top_p)
    mask = mb.per_token([[1.0] * len(r) for _, r in seqs], [len(p) for p, _ in seqs])
    return lp, mask, mb


@pytest.mark.parametrize("attn", ["sdpa", "eager", VARLEN_SDPA])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_packed_logprobs_equal_padded(attn, temperature, top_p):
    model = _model(attn).eval()
    seqs = _seqs()
    with torch.no_grad():
        lp_pad, m_pad, pad = _response_logprobs(model, seqs, False, temperature, top_p)
        lp_pack, m_pack, pack = _response_logprobs(model, seqs, True, temperature, top_p)
    assert pack.input_ids.shape[0] == 1 and pack.slots == pack.tokens  # one row, no pad token
    assert pad.slots > pad.tokens
    got = lp_pack[m_pack.bool()]
    want = lp_pad[m_pad.bool()]
    assert got.numel() == sum(len(r) for _, r in seqs)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", VARLEN_SDPA])
def test_packed_gradient_equals_padded(attn):
    seqs = _seqs(9, seed=3)
    adv = [random.Random(i).uniform(-1, 1) for i in range(len(seqs))]
    grads = []
    for packed in (False, True):
        model = _model(attn)
        mb = build_micro_batch([p + r for p, r in seqs], packed=packed, pad_id=0, varlen=packed and attn == VARLEN_SDPA)
        offs, counts = [len(p) for p, _ in seqs], [len(r) for _, r in seqs]
        lp = micro_batch_logprobs(model, mb)
        mask = mb.per_token([[1.0] * c for c in counts], offs)
        a = mb.per_sequence(adv, offs, counts)
        (lp * a * mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_per_token_places_values_on_response_positions():
    mb = build_micro_batch([[1, 2, 3, 4], [5, 6, 7]], packed=True, pad_id=0)
    vals = mb.per_token([[10.0, 11.0], [20.0]], [2, 2])
    # targets row: 2 3 4 | 5 6 7 -> response of seq 0 = tokens 3, 4 at columns 1, 2; seq 1 = token 7 at column 5
    assert vals.tolist() == [[0.0, 10.0, 11.0, 0.0, 0.0, 20.0]]
    assert mb.forward_kwargs["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    seq = mb.per_sequence([1.5, -2.0], [2, 2], [2, 1])
    assert seq.tolist() == [[0.0, 1.5, 1.5, 0.0, 0.0, -2.0]]


def test_varlen_kwargs():
    mb = build_micro_batch([[1, 2, 3], [4, 5]], packed=True, pad_id=0, varlen=True)
    assert mb.forward_kwargs["cu_seq_lens_q"].tolist() == [0, 3, 5]
    assert mb.forward_kwargs["max_length_k"] == 3


def test_probe_accepts_sdpa_and_eager_refuses_mixing():
    for attn in ("sdpa", "eager"):
        ok, diff = packing_supported(_model(attn))
        assert ok and diff < 1e-5, (attn, diff)
    ok, diff = packing_supported(_model(VARLEN_SDPA), varlen=True)
    assert ok and diff < 1e-5, diff
    ok, diff = packing_supported(ignores_positions(_model()))
    assert not ok and diff > 1e-3


def test_varlen_sdpa_length_classes_keep_sequences_apart():
    """Lengths 1..97 in one row: classes within a factor of two, every token in exactly one class,
    and each sequence's log-probs equal to those it gets alone."""
    lens = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 97, 4, 64, 65]
    bounds = (0, *[sum(lens[:i + 1]) for i in range(len(lens))])
    classes = length_classes(bounds)
    covered = sorted(int(x) for index, valid, _ in classes for x in index[valid])
    assert covered == list(range(sum(lens)))
    for index, valid, _ in classes:
        n = valid.sum(1)
        assert int(n.max()) <= 2 * int(n.min()) or int(n.max()) <= 2
    model = _model(VARLEN_SDPA).eval()
    rng = random.Random(7)
    seqs = [[rng.randrange(1, VOCAB) for _ in range(n + 1)] for n in lens]
    with torch.no_grad():
        mb = build_micro_batch(seqs, packed=True, pad_id=0, varlen=True)
        lp = micro_batch_logprobs(model, mb)[0]
        for s, st in zip(seqs, mb.starts):
            alone = micro_batch_logprobs(model, build_micro_batch([s], packed=False, pad_id=0))[0]
            torch.testing.assert_close(lp[int(st):int(st) + len(s) - 1], alone, rtol=0, atol=1e-5)
