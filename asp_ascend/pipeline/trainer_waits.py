"""The loop's bounded waits on the trainer's calls outside a train step (a part of
:class:`~asp_ascend.pipeline.orchestrator.Orchestrator`, whose state they use): the ``publish`` of
each version, the checkpoint save (``save_checkpoint``) and the ``open_group`` of a new broadcast
group (``WeightSync.wait_group``: the set of instances changed, or a broadcast failed).

Each has its own :class:`~asp_ascend.pipeline.train_watch.StepWatch` with the step's keys: a call
still out after max(``train.step_timeout_s``, ``train.step_timeout_factor`` x the slowest such call
so far) stops the run through ``_stop_hung`` (a ``trainer`` event, a log line, an error naming the
newest complete checkpoint). A call's clock runs from its send to when the loop sees it done.

The publish is sent when an iteration ends and not waited for: the instances' ``update_weights``
(object store) or the trainer's ``send_weights`` (broadcast) take its result. A publish that never
returns held the run for ever when no train step followed to time it (the run's last version);
now it is checked at every pass of the loop and while the loop waits on a later trainer call
(:meth:`TrainerWaits._trainer_get`), and stops the run with :class:`PublishHung`. The loop waits
for ``open_group`` at once (the instances must be told the port its store listens on); it had no
bound (``weight_sync.timeout_s``, its argument, is the store's rendezvous timeout: the call itself
waits for no one) and now stops the run with :class:`GroupOpenHung`.
"""
from __future__ import annotations

from typing import Any

from .train_watch import (CheckpointSaveHung, GroupOpenHung, PublishHung, group_hung_message, publish_hung_message,
                          save_hung_message)

__all__ = ["TrainerWaits"]


class TrainerWaits:
    """The waits on the trainer's publish and checkpoint save; mixed into the orchestrator."""

    def _publish_sent(self, version: int, ref: Any) -> None:
        """``ref``: the trainer's ``publish`` of ``version``, just sent; its clock starts (a publish
        still out before it keeps the watch's clock: the actor runs them in order)."""
        self._check_publish()
        self.publishing.append((ref, version, self.now()))
        if len(self.publishing) == 1:
            self.publish_watch.sent(self.now(), "publish")

    def _check_publish(self) -> None:
        """Take the publishes that returned (oldest first); raise :class:`PublishHung` when the oldest
        still out is past its bound."""
        w = self.publish_watch
        while self.publishing:
            ref, version, _ = self.publishing[0]
            if not self.ray.wait([ref], timeout=0)[0]:
                break
            w.done(self.now())
            self.publishing.pop(0)
            if self.publishing:
                w.sent(self.publishing[0][2], "publish")
        if not self.publishing:
            return
        waited = w.overdue(self.now())
        if waited is not None:
            how = "broadcast" if self.wsync.broadcast else "object_store"
            self._stop_hung(w, waited, version - 1, None, version, f"version {version}",
                            lambda ck: PublishHung(publish_hung_message(version, how, waited, w, ck)))

    def _save_trainer(self, version: int, tmp) -> Any:
        """The trainer's part of checkpoint ``version`` into ``tmp``, bounded by ``save_watch``: past the
        bound, :class:`CheckpointSaveHung`; ``tmp`` is never renamed."""
        w, ref = self.save_watch, self.trainer.save_checkpoint.remote(str(tmp), {"iteration": version})
        return self._watched_get(w, "save_checkpoint", ref, version, f"version {version}", lambda waited, ck:
                                 CheckpointSaveHung(save_hung_message(version, str(tmp), waited, w, ck)))

    def _wait_group(self, ref, version: int, gen: int, members: list[int]) -> int:
        """The port of the trainer's ``open_group`` (``ref``) of weight-sync group ``gen``, formed to send
        ``version`` to ``members`` (``WeightSync.wait_group``), bounded by ``group_watch``: past the
        bound, :class:`GroupOpenHung`."""
        w = self.group_watch
        return self._watched_get(w, "open_group", ref, version, f"weight-sync group {gen}",
                                 lambda waited, ck: GroupOpenHung(group_hung_message(
                                     version, gen, members, waited, w, ck, self.wsync.timeout_s)))

    def _watched_get(self, w, call: str, ref, version: int, of: str, error) -> Any:
        """``ray.get`` of trainer call ``ref`` (``call``, just sent, towards policy version ``version``)
        with watch ``w``'s clock on it: past its bound, a ``trainer`` event (state ``hung``), a log line
        and ``error(waited, the newest complete checkpoint or None)`` raised."""
        w.sent(self.now(), call)

        def check() -> None:
            waited = w.overdue(self.now())
            if waited is not None:
                self._stop_hung(w, waited, version - 1, None, version, of, lambda ck: error(waited, ck))
        got = self._trainer_get(ref, check)
        w.done(self.now())
        return got

    def _trainer_get(self, ref, check=None) -> Any:
        """``ray.get`` of a trainer call, which runs only after the calls sent before it on the trainer's
        actor return: meanwhile a broadcast in flight is checked (``PendingSyncs.check_sends``) and so is
        a publish (:meth:`_check_publish`), so a trainer hung in either stops the run here too instead of
        blocking it; then ``check()`` (the call's own bound)."""
        while not self.ray.wait([ref], timeout=0.2)[0]:
            self.syncs.check_sends(self.ray)
            self._check_publish()
            if check is not None:
                check()
        return self.ray.get(ref)
