"""A tiny Qwen2-architecture policy built locally (no downloads) for the CPU default.

``build_tiny_model(words, out_dir, ...)`` writes an HF-format directory that both the
trainer (transformers) and the rollout instances (vLLM) load: a ``Qwen2ForCausalLM``
with random weights and a tokenizer in Qwen2's own format (:func:`build_tokenizer`).

Why Qwen2's format: transformers (5.x, both verl's pin < 5.11 and vLLM's >= 5.16) loads any
``qwen2`` model's tokenizer through ``AutoTokenizer`` as ``Qwen2Tokenizer`` whatever
``tokenizer_class`` says (``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``), and that class keeps
only the vocabulary, merges and added tokens of ``tokenizer.json``, rebuilding the rest (NFC,
Qwen2's split regex + byte-level pre-tokenizer, BPE without an unknown token, byte-level
decoder). A word-level tokenizer saved there encodes every text to ``[]``. So the tokenizer here
*is* a ``Qwen2Tokenizer``; every loader (``AutoTokenizer`` in either stack, vLLM, verl) gets the
same ids.

Tokens: the special tokens, then every task word twice -- alone (a text's first word) and after
one space (``" 12"``, the form every later word takes) -- as added tokens, so each
whitespace-separated word is one token whatever Qwen2's regex would split (it cuts numbers
into digits), and decoding joins them back into the text; last the byte-level symbols of a
space and a newline (whitespace runs; verl's Qwen template wiring needs ``"\\n"`` to be one
token). Other characters are dropped, as Qwen2's BPE without an unknown token does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def task_vocabulary(texts: Iterable[str | None]) -> list[str]:
    """Special tokens first, then the sorted set of whitespace-separated words of ``texts``."""
    words = sorted({w for t in texts if t for w in t.split()})
    return [PAD, EOS, UNK] + [w for w in words if w not in (PAD, EOS, UNK)]


def prompts_vocabulary(train, ev=None) -> list[str]:
    """:func:`task_vocabulary` of a prompts file's run: its prompts and answers, and the eval set's
    (what ``asp train`` builds the tiny model from when ``model.path`` is not set)."""
    texts = list(train.prompts) + [a for a in train.answers if a]
    if ev is not None:
        texts += list(ev.prompts) + [a for a in ev.answers if a]
    return task_vocabulary(texts)


BYTE_SPACE, BYTE_NEWLINE = "\u0120", "\u010a"   # byte-level BPE's symbols for " " and "\n" (GPT-2's Ġ, Ċ)


def tokenizer_tokens(vocab: list[str]) -> list[str]:
    """Token strings by id for :func:`task_vocabulary`'s ``vocab``: the special tokens and the words at
    their positions in ``vocab``, then each word after a space, then the space and newline symbols."""
    words = [w for w in vocab if w not in (PAD, EOS, UNK)]
    if vocab[:3] != [PAD, EOS, UNK]:
        raise ValueError(f"vocab must start with {[PAD, EOS, UNK]} (task_vocabulary), got {vocab[:3]}")
    return list(vocab) + [" " + w for w in words] + [BYTE_SPACE, BYTE_NEWLINE]


def build_tokenizer(vocab: list[str]):
    """A ``Qwen2Tokenizer`` in which every word of ``vocab`` is one token (the module doc)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    tokens = tokenizer_tokens(vocab)
    tok = Qwen2Tokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token=UNK, eos_token=EOS,
                         pad_token=PAD, bos_token=EOS, model_max_length=4096, clean_up_tokenization_spaces=False)
    # words as added tokens: matched in the raw text before Qwen2's regex split; ids from the vocabulary
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in tokens[3:-2]])
    return tok


def load_tokenizer(model_dir: str | Path):
    """The model directory's tokenizer: ``AutoTokenizer`` (for a directory written here, the
    ``Qwen2Tokenizer`` every other loader also gets). A directory written before the tokenizer
    took Qwen2's format (a generic word-level ``tokenizers`` JSON) is loaded as such, since
    ``AutoTokenizer`` would turn it into a ``Qwen2Tokenizer`` that encodes nothing.

    The prompt-token cache keys a model directory by its files and the libraries' versions, not by
    this function: a change here that changes how a directory tokenizes must bump
    ``data.prompt_tokens.CACHE_FORMAT``."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_path = Path(model_dir) / "tokenizer_config.json"
    cls = json.loads(cfg_path.read_text()).get("tokenizer_class") if cfg_path.is_file() else None
    if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    return AutoTokenizer.from_pretrained(model_dir)


def build_tiny_model(vocab: list[str], out_dir: str | Path, *, hidden_size: int = 128, num_layers: int = 2,
                     num_heads: int = 4, num_kv_heads: int = 2, max_positions: int = 1024,
                     seed: int = 0) -> Path:
    """Write tokenizer + randomly initialised Qwen2 model into ``out_dir``; returns it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab)
    vocab_size = -(-len(tokenizer) // 16) * 16  # round up: friendlier matmul shapes
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
