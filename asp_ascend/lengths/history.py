"""Length history: a table of observed response lengths (DESIGN 6).

Columns: ``prompt_id``, ``response_length`` (required), ``epoch``, ``sample``,
``prompt_length`` (optional). Parquet, CSV or JSONL. Real runs append rows with these
names. Every malformed row ends in one DataError naming the file, the row and the fix.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError

log = logging.getLogger(__name__)

REQUIRED = ("prompt_id", "response_length")
OPTIONAL = ("epoch", "sample", "prompt_length")


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a parquet, CSV or JSONL table; errors name the file and the fix."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file does not exist")
    if path.is_dir():
        raise DataError(f"{path}: is a directory; point the key at a table file (.parquet, .csv or .jsonl)")
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix in (".jsonl", ".ndjson", ".json"):
            return pd.read_json(path, lines=True)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise DataError(f"{path}: cannot parse as {suffix.lstrip('.')} ({str(exc).splitlines()[0]})") from None
    except Exception as exc:  # pyarrow raises its own types
        raise DataError(f"{path}: cannot read ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    what = f"extension '{suffix}'" if suffix else "no file extension"
    raise DataError(f"{path}: unsupported table file ({what}); use .parquet, .csv or .jsonl")


def _row_label(path: Path, i: int) -> str:
    # CSV: header is line 1, so data row i (0-based) is line i + 2; JSONL: line i + 1.
    s = path.suffix.lower()
    if s == ".csv":
        return f"{path}:{i + 2}"
    if s in (".jsonl", ".ndjson", ".json"):
        return f"{path}:{i + 1}"
    return f"{path}: row {i}"


def cell(value) -> str:
    """A table cell as a user reads it: ``empty`` for a missing cell, else its plain value."""
    if value is None or (isinstance(value, float) and value != value):
        return "empty"
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _numeric(col: pd.Series) -> pd.Series:
    """``pd.to_numeric(col, errors="coerce")``, without its copy of a column that is numeric already
    (a parquet history's integer columns: 10^7 rows each, 0.4 s a copy on one core)."""
    if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
        return col
    return pd.to_numeric(col, errors="coerce")


def validate_lengths(df: pd.DataFrame, path: Path, max_response_length: int | None,
                     column: str = "response_length") -> pd.DataFrame:
    vals = _numeric(df[column])
    bad = vals.isna().to_numpy() | ~np.isfinite(vals.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{_row_label(path, i)}: {column} is {cell(df[column].iloc[i])}, not a number; "
                        f"fix or drop the row ({int(bad.sum())} such row(s))")
    neg = (vals < 0).to_numpy()
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise DataError(f"{_row_label(path, i)}: {column} is {vals.iloc[i]:g}, negative; lengths are token "
                        f"counts >= 0 ({int(neg.sum())} such row(s))")
    if max_response_length is not None:
        over = (vals > max_response_length).to_numpy()
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise DataError(f"{_row_label(path, i)}: {column} {vals.iloc[i]:g} exceeds "
                            f"lengths.max_response_length={max_response_length} ({int(over.sum())} row(s)); "
                            "raise lengths.max_response_length or clip the table")
    return vals


def load_history(path: str | Path, max_response_length: int | None = None) -> pd.DataFrame:
    """Load and validate a length history. Returns columns prompt_id (str), response_length
    (int), epoch (int, 0 if absent), sample (int), prompt_length (float, NaN if absent)."""
    path = Path(path)
    df = read_table(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)} (has: {', '.join(map(str, df.columns))}); "
                        "a length history needs prompt_id and response_length")
    if df.empty:
        raise DataError(f"{path}: the length history is empty; drop lengths.path to plan without history")
    lengths = validate_lengths(df, path, max_response_length)
    # ids stay in pandas' own string column (no round trip through Python objects: 10^7 rows)
    out = pd.DataFrame({"prompt_id": df["prompt_id"].astype(str).reset_index(drop=True),
                        "response_length": lengths.to_numpy(dtype=np.int64)})
    for col in ("epoch", "sample"):
        if col in df.columns:
            v = _numeric(df[col])
            if v.isna().any():
                i = int(np.flatnonzero(v.isna().to_numpy())[0])
                raise DataError(f"{_row_label(path, i)}: {col} is {cell(df[col].iloc[i])}, not an integer")
            out[col] = v.to_numpy(dtype=np.int64)
        else:
            out[col] = 0 if col == "epoch" else out.groupby("prompt_id").cumcount().to_numpy()
    if "prompt_length" in df.columns:
        out["prompt_length"] = _numeric(df["prompt_length"]).to_numpy(dtype=float)
    else:
        out["prompt_length"] = np.nan
    return out


def positions_in(history: pd.DataFrame, prompt_ids) -> np.ndarray:
    """Per history row: the position of its prompt in ``prompt_ids`` (unique), -1 if absent.
    Hash join in pyarrow (pandas' string ``isin`` loops in Python at 10^7 rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = np.asarray(prompt_ids, dtype=object)
    try:
        keys = pa.array(ids, type=pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):  # not all str: compare as text
        keys = pa.array(ids.astype(str), type=pa.string())
    rows = pa.array(history["prompt_id"].astype(str), type=pa.string())
    pos = pc.index_in(rows, value_set=keys)
    return pos.to_numpy(zero_copy_only=False) if pos.null_count == 0 else pos.fill_null(-1).to_numpy()


def restrict_to(history: pd.DataFrame, prompt_ids, source: str = "length history", *,
                encode: bool = False) -> pd.DataFrame:
    """Keep rows of prompts in ``prompt_ids``; warn with the count of rows skipped. With
    ``encode``, ``prompt_id`` becomes the prompt's position in ``prompt_ids`` (int64): what
    the predictors group by fastest (pass ``np.arange(len(prompt_ids))`` as their ids). A
    history that matches no prompt at all is an error (planning on priors alone would be silent)."""
    pos = positions_in(history, prompt_ids)
    mask = pos >= 0
    if len(history) and not mask.any():
        theirs = ", ".join(repr(str(x)) for x in pd.unique(history["prompt_id"])[:3])
        ours = ", ".join(repr(str(x)) for x in list(prompt_ids)[:3])
        raise DataError(f"{source}: none of its {history['prompt_id'].nunique()} prompt id(s) ({theirs}, ...) is a "
                        f"prompt of the dataset ({ours}, ...); the history belongs to another dataset, or the ids "
                        "differ (data.id_key); fix lengths.path or data.id_key, or drop lengths.path to plan on priors")
    skipped = int((~mask).sum())
    if skipped:
        n_prompts = history.loc[~mask, "prompt_id"].nunique()
        log.warning("%s: skipped %d row(s) of %d prompt(s) not in the dataset", source, skipped, n_prompts)
    out = history.loc[mask].reset_index(drop=True) if skipped else history.reset_index(drop=True)
    if encode:
        out["prompt_id"] = pos[mask].astype(np.int64)
    return out
