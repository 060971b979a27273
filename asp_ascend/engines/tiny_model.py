"""A tiny Qwen2-architecture policy built locally (no downloads) for the CPU default.

``build_tiny_model(words, out_dir, ...)`` writes an HF-format directory that both the
trainer (transformers) and the rollout instances (vLLM) load: a ``Qwen2ForCausalLM``
with random weights and a word-level ``tokenizers`` tokenizer whose vocabulary is the
special tokens plus every whitespace-separated word of the task's text.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def task_vocabulary(texts: Iterable[str | None]) -> list[str]:
    """Special tokens first, then the sorted set of whitespace-separated words of ``texts``."""
    words = sorted({w for t in texts if t for w in t.split()})
    return [PAD, EOS, UNK] + [w for w in words if w not in (PAD, EOS, UNK)]


def build_tokenizer(vocab: list[str]):
    """A word-level fast tokenizer (transformers ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   bos_token=EOS, model_max_length=4096)


def load_tokenizer(model_dir: str | Path):
    """The model directory's tokenizer.

    A generic fast tokenizer (``tokenizers`` JSON, as written here) is loaded as such:
    ``AutoTokenizer`` would map it to the architecture's own tokenizer class.
    """
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
    vocab_size = -(-len(vocab) // 16) * 16  # round up: friendlier matmul shapes
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
