"""The run's tokenizer for the offline planners (``asp schedule``, ``asp simulate``, the MindSpeed-RL entry).

:func:`counter_for` applies the one rule of data/prompt_tokens.py to a config: the prompts of
``data.path`` are counted in tokens of the tokenizer the run uses -- ``model.path``, which the
framework bridges fill from ``actor_rollout_ref.model.path`` (verl) and
``megatron_training.tokenizer_name_or_path`` (MindSpeed-RL) -- loaded as ``asp train`` loads it
(``engines/tiny_model.load_tokenizer``: ``AutoTokenizer``). transformers is imported here, when a
plan needs it, never on the scheduler's import path. Without a tokenizer (no key, a directory
that is not on this machine, transformers missing) the command stops naming the key and the two
fixes: the model directory, or the explicit ``data.prompt_length=words``.
"""
from __future__ import annotations

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
    try:
        from ..engines.tiny_model import load_tokenizer

        tok = load_tokenizer(p)
    except ImportError as exc:
        raise ConfigError([f"{model_key}: counting the prompt tokens of {where} needs transformers ({exc}); "
                           f"pip install transformers tokenizers, {WORDS_FIX}"]) from None
    except (OSError, ValueError) as exc:
        raise ConfigError([f"{model_key}: {path!r}: no tokenizer could be loaded ({exc}); point {model_key} at "
                           f"the model directory with its tokenizer files, {WORDS_FIX}"]) from None
    return TokenCounter(tok, f"{model_key}={path}", cfg.data.chat_template, dict(template_kwargs or {}),
                        always_template, cache_dir=default_cache_dir())


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
