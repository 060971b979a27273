"""Atomic file writes: write to a temp file in the same folder, then rename.

A crash mid-write never leaves a half-written file under the final name.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

SCHEMA_VERSION = 1


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to ``path``; rename it over ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | os.PathLike, obj: dict[str, Any]) -> None:
    """Write ``obj`` as JSON with ``schema_version`` first, atomically."""
    payload = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in obj.items() if k != "schema_version"}}
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=json_default) + "\n")


def write_parquet_atomic(path: str | os.PathLike, df, metadata: dict[str, str] | None = None) -> None:
    """Write a pandas DataFrame to parquet atomically, with ``schema_version`` in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"schema_version"] = str(SCHEMA_VERSION).encode()
    for k, v in (metadata or {}).items():
        meta[k.encode()] = str(v).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def json_default(o: Any):
    """``json.dumps(default=...)`` for numpy scalars and arrays and paths."""
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
