"""The tiny model's word-level tokenizer loads through ``AutoTokenizer`` (what verl's ``hf_tokenizer`` and
vLLM call) as the fast tokenizer it is, and round-trips text. transformers maps a Qwen2 model's
``TokenizersBackend`` tokenizer to ``Qwen2Tokenizer``, which encoded this vocabulary to ``[]``."""
from __future__ import annotations

import json

from asp_ascend.engines.tiny_model import build_tiny_model, load_tokenizer

VOCAB = ["<pad>", "<eos>", "<unk>", "what", "is", "one", "plus", "two"]


def test_auto_tokenizer_round_trips_the_tiny_models_text(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out = build_tiny_model(VOCAB, tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(out)
    assert isinstance(tok, PreTrainedTokenizerFast) and type(tok).__name__ != "Qwen2Tokenizer"
    text = "what is one plus two"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [3, 4, 5, 6, 7]                       # one id per word, in the vocabulary's order
    assert tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert load_tokenizer(out).encode(text, add_special_tokens=False) == ids
