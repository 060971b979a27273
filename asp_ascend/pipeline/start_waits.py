"""The trainer's calls before the loop, bounded as the loop's are (used by ``pipeline/actors.warm_up``).

Before its first iteration ``asp train`` waits on the trainer: a resume's ``load_checkpoint`` (the
optimizer state, RNG states and KL reference read back), the first ``publish`` (version 0, or the
resumed version) and, with the broadcast, the ``node_ip`` and ``open_group`` of the run's first
weight-sync group, then the first sync itself (the instances' receives, the trainer's
``send_weights``). These were bare ``ray.get`` calls: a trainer hung in one (a file system that
blocks, a gather that never completes, a wedged device) held the run there for ever, silently.

:class:`StartWaits` waits on them with the loop's own code (:class:`~.trainer_waits.TrainerWaits`:
``_watched_get``, ``_trainer_get``, ``_publish_sent`` / ``_check_publish``, ``_wait_group``,
``_stop_hung``) and keys: each call has its own :class:`~.train_watch.StepWatch` with
``train.step_timeout_s`` and ``train.step_timeout_factor`` (nothing is measured yet, so the bound is
``train.step_timeout_s``; 0 turns it off), checked every 0.2 s while it is out, beside the publish
queued before it; the first sync's broadcast send is bounded as the loop's are
(``PendingSyncs.check_sends``: ``weight_sync.stall_timeout_s`` + ``weight_sync.send_slack_s`` after
its last receiver ended). A call past its bound appends a ``trainer`` event (state ``hung``,
``iteration`` null: none has started) to ``timeline.jsonl``, logs a line and stops the run with
:class:`~.train_watch.CheckpointLoadHung`, :class:`~.train_watch.PublishHung` or
:class:`~.train_watch.GroupOpenHung` (each a ``TrainerHung``).
"""
from __future__ import annotations

import time
from ..metrics import TimelineWriter
from .contracts import PendingWeights, Trainer, WeightTransport
from .sync_retry import PendingSyncs
from .task import RunOutputs
from .train_watch import CheckpointLoadHung, TrainerBounds, load_hung_message
from .trainer_waits import TrainerWaits

__all__ = ["StartWaits"]


class StartWaits(TrainerWaits):
    """The bounded waits of ``warm_up`` on ``trainer`` (``wsync``: the run's weight transport;
    ``out``: where the run logs, writes its timeline and keeps its checkpoints)."""

    def __init__(self, trainer: Trainer, wsync: WeightTransport, bounds: TrainerBounds, out: RunOutputs):
        import ray

        self.ray, self.trainer, self.wsync, self.out = ray, trainer, wsync, out
        self.t0, self.log = out.t0, out.logger
        self.load_watch = bounds.watch()   # load_checkpoint
        self._init_waits(bounds)           # the first publish, node_ip, open_group
        self.members: list[int] = []
        # only its check_sends runs here (a failed first sync stops the run: nothing is sent again)
        self.syncs = PendingSyncs(wsync, lambda: list(self.members), lambda _v: False, self.log.say,
                                  send_slack_s=bounds.send_slack_s)

    def now(self) -> float:
        return time.time() - self.t0

    def _iteration_of(self, version: int) -> None:
        return None   # before the loop: no iteration has started

    def _event(self, kind: str, **ev) -> None:
        """Appended to the run's ``timeline.jsonl`` (the loop's writer appends after it)."""
        writer = TimelineWriter(self.out.timeline_path)
        try:
            writer.add(kind, **ev)
        finally:
            writer.close()

    def load_checkpoint(self, path, version: int) -> int:
        """The trainer's ``load_checkpoint`` of a resume's checkpoint ``path`` (of policy ``version``),
        bounded by ``load_watch``: past the bound, :class:`CheckpointLoadHung`. Returns the version read."""
        w = self.load_watch
        ref = self.trainer.load_checkpoint.remote(str(path))
        return int(self._watched_get(w, "load_checkpoint", ref, version, f"checkpoint {path}",
                                     lambda waited, _ck: CheckpointLoadHung(load_hung_message(str(path), waited, w))))

    def first_sync(self, version: int, members: list[int]) -> PendingWeights:
        """Publish ``version`` and send it to ``members``, waiting until every one holds it (a receive's
        or the send's error is raised, as ``ray.get`` would): the publish, ``node_ip`` and ``open_group``
        bounded as the loop's, the broadcast's send by its stall bound. Returns the sync."""
        self.members = list(members)
        self.wsync.wait_group = self._wait_group
        try:
            s = self.wsync.publish(version)
            self._publish_sent(version, s.ticket)
            self.wsync.push(s, self.members)
            self.syncs.add(s)
            self._trainer_get(s.waiting())
        finally:
            self.wsync.wait_group = None   # the loop sets its own
        return s
