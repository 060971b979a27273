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
waits for no one) and now stops the run with :class:`GroupOpenHung`; so does the ``node_ip`` asked
before a run's first group. A restarted instance's catch-up copy (``WeightSync.catch_up_ticket``, a
``publish`` to the object store under the broadcast) is a publish like the others: the fleet hands
it to :meth:`TrainerWaits._publish_sent` (it was timed only by a train step queued behind it).

The trainer's calls before the loop (a resume's ``load_checkpoint``, the first publish, ``node_ip``
and ``open_group`` of the first group) wait the same way, through
:class:`~asp_ascend.pipeline.start_waits.StartWaits` (the same methods, watches and keys).
"""
from __future__ import annotations

from typing import Any

from .train_watch import (CheckpointSaveHung, GroupOpenHung, PublishHung, group_hung_message, publish_hung_message,
                          save_hung_message)

__all__ = ["TrainerWaits"]


class TrainerWaits:
    """The waits on the trainer's publish, checkpoint save and group formation; mixed into the
    orchestrator, and into :class:`~asp_ascend.pipeline.start_waits.StartWaits` before the loop. Uses
    the host's ``ray``, ``trainer``, ``wsync``, ``syncs``, ``out``, ``log``, ``now()``, ``_event`` and its
    watches (``publish_watch``, ``save_watch``, ``group_watch``, ``host_watch``) and ``publishing``, which
    :meth:`_init_waits` makes."""

    def _init_waits(self, bounds) -> None:
        """The watches of the calls waited on here, each on ``bounds`` (a ``TrainerBounds``), and no
        publish out yet."""
        self.save_watch, self.publish_watch = bounds.watch(), bounds.watch()
        self.group_watch, self.host_watch = bounds.watch(), bounds.watch()   # open_group, node_ip
        self.publishing: list[tuple] = []   # (publish ref, version, sent, catch-up instance or None), oldest first

    def _iteration_of(self, version: int) -> int | None:
        """The iteration a hung call towards ``version`` stops (its ``trainer`` event's): the one whose
        end sent it."""
        return version - 1

    def _publish_sent(self, version: int, ref: Any, catch_up: int | None = None) -> None:
        """``ref``: the trainer's ``publish`` of ``version``, just sent (``catch_up``: the restarted
        instance it is a copy for; None: the version's own publish); its clock starts (a publish still
        out before it keeps the watch's clock: the actor runs them in order)."""
        self._check_publish()
        self.publishing.append((ref, version, self.now(), catch_up))
        if len(self.publishing) == 1:
            self.publish_watch.sent(self.now(), "publish")

    def _check_publish(self) -> None:
        """Take the publishes that returned (oldest first); raise :class:`PublishHung` when the oldest
        still out is past its bound."""
        w = self.publish_watch
        while self.publishing:
            ref, version, _, catch_up = self.publishing[0]
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
            how = "broadcast" if self.wsync.broadcast and catch_up is None else "object_store"
            of = f"version {version}" if catch_up is None else \
                f"version {version} (a catch-up copy for restarted instance {catch_up})"
            # a catch-up copy is sent while the trainer holds ``version``, before any step of iteration ``version``
            iteration = self._iteration_of(version) if catch_up is None else version
            self._stop_hung(w, waited, iteration, None, version, of,
                            lambda ck: PublishHung(publish_hung_message(version, how, waited, w, ck, catch_up)))

    def _save_trainer(self, version: int, tmp) -> Any:
        """The trainer's part of checkpoint ``version`` into ``tmp``, bounded by ``save_watch``: past the
        bound, :class:`CheckpointSaveHung`; ``tmp`` is never renamed."""
        w, ref = self.save_watch, self.trainer.save_checkpoint.remote(str(tmp), {"iteration": version})
        return self._watched_get(w, "save_checkpoint", ref, version, f"version {version}", lambda waited, ck:
                                 CheckpointSaveHung(save_hung_message(version, str(tmp), waited, w, ck)))

    def _wait_group(self, call: str, ref, version: int, gen: int, members: list[int]) -> Any:
        """The result of the trainer's ``call`` (``ref``): ``node_ip`` (the host of the group's store) or
        ``open_group`` (the port it listens on) of weight-sync group ``gen``, formed to send ``version`` to
        ``members`` (``WeightSync.wait_group``), bounded by ``group_watch`` (``host_watch`` for ``node_ip``):
        past the bound, :class:`GroupOpenHung`."""
        w = self.group_watch if call == "open_group" else self.host_watch
        return self._watched_get(w, call, ref, version, f"weight-sync group {gen}",
                                 lambda waited, ck: GroupOpenHung(group_hung_message(
                                     version, gen, members, waited, w, ck, self.wsync.timeout_s, call)))

    def _watched_get(self, w, call: str, ref, version: int, of: str, error) -> Any:
        """``ray.get`` of trainer call ``ref`` (``call``, just sent, towards policy version ``version``)
        with watch ``w``'s clock on it: past its bound, a ``trainer`` event (state ``hung``), a log line
        and ``error(waited, the newest complete checkpoint or None)`` raised."""
        w.sent(self.now(), call)

        def check() -> None:
            waited = w.overdue(self.now())
            if waited is not None:
                self._stop_hung(w, waited, self._iteration_of(version), None, version, of,
                                lambda ck: error(waited, ck))
        got = self._trainer_get(ref, check)
        w.done(self.now())
        return got

    def _trainer_get(self, ref, check=None) -> Any:
        """``ray.get`` of a trainer call (or of a list of references, once all are ready), which runs
        only after the calls sent before it on the trainer's actor return: meanwhile a broadcast in
        flight is checked (``PendingSyncs.check_sends``) and so is a publish (:meth:`_check_publish`),
        so a trainer hung in either stops the run here too instead of blocking it; then ``check()``
        (the call's own bound)."""
        refs = ref if isinstance(ref, list) else [ref]
        while len(self.ray.wait(refs, num_returns=len(refs), timeout=0.2)[0]) < len(refs):
            self.syncs.check_sends(self.ray)
            self._check_publish()
            if check is not None:
                check()
        return self.ray.get(ref)

    def _stop_hung(self, w, waited: float, iteration: int | None, mini_batch, version: int, of: str, error) -> None:
        """Stop the run for the trainer call of watch ``w`` out ``waited`` s past its bound: a ``trainer``
        event (state ``hung``), a log line, then ``error(the newest complete checkpoint or None)``."""
        from .checkpoint import find_latest

        ck = find_latest(self.out.checkpoint_dir) if self.out.checkpoint_dir is not None else None
        self._event("trainer", t=self.now(), state="hung", call=w.call, iteration=iteration, mini_batch=mini_batch,
                    version=version, waited_s=waited, bound_s=w.bound_s())
        self.log.say(f"trainer hung: its {w.call} of {of} is out {waited:.0f} s (bound {w.bound_s():g} s); "
                     f"stopping the run")
        raise error(None if ck is None else str(ck))
