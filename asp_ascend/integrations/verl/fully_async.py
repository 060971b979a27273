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

verl's own count-based pause stays in force; with the feed in iteration order and
``staleness_threshold >= k`` (checked by the config bridge) it never pauses earlier than the lag bound
does. Instance choice stays verl's (its load balancer); guided dispatch across verl's servers is not
wired in.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from ...scheduler.admission import AdmissionController


class LagGate:
    """ASP admission over one stream of prompts: the n-th prompt fed belongs to iteration
    ``n // prompts_per_version``; it may start while the rollouter holds version v >= iteration - k.
    State changes only through :meth:`take` and :meth:`on_sync`."""

    def __init__(self, prompts_per_version: int, lag_bound: int, start_version: int = 0, taken: int = 0):
        if prompts_per_version < 1:
            raise ValueError(f"prompts_per_version must be >= 1, got {prompts_per_version}")
        self.b, self.taken, self.start = int(prompts_per_version), int(taken), int(start_version)
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
    """verl's ``pending_queue`` with ASP admission on ``get``; ``None`` (verl's end signal) passes."""

    def __init__(self, gate: LagGate, maxsize: int = 0):
        super().__init__(maxsize)
        self.gate = gate
        self._opened: Optional[asyncio.Event] = None

    async def get(self):
        item = await super().get()
        if item is None:
            return item
        while not self.gate.admissible():
            if self._opened is None:
                self._opened = asyncio.Event()
            self._opened.clear()
            await self._opened.wait()
        self.gate.take()
        return item

    def on_sync(self) -> int:
        version = self.gate.on_sync()
        if self._opened is not None:
            self._opened.set()
        return version


def asp_rollouter_class(base: Optional[type] = None) -> type:
    """verl's ``FullyAsyncRollouter`` (its undecorated class; wrap the result with ``ray.remote`` as verl
    does) with the ASP feed order and admission; construct with verl's arguments plus ``asp=VerlSchedule``."""
    if base is None:
        from . import import_verl

        base = import_verl("verl.experimental.fully_async_policy.fully_async_rollouter",
                           "the ASP fully async rollouter").FullyAsyncRollouter.__ray_actor_class__

    class AspRollouter(base):  # type: ignore[misc, valid-type]
        """verl's fully async rollouter fed and admitted by the ASP schedule (see the module doc)."""

        def __init__(self, *args: Any, asp, **kwargs: Any):
            self.asp = asp
            self.asp_sampler = None
            super().__init__(*args, **kwargs)
            cfg = asp.cfg
            self.asp_gate = LagGate(cfg.train.global_batch_size, cfg.pipeline.lag_bound)
            self.pending_queue = AdmissionQueue(self.asp_gate, maxsize=self.pending_queue.maxsize)

        def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler=None):
            from .lengths import IndexedDataset

            dataset = train_dataset if isinstance(train_dataset, IndexedDataset) else IndexedDataset(train_dataset)
            self.asp_sampler = self.asp.sampler(len(dataset), layout="dispatch")
            return super()._create_dataloader(dataset, val_dataset, collate_fn, self.asp_sampler)

        def load_checkpoint(self):
            """verl's resume (``global_steps`` from ``global_step_{version}``, the dataloader state), then the
            gate resumes at that parameter version."""
            out = super().load_checkpoint()
            per_version = self.required_samples * self.config.async_training.trigger_parameter_sync_step
            self.asp_gate.restore((self.global_steps - 1) // per_version)
            return out

        async def reset_staleness(self):
            out = await super().reset_staleness()
            self.pending_queue.on_sync()
            return out

    AspRollouter.__name__ = AspRollouter.__qualname__ = "AspRollouter"
    return AspRollouter
