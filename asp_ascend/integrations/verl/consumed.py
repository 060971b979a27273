"""The fully async trainer's message-queue client that tells the rollouter which samples it trains.

verl 0.9.1's ``MessageQueue`` (``verl/experimental/fully_async_policy/message_queue.py``) drops its
oldest sample when it is full (``put_sample`` returns False; verl counts it as a dropped stale
sample), and ``FullyAsyncTrainer._get_samples_from_queue`` trains what ``get_sample`` hands it. The
length history must hold what was trained, so the rollouter records a group's lengths only when the
trainer takes it: :class:`ConsumptionClient` is verl's ``MessageQueueClient`` whose ``get_sample``
calls the rollouter's ``asp_consumed`` with the sample's id before returning the sample. The
fully async task runner gives it to the trainer (verl's ``set_message_queue_client``) once verl has
built its components. This module imports verl.
"""
from __future__ import annotations

import asyncio
from typing import Any

from . import import_verl

_mq = import_verl("verl.experimental.fully_async_policy.message_queue", "the ASP fully async length history")


class ConsumptionClient(_mq.MessageQueueClient):
    """verl's queue client; ``get_sample`` also reports the sample's id to ``rollouter.asp_consumed``."""

    def __init__(self, queue_actor: Any, rollouter: Any):
        super().__init__(queue_actor)
        self.rollouter = rollouter

    async def get_sample(self) -> Any | None:
        item = await super().get_sample()
        if item is not None and item[0] is not None:
            import ray.cloudpickle as cloudpickle

            sample_id = cloudpickle.loads(item[0]).sample_id
            report = self.rollouter.asp_consumed
            if hasattr(report, "remote"):           # the rollouter's Ray actor (the run)
                await asyncio.wrap_future(report.remote([sample_id]).future())
            else:                                   # a rollouter in this process
                report([sample_id])
        return item
