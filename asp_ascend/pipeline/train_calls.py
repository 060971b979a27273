"""The loop's trainer side (a part of :class:`~asp_ascend.pipeline.orchestrator.Orchestrator`):
which mini-batch the trainer takes next and the calls that train it, whole (``train_step``) or
streamed group by group (``pipeline.stream_groups``: ``accumulate`` per batch of generated groups,
``apply_step`` after the last), and what a finished step records. The state it reads and writes
is the orchestrator's (queue, plan, tail control, progress, ``train_call``, ``streamed``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..scheduler.admission import LagViolation
from ..scheduler.execution import stream_candidate
from ..scheduler.microbatch import step_denominator
from .progress import IterationProgress, check_step_finite
from .train_watch import TrainStepHung, hung_message

__all__ = ["StreamedStep", "TrainerCalls"]


@dataclass
class StreamedStep:
    """``pipeline.stream_groups``: the mini-batch whose groups go to the trainer as they are
    generated (``accumulate``); its optimizer step (``apply_step``) follows its last group."""
    mini_batch: int
    sent: set = field(default_factory=set)           # keys of the groups already sent to the trainer
    samples: list = field(default_factory=list)      # their samples (for the step's denominator)
    ids: list = field(default_factory=list)          # [epoch, prompt_id, sample] of every sent sample


class TrainerCalls:
    """The trainer-side phases of the loop; mixed into the orchestrator, whose state they use."""

    def _start_train_step(self) -> None:
        if self.train_call is not None or self.iteration >= self.last_iteration:
            return
        if self.syncs.broadcasting:
            return  # a broadcast is in flight: the weights must stay those of its version until it lands
        planned = self.plan.iterations.get(self.iteration)
        if planned is None:  # adaptive: the next epoch is not planned yet
            return
        it = self.progress.setdefault(self.iteration, IterationProgress())
        mbs = self.tail.members(self.iteration, planned)
        todo = [m for m in sorted(mbs) if m not in it.done]
        if self.settings.sync_mode and not all(k in self.queue for m in todo for k in mbs[m]):
            return  # sync baseline: generate the whole iteration, then train
        if self.stream_start is not None:
            self._stream_groups(it, planned, mbs, todo)
            return
        mbs, m = self._whole_mini_batch(planned, mbs, todo)
        if m is None:
            return
        self._train_whole(it, mbs, m)

    def _whole_mini_batch(self, planned: dict, mbs: dict, todo: list[int]) -> tuple[dict, int | None]:
        """The membership and the first of ``todo`` whose groups are all generated (None: none is):
        as planned, else after ``pipeline.regroup`` filled one within the iteration, else after
        partial rollout carried the late groups over (each asked only when the one before left
        none)."""
        whole = lambda ms: next((m for m in todo if all(k in self.queue for k in ms[m])), None)  # noqa: E731
        m = whole(mbs)
        for move in (self.tail.regroup, self.tail.maybe_defer):
            if m is None and move(self.iteration):
                mbs = self.tail.members(self.iteration, planned)
                m = whole(mbs)
        if m is not None and self.tail.heavy_first(self.iteration, m):   # pipeline.regroup_heavy
            mbs = self.tail.members(self.iteration, planned)
        return mbs, m

    def _train_whole(self, it: IterationProgress, mbs: dict, m: int) -> None:
        """One ``train_step`` over mini-batch ``m``, all of its groups generated."""
        groups = self.queue.take(mbs[m], self.now())
        samples = self._trained_samples(it, groups)
        denom = self._denominator(mbs)
        ref = (self.trainer.train_step.remote(samples) if denom is None
               else self.trainer.train_step.remote(samples, denom))
        ids = [[g["epoch"], g["prompt_id"], s["sample"]] for g in groups for s in g["samples"]]
        self._send((ref, self.iteration, m, ids), "train_step", len(samples))

    def _stream_groups(self, it: IterationProgress, planned: dict, mbs: dict, todo: list[int]) -> None:
        """``pipeline.stream_groups``: send the generated groups of the mini-batch being streamed to
        the trainer (``accumulate``), its step (``apply_step``) with its last group. With none
        under way: a fully generated mini-batch is trained whole (lowest index first), else
        :func:`stream_candidate` picks a partly generated one; once a group of it is sent, the
        trainer takes no other mini-batch before its step (the others need the step's weights).
        ``pipeline.regroup`` first completes a mini-batch from the iteration's generated groups
        (none under way), or moves generated groups of the other untrained mini-batches into the
        streamed one's unsent, unfinished slots (one waiting). Partial rollout may then defer the
        streamed mini-batch's unfinished groups (never a sent one: a sent group is finished) and
        swap in finished ones of the next iteration."""
        st = self.streamed
        if st is None:
            mbs, m = self._whole_mini_batch(planned, mbs, todo)
            if m is not None:
                self._train_whole(it, mbs, m)
                return
            m = stream_candidate(self.stream_start, todo, lambda x: len(mbs[x]),
                                 lambda x: sum(1 for k in mbs[x] if k in self.queue))
            if m is None:
                return
            st = self.streamed = StreamedStep(m)
        elif not any(k in self.queue for k in mbs[st.mini_batch] if k not in st.sent):
            if not (self.tail.regroup(self.iteration, st.mini_batch) or self.tail.maybe_defer(self.iteration)):
                return
            mbs = self.tail.members(self.iteration, planned)
        m = st.mini_batch
        keys = [k for k in mbs[m] if k not in st.sent and k in self.queue]
        if not keys:
            return
        last = len(st.sent) + len(keys) == len(mbs[m])
        groups = self.queue.take(keys, self.now())
        samples = self._trained_samples(it, groups)
        st.sent.update(keys)
        st.samples.extend(samples)
        st.ids.extend([g["epoch"], g["prompt_id"], s["sample"]] for g in groups for s in g["samples"])
        ref = self.trainer.accumulate.remote(samples)
        if not last:
            self._send((ref, self.iteration, m, None), "accumulate", len(samples))
            return
        denom = self._denominator(mbs)
        if denom is None:
            denom = step_denominator(st.samples, self.task.loss_agg)
        self.streamed = None
        self._send((self.trainer.apply_step.remote(denom), self.iteration, m, st.ids, ref), "accumulate + apply_step",
                   len(samples))

    def _trained_samples(self, it: IterationProgress, groups: list[dict]) -> list[dict]:
        """The trainer's samples of ``groups`` (taken for the current iteration): their requests
        written, the lag bound checked, the iteration's statistics counted; the iteration begun
        on the trainer before its first call."""
        samples = []
        self._record_requests(groups)
        for g in groups:
            lag = self.iteration - g["admission_version"]
            bound = self.tail.lag_bound((g["epoch"], g["prompt_id"]))
            if lag > bound:
                raise LagViolation(f"prompt {g['prompt_id']} trained in iteration {self.iteration}, admitted at "
                                   f"version {g['admission_version']}: lag {lag} above {bound}")
            pids = self.task.prompts.token_ids[g["prompt_id"]]
            for s in g["samples"]:
                samples.append({"prompt_ids": pids, "response_ids": s["token_ids"],
                                "behav_logprobs": s["logprobs"], "advantage": s["advantage"],
                                "version_first": s["version_first"], "version_last": s["version_last"],
                                "masked": s.get("masked", False)})
                it.rewards.append(s["reward"])
                it.truncated.append(bool(s.get("truncated")))
                it.resp_lens.append(len(s["token_ids"]))
                it.lags.append(lag)
        if not it.begun:
            it.begun = True
            self.trainer.begin_iteration.remote(self.iteration, len(self.plan.iterations[self.iteration]))
        return samples

    def _denominator(self, mbs: dict) -> float | None:
        """The iteration's denominator (``token-mean-iteration``), or None: the step's own."""
        return self.task.iteration_denominator(self.plan.predicted.get(self.iteration, 0.0),
                                               sum(len(keys) for keys in mbs.values()), len(mbs))

    def _record_requests(self, groups: list[dict]) -> None:
        """The ``request`` events of ``groups``, taken by the trainer for the current iteration:
        ``iteration`` is the iteration that trains the sample (DESIGN 5: lag = trained iteration -
        admission version), ``planned_iteration`` the schedule's; they differ for a group that
        partial rollout deferred or swapped in (as the simulator's and MindSpeed-RL's timelines
        write them). Written at the take, when the trained iteration is known; the iteration's
        metrics window counted them when they finished."""
        for g in groups:
            for ev in g.pop("requests", ()):
                ev["iteration"] = self.iteration
                self.timeline.add("request", **ev)
                self._writer.add("request", **ev)

    def _send(self, call: tuple, name: str, samples: int) -> None:
        """``call`` (ref, iteration, mini-batch, trained ids or None, *earlier parts) is now the
        trainer call in flight; its clock starts (pipeline/train_watch.py)."""
        self.train_call = call
        self.step_watch.sent(self.now(), name, samples)

    def _check_step_hung(self, i: int, m: int) -> None:
        """Raise :class:`TrainStepHung` when the trainer call in flight is past its bound."""
        w = self.step_watch
        waited = w.overdue(self.now())
        if waited is not None:
            self._stop_hung(w, waited, i, m, i, f"iteration {i}, mini-batch {m}",
                            lambda ck: TrainStepHung(hung_message(w.call, i, m, w.samples, waited, w, ck)))

    def _finish_train_step(self) -> None:
        if self.train_call is None:
            return
        ref, i, m, ids, *parts = self.train_call
        ready, _ = self.ray.wait([ref], timeout=0)
        if not ready:
            self._check_step_hung(i, m)
            return
        self.step_watch.done(self.now())
        self.ray.get(parts)  # a streamed step's last part: its error first, if it failed
        st = self.ray.get(ref)
        self.train_call = None
        if ids is None:  # a streamed part (accumulate): no step yet
            return
        check_step_finite(st, i, m)  # a NaN/inf step was not applied; stop before any sync or checkpoint
        streamed = {"t_first": st["t_first"] - self.t0, "parts": st["parts"]} if st.get("parts", 1) > 1 else {}
        self._event("step", t_start=st["t_start"] - self.t0, t_end=st["t_end"] - self.t0, iteration=i,
                    mini_batch=m, version=i, samples=ids, tokens=st["tokens"], padded_tokens=st["padded_tokens"],
                    **streamed)
        it = self.progress[i]
        it.done.add(m)
        it.steps.append(st)
        self._train_start.setdefault(i, st["t_start"] - self.t0)
        self.tail.on_trained(i, m)
        if len(it.done) == len(self.plan.iterations[i]):
            self._end_iteration(i)
