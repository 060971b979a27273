"""A run's length history written as it trains: one parquet part per training step.

Each part (``<dir>/<key>_<n>.parquet``, written atomically) holds the DESIGN 6 rows (``prompt_id,
response_length, epoch, sample, prompt_length``) of the samples one step trained, plus a column
``<key>`` = n. Only whole parts exist, so after a crash the directory holds exactly the steps whose
part was written; a resume from the checkpoint of step s drops the parts after it
(:meth:`LengthParts.truncate_after`) and reads the history up to it (:meth:`LengthParts.history`).
:meth:`LengthParts.consolidate` joins the parts into one table (``lengths.path`` reads it).
Used by the verl bridge (``step`` = verl's global step) and the MindSpeed-RL sample source
(``iteration`` = the iteration that trained the rows).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd


class LengthParts:
    """The parts under ``directory``; ``key`` names the step column and the files' prefix."""

    def __init__(self, directory: str | Path, key: str = "step"):
        self.dir, self.key = Path(directory), key
        self._part = re.compile(rf"^{re.escape(key)}_(\d+)\.parquet$")

    def path(self, step: int) -> Path:
        return self.dir / f"{self.key}_{int(step):08d}.parquet"

    def write(self, step: int, rows: pd.DataFrame) -> Path:
        """The part of ``step`` is ``rows`` (+ the step column), atomically."""
        from ..io import write_parquet_atomic

        path = self.path(step)
        write_parquet_atomic(path, rows.assign(**{self.key: np.int64(step)}))
        return path

    def append(self, step: int, rows: pd.DataFrame) -> Path:
        """Add ``rows`` to the part of ``step``, atomically."""
        path = self.path(step)
        if path.is_file():
            rows = pd.concat([pd.read_parquet(path).drop(columns=[self.key]), rows], ignore_index=True)
        return self.write(step, rows)

    def parts(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in self.dir.iterdir() if (m := self._part.match(p.name)))

    def truncate_after(self, step: int) -> int:
        """Remove the parts of steps after ``step`` (resuming from that checkpoint); returns how many."""
        gone = 0
        for n, p in self.parts():
            if n > step:
                p.unlink()
                gone += 1
        return gone

    def history(self, before_epoch: Optional[int] = None) -> Optional[pd.DataFrame]:
        """Every part's rows (of epochs before ``before_epoch``), or None when there are none."""
        frames = [pd.read_parquet(p) for _, p in self.parts()]
        if not frames:
            return None
        df = pd.concat(frames, ignore_index=True)
        if before_epoch is not None:
            df = df[df["epoch"] < before_epoch].reset_index(drop=True)
        return df if len(df) else None

    def consolidate(self, path: str | Path | None = None) -> Optional[Path]:
        """Write every part into one DESIGN 6 table (default ``<dir>/../length_history.parquet``)."""
        from ..io import write_parquet_atomic

        df = self.history()
        if df is None:
            return None
        out = Path(path) if path else self.dir.parent / "length_history.parquet"
        write_parquet_atomic(out, df.sort_values([self.key, "prompt_id", "sample"], kind="stable"))
        return out
