"""The run's tokenizer for the offline planners (``asp schedule``, ``asp simulate``, the MindSpeed-RL entry).

:func:`counter_for` applies the one rule of data/prompt_tokens.py to a config: the prompts of
``data.path`` are counted in tokens of the tokenizer the run uses -- ``model.path``, which the
framework bridges fill from ``actor_rollout_ref.model.path`` (verl) and
``megatron_training.tokenizer_name_or_path`` (MindSpeed-RL) -- loaded as ``asp train`` loads it
(``engines/tiny_model.load_tokenizer``: ``AutoTokenizer``). transformers is imported here, when a
plan needs it, never on the scheduler's import path. Without a tokenizer (no key, a directory
that is not on this machine, transformers missing) the command stops naming the key and the two
fixes: the model directory, or the explicit ``data.prompt_length=words``.

A re-plan of the same prompts reads their counts from the cache without importing transformers:
:func:`tokenizer_files_digest` names the tokenizer by the content of every file its loader can read
(the directory's top-level files but model weights, and ``additional_chat_templates/``) and by the
transformers and tokenizers versions, and the tokenizer is loaded only when counts are missing. A
directory it cannot name so (custom tokenizer code, a config pointing at files elsewhere, no
``tokenizer_config.json``, more than ``DIGEST_MAX_BYTES`` to read) keeps the key of the loaded
tokenizer's definition, loaded up front as before.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from ..data.prompt_tokens import WORDS, TokenCounter, default_cache_dir
from ..errors import ConfigError

WORDS_FIX = ("or set data.prompt_length=words to plan on whitespace words (recorded in schedule_report.json; the "
             "run's lengths.parquet and the regression prior stay in tokens, so words misstate prefill costs)")


def counter_for(cfg, model_key: str = "model.path", template_kwargs: Optional[dict] = None,
                always_template: bool = False, where: Optional[str] = None):
    """The counter of ``cfg.data.path``'s prompts (None without ``data.path``: a built-in or experiment workload).

    ``model_key``: the key the user sets for the tokenizer (ours, or the framework's that the bridge read);
    ``template_kwargs`` / ``always_template``: how the framework renders chat prompts (verl: every prompt
    through the template, with ``data.apply_chat_template_kwargs``)."""
    if not cfg.data.path:
        return None
    if cfg.data.prompt_length == "words":
        return WORDS
    where = where or f"data.path={cfg.data.path!r}"
    path = cfg.model.path
    if not path and model_key == "model.path":   # asp train's tiny model, built from these prompts
        return _tiny_counter(cfg, where)
    if not path:
        raise ConfigError([f"{model_key}: not set, so no tokenizer counts the prompt tokens of {where} that the run "
                           f"prefills and records; set {model_key} to the model directory, {WORDS_FIX}"])
    p = Path(path)
    if not p.is_dir():
        raise ConfigError([f"{model_key}: {path!r} is not a directory on this machine, and its tokenizer counts the "
                           f"prompt tokens of {where}; run where the model is, point {model_key} at a copy of its "
                           f"tokenizer files (tokenizer.json, tokenizer_config.json, config.json), {WORDS_FIX}"])
    load = _loader(p, model_key, path, where)
    files = (lambda: tokenizer_files_digest(p))
    lazy = files() is not None   # named by its files: loaded only when a count needs it (a cache miss)
    return TokenCounter(None if lazy else load(), f"{model_key}={path}", cfg.data.chat_template,
                        dict(template_kwargs or {}), always_template, cache_dir=default_cache_dir(),
                        load=load, files_key=files if lazy else None)


def _loader(p: Path, model_key: str, path: str, where: str):
    """``p``'s tokenizer as ``asp train`` loads it, or the error naming ``model_key`` and the fixes."""
    def load():
        try:
            from ..engines.tiny_model import load_tokenizer

            return load_tokenizer(p)
        except ImportError as exc:
            raise ConfigError([f"{model_key}: counting the prompt tokens of {where} needs transformers ({exc}); "
                               f"pip install transformers tokenizers, {WORDS_FIX}"]) from None
        except (OSError, ValueError) as exc:
            raise ConfigError([f"{model_key}: {path!r}: no tokenizer could be loaded ({exc}); point {model_key} at "
                               f"the model directory with its tokenizer files, {WORDS_FIX}"]) from None
    return load


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz",
                   ".npy", ".tflite")
TOKENIZER_WORDS = ("tok", "vocab", "merges", "spm", "sentencepiece", "bpe", "spiece")
DIGEST_MAX_BYTES = 1 << 30   # more than this outside the weights: not worth hashing on every plan, keep the old key


def tokenizer_files_digest(model_dir: Path) -> Optional[str]:
    """A digest of everything ``load_tokenizer(model_dir)`` reads (engines/tiny_model: ``AutoTokenizer`` or
    ``PreTrainedTokenizerFast``), without importing transformers: the transformers and tokenizers versions,
    and the name, size and content of every top-level file of the directory but model weights (a weights
    suffix and no tokenizer word in the name) and of ``additional_chat_templates/``. That covers
    tokenizer.json, vocabularies, merges, sentencepiece models, tokenizer_config.json, special_tokens_map.json,
    added_tokens.json, chat_template.jinja/.json and config.json (whose model_type picks the class). None
    where that is not all the loader may read, so the caller keys by the loaded tokenizer: transformers not
    installed, no readable tokenizer_config.json, custom tokenizer code (``auto_map``, whose modules may come
    from elsewhere), a ``*_file`` path in tokenizer_config.json, or over ``DIGEST_MAX_BYTES`` to hash."""
    from importlib import metadata

    d = Path(model_dir)
    try:
        versions = [metadata.version(pkg) for pkg in ("transformers", "tokenizers")]
        tok_cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        model_cfg = json.loads((d / "config.json").read_text(encoding="utf-8")) if (d / "config.json").is_file() else {}
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None
    if not isinstance(tok_cfg, dict) or not isinstance(model_cfg, dict):
        return None
    auto_map = model_cfg.get("auto_map") or {}
    if "auto_map" in tok_cfg or not isinstance(auto_map, dict) or "AutoTokenizer" in auto_map:
        return None
    if any(k.endswith(("_file", "_files")) and k != "fast_tokenizer_files" for k in tok_cfg):
        return None
    try:
        files = [f for f in d.iterdir() if f.is_file() and not _weights(f.name)]
        extra = d / "additional_chat_templates"
        if extra.is_dir():
            files += [f for f in extra.iterdir() if f.is_file()]
        if sum(f.stat().st_size for f in files) > DIGEST_MAX_BYTES:
            return None
        h = hashlib.blake2b(digest_size=20)
        h.update(json.dumps(versions).encode() + b"\0")
        for f in sorted(files, key=lambda f: f.relative_to(d).as_posix()):
            h.update(f.relative_to(d).as_posix().encode("utf-8", "surrogateescape") + b"\0")
            h.update(f.stat().st_size.to_bytes(8, "little"))
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _weights(name: str) -> bool:
    low = name.lower()
    return low.endswith(WEIGHT_SUFFIXES) and not any(w in low for w in TOKENIZER_WORDS)


def _tiny_counter(cfg, where: str) -> TokenCounter:
    """Without ``model.path``, ``asp train`` builds the tiny model from the prompts and answers of ``data.path``
    (and ``data.eval_path``) at its start (pipeline/run.prepare_model); the same tokenizer, built here, counts.
    Reads the texts (the line-by-line loader): meant for the small sets a tiny model trains on."""
    from ..data.datasets import prompts_from_config

    train, ev = prompts_from_config(cfg)
    try:
        from ..engines.tiny_model import build_tokenizer, prompts_vocabulary

        tok = build_tokenizer(prompts_vocabulary(train, ev))
    except ImportError as exc:
        raise ConfigError([f"model.path: not set, so asp train would build the tiny model from the prompts of {where}, "
                           f"and counting their tokens with its tokenizer needs transformers ({exc}); pip install "
                           f"transformers tokenizers, set model.path to the model directory, {WORDS_FIX}"]) from None
    return TokenCounter(tok, "the tiny model asp train builds from data.path (model.path not set)",
                        cfg.data.chat_template)
