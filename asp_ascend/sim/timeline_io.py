"""Writing columnar timeline frames as ``timeline.jsonl`` (the format of metrics/timeline.py)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..io import json_default
from ..metrics.timeline import KINDS


def write_frames_jsonl(frames: dict[str, pd.DataFrame], path, events: dict[str, list] | None = None) -> None:
    """One JSON object per event with ``kind`` first, kinds in the canonical order; a kind with
    ``events`` (kind -> [fields]) is written from them, as a real run's timeline writes it."""
    with open(path, "w") as fh:
        for kind in KINDS:
            evs = (events or {}).get(kind)
            if evs:
                for ev in evs:
                    fh.write(json.dumps({"kind": kind, **ev}, default=json_default) + "\n")
                continue
            df = frames.get(kind)
            if df is None or df.empty:
                continue
            cols = list(df.columns)
            arrays = [df[c].to_numpy() if df[c].dtype != object else df[c].tolist() for c in cols]
            for row in zip(*arrays):
                ev = {"kind": kind}
                for c, v in zip(cols, row):
                    ev[c] = v.item() if isinstance(v, np.generic) else v
                fh.write(json.dumps(ev, default=json_default) + "\n")
