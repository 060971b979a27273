"""A trainer hung inside a train step: the bound the loop keeps while it waits for a trainer call.

Ray cannot interrupt a running call of the trainer's actor, and every later call (the next step,
a weight sync, a checkpoint) queues behind it; a trainer call that never returns (a collective
that never completes on one rank, a wedged device, a deadlock in the data path) would hold the
run for ever while the rollout instances fill to the lag bound and wait. So the loop measures
each trainer call of a step (``train_step``, or a streamed step's ``accumulate`` and
``apply_step``) from the moment it sends it to the moment it sees its result, and gives up on
one that has been out longer than

    max(train.step_timeout_s, train.step_timeout_factor x the slowest such call so far)

(:class:`StepWatch`): the run stops with :class:`TrainStepHung`. The first call of an attempt
has no measurement, so only ``train.step_timeout_s`` bounds it: it must cover the first step's
one-time costs (kernel compilation, graph capture, allocator warm-up). Checkpoint saves are not
train steps: the loop sends none while a step is out, their time does not count, and they do not
enter "the slowest call". A save has its own :class:`StepWatch` (the same keys, its own clock and
its own slowest save): one that outlives it stops the run with :class:`CheckpointSaveHung`. A call queued behind the trainer's previous work (the object store's
``publish`` of the version before, ``begin_iteration``) counts from its send, so that work counts
too. ``train.step_timeout_s: 0`` turns the bound off.
"""
from __future__ import annotations

from dataclasses import dataclass

from .sync_retry import SEND_SLACK_S, TrainerHung

STEP_TIMEOUT_S = 1800.0      # train.step_timeout_s: the bound of a call with nothing measured yet
STEP_TIMEOUT_FACTOR = 10.0   # train.step_timeout_factor: times the slowest call so far

__all__ = ["STEP_TIMEOUT_FACTOR", "STEP_TIMEOUT_S", "CheckpointLoadHung", "CheckpointSaveHung", "GroupOpenHung",
           "PublishHung", "StepWatch", "TrainStepHung", "TrainerBounds", "group_hung_message", "hung_message",
           "load_hung_message", "publish_hung_message", "save_hung_message"]


@dataclass
class TrainerBounds:
    """How long the loop waits on the trainer before it counts as hung (config keys in comments)."""
    step_timeout_s: float = STEP_TIMEOUT_S            # train.step_timeout_s (0 = no bound)
    step_timeout_factor: float = STEP_TIMEOUT_FACTOR  # train.step_timeout_factor
    send_slack_s: float = SEND_SLACK_S                # weight_sync.send_slack_s (pipeline/sync_retry.py)

    @classmethod
    def from_config(cls, cfg) -> "TrainerBounds":
        return cls(float(cfg.train.step_timeout_s), float(cfg.train.step_timeout_factor),
                   float(cfg.weight_sync.send_slack_s))

    def watch(self) -> "StepWatch":
        """A new watch on these bounds: each kind of trainer call has its own clock and slowest call."""
        return StepWatch(self.step_timeout_s, self.step_timeout_factor)


class TrainStepHung(TrainerHung):
    """A trainer call of a train step did not return within its bound: the trainer hangs, and
    the run cannot go on without it (the CLI prints the message, which says how to go on)."""


class CheckpointSaveHung(TrainerHung):
    """The trainer's checkpoint save did not return within its bound (a file system that blocks, a
    full disk that hangs): the run stops; the half-written checkpoint is never the resume point."""


class CheckpointLoadHung(TrainerHung):
    """A resume's ``load_checkpoint`` (the optimizer state, RNG states and KL reference read back) did
    not return within its bound: the run stops before its loop; the checkpoint is left as it is."""


class PublishHung(TrainerHung):
    """The trainer's ``publish`` of a version (the gather of its weights, and with the object store
    their ``ray.put``) did not return within its bound: the instances would never receive it."""


class GroupOpenHung(TrainerHung):
    """The trainer's ``open_group`` of a new broadcast group (the run's first, the set of instances
    changed, or a broadcast failed), or the ``node_ip`` asked before the first, did not return within
    its bound: no weights can reach the instances again."""


class StepWatch:
    """The clock of the trainer call in flight (at most one) and the slowest call seen. Times are
    the caller's clock (seconds); pure, no Ray."""

    def __init__(self, timeout_s: float = STEP_TIMEOUT_S, factor: float = STEP_TIMEOUT_FACTOR):
        self.timeout_s, self.factor = float(timeout_s), float(factor)
        self.t_sent: float | None = None   # when the call in flight was sent
        self.slowest = 0.0                 # the longest call seen so far, sent to seen done (s)
        self.calls = 0                     # calls seen done
        self.call, self.samples = "", 0    # the call in flight: its name, the samples it trains

    def sent(self, now: float, call: str = "train_step", samples: int = 0) -> None:
        """A trainer call of a step was sent (the loop has at most one out)."""
        self.t_sent, self.call, self.samples = now, call, int(samples)

    def done(self, now: float) -> float:
        """The call in flight was seen done; returns its time."""
        took = 0.0 if self.t_sent is None else max(0.0, now - self.t_sent)
        self.slowest, self.calls, self.t_sent = max(self.slowest, took), self.calls + 1, None
        return took

    def bound_s(self) -> float:
        """The bound of the call in flight: ``max(timeout_s, factor x slowest)``; 0 = none."""
        if self.timeout_s <= 0:
            return 0.0
        return max(self.timeout_s, self.factor * self.slowest)

    def overdue(self, now: float) -> float | None:
        """The seconds the call in flight has been out, once past its bound (else None)."""
        bound = self.bound_s()
        if self.t_sent is None or bound <= 0 or now - self.t_sent <= bound:
            return None
        return now - self.t_sent


def hung_message(call: str, iteration: int, mini_batch: int, samples: int, waited: float, watch: StepWatch,
                 checkpoint: str | None) -> str:
    """What :class:`TrainStepHung` says: what the loop waited for, how long, its bound and where it
    comes from, the checkpoint to resume from (``checkpoint``: its folder, None: none written)."""
    what = f"{call} of {samples} sample(s)" if samples else call
    how = (f"resume from its newest checkpoint, {checkpoint}, with resume=true" if checkpoint is not None else
           "no checkpoint was written (train.checkpoint_every=N saves one every N iterations), so start it again "
           "with overwrite=true")
    return (f"iteration {iteration} (policy version {iteration}), mini-batch {mini_batch}: the trainer's {what} has "
            f"not returned {waited:.0f} s after it was sent, past its bound of {watch.bound_s():g} s "
            f"({_bound_from(watch, 'trainer call')}): the trainer hangs (a collective that never returns on one of its "
            f"ranks, a wedged device, a deadlock in its data path), and every later trainer call would wait behind "
            f"it. The run stops with nothing of iteration {iteration} saved; {how}. If the trainer is only slow (a "
            f"first step that compiles, a much longer batch), {_RAISE}")


def _bound_from(watch: StepWatch, call: str) -> str:
    """Where the bound of ``watch``'s call in flight comes from (``call``: what it measures)."""
    measured = (f"train.step_timeout_factor {watch.factor:g} x the slowest of {watch.calls} {call}(s) so far, "
                f"{watch.slowest:.1f} s" if watch.calls else f"no {call} measured yet: this is the first")
    return f"the larger of train.step_timeout_s = {watch.timeout_s:g} s and {measured}"


def _resume_from(checkpoint: str | None) -> str:
    return (f"resume from the newest complete checkpoint, {checkpoint}, with resume=true" if checkpoint is not None
            else "no complete checkpoint exists, so start it again with overwrite=true")


_RAISE = "raise train.step_timeout_s or train.step_timeout_factor (train.step_timeout_s=0 turns the bound off)"


def publish_hung_message(version: int, transport: str, waited: float, watch: StepWatch, checkpoint: str | None,
                         catch_up: int | None = None) -> str:
    """What :class:`PublishHung` says: the publish, how long, its bound and where it comes from, the
    newest complete checkpoint to resume from (``checkpoint``; None: none written). ``catch_up``: the
    restarted instance the publish is a copy for (None: the version's own publish)."""
    what = "its weights gathered and put in Ray's object store" if transport == "object_store" else \
        "its weights gathered for the broadcast"
    if catch_up is not None:
        what += f", a catch-up copy for restarted instance {catch_up}, which rejoins once it holds it"
    who = "the instances never receive" if catch_up is None else f"instance {catch_up} never receives"
    return (f"policy version {version}: the trainer's publish of version {version} ({transport}: {what}) has not "
            f"returned {waited:.0f} s after it was sent, past its bound of {watch.bound_s():g} s "
            f"({_bound_from(watch, 'publish call')}): the trainer hangs (a gather that never completes on one of "
            f"its ranks, an object store that does not take the weights, a wedged device), {who} version "
            f"{version}, and every later trainer call would wait behind it. The run stops; "
            f"{_resume_from(checkpoint)}. If the publish is only slow (a large model), {_RAISE}")


def group_hung_message(version: int, gen: int, members: list[int], waited: float, watch: StepWatch,
                       checkpoint: str | None, group_timeout_s: float, call: str = "open_group") -> str:
    """What :class:`GroupOpenHung` says: the call (``open_group``, or ``node_ip``, asked before a run's
    first group), the group, how long, its bound and where it comes from, the newest complete checkpoint
    to resume from (``checkpoint``; None: none written)."""
    if call == "open_group":
        what, doing = call, "closing its previous group, starting the group's rendezvous store"
    else:
        what, doing = f"{call} (the host its store will listen on)", "its actor stuck, its node's address not found"
    return (f"weight sync of policy version {version}: the trainer's {what} of weight-sync group {gen} (the "
            f"trainer and the workers of instance(s) {', '.join(map(str, members))}) has not returned {waited:.0f} s "
            f"after it was sent, past its bound of {watch.bound_s():g} s ({_bound_from(watch, f'{call} call')}): "
            f"the trainer hangs ({doing}, or in the publish queued before it), no weights can reach the instances, "
            f"and every later trainer call would wait behind it (weight_sync.timeout_s = {group_timeout_s:g} s bounds "
            f"the group's rendezvous after this call, not the call). The run stops; {_resume_from(checkpoint)}. If "
            f"the trainer is only slow, {_RAISE}")


def load_hung_message(path: str, waited: float, watch: StepWatch) -> str:
    """What :class:`CheckpointLoadHung` says: the checkpoint, how long, its bound and where it comes from,
    and that the same resume can be tried again (the load writes nothing)."""
    return (f"resume from {path}: the trainer's load_checkpoint (its optimizer state, RNG states and KL reference "
            f"read back) has not returned {waited:.0f} s after it was sent, past its bound of {watch.bound_s():g} s "
            f"({_bound_from(watch, 'checkpoint load')}): the load hangs (a network file system that blocks, a "
            f"wedged device), and every later trainer call would wait behind it. The run stops before its first "
            f"iteration, with nothing trained and the checkpoint untouched; check that its file system answers "
            f"(e.g. ls -l {path}), then run the same command with resume=true again. If the load is only slow (a "
            f"large optimizer state on a slow file system), {_RAISE}")


def save_hung_message(version: int, tmp: str, waited: float, watch: StepWatch, checkpoint: str | None) -> str:
    """What :class:`CheckpointSaveHung` says: the save, how long, its bound and where it comes from,
    the newest complete checkpoint to resume from (``checkpoint``; None: none written)."""
    return (f"checkpoint of policy version {version}: the trainer's save_checkpoint into {tmp} has not returned "
            f"{waited:.0f} s after it was sent, past its bound of {watch.bound_s():g} s "
            f"({_bound_from(watch, 'checkpoint save')}): the save hangs (a network file system that blocks, a full "
            f"disk, a wedged device), and every later trainer call would wait behind it. The run stops; the "
            f"half-written folder is never used for a resume; {_resume_from(checkpoint)}. If the save is only slow "
            f"(a large model on a slow file system), {_RAISE}")
