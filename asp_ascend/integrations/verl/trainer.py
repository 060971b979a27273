"""verl trainers with the ASP schedule: four hooks on verl's own ``RayPPOTrainer`` methods.

:func:`asp_trainer_class` subclasses a trainer class that has ``RayPPOTrainer``'s methods
(``RayPPOTrainer``; ``OneStepOffRayTrainer`` for one-step-off) and overrides, each calling
verl's method:

- ``_create_dataloader``: wraps the train dataset in :class:`.lengths.IndexedDataset` and
  passes the schedule's :class:`.sampler.AspSampler` as ``train_sampler`` (verl's
  ``StatefulDataLoader`` is built unchanged around it);
- ``init_workers``: tells the sampler the actor's data-parallel size
  (``_get_dp_size(actor_rollout_wg, "actor")``), which fixes the mini-batch layout;
- ``_load_checkpoint``: aligns the sampler with the resumed ``global_steps`` (verl skips
  ``data.pt`` at an epoch boundary) and drops length records of steps after the checkpoint;
- ``_update_actor``: records the batch's response lengths (DESIGN 6) before verl's update, and
  reports each group's lengths to the load balancer (``report_groups``), whose estimator learns the
  within-group spread and the prediction bias from them (what the fully async rollouter reports per
  finished group). verl calls ``_update_actor`` once per trained batch: ``RayPPOTrainer.fit`` and,
  one-step-off, ``SeparateRayPPOTrainer._fit_update_actor``; both skip it during critic warm-up
  (``trainer.critic_warmup`` steps), whose batches only train the critic and are not recorded;
- ``_get_gen_batch``: gives every row of a training batch the ``priority`` that carries its group's
  schedule instance (``verl.route_servers``; :mod:`.routing`), which verl's agent loops pass to the
  load balancer the entry installs (:mod:`.router`). Validation batches keep verl's priorities. The
  priority of each prompt's ``uid`` (set by verl just before) is kept until its batch is trained:
  one-step-off generates the next batch, possibly of the next epoch, before it trains this one.

verl is imported only when a class is made.
"""
from __future__ import annotations

from typing import Any, Optional

from . import require_verl


def asp_trainer_class(base: Optional[type] = None) -> type:
    """``base`` (default verl's ``RayPPOTrainer``) with the ASP hooks; construct it with verl's
    arguments plus ``asp=VerlSchedule``."""
    if base is None:
        require_verl("the ASP trainer")
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer as base  # noqa: N813

    class AspTrainer(base):  # type: ignore[misc, valid-type]
        """verl's trainer fed by the ASP schedule (asp_ascend.integrations.verl.trainer)."""

        def __init__(self, *args: Any, asp, **kwargs: Any):
            self.asp = asp
            self.asp_sampler = None
            self.asp_routed: list[dict] = []     # per generated batch: prompt uid -> priority, until trained
            super().__init__(*args, **kwargs)

        def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler=None):
            from .lengths import IndexedDataset

            if train_dataset is None:
                from ...errors import ConfigError

                raise ConfigError(["the ASP trainer needs the train dataset passed in (train_dataset=...); "
                                   "the asp entry (python -m asp_ascend.integrations.verl.main_ppo) does this"])
            dataset = train_dataset if isinstance(train_dataset, IndexedDataset) else IndexedDataset(train_dataset)
            self.asp_sampler = self.asp.sampler(len(dataset))
            return super()._create_dataloader(dataset, val_dataset, collate_fn, self.asp_sampler)

        def init_workers(self):
            out = super().init_workers()
            self.asp_sampler.set_trainer_dp(self._get_dp_size(self.actor_rollout_wg, "actor"))
            return out

        def _load_checkpoint(self):
            out = super()._load_checkpoint()
            steps = getattr(self, "global_steps", 0) or 0
            self.asp_sampler.resume_at(steps, len(self.train_dataloader))
            self.asp.recorder.truncate_after(steps)
            return out

        def _update_actor(self, batch):
            lengths = self.asp_record(batch) if self.asp.cfg.verl.record_lengths else None
            self.asp_report(batch, lengths)
            return super()._update_actor(batch)

        def _get_gen_batch(self, batch):
            gen = super()._get_gen_batch(batch)
            if self.asp.cfg.verl.route_servers and self.asp_sampler is not None:
                priorities = self.asp_priorities(batch)
                if priorities is not None:
                    gen.non_tensor_batch["priority"] = priorities
                    uids = batch.non_tensor_batch.get("uid")
                    if uids is not None:
                        self.asp_routed = self.asp_routed[-3:] + [dict(zip(uids, priorities.tolist()))]
            return gen

        def asp_report(self, batch, lengths=None) -> None:
            """Each group's response lengths of a trained batch to the balancer's estimator
            (``lengths``: the batch's ``batch_lengths`` rows when ``asp_record`` already made them)."""
            from .lengths import batch_lengths

            balancer = getattr(getattr(self, "llm_server_manager", None), "global_load_balancer", None)
            uids = batch.non_tensor_batch.get("uid")
            if balancer is None or not hasattr(balancer, "report_groups") or uids is None or not self.asp_routed:
                return
            routed = {}
            for table in self.asp_routed:
                routed.update(table)
            if lengths is None:
                lengths = batch_lengths(batch.batch, batch.non_tensor_batch, self.asp.cfg.train.group_size)
            groups: dict[int, list[int]] = {}
            for uid, n in zip(uids, lengths["response_length"].tolist()):
                if uid in routed:
                    groups.setdefault(int(routed[uid]), []).append(int(n))
            done = set(uids)
            self.asp_routed = [t for t in ({u: p for u, p in t.items() if u not in done} for t in self.asp_routed) if t]
            if groups:
                balancer.report_groups.remote(sorted(groups.items()))

        def asp_priorities(self, batch):
            """Per row of a drawn training batch, its group's routing priority (None: not a training batch)."""
            import numpy as np

            from .lengths import PROMPT_ID_KEY
            from .routing import priority_table

            extra = batch.non_tensor_batch.get("extra_info")
            if extra is None or not all(isinstance(e, dict) and PROMPT_ID_KEY in e for e in extra):
                return None
            epoch = self.asp_sampler.epoch
            table = priority_table(self.asp_sampler.order(epoch), self.asp_sampler.plan(epoch), epoch,
                                   self.asp.cfg.rollout.num_instances)
            return np.array([table[int(e[PROMPT_ID_KEY])] for e in extra], dtype=np.int64)

        def asp_record(self, batch):
            """Write the response lengths of the step's batch (returned: its rows); at an epoch's
            end, the whole history."""
            per_epoch = len(self.train_dataloader)
            step = int(self.global_steps)
            rows = self.asp.recorder.record(step, (step - 1) // per_epoch, batch.batch, batch.non_tensor_batch)
            if step % per_epoch == 0:
                self.asp.recorder.consolidate()
            return rows

    return AspTrainer
