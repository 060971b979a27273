"""Prompt lengths in the run's tokens: one rule for every planner of a prompts file.

A run prefills, records (``lengths.parquet``, verl's ``length_history.parquet``, MindSpeed-RL's
sample source) and is costed in tokens of its model's tokenizer, so a plan counts its prompts the
same way: :class:`TokenCounter` holds that tokenizer (loaded by the caller above the torch line:
``integrations/prompt_tokens.py``; nothing here imports transformers) and counts as
:func:`~.datasets.encode_prompts` (what ``asp train`` sends) and verl's agent loop encode:
a plain string as it is, without special tokens; a chat prompt (``{role, content}`` messages)
rendered by the tokenizer's chat template with the generation prompt, then tokenized without
special tokens (what ``apply_chat_template(..., tokenize=True)`` does), or joined when the
tokenizer has no template (``data.chat_template: auto``) or ``none`` is asked for.

Counting a million prompts takes tens of seconds (docs/scheduler.md, "Speed"), so the
offline commands keep the counts by content (``cache_dir``: a digest of the tokenizer's whole
definition, the chat template and how it is applied, and every text): planning the same file again
with other keys reads them (``schedule_report.json`` says ``from_cache``). Where the caller can name
the tokenizer by its files (``files_key``: a digest of every file its loader reads and of the
loader's versions, integrations/prompt_tokens.py), that digest stands for the loaded definition, the
tokenizer is loaded (``load``) only on a miss, and a hit reads the tokenizer's class and whether it
has a chat template (the report's record) from beside the counts: no transformers on a hit.

Whitespace words are the explicit opt-in ``data.prompt_length: words`` (:data:`WORDS`), recorded
as such in ``schedule_report.json``; a caller that has no counter for ``tokens`` is an error
(:func:`rule_for`), never a silent fall back to words.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import ConfigError

BATCH = 4096  # prompts per tokenizer call: the fast tokenizers encode a batch in parallel, memory stays bounded
CACHE_FORMAT = "asp-prompt-tokens-1"


@dataclass
class WordCounter:
    """``len(text.split())`` (the ``data.prompt_length: words`` opt-in)."""

    unit: str = "words"
    record: dict = field(default_factory=lambda: {"unit": "words", "opt_in": "data.prompt_length=words"})

    def __call__(self, texts: Sequence[str], messages: Optional[Sequence[Any]] = None) -> np.ndarray:
        return np.fromiter((len(t.split()) for t in texts), dtype=np.int64, count=len(texts))


WORDS = WordCounter()


@dataclass
class TokenCounter:
    """Token counts of prompts with ``tokenizer`` (an HF tokenizer object), as the run encodes them.

    ``source``: where the tokenizer came from (the config key and its value), for the report;
    ``template_kwargs``: extra keywords of the chat template (verl's ``data.apply_chat_template_kwargs``);
    ``load`` / ``files_key``: ``tokenizer`` None, loaded by ``load()`` when first needed, and cached counts
    keyed by ``files_key()`` (a digest of the files ``load`` reads; None: they cannot be named so, and the
    key is the loaded tokenizer's definition), so that a cache hit loads nothing."""

    tokenizer: Any
    source: str
    chat_template: str = "auto"
    template_kwargs: dict = field(default_factory=dict)
    always_template: bool = False   # verl renders every prompt with the template (no plain-text path)
    cache_dir: Optional[Path] = None  # counts kept by content (tokenizer, template, texts): a re-plan reads them
    unit: str = "tokens"
    from_cache: Optional[bool] = None   # how the last call got its counts (None: no cache)
    load: Optional[Callable[[], Any]] = None
    files_key: Optional[Callable[[], Optional[str]]] = None
    _seen: Optional[dict] = field(default=None, init=False, repr=False)   # traits read beside cached counts
    _loaded_files: Optional[str] = field(default=None, init=False, repr=False)   # files_key() around the load

    @property
    def record(self) -> dict:
        traits = self._seen if self.tokenizer is None and self._seen is not None else _traits(self._tok())
        has = traits["chat_template"]
        how = ("rendered with the tokenizer's chat template (generation prompt added)" if has and
               (self.always_template or self.chat_template == "auto") else "contents joined by newlines")
        rec = {"unit": "tokens", "tokenizer": self.source, "tokenizer_class": traits["tokenizer_class"],
               "chat_prompts": how, "plain_prompts": "tokenized as they are, no special tokens"}
        if self.template_kwargs:
            rec["chat_template_kwargs"] = dict(self.template_kwargs)
        if self.from_cache is not None:
            rec["from_cache"] = self.from_cache
        return rec

    def _tok(self):
        """The tokenizer, loaded now if it was not (``files_key`` read before and after: a file changed
        meanwhile leaves ``_loaded_files`` None, and counts are then not kept under a files key)."""
        if self.tokenizer is None:
            before = self.files_key() if self.files_key is not None else None
            self.tokenizer = self.load()
            after = self.files_key() if self.files_key is not None else None
            self._loaded_files = before if before == after else None
        return self.tokenizer

    def __call__(self, texts: Sequence[str], messages: Optional[Sequence[Any]] = None) -> np.ndarray:
        """Token counts of ``texts`` (``messages[i]``, when not None, is prompt i's chat messages); with
        ``cache_dir``, read from there when the same tokenizer, template and texts were counted before."""
        files = self.files_key() if self.cache_dir is not None and self.files_key is not None else None
        key = self._cache_key(texts, messages, files) if self.cache_dir is not None else None
        if key is not None:
            got = _read_counts(Path(self.cache_dir) / f"{key}.npy", len(texts))
            traits = _read_traits(Path(self.cache_dir) / f"{key}.json") if files is not None else {}
            self.from_cache = got is not None and traits is not None
            if self.from_cache:
                if files is not None:
                    self._seen = traits
                return got
        out = self._count(texts, messages)
        if key is not None and (files is None or self._keeps(files)):
            if files is not None:
                _write_traits(Path(self.cache_dir), key, _traits(self.tokenizer))
            _write_counts(Path(self.cache_dir), key, out)
        return out

    def _keeps(self, files: str) -> bool:
        """Whether counts just made may be kept under ``files``: the tokenizer was loaded from those very
        files, and it has a serializable backend (as the definition key requires: a Python-only tokenizer
        may depend on more than its files)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        return self._loaded_files == files and backend is not None and hasattr(backend, "to_str")

    def _cache_key(self, texts: Sequence[str], messages: Optional[Sequence[Any]],
                   files: Optional[str] = None) -> Optional[str]:
        """A digest of everything the counts depend on: ``files`` (the digest of the tokenizer's files and
        loader) or else the backend tokenizer's full definition (vocabulary, merges, added tokens, normalizer,
        pre-tokenizer) and chat template; then how the template is applied, and every text (and chat message).
        None for a loaded tokenizer without a serializable backend: never cached."""
        if files is not None:
            head = (CACHE_FORMAT, "files", files)
        else:
            tok = self._tok()
            backend = getattr(tok, "backend_tokenizer", None)
            if backend is None or not hasattr(backend, "to_str"):
                return None
            head = (CACHE_FORMAT, type(tok).__name__, backend.to_str(), str(getattr(tok, "chat_template", None)))
        h = hashlib.blake2b(digest_size=20)
        for part in head + (json.dumps(self.template_kwargs, sort_keys=True, default=str), self.chat_template,
                            str(self.always_template)):
            h.update(part.encode("utf-8", "surrogatepass") + b"\0")
        h.update(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)).tobytes())
        h.update("".join(texts).encode("utf-8", "surrogatepass"))
        if messages is not None and any(m is not None for m in messages):
            h.update(json.dumps(list(messages), sort_keys=True, default=str).encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def _count(self, texts: Sequence[str], messages: Optional[Sequence[Any]]) -> np.ndarray:
        tok = self._tok()
        use = (self.always_template or self.chat_template == "auto") and bool(getattr(tok, "chat_template", None))
        out = np.zeros(len(texts), dtype=np.int64)
        for lo in range(0, len(texts), BATCH):
            hi = min(len(texts), lo + BATCH)
            batch = list(texts[lo:hi])
            if messages is not None and use:
                chats = [(j, m) for j, m in enumerate(messages[lo:hi]) if m is not None]
                if chats:
                    rendered = tok.apply_chat_template([m for _, m in chats], add_generation_prompt=True,
                                                       tokenize=False, **self.template_kwargs)
                    for (j, _), text in zip(chats, rendered):
                        batch[j] = text
            out[lo:hi] = _lengths(tok, batch)
        return out


def _read_counts(path: Path, n: int) -> Optional[np.ndarray]:
    """The cached counts at ``path`` (None when absent, unreadable or not ``n`` non-negative integers)."""
    try:
        got = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if got.shape != (n,) or got.dtype.kind not in "iu" or (n and got.min() < 0):
        return None
    return got.astype(np.int64)


def _write_counts(directory: Path, key: str, counts: np.ndarray) -> None:
    """Keep ``counts`` under ``directory`` (atomic; a directory that cannot be written just keeps nothing)."""
    from ..io import atomic_path

    try:
        with atomic_path(directory / f"{key}.npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, counts.astype(np.int32))
    except OSError:
        pass


def _traits(tok) -> dict:
    """What the report's record reads of a loaded tokenizer (kept beside counts keyed by its files)."""
    return {"tokenizer_class": type(tok).__name__, "chat_template": bool(getattr(tok, "chat_template", None))}


def _read_traits(path: Path) -> Optional[dict]:
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (isinstance(got, dict) and isinstance(got.get("tokenizer_class"), str)
          and isinstance(got.get("chat_template"), bool))
    return got if ok else None


def _write_traits(directory: Path, key: str, traits: dict) -> None:
    from ..io import atomic_path

    try:
        with atomic_path(directory / f"{key}.json") as tmp:
            tmp.write_text(json.dumps(traits), encoding="utf-8")
    except OSError:
        pass


def default_cache_dir() -> Path:
    """Where the offline commands keep prompt token counts: ``$XDG_CACHE_HOME/asp_ascend/prompt_tokens``
    (``~/.cache`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asp_ascend" / "prompt_tokens"


def _lengths(tok, texts: list[str]) -> list[int]:
    """``len(tok(text, add_special_tokens=False).input_ids)`` for each text, in one batch: through the fast
    tokenizer's Rust backend (encoding in parallel, no Python id lists) when it has one and nothing in it
    would truncate or pad, else through ``tok`` itself."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast") and not backend.truncation and not backend.padding:
        return [len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return [len(ids) for ids in tok(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]]


def rule_for(cfg, count):
    """The counter a planner of ``data.path`` uses: ``count`` (the caller loaded the tokenizer), or
    the words opt-in; ``tokens`` without a counter is an error, not words."""
    if count is not None:
        if cfg.data.prompt_length == "words" and count.unit != "words":
            raise ConfigError(["data.prompt_length: 'words' was asked for, but the caller counted tokens"])
        return count
    if cfg.data.prompt_length == "words":
        return WORDS
    raise ConfigError([f"data.prompt_length: 'tokens' (the default) needs the run's tokenizer to count the prompts of "
                       f"data.path={cfg.data.path!r}; plan through asp schedule / asp simulate / the framework entry "
                       "(they load it from model.path), or set data.prompt_length=words to plan on whitespace words "
                       "(recorded in schedule_report.json)"])
