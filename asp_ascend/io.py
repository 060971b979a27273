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
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; a run is readable as the umask allows
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


def current_umask() -> int:
    """The process's umask (read from /proc where possible: setting it, even briefly, is not thread-safe)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def check_output_dir(path: str | os.PathLike | None, key: str = "output_dir") -> Path:
    """``path`` can be a run directory: it is one (or can be made), and this user may write there.
    Checked before any work; nothing is left behind (writability is tried with a probe file,
    removed at once). Raises ConfigError naming ``key``."""
    from .errors import ConfigError

    if path is None or not str(path).strip():
        raise ConfigError([f"{key}: empty; give the run directory, e.g. {key}=runs/my_run"])
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError([f"{key}: {p} is a file, not a directory; choose another {key} (or move the file away)"])
    existing = p
    while not existing.exists():  # the nearest folder that exists is where the run's folders get made
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError([f"{key}: {p} cannot be created: {existing} is a file, not a directory; choose another {key}"])
    if not _can_write_in(existing):
        what = "is not writable" if existing == p else f"cannot be created ({existing} is not writable)"
        raise ConfigError([f"{key}: {p} {what} by this user; choose a directory you can write, e.g. "
                           f"{key}=$HOME/runs/{p.name or 'run'}"])
    return p


def _can_write_in(folder: Path) -> bool:
    """This process can create a file in ``folder``: tried for real (a probe file, removed at once),
    since the permission bits do not tell for root, read-only mounts, ACLs or quotas."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".asp-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


# The run's log file for the actors' own output, passed to each engine actor in its environment.
ACTOR_LOG_ENV = "ASP_ACTOR_LOG"


def output_to_actor_log() -> None:
    """First thing an engine actor does: when its environment names the run's log file
    (``ASP_ACTOR_LOG``, set by the driver for ``logging.actor_output: log``), the process's stdout
    and stderr -- vLLM's and torch's warnings, C++ notices, load bars, also those of the engine
    processes it starts, which inherit them -- are appended to that file instead of streamed to
    the driver's terminal by Ray. Errors still reach the driver as exceptions of the calls that
    failed. A process on a node that cannot see the run directory keeps Ray's default."""
    import sys

    path = os.environ.get(ACTOR_LOG_ENV)
    if not path or not os.path.isdir(os.path.dirname(path)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.write(fd, f"--- output of actor process {os.getpid()} follows ---\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.pop(ACTOR_LOG_ENV)  # once per process


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
