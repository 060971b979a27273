"""Prompt ids and prompt lengths of a prompts file, without building the texts.

``asp schedule`` needs only each prompt's id and length. ``read_prompt_index`` reads them with
pyarrow's columnar readers and counts the prompts with the caller's counter (the run's tokenizer,
data/prompt_tokens.py), or whitespace words over the raw UTF-8 bytes with numpy,
which is several times faster than :func:`datasets.load_prompts` on a million-line JSONL file.
It accepts exactly the files ``load_prompts`` accepts and gives the same ids and lengths: any
row the fast path is not sure about (a parse error, a missing or non-string prompt, a chat
list, a duplicate or non-integer numeric id, a byte-order mark, two objects on one line) sends
the whole file through ``load_prompts``, whose errors name the file and line.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .datasets import load_prompts

# str.split() separators (str.isspace) beyond ASCII, as UTF-8 byte sequences
_WIDE_SPACES = [chr(c).encode() for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
                                          0x205F, 0x3000)]
_CHUNK_BYTES = 1 << 26
_BLANK_LINE = re.compile(rb"\n[ \t\r]*\n")  # an inner blank line
_FIRST_BLANK = re.compile(rb"[ \t\r]*\n")


def read_prompt_index(path: str | Path, prompt_key: str = "prompt", id_key: str = "id",
                      count=None) -> tuple[np.ndarray, np.ndarray]:
    """(ids as an object array of str, prompt lengths) of a prompts file. Lengths in whitespace words
    without ``count`` (or a words counter); else ``count(texts, messages)`` (data/prompt_tokens.py:
    the run's tokens, chat prompts through the tokenizer's template)."""
    path = Path(path)
    words = count is None or count.unit == "words"
    fast = None
    if path.exists():
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json", ".ndjson"):
            fast = _jsonl_columns(path, prompt_key, id_key)
        elif suffix in (".parquet", ".pq"):
            fast = _parquet_columns(path, prompt_key, id_key)
    if fast is not None:
        ids = _ids_of(*fast)
        if ids is not None:
            lengths = whitespace_tokens(fast[1])
            if lengths.size and lengths.min() > 0:  # an empty/blank prompt: load_prompts names its line
                return ids, (lengths if words else count(fast[1].to_pylist()))
    ps = load_prompts(path, prompt_key, id_key)
    lengths = ps.prompt_lengths if words else count(ps.prompts, ps.extra.get("messages"))
    return np.asarray(ps.ids, dtype=object), np.asarray(lengths, dtype=np.int64)


def _jsonl_columns(path: Path, prompt_key: str, id_key: str):
    """(id column or None, prompt column) read by pyarrow, or None when not sure."""
    import pyarrow as pa
    import pyarrow.json as pj

    if prompt_key == id_key:
        return None
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        return None
    for id_type in (pa.string(), pa.int64()):
        opts = pj.ParseOptions(explicit_schema=pa.schema([(id_key, id_type), (prompt_key, pa.string())]),
                               unexpected_field_behavior="ignore")
        try:
            table = pj.read_json(pa.BufferReader(data), parse_options=opts)
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    else:
        return None
    if table.num_rows != _nonblank_lines(data):
        return None  # e.g. two objects on one line: load_prompts rejects that
    return table.column(id_key), table.column(prompt_key)


def _nonblank_lines(data: bytes) -> int:
    """Lines holding more than JSON whitespace (what load_prompts counts as records)."""
    last = data[data.rfind(b"\n", 0, len(data) - 1) + 1:]  # the last line, its newline included
    if last.strip() and not _FIRST_BLANK.match(data) and not _BLANK_LINE.search(data):
        return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)  # no copy of a 10^8-byte file
    return sum(1 for line in data.split(b"\n") if line.strip())


def _parquet_columns(path: Path, prompt_key: str, id_key: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception:  # noqa: BLE001 - load_prompts reports it with the fix
        return None
    if prompt_key not in names:
        return None
    cols = [prompt_key] + ([id_key] if id_key in names and id_key != prompt_key else [])
    table = pq.read_table(path, columns=cols)
    prompt = table.column(prompt_key)
    if not (pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type)):
        return None  # chat lists and the like: the reference path joins them
    ids = table.column(id_key) if id_key in cols else pa.nulls(table.num_rows, pa.string())
    return ids, prompt


def _ids_of(ids, prompts) -> np.ndarray | None:
    """The ids as load_prompts makes them (str of the value, the row number when null), or
    None when the fast path cannot be sure to match it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if prompts.null_count or not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)
                                  or pa.types.is_integer(ids.type) or pa.types.is_null(ids.type)):
        return None
    text = pc.cast(ids, pa.string()) if not pa.types.is_string(ids.type) else ids
    if ids.null_count:
        rows = pa.array(np.arange(len(ids)).astype(str))
        text = pc.if_else(pc.is_null(text), rows, text)
    out = text.to_numpy(zero_copy_only=False).astype(object)
    if len(out) == 0 or pc.count_distinct(text).as_py() != len(out):
        return None  # empty or duplicate ids: load_prompts names the line
    return out


def whitespace_tokens(prompts) -> np.ndarray:
    """``len(text.split())`` for each string of a pyarrow string (chunked) array, computed on its
    UTF-8 bytes: the number of non-separator bytes that start a string or follow a separator."""
    import pyarrow as pa

    if isinstance(prompts, pa.ChunkedArray):
        parts = [whitespace_tokens(c) for c in prompts.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    prompts = prompts.cast(pa.large_string())
    _, offs_buf, data_buf = prompts.buffers()
    n = len(prompts)
    offsets = np.frombuffer(offs_buf, dtype=np.int64, count=prompts.offset + n + 1)[prompts.offset:]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    counts = np.zeros(n, dtype=np.int64)
    lo = 0
    while lo < n:  # strings in chunks of about _CHUNK_BYTES bytes (bounded temporary memory)
        hi = max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + _CHUNK_BYTES, side="right")) - 1)
        hi = min(hi, n)
        b0, b1 = int(offsets[lo]), int(offsets[hi])
        sep = _separators(data[b0:b1])
        start = ~sep
        start[1:] &= sep[:-1]
        first = offsets[lo:hi] - b0
        first = first[first < b1 - b0]
        start[first] = ~sep[first]  # a string's first byte starts a token unless it is a separator
        starts = np.flatnonzero(start)
        counts[lo:hi] = np.diff(np.searchsorted(starts, offsets[lo:hi + 1] - b0))
        lo = hi
    return counts


def _separators(b: np.ndarray) -> np.ndarray:
    """Per byte: part of a str.isspace() character (UTF-8)."""
    sep = (b == 32) | ((b - np.uint8(9)) <= 4) | ((b - np.uint8(28)) <= 3)  # space, \t..\r, \x1c..\x1f
    if b.size and b.max() >= 0xC2:  # only then can a multi-byte separator occur
        for seq in _WIDE_SPACES:
            m = len(seq)
            hit = b[:b.size - m + 1] == seq[0]
            for j in range(1, m):
                hit &= b[j:b.size - m + 1 + j] == seq[j]
            at = np.flatnonzero(hit)
            for j in range(m):
                sep[at + j] = True
    return sep
