"""Prompt datasets: JSONL or verl-style parquet, with stable prompt ids.

JSONL: one object per line with the prompt field (``data.prompt_key``, default
``prompt``) and optionally an id (``data.id_key``) and a reference answer. Parquet
(verl style): a prompt column that holds a string or a chat list of
``{"role", "content"}`` messages. Prompts without an id get ``"<row>"`` (the row number,
stable as long as the file is). Prompt lengths are whitespace words as loaded (``length_unit``
says so); every planner replaces them with the run's tokens (data/prompt_tokens.py) or plans on
words only where ``data.prompt_length: words`` asks for it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from .prompts import PromptSet

__all__ = ["POSITION_ID_KEY", "PromptSet", "load_prompts", "prompts_from_config"]

# A data.id_key no prompts file has: every prompt's id is its row position ("0", "1", ...). The
# framework bridges set it, since MindSpeed-RL and verl address their prompts by dataset position.
POSITION_ID_KEY = "__asp_row_position__"


def _prompt_text(val: Any, where: str, prompt_key: str) -> str:
    if isinstance(val, float) and val != val:  # an empty parquet/CSV cell reads as NaN
        val = ""
    if isinstance(val, np.ndarray):
        val = val.tolist()
    if isinstance(val, list) and all(isinstance(m, dict) and "content" in m for m in val):
        val = "\n".join(str(m["content"]) for m in val)
    if not isinstance(val, str):
        raise DataError(f"{where}: prompt must be a string or a list of chat messages "
                        f"{{role, content}}, got {type(val).__name__}")
    if not val.strip():
        raise DataError(f"{where}: the prompt in '{prompt_key}' is empty{' (only whitespace)' if val else ''}; "
                        "fill it in or drop the row (an empty prompt gives the model nothing to answer)")
    return val


def make_prompt_set(records: list[dict], source: str, prompt_key: str, id_key: str, answer_key: str,
                    row_offset: int = 1, row_word: str = "line") -> PromptSet:
    if not records:
        raise DataError(f"{source}: the dataset is empty; add prompts (one per {row_word}) or drop data.path "
                        "to use the built-in synthetic task")
    ids, prompts, answers, messages = [], [], [], []
    first_row: dict[str, int] = {}
    for i, rec in enumerate(records):
        where = f"{source}:{row_word} {i + row_offset}"
        if prompt_key not in rec or rec[prompt_key] is None:
            keys = ", ".join(map(str, rec.keys())) or "none"
            raise DataError(f"{where}: no '{prompt_key}' field (fields: {keys}); set data.prompt_key to the "
                            "field that holds the prompt")
        prompts.append(_prompt_text(rec[prompt_key], where, prompt_key))
        messages.append(_chat_messages(rec[prompt_key]))
        pid = rec.get(id_key)
        pid = str(i) if pid is None else str(pid)
        if pid in first_row:
            raise DataError(f"{where}: duplicate prompt id {pid!r} (first at {row_word} {first_row[pid]}); "
                            f"prompt ids in '{id_key}' must be unique")
        first_row[pid] = i + row_offset
        ids.append(pid)
        ans = rec.get(answer_key)
        if ans is None and isinstance(rec.get("reward_model"), dict):  # verl parquet convention
            ans = rec["reward_model"].get("ground_truth")
        answers.append(None if ans is None else str(ans))
    lengths = np.fromiter((len(p.split()) for p in prompts), dtype=np.int64, count=len(prompts))
    extra = {"messages": messages} if any(m is not None for m in messages) else {}
    return PromptSet(ids, prompts, answers, lengths, None, source, extra, {"unit": "words"})


def _chat_messages(val: Any) -> list[dict] | None:
    """The {role, content} messages of a chat-format prompt (None for a plain string), kept so
    the runtime can render them with the model's chat template (``data.chat_template``)."""
    if isinstance(val, np.ndarray):
        val = val.tolist()
    if isinstance(val, list):
        return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in val]
    return None


def encode_prompts(tok, prompts: PromptSet, chat_template: str = "auto") -> dict[str, list[int]]:
    """Token ids per prompt id. ``chat_template: auto``: chat-format prompts are rendered with the
    tokenizer's chat template (generation prompt added) when it has one; otherwise (and for
    plain strings, or ``none``) the text is tokenized as it is, without special tokens."""
    messages = prompts.extra.get("messages") or [None] * len(prompts)
    use = chat_template == "auto" and bool(getattr(tok, "chat_template", None))
    out = {}
    for pid, text, msgs in zip(prompts.ids, prompts.prompts, messages):
        if use and msgs is not None:
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            out[pid] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            out[pid] = tok(text, add_special_tokens=False).input_ids
    return out


def load_prompts(path: str | Path, prompt_key: str = "prompt", id_key: str = "id",
                 answer_key: str = "answer") -> PromptSet:
    """Load prompts from ``.jsonl``/``.json`` lines or ``.parquet``."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: prompts file does not exist; fix data.path")
    if path.is_dir():
        raise DataError(f"{path}: is a directory; point data.path at a prompts file (.jsonl or .parquet)")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        records = []
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError as exc:
            raise DataError(f"{path}: cannot read ({exc.strerror})") from None
        for lineno, raw_line in enumerate(lines, 1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{lineno}: not UTF-8 text; save the file as UTF-8 JSONL") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one "
                                "JSON object") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            rec.setdefault("__line__", lineno)
            records.append(rec)
        if not records:
            raise DataError(f"{path}: the dataset is empty; add prompts (one JSON object per line)")
        # Report real line numbers (blank lines are skipped).
        ps = None
        try:
            ps = make_prompt_set(records, str(path), prompt_key, id_key, answer_key)
        except DataError as exc:
            msg = str(exc)
            import re

            m = re.search(r":line (\d+):", msg)
            if m:
                real = records[int(m.group(1)) - 1]["__line__"]
                msg = msg.replace(f":line {m.group(1)}:", f":{real}:", 1)
            raise DataError(msg) from None
        return ps
    if suffix in (".parquet", ".pq"):
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as exc:
            raise DataError(f"{path}: cannot read parquet ({exc}); is it a parquet file?") from None
        if prompt_key not in df.columns:
            raise DataError(f"{path}: no '{prompt_key}' column (columns: {', '.join(map(str, df.columns))}); "
                            "set data.prompt_key to the column that holds the prompt")
        return make_prompt_set(df.to_dict("records"), str(path), prompt_key, id_key, answer_key,
                               row_offset=0, row_word="row")
    what = f"extension '{suffix}'" if suffix else "no file extension"
    raise DataError(f"{path}: unsupported prompts file ({what}); use a .jsonl or .parquet file")


def prompts_from_config(cfg) -> tuple[PromptSet, PromptSet | None]:
    """(train, eval) prompts: ``data.path`` or, when absent, the built-in synthetic task."""
    d = cfg.data
    if d.path:
        train = load_prompts(d.path, d.prompt_key, d.id_key, d.answer_key)
        ev = load_prompts(d.eval_path, d.prompt_key, d.id_key, d.answer_key) if d.eval_path else None
        return train, ev
    from .synthetic import make_synthetic_task

    return make_synthetic_task(d.synthetic, cfg.seed)
