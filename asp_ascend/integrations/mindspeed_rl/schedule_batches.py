"""Offline-schedule batches as the ``data_iters`` of MindSpeed-RL's ``RayGRPOTrainer.fit``.

``fit`` only calls ``next(data_iters)`` and expects ``global_batch_size`` prompts as
``{"prompts": [LongTensor, ...], <dataset_additional_keys>: [Tensor, ...]}`` (what
``PromptDataLoader``'s collator yields). This iterator yields the prompts of
``schedule.parquet`` iteration by iteration instead of a shuffled sampler's order.

Order (strict, DESIGN 6): iterations ascending by (epoch, iteration); within an
iteration rows sorted by ``(instance, dispatch_rank, prompt_id)`` (``order="instance"``,
the default) or by ``(dispatch_rank, instance, prompt_id)`` (``order="dispatch"``).
With ``rl_config.guarantee_order: true`` MindSpeed-RL hands batch row i to rollout
replica ``i // (gbs / rollout_dp)``, so ``order="instance"`` places each instance's
prompts on one replica when the schedule gives every instance gbs / R prompts an
iteration (``replica_of_rows`` reports the placement it gets).

Resume: MindSpeed-RL skips ``consumed_train_samples // gbs`` batches; pass the same
``consumed_samples`` and the iterator starts at that iteration (``skipped_iterations``).
Only pandas is needed to plan; torch only to collate.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ...errors import DataError

SCHEDULE_COLUMNS = ("epoch", "prompt_id", "iteration", "mini_batch", "instance", "dispatch_rank",
                    "predicted_length")
_ORDERS = {"instance": ["instance", "dispatch_rank", "prompt_id"],
           "dispatch": ["dispatch_rank", "instance", "prompt_id"]}


def read_schedule(schedule, global_batch_size: int):
    """Load and check a schedule (path or DataFrame). Raises DataError naming the file and the row."""
    import pandas as pd

    name = str(schedule) if not isinstance(schedule, pd.DataFrame) else "<schedule frame>"
    if isinstance(schedule, pd.DataFrame):
        df = schedule.copy()
    else:
        p = Path(schedule)
        if not p.is_file():
            raise DataError(f"schedule {p} does not exist; run `asp schedule CONFIG` first "
                            f"(it writes OUTPUT_DIR/schedule.parquet)")
        df = pd.read_parquet(p)
    missing = [c for c in SCHEDULE_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{name}: missing column(s) {missing}; a schedule has {list(SCHEDULE_COLUMNS)}")
    dup = df.duplicated(["epoch", "prompt_id"], keep="first")
    if dup.any():
        row = int(dup.to_numpy().nonzero()[0][0])
        raise DataError(f"{name} row {row}: prompt_id {df['prompt_id'].iloc[row]!r} appears twice in epoch "
                        f"{df['epoch'].iloc[row]}; a schedule lists each prompt once per epoch")
    sizes = df.groupby(["epoch", "iteration"], sort=True).size()
    bad = sizes[sizes != global_batch_size]
    if len(bad):
        (ep, it), n = bad.index[0], int(bad.iloc[0])
        raise DataError(f"{name}: epoch {ep} iteration {it} has {n} prompts but global_batch_size is "
                        f"{global_batch_size}; re-run `asp schedule` with train.global_batch_size="
                        f"{global_batch_size} (MindSpeed-RL: megatron_training.global_batch_size)")
    return df


class ScheduleBatches:
    """Iterator of collated batches, one per scheduled iteration, resuming after ``consumed_samples``.

    ``fetch(prompt_id) -> item`` returns a dataset item (for MindSpeed-RL's PromptDataset a
    dict with ``input_ids`` and the ``dataset_additional_keys``); ``collate(items)`` builds the
    batch (default :func:`collate_prompts`).
    """

    def __init__(self, schedule, global_batch_size: int, fetch: Callable[[Any], dict],
                 collate: Optional[Callable[[list[dict]], dict]] = None,
                 dataset_additional_keys: Sequence[str] = (), consumed_samples: int = 0,
                 order: str = "instance"):
        if order not in _ORDERS:
            raise DataError(f"order: unknown value {order!r}; choose one of {', '.join(_ORDERS)}")
        if global_batch_size < 1:
            raise DataError(f"global_batch_size must be >= 1, got {global_batch_size}")
        df = read_schedule(schedule, global_batch_size)
        df = df.sort_values(["epoch", "iteration", *_ORDERS[order]], kind="stable").reset_index(drop=True)
        self.gbs = global_batch_size
        self.fetch = fetch
        self.keys = list(dataset_additional_keys)
        self.collate = collate or (lambda items: collate_prompts(items, self.keys))
        self.iterations: list[list[dict]] = [g.to_dict("records") for _, g in
                                             df.groupby(["epoch", "iteration"], sort=True)]
        self.skipped_iterations = max(0, int(consumed_samples)) // global_batch_size
        if self.skipped_iterations > len(self.iterations):
            raise DataError(f"resume: {consumed_samples} consumed samples = {self.skipped_iterations} iterations, "
                            f"but the schedule has only {len(self.iterations)}; schedule more epochs "
                            f"or start a fresh run")
        self.position = self.skipped_iterations
        self.last_rows: list[dict] = []

    def __len__(self) -> int:
        return len(self.iterations) - self.position

    def __iter__(self) -> "ScheduleBatches":
        return self

    def __next__(self) -> dict:
        if self.position >= len(self.iterations):
            raise StopIteration
        rows = self.iterations[self.position]
        self.position += 1
        self.last_rows = rows
        return self.collate([self.fetch(r["prompt_id"]) for r in rows])

    def prompt_order(self) -> list[list[Any]]:
        """The prompt ids of every remaining iteration, in the order they will be yielded."""
        return [[r["prompt_id"] for r in rows] for rows in self.iterations[self.position:]]

    @property
    def consumed_samples(self) -> int:
        return self.position * self.gbs


def replica_of_rows(global_batch_size: int, rollout_dp: int) -> list[int]:
    """MindSpeed-RL's placement with guarantee_order: batch row i -> replica i // (gbs / dp)."""
    if global_batch_size % rollout_dp:
        raise DataError(f"global_batch_size {global_batch_size} is not divisible by the rollout data-parallel "
                        f"size {rollout_dp} (MindSpeed-RL requires it too)")
    per = global_batch_size // rollout_dp
    return [i // per for i in range(global_batch_size)]


def collate_prompts(items: list[dict], dataset_additional_keys: Sequence[str] = ()) -> dict:
    """``{"prompts": [LongTensor], key: [Tensor]}``, the batch layout of MindSpeed-RL's PromptDataLoader."""
    import torch

    out: dict[str, list] = {"prompts": [torch.as_tensor(it["input_ids"], dtype=torch.long) for it in items]}
    for k in dataset_additional_keys:
        missing = [i for i, it in enumerate(items) if k not in it]
        if missing:
            raise DataError(f"dataset item {missing[0]} of the batch has no {k!r}; it is listed in "
                            f"megatron_training.dataset_additional_keys, so every item needs it")
        out[k] = [torch.as_tensor(it[k]) for it in items]
    return out


def prompt_dataset_fetch(dataset) -> Callable[[Any], dict]:
    """``fetch`` for a MindSpeed-RL PromptDataset: schedule prompt ids are dataset positions."""
    n = len(dataset)

    def fetch(prompt_id) -> dict:
        try:
            idx = int(prompt_id)
        except (TypeError, ValueError):
            raise DataError(f"prompt_id {prompt_id!r}: MindSpeed-RL datasets are addressed by position; "
                            f"schedule the dataset with integer ids (data.id_key absent = row index)") from None
        if not 0 <= idx < n:
            raise DataError(f"prompt_id {idx} is outside the dataset (0..{n - 1}); the schedule was made for "
                            f"another dataset")
        return dataset[idx]

    return fetch

