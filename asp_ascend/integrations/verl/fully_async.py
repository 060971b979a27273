"""Fully async verl with the ASP schedule: feed order and admission inside ``FullyAsyncRollouter``.

verl's fully async recipe (``verl/experimental/fully_async_policy``) has a rollouter that feeds one
prompt at a time from its dataloader into ``pending_queue`` (``_feed_samples``); a processor loop
takes them (``_processor_worker``: ``await self.pending_queue.get()``) and starts each on a rollout
server; the trainer publishes parameter versions and calls ``reset_staleness`` after every sync (and
once before ``fit``, for the initial weights). verl bounds staleness by a *count*: generation pauses
when ``staleness_samples >= required_samples x (staleness_threshold + 1) x trigger_parameter_sync_step``.

What :func:`asp_rollouter_class` changes, each override calling verl's own method:

- **feed order** (``_create_dataloader``): the dataloader draws from :class:`.sampler.AspSampler` with
  the ``dispatch`` layout: the schedule's iterations in order (one ASP iteration = the prompts of one
  parameter version, ``require_batches x trigger_parameter_sync_step x ppo_mini_batch_size``), each in
  the order the schedule starts its prompts (long-tail groups first, DESIGN 4).
- **admission** (``pending_queue``): an :class:`AdmissionQueue` whose ``get`` hands out the next prompt
  only when ASP's admission state machine (:class:`~asp_ascend.scheduler.admission.AdmissionController`,
  the one the simulator and the runtime drive) admits its iteration i: the rollouter holds version
  >= i - k. verl's processor loop blocks in that ``get`` until it does.
- **versions** (``reset_staleness``): each call publishes the next version to the gate (the first call,
  before ``fit``, is the starting version).

- **instance** (``_process_single_sample_streaming``, ``verl.route_servers``): before verl's method
  generates a group, its rows get the ``priority`` that carries the group's schedule instance
  (:mod:`.routing`); verl's load balancer, created from ``actor_rollout_ref.rollout.router_config_path``
  (set here, :mod:`.router`), sends the group to that server (guided: to another one with room when it
  is full).
- **lengths** (same method, ``verl.record_lengths``): after verl's method the sample holds verl's
  rollout output; its response lengths are kept until the trainer takes the sample from verl's
  message queue (:class:`TrainedLengths`; the trainer's queue client is
  :class:`.consumed.ConsumptionClient`, so a sample the queue drops is never recorded), then written
  per parameter version
  (``output_dir/lengths/step_<version>.parquet``, DESIGN 6), and consolidated into
  ``length_history.parquet`` before each epoch is planned (the adaptive re-plan reads them) and when
  ``fit`` ends.

verl's own count-based pause stays in force; with the feed in iteration order and
``staleness_threshold >= k`` (checked by the config bridge) it never pauses earlier than the lag bound
does.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import numpy as np

from ...scheduler.admission import AdmissionController


class LagGate:
    """ASP admission over one stream of prompts: the n-th prompt fed belongs to iteration
    ``n // prompts_per_version``; it may start while the rollouter holds version v >= iteration - k.
    State changes only through :meth:`take` and :meth:`on_sync`."""

    def __init__(self, prompts_per_version: int, lag_bound: int, start_version: int = 0, taken: int = 0):
        if prompts_per_version < 1:
            raise ValueError(f"prompts_per_version must be >= 1, got {prompts_per_version}")
        self.b, self.taken, self.start = int(prompts_per_version), int(taken), int(start_version)
        self.fed = self.taken       # prompts put into the queue (fed <= admissible frontier, see feedable)
        self.adm = AdmissionController(lag_bound, 1)
        self.syncs = 0
        self.admitted: list[tuple[int, int]] = []   # (iteration, version held at admission), per prompt

    @property
    def version(self) -> int:
        return self.adm.instance_version[0]

    @property
    def next_iteration(self) -> int:
        return self.taken // self.b

    def admissible(self) -> bool:
        return self.adm.admissible(0, self.next_iteration)

    def feedable(self) -> bool:
        """The next prompt the feed would put belongs to an admissible iteration. The feed waits for it,
        so verl's dataloader draws (and an adaptive schedule plans an epoch) no earlier than the lag
        bound lets its prompts start: the re-plan sees every length observed up to then."""
        return self.adm.admissible(0, self.fed // self.b)

    def take(self) -> int:
        """Admit the next prompt (raises LagViolation when it is not admissible); returns its version."""
        it = self.next_iteration
        version = self.adm.on_admit(0, it)
        self.taken += 1
        self.admitted.append((it, version))
        return version

    def restore(self, version: int) -> None:
        """Resume at parameter version ``version`` (verl's ``global_step_{version}`` checkpoint): the trainer
        has consumed ``version x prompts_per_version`` prompts, so the next prompt admitted is the first of
        iteration ``version``, and the next sync (verl's sync before ``fit``) holds ``version``. Prompts verl
        had drawn but not finished when it saved are not counted (verl does not restore them either)."""
        if self.syncs or self.taken:
            raise RuntimeError(f"LagGate.restore({version}) after {self.syncs} syncs and {self.taken} prompts; "
                               f"restore before the first sync (verl loads checkpoints before fit)")
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        self.start, self.taken = int(version), int(version) * self.b
        self.fed = self.taken
        self.adm = AdmissionController(self.adm.k, 1)

    def on_sync(self) -> int:
        """verl synced its rollout servers (``reset_staleness``): the first sync holds the starting
        version, every later one the next. Returns the version now held."""
        version = self.start + self.syncs
        self.syncs += 1
        if version > self.adm.published:
            self.adm.on_publish(version)
        self.adm.on_instance_synced(0, version)
        return version


class AdmissionQueue(asyncio.Queue):
    """verl's ``pending_queue`` with ASP admission on ``get`` (and the feed held at the admissible
    frontier on ``put``); ``None`` (verl's end signal) passes."""

    def __init__(self, gate: LagGate, maxsize: int = 0):
        super().__init__(maxsize)
        self.gate = gate
        self._opened: Optional[asyncio.Event] = None

    async def put(self, item) -> None:
        """verl's feed: waits until the item's iteration is admissible (:meth:`LagGate.feedable`)."""
        if item is not None:
            await self._until(self.gate.feedable)
            self.gate.fed += 1
        await super().put(item)

    async def get(self):
        item = await super().get()
        if item is None:
            return item
        await self._until(self.gate.admissible)
        self.gate.take()
        return item

    async def _until(self, ready) -> None:
        while not ready():
            if self._opened is None:
                self._opened = asyncio.Event()
            self._opened.clear()
            await self._opened.wait()

    def on_sync(self) -> int:
        version = self.gate.on_sync()
        if self._opened is not None:
            self._opened.set()
        return version


class TrainedLengths:
    """Length rows of generated samples, released once the trainer consumes the sample (verl's
    ``MessageQueue`` drops its oldest sample when full; a dropped sample is never trained, so its
    lengths never reach the history). Either event may come first: the trainer can take a sample
    from the queue before the rollouter's ``put_sample`` call has returned."""

    def __init__(self):
        self.kept: dict = {}          # sample id -> rows, generated, not consumed yet
        self.early: set = set()       # consumed before its rows were kept
        self.ready: list = []         # rows of consumed samples, until taken

    def generated(self, sample_id, rows) -> None:
        if sample_id in self.early:
            self.early.discard(sample_id)
            self.ready.append(rows)
        else:
            self.kept[sample_id] = rows

    def consumed(self, sample_id) -> None:
        rows = self.kept.pop(sample_id, None)
        if rows is None:
            self.early.add(sample_id)
        else:
            self.ready.append(rows)

    def take(self) -> list:
        out, self.ready = self.ready, []
        return out

    def clear(self) -> None:
        self.kept.clear()
        self.early.clear()
        self.ready.clear()


def asp_rollouter_class(base: Optional[type] = None) -> type:
    """verl's ``FullyAsyncRollouter`` (its undecorated class; wrap the result with ``ray.remote`` as verl
    does) with the ASP feed order and admission; construct with verl's arguments plus ``asp=VerlSchedule``."""
    if base is None:
        from . import import_verl

        base = import_verl("verl.experimental.fully_async_policy.fully_async_rollouter",
                           "the ASP fully async rollouter").FullyAsyncRollouter.__ray_actor_class__

    class AspRollouter(base):  # type: ignore[misc, valid-type]
        """verl's fully async rollouter fed, admitted and routed by the ASP schedule (see the module doc)."""

        def __init__(self, *args: Any, asp, **kwargs: Any):
            self.asp = asp
            self.asp_sampler = None
            self.asp_routes: dict[int, dict[int, int]] = {}
            self.asp_lengths: list = []
            self.asp_trained = TrainedLengths()
            config = kwargs.get("config", args[0] if args else None)
            if asp.cfg.verl.route_servers:
                from .router import install

                install(config, asp.cfg, asp.out)
            super().__init__(*args, **kwargs)
            cfg = asp.cfg
            self.asp_gate = LagGate(cfg.train.global_batch_size, cfg.pipeline.lag_bound)
            self.pending_queue = AdmissionQueue(self.asp_gate, maxsize=self.pending_queue.maxsize)

        def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler=None):
            from .lengths import IndexedDataset

            dataset = train_dataset if isinstance(train_dataset, IndexedDataset) else IndexedDataset(train_dataset)
            self.asp_sampler = self.asp.sampler(len(dataset), layout="dispatch")
            if self.asp_sampler.plan_epoch is not None:
                plan = self.asp_sampler.plan_epoch

                def plan_with_lengths(epoch: int):
                    self.asp_flush_lengths()         # the lengths seen so far feed the re-plan
                    self.asp.recorder.consolidate()
                    return plan(epoch)

                self.asp_sampler.plan_epoch = plan_with_lengths
            return super()._create_dataloader(dataset, val_dataset, collate_fn, self.asp_sampler)

        def load_checkpoint(self):
            """verl's resume (``global_steps`` from ``global_step_{version}``, the dataloader state), then the
            gate resumes at that parameter version and length records of later versions are dropped."""
            out = super().load_checkpoint()
            per_version = self.required_samples * self.config.async_training.trigger_parameter_sync_step
            version = (self.global_steps - 1) // per_version
            self.asp_gate.restore(version)
            self.asp.recorder.truncate_after(version)
            self.asp_trained.clear()
            return out

        async def reset_staleness(self):
            out = await super().reset_staleness()
            self.asp_flush_lengths()
            self.pending_queue.on_sync()
            return out

        async def _process_single_sample_streaming(self, rollout_sample):
            prompt_id = _prompt_id(rollout_sample.full_batch)
            priority = None
            if self.asp.cfg.verl.route_servers and prompt_id is not None:
                priority = self.asp_priority(rollout_sample.epoch, prompt_id)
                if priority is not None:
                    rollout_sample.full_batch.non_tensor_batch["priority"] = np.full(
                        len(rollout_sample.full_batch), priority, dtype=np.int64)
            await super()._process_single_sample_streaming(rollout_sample)   # full_batch is now verl's output
            if prompt_id is None:
                return
            rows = self.asp_rows(rollout_sample.epoch, prompt_id, rollout_sample.full_batch)
            if self.asp.cfg.verl.record_lengths:
                # recorded once the trainer takes the sample from verl's message queue (asp_consumed): a
                # sample the queue drops (full: verl's staleness) is never trained and never recorded
                self.asp_trained.generated(rollout_sample.sample_id, rows)
            if priority is not None:                  # the balancer's estimator learns from every finished group
                balancer = getattr(getattr(self, "llm_server_manager", None), "global_load_balancer", None)
                if balancer is not None and hasattr(balancer, "report_lengths"):
                    balancer.report_lengths.remote(int(priority), [int(n) for n in rows["response_length"]])

        def asp_consumed(self, sample_ids: list) -> None:
            """The trainer took these samples from verl's message queue to train them (called by
            :class:`.consumed.ConsumptionClient`, the trainer's queue client): their lengths are recorded."""
            for sid in sample_ids:
                self.asp_trained.consumed(sid)

        async def fit(self):
            try:
                return await super().fit()
            finally:
                self.asp_flush_lengths()
                self.asp.recorder.consolidate()

        # ------------------------------------------------------------ ASP helpers
        def asp_priority(self, epoch: int, prompt_id: int) -> Optional[int]:
            """The ``priority`` that routes ``prompt_id``'s group of ``epoch`` to its schedule instance."""
            from .routing import priority_table

            if epoch not in self.asp_routes:
                self.asp_routes = {e: t for e, t in self.asp_routes.items() if e >= epoch - 1}
                self.asp_routes[epoch] = priority_table(self.asp_sampler.order(epoch), self.asp_sampler.plan(epoch),
                                                        epoch, self.asp.cfg.rollout.num_instances)
            return self.asp_routes[epoch].get(int(prompt_id))

        def asp_rows(self, epoch: int, prompt_id: int, output):
            """The length-history rows (DESIGN 6) of one group's verl output."""
            from .lengths import PROMPT_ID_KEY, batch_lengths

            n = len(output)
            rows = batch_lengths(output.batch, {"extra_info": [{PROMPT_ID_KEY: prompt_id}] * n}, n)
            rows.insert(2, "epoch", np.int64(epoch))
            return rows

        def asp_flush_lengths(self) -> None:
            """Write the lengths kept since the last flush, as the part of the version now held."""
            self.asp_lengths.extend(self.asp_trained.take())
            if self.asp_lengths:
                import pandas as pd

                rows, self.asp_lengths = pd.concat(self.asp_lengths, ignore_index=True), []
                self.asp.recorder.append(self.asp_gate.version, rows)

    AspRollouter.__name__ = AspRollouter.__qualname__ = "AspRollouter"
    return AspRollouter


def _prompt_id(batch) -> Optional[int]:
    """The dataset position :class:`.lengths.IndexedDataset` put into a sample's ``extra_info``."""
    from .lengths import PROMPT_ID_KEY

    extra = batch.non_tensor_batch.get("extra_info")
    if extra is None or not len(extra) or not isinstance(extra[0], dict) or PROMPT_ID_KEY not in extra[0]:
        return None
    return int(extra[0][PROMPT_ID_KEY])
