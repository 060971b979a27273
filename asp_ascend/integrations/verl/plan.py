"""The schedule of a verl run: made at start, kept in ``output_dir``, re-planned per epoch.

:class:`VerlSchedule` owns ``output_dir/schedule.parquet`` (DESIGN 6, prompt ids = dataset
positions) and the run's length history (:class:`.lengths.LengthRecorder` under
``output_dir/lengths``). The first start plans with ``asp schedule``'s code
(:func:`asp_ascend.scheduler.run.build_schedule`): all epochs, or epoch 0 only with
``scheduler.adaptive``, whose later epochs :meth:`plan_epoch` plans from the lengths verl
observed in the epochs before (the runtime's re-plan rule). Every plan is appended to
``schedule.parquet`` atomically before its first batch is drawn, so a resumed run replays it.
No torch, no verl.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from ...errors import DataError
from .lengths import LengthRecorder


def prompt_set_from_dataset(dataset, tokenizer, template_kwargs: Optional[dict] = None, prompt_key: str = "prompt"):
    """A :class:`~asp_ascend.data.datasets.PromptSet` of a verl dataset, ids = positions.

    Items of verl's ``RLHFDataset`` carry ``raw_prompt`` (chat messages); other datasets
    ``prompt_key``. Prompt length = the tokens verl's agent loop prefills: ``tokenizer`` (verl's, of
    ``actor_rollout_ref.model.path``) over the messages rendered by its chat template with the
    generation prompt and ``template_kwargs`` (``data.apply_chat_template_kwargs``), the count verl's
    length filter takes too (data/prompt_tokens.TokenCounter)."""
    from ...data.datasets import POSITION_ID_KEY, make_prompt_set
    from ...data.prompt_tokens import TokenCounter

    records = []
    for i in range(len(dataset)):
        item = dataset[i]
        text = item.get("raw_prompt", item.get(prompt_key))
        records.append({"prompt": text, "answer": None, "reward_model": item.get("reward_model")})
    ps = make_prompt_set(records, f"<verl train dataset, {len(records)} prompts>", "prompt", POSITION_ID_KEY,
                         "answer")
    count = TokenCounter(tokenizer, "actor_rollout_ref.model.path (verl's tokenizer)",
                         template_kwargs=dict(template_kwargs or {}), always_template=True)
    ps.prompt_lengths = count(ps.prompts, ps.extra.get("messages"))
    ps.length_unit = count.record
    return ps


def first_plan_config(cfg):
    """The config of a verl run's first plan: every epoch, or epoch 0 alone with ``scheduler.adaptive``
    (the later epochs are planned from the lengths the run observes, :meth:`VerlSchedule.plan_epoch`)."""
    if cfg.scheduler.adaptive and cfg.train.epochs > 1:
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1))
    return cfg


class VerlSchedule:
    """Schedule + length history of one verl run (see the module doc)."""

    def __init__(self, cfg, prompts, output_dir: Optional[str | Path] = None):
        self.cfg = cfg
        self.prompts = prompts
        self.out = Path(output_dir or cfg.output_dir)
        self.path = self.out / "schedule.parquet"
        self.recorder = LengthRecorder(self.out / "lengths", cfg.train.group_size)
        self.adaptive = bool(cfg.scheduler.adaptive and cfg.train.epochs > 1)
        self.frame = self._load_or_plan()

    def _load_or_plan(self) -> pd.DataFrame:
        from ...config import save_resolved
        from ...io import write_json_atomic, write_parquet_atomic
        from ...scheduler.run import build_schedule

        if self.path.is_file():
            df = pd.read_parquet(self.path)
            unknown = set(df["prompt_id"].astype(str)) - set(map(str, self.prompts.ids))
            if unknown:
                raise DataError(f"{self.path}: {len(unknown)} prompt id(s) (e.g. {sorted(unknown)[0]!r}) are not rows "
                                f"of the train dataset; it was planned for another dataset (move it away to re-plan)")
            return df
        cfg = first_plan_config(self.cfg)
        df, report = build_schedule(cfg, self.prompts, self._history(None), compare=False)
        write_parquet_atomic(self.path, df, {"policy": cfg.scheduler.policy, "adaptive": str(self.adaptive).lower()})
        write_json_atomic(self.out / "schedule_report.json", report)
        save_resolved(self.cfg, self.out)
        return df

    def _history(self, before_epoch: Optional[int]) -> Optional[pd.DataFrame]:
        """Observed lengths of this run (epochs < before_epoch), else ``lengths.path``'s table."""
        hist = self.recorder.history(before_epoch) if before_epoch is not None else None
        if hist is not None:
            return hist
        if self.cfg.lengths.path:
            from ...lengths.history import load_history

            return load_history(self.cfg.lengths.path, self.cfg.lengths.max_response_length)
        return None

    def plan_epoch(self, epoch: int) -> pd.DataFrame:
        """Epoch ``epoch``'s rows: the persisted plan, or (adaptive) a new plan from the lengths
        observed in epochs ``< epoch``, appended to ``schedule.parquet``."""
        from ...io import write_parquet_atomic
        from ...scheduler.run import inputs_from_config, plan_epoch_frame

        have = self.frame[self.frame["epoch"] == epoch]
        if len(have):
            return have
        if not self.adaptive:
            raise DataError(f"{self.path} has no epoch {epoch} (planned: {sorted(self.frame['epoch'].unique())}); "
                            f"trainer.total_epochs must match the planned epochs")
        inp = inputs_from_config(self.cfg, self.prompts, self._history(epoch))
        df = plan_epoch_frame(self.cfg, inp, epoch, int(self.frame["iteration"].max()) + 1)
        self.frame = pd.concat([self.frame, df], ignore_index=True)
        write_parquet_atomic(self.path, self.frame, {"policy": self.cfg.scheduler.policy, "adaptive": "true"})
        return df

    def sampler(self, num_samples: int, iteration_size: Optional[int] = None, trainer_dp: int = 1,
                layout: Optional[str] = None) -> Any:
        from .sampler import AspSampler

        return AspSampler(self.frame, iteration_size or self.cfg.train.global_batch_size, num_samples,
                          layout=layout or self.cfg.verl.batch_layout, trainer_dp=trainer_dp,
                          plan_epoch=self.plan_epoch if self.adaptive else None)
