"""The tiny model's tokenizer is the same for every loader of its directory.

transformers loads any ``qwen2`` model's tokenizer as ``Qwen2Tokenizer`` (verl's pinned < 5.11 and
vLLM's >= 5.16 alike), so the directory ``build_tiny_model`` writes must tokenize identically
through ``AutoTokenizer`` in whichever environment runs this file: it runs in the default suite
(vLLM's stack) and, being ``verl``-marked without a skip, in verl's (``pytest -m verl``). The ids are
computed by hand from ``task_vocabulary``'s order (module doc of asp_ascend/engines/tiny_model.py).
"""
from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = [pytest.mark.verl,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                                 or importlib.util.find_spec("torch") is None,
                                 reason="needs transformers and torch (the cpu or verl stack: ci/env.sh)")]

TEXTS = ["count 1 to 12 :", "1 2 3 12"]
# task_vocabulary(TEXTS): <pad> <eos> <unk>, then the sorted words 1 12 2 3 : count to (ids 3..9);
# each word after a space: " 1" 10, " 12" 11, " 2" 12, " 3" 13, " :" 14, " count" 15, " to" 16;
# the byte-level space 17 and newline 18
WANT = {"count 1 to 12 :": [8, 10, 16, 11, 14],
        "1 2 3 12": [3, 12, 13, 11],
        "12 1\n": [4, 10, 18],
        "to  count": [9, 17, 15]}       # a second space is the space symbol


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary

    vocab = task_vocabulary(TEXTS)
    assert vocab[3:] == ["1", "12", "2", "3", ":", "count", "to"]
    return build_tiny_model(vocab, tmp_path_factory.mktemp("tok") / "model", hidden_size=16, num_layers=1,
                            num_heads=2, num_kv_heads=1)


def _check(tok):
    for text, ids in WANT.items():
        assert tok.encode(text, add_special_tokens=False) == ids, text
        assert tok.decode(ids) == text
    assert tok.decode([8, 10, 1, 0], skip_special_tokens=True) == "count 1"      # <eos>, <pad> dropped
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_auto_tokenizer_and_load_tokenizer_give_the_hand_computed_ids(model_dir):
    from transformers import AutoConfig, AutoTokenizer

    from asp_ascend.engines.tiny_model import load_tokenizer

    auto = AutoTokenizer.from_pretrained(model_dir)
    assert type(auto).__name__ == "Qwen2Tokenizer"
    _check(auto)
    _check(load_tokenizer(model_dir))
    assert len(auto) == 19 and AutoConfig.from_pretrained(model_dir).vocab_size == 32   # rounded up to 16s


def test_every_task_word_is_one_token_after_a_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from asp_ascend.data.synthetic import vocabulary
    from asp_ascend.engines.tiny_model import build_tokenizer, task_vocabulary

    class Syn:
        alphabet_size, max_answer_length = 20, 20

    vocab = task_vocabulary(vocabulary(Syn))
    build_tokenizer(vocab).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "count 7 to 40 : " + " ".join(str(i) for i in range(7, 41))
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.split()) and tok.decode(ids) == text
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    chat = tok.apply_chat_template([{"role": "user", "content": "count 3 to 5 :"}], tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    assert tok.decode(chat) == "count 3 to 5 :\n" and len(chat) == 6


def test_a_directory_written_before_the_qwen2_format_still_loads(tmp_path):
    """``load_tokenizer`` on a word-level ``tokenizers`` JSON (the format before): loaded as such."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from asp_ascend.engines.tiny_model import load_tokenizer

    raw = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2, "a": 3, "b": 4}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("a b x", add_special_tokens=False) == [3, 4, 2] and tok.decode([3, 4]) == "a b"


def test_vllm_tokenizes_the_directory_identically(model_dir):
    pytest.importorskip("vllm", reason="vLLM is in the cpu stack only (verl's stack has none)")
    from vllm.tokenizers import get_tokenizer

    _check(get_tokenizer(str(model_dir)))


def test_verl_loads_the_same_tokenizer_and_builds_its_qwen_wiring(model_dir):
    pytest.importorskip("verl", reason="verl is in its own stack (ASP_STACK=verl bash ci/env.sh)")
    from verl.utils import hf_tokenizer
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder

    tok = hf_tokenizer(str(model_dir))
    _check(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    QwenContinuousTokenBuilder(tok)      # needs "\n" as one token (it raises otherwise)
