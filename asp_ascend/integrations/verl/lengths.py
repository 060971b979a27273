"""Length history from verl's own rollout output, in DESIGN 6's format.

Every training batch verl hands to ``_update_actor`` carries the rollout's tensors:
``responses`` (B*n x response width) and ``attention_mask`` (prompt and response, left/right
padded), rows repeated ``rollout.n`` times interleaved, and per row ``extra_info`` (the reward
key verl keeps on the batch). :class:`IndexedDataset` puts the prompt's dataset position into
``extra_info["asp_prompt_id"]``, so each row's prompt is known whatever verl reorders.

:class:`LengthRecorder` writes one parquet part per training step
(``<dir>/step_<global_step>.parquet``, atomic) and :meth:`LengthRecorder.consolidate` joins
them into ``length_history.parquet`` (columns ``prompt_id, response_length, epoch, sample,
prompt_length, step``), the file ``asp schedule`` / ``asp simulate`` read as ``lengths.path``.
On resume, parts of steps after the checkpoint (a crashed run's future) are removed.
No torch import: tensors are read through ``.sum(-1).tolist()``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...errors import DataError
from ...lengths.parts import LengthParts

PROMPT_ID_KEY = "asp_prompt_id"


class IndexedDataset:
    """A verl dataset whose items carry their position in ``extra_info["asp_prompt_id"]``.

    Composition over verl's ``RLHFDataset`` (or any map-style dataset of dict items): length,
    items and every other attribute are the wrapped dataset's.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        item = self.dataset[index]
        extra = dict(item.get("extra_info") or {})
        extra[PROMPT_ID_KEY] = int(index)
        item["extra_info"] = extra
        return item

    def __getattr__(self, name: str) -> Any:  # collate_fn, tokenizer, ... of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def batch_lengths(tensors, non_tensors: dict, group_size: int) -> pd.DataFrame:
    """Rows ``prompt_id, response_length, prompt_length, sample`` of one verl batch.

    ``tensors``: mapping with ``responses`` and ``attention_mask`` (verl's ``batch.batch``);
    ``non_tensors``: verl's ``batch.non_tensor_batch`` (needs ``extra_info`` with
    ``asp_prompt_id``). ``sample`` numbers a prompt's rows 0..n-1 in batch order.
    """
    for key in ("responses", "attention_mask"):
        if key not in tensors.keys():
            raise DataError(f"verl batch has no {key!r} tensor (has {sorted(tensors.keys())}); the length "
                            f"history needs the rollout's output")
    width = int(tensors["responses"].shape[-1])
    mask = tensors["attention_mask"]
    total = np.asarray(mask.sum(-1).tolist(), dtype=np.int64)
    resp = np.asarray(mask[:, -width:].sum(-1).tolist(), dtype=np.int64)
    extra = non_tensors.get("extra_info")
    if extra is None:
        raise DataError("verl batch has no extra_info; wrap the train dataset in IndexedDataset (the ASP "
                        "trainer does) so each row names its prompt")
    try:
        ids = [str(int(e[PROMPT_ID_KEY])) for e in extra]
    except (KeyError, TypeError):
        raise DataError(f"verl batch rows lack extra_info[{PROMPT_ID_KEY!r}]; wrap the train dataset in "
                        f"IndexedDataset") from None
    df = pd.DataFrame({"prompt_id": ids, "response_length": resp, "prompt_length": (total - resp).astype(float)})
    df["sample"] = df.groupby("prompt_id").cumcount().astype(np.int64)
    if group_size and (df["sample"].max() + 1) > group_size:
        raise DataError(f"verl batch has {int(df['sample'].max()) + 1} rows of one prompt, rollout.n is {group_size}")
    return df


class LengthRecorder(LengthParts):
    """Writes the length history of a verl run under ``directory`` (parts keyed by verl's global step)."""

    def __init__(self, directory: str | Path, group_size: int):
        super().__init__(directory, "step")
        self.group_size = int(group_size)

    def record(self, global_step: int, epoch: int, tensors, non_tensors: dict) -> pd.DataFrame:
        """Write the batch's rows (``batch_lengths`` + ``epoch``, ``step``) as the part of
        ``global_step``; returns them (the trainer reports the same lengths to the balancer)."""
        df = batch_lengths(tensors, non_tensors, self.group_size)
        df.insert(2, "epoch", np.int64(epoch))
        self.write(global_step, df)
        return df.assign(step=np.int64(global_step))
