"""The main loop: rollout instances -> sample queue -> trainer -> weight sync, on Ray.

Invariants (DESIGN 2, 7):
- Admission goes through the plan's :class:`~asp_ascend.scheduler.execution.Feeder` (the same
  rule as the simulator's and the MindSpeed-RL source's): a prompt of iteration i starts only on
  an instance holding version >= i - k, so every trained sample has lag <= k (checked again when
  its group arrives).
- Iteration i trains exactly the schedule's prompts with ``iteration == i``, as complete
  groups, one optimizer step per ``mini_batch``; every prompt of an epoch is trained once.
- After the last optimizer step of iteration i the trainer publishes version i + 1 to every
  instance (between decode steps: running requests continue on the new weights).
- ``sync`` mode: k = 0 and the trainer starts an iteration only when all of its groups
  are generated (generate, then train) - same pieces, same code path.

Every step of the loop is a named phase; Ray calls never block the loop except the short
long-poll in ``_wait``. Background errors (an instance's engine loop, a trainer call) are
re-raised here. Failures, hung instances and restarts are the fleet's (pipeline/fleet.py);
evaluation is the evaluator's (pipeline/evaluation.py); the loop sends what they decide.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ..algos.grpo import group_advantages
from ..metrics import Timeline, TimelineWriter
from ..scheduler.admission import LagViolation
from ..scheduler.execution import STREAM_STARTS, ExecutionPlan, stream_candidate
from ..scheduler.microbatch import step_denominator
from .contracts import RolloutInstance, Trainer, WeightTransport
from .evaluation import EvalRequest, Evaluator, Prompts
from .fleet import Fleet, FleetOptions
from .progress import IterationProgress, WindowMetrics, check_rewards_finite, check_step_finite
from .sample_queue import SampleQueue
from .task import RunOutputs, Sampling, Task, score_response  # noqa: F401 - importable from here too
from ..scheduler.tail_control import TailControl, TailOptions
from .sync_retry import PendingSyncs

__all__ = ["Orchestrator", "Prompts", "Sampling", "Task", "RunOutputs", "FleetOptions", "Evaluator", "TailOptions",
           "StreamedStep"]


@dataclass
class StreamedStep:
    """``pipeline.stream_groups``: the mini-batch whose groups go to the trainer as they are
    generated (``accumulate``); its optimizer step (``apply_step``) follows its last group."""
    mini_batch: int
    sent: set = field(default_factory=set)           # keys of the groups already sent to the trainer
    samples: list = field(default_factory=list)      # their samples (for the step's denominator)
    ids: list = field(default_factory=list)          # [epoch, prompt_id, sample] of every sent sample


class Orchestrator:
    """``replan`` (adaptive): epoch e + 1 is planned from the lengths observed so far once
    epoch e is dispatched. ``ticket``: the reference of version 0's weights (for restarts).
    ``trace``: a list the plan's Feeder records every admission and admission event in.

    :meth:`run` is the whole loop. A driver that steps it itself (the execution-path tests)
    calls :meth:`start`, then the phases :meth:`collect_rollouts` and :meth:`dispatch`."""

    def __init__(self, instances: list[RolloutInstance], trainer: Trainer, plan: ExecutionPlan, task: Task,
                 outputs: RunOutputs, *, weight_sync: WeightTransport, ticket: Any = None,
                 fleet: FleetOptions | None = None, evaluator: Evaluator | None = None,
                 replan: Callable | None = None, tail: TailOptions | None = None, trace: list | None = None,
                 stream_start: str | None = None):
        if stream_start is not None and stream_start not in STREAM_STARTS:
            raise ValueError(f"pipeline.stream_groups_start: {stream_start!r} is not one of {', '.join(STREAM_STARTS)}")
        if stream_start is not None and plan.settings.sync_mode:
            raise ValueError("pipeline.stream_groups: the sync mode trains once the whole iteration is generated; "
                             "set pipeline.mode=async or pipeline.stream_groups=false")
        self.instances = instances
        self.trainer = trainer
        self.wsync = weight_sync
        self.plan = plan
        self.settings = plan.settings
        self.feeder = plan.feeder(trace)
        self.dispatcher = plan.dispatcher
        self.adm = plan.dispatcher.adm
        self.k = plan.settings.lag_bound
        self.n_iters = plan.total_iterations
        self.first_iter = plan.start
        self.replan = replan
        self.next_epoch = 1
        self.task, self.sp = task, task.sampling
        self.out = outputs
        self.t0, self.log = outputs.t0, outputs.logger
        self.evaluator = evaluator
        self.opts = fleet or FleetOptions()
        self.fleet = Fleet(instances, self.feeder, weight_sync, self.opts, ticket=ticket, event=self._event,
                           say=self.log.say, now=self.now)
        self.progress: dict[int, IterationProgress] = {}
        self.timeline = Timeline()
        self.window = WindowMetrics(len(instances), plan.settings.max_num_seqs, 0.0)
        self._writer = TimelineWriter(outputs.timeline_path)
        self.queue = SampleQueue(plan.settings.queue_capacity, on_event=lambda **ev: self._event("queue", **ev))
        self.iteration = self.first_iter          # the trainer's iteration (= its version)
        self.train_call = None                    # (ref, iteration, mini_batch, keys)
        self.syncs = PendingSyncs(weight_sync, self.fleet.live, self._trainer_holds, self.log.say)  # oldest first
        self.poll_refs: dict[int, Any] = {}
        self.submit_refs: list = []
        self.pending_rows: dict[int, dict] = {}   # iteration -> metrics row awaiting its sync
        self.last_sync_end = 0.0
        self.history: list[dict] = []             # observed lengths (the run's length history)
        # the tail mechanisms (DESIGN 9): re-estimation, tail-aware concurrency, carry-over
        self.tail = TailControl(plan, tail or TailOptions(), max_tokens=task.sampling.max_tokens, event=self._event,
                                now=self.now, prompt_length=lambda pid: len(task.prompts.token_ids[pid]))
        self._train_start: dict[int, float] = {}  # iteration -> its first optimizer step's start (measured costs)
        self.stream_start = stream_start          # pipeline.stream_groups: its start rule (None: off)
        self.streamed: StreamedStep | None = None  # the mini-batch being streamed (its step not applied yet)

    # ------------------------------------------------------------------ helpers
    def now(self) -> float:
        return time.time() - self.t0

    def _event(self, kind: str, **ev) -> None:
        self.timeline.add(kind, **ev)
        self._writer.add(kind, **ev)
        self.window.add(kind, ev)

    @property
    def last_iteration(self) -> int:
        return self.first_iter + self.n_iters

    # ------------------------------------------------------------------ main loop
    def start(self) -> None:
        """The first poll of every instance, the run's window, the evaluation of the start version."""
        import ray

        self.ray = ray
        for r in range(len(self.instances)):
            self.poll_refs[r] = self.instances[r].poll.remote(0.0)
        self.last_sync_end = self.now()
        self.window.start = self.last_sync_end
        self._evaluate(self.adm.published)

    def run(self) -> dict:
        self.start()
        while self.iteration < self.last_iteration or self.syncs:
            self.collect_rollouts()
            self._fail_hung_instances()
            self._rejoin_instances()
            self.fleet.check_not_stranded(bool(self.syncs))
            self._finish_train_step()
            self._finish_syncs()
            self.dispatch()
            self._start_train_step()
            self._wait()
        if self.evaluator is not None:
            self._evaluate(self.adm.published)
            while self.evaluator.pending:
                self.collect_rollouts()
                self._wait()
        self._writer.close()
        return {"iterations": self.n_iters, "final_version": self.adm.published}

    # ------------------------------------------------------------------ phases
    def collect_rollouts(self) -> None:
        """Take every instance's finished groups (scored, into the sample queue); a dead instance fails."""
        ray = self.ray
        refs = {ref: r for r, ref in self.poll_refs.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            r = refs[ref]
            try:
                res = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._instance_failed(r, exc)
                continue
            self.fleet.watch.on_poll(r, self.now(), res.get("busy_s", 0.0), len(res["groups"]))
            self.tail.on_costs(r, res.get("meter"))
            self.tail.on_progress(res.get("progress", ()))
            for g in res["groups"]:
                self._on_group(g)
            self.poll_refs[r] = self.instances[r].poll.remote(self.opts.poll_s)
        if self.submit_refs:
            done, self.submit_refs = ray.wait(self.submit_refs, num_returns=len(self.submit_refs), timeout=0)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    pass  # the failed instance is handled through its poll

    def _on_group(self, g: dict) -> None:
        meta = g["meta"]
        if meta.get("eval"):
            row = self.evaluator.on_group(g)
            if row is not None:
                self.log.log_side("eval.jsonl", {"t": self.now(), **row})
                self.log.say(f"eval at v{row['eval_version']}: reward {row['eval_reward_mean']:.3f}, "
                             f"accuracy {row['eval_accuracy']:.3f}")
            return
        epoch, pid = int(meta["epoch"]), meta["prompt_id"]
        job, _ = self.feeder.finished(epoch, pid)
        key = (epoch, pid)
        self.tail.on_finish(key, [len(s["token_ids"]) for s in g["samples"]])
        self._record_speculation(g)
        r = g["instance"]
        v = int(g["admission_version"])
        if job.iteration - v > self.k:
            raise LagViolation(f"prompt {pid} of iteration {job.iteration} admitted at version {v}: lag above {self.k}")
        prompts = self.task.prompts
        answer = prompts.answers.get(pid)
        rewards = self.task.rewards(g["samples"], answer)
        check_rewards_finite(rewards, pid, job.iteration, getattr(self.task.reward_fn, "__name__", "train.reward"))
        adv = group_advantages(rewards, unbiased=self.task.adv_unbiased)
        plen = len(prompts.token_ids[pid])
        requests = []
        for s, rw, a in zip(g["samples"], rewards, adv):
            s["reward"], s["advantage"] = rw, float(a)
            s["truncated"] = s.get("finish_reason") == "length"
            s["masked"] = s["truncated"] and self.task.truncated == "mask"
            ev = dict(epoch=epoch, iteration=job.iteration, instance=r, prompt_id=pid,
                      sample=s["sample"], admission_version=v, t_admit=g["t_admit"] - self.t0,
                      t_first_token=s["t_first_token"] - self.t0, t_finish=s["t_finish"] - self.t0,
                      prompt_length=plen, response_length=len(s["token_ids"]),
                      segments=s.get("segments") or [[0, v]], finish_reason=s.get("finish_reason"),
                      resumed_at=int(s.get("resumed_at", 0)), planned_iteration=job.iteration)
            self.window.add("request", ev)   # the rollout's windows count it when it finished
            requests.append(ev)
            self.history.append({"prompt_id": pid, "epoch": epoch, "sample": s["sample"],
                                 "prompt_length": plen, "response_length": len(s["token_ids"])})
        g["iteration"], g["epoch"], g["prompt_id"] = job.iteration, epoch, pid
        g["requests"] = requests   # written to the timeline when trained (``_record_requests``)
        self.queue.put((epoch, pid), g, self.now())

    def _record_speculation(self, g: dict) -> None:
        """``speculative`` event of a group drawn with speculative decoding: tokens per engine step
        (1 + the accepted draft tokens) and the acceptance rate they imply."""
        draft = int(g.get("speculative_tokens") or 0)
        if not draft:
            return
        tokens = sum(len(s["token_ids"]) for s in g["samples"])
        steps = sum(int(s.get("steps", 0)) for s in g["samples"])
        if steps:
            per_step = tokens / steps
            self._event("speculative", t=self.now(), instance=g["instance"], epoch=int(g["meta"]["epoch"]),
                        prompt_id=g["meta"]["prompt_id"], tokens=tokens, steps=steps, tokens_per_step=per_step,
                        draft_tokens=draft, accepted_per_step=per_step - 1.0)

    def _plan_next_epoch(self) -> None:
        offset = self.plan.next_unplanned
        if (self.replan is None or self.next_epoch >= self.settings.epochs or self.dispatcher.pending()
                or offset >= self.plan.end):
            return
        self.plan.add_epoch(self.replan(self.next_epoch, list(self.history), offset))
        self.tail.add_epoch(self.plan.iterations, offset)
        self.log.say(f"epoch {self.next_epoch} re-planned from {len(self.history)} observed lengths")
        self.next_epoch += 1

    def dispatch(self) -> None:
        """Admit through the plan's Feeder (and re-plan the next epoch when adaptive)."""
        self._plan_next_epoch()
        # backpressure: the sample queue holds room for every admitted group (the trainer's
        # current iteration is exempt)
        gate = lambda job: self.queue.can_admit(force=job.iteration <= self.iteration)  # noqa: E731
        sp = self.sp
        for r, job, _version in self.feeder.fill(gate, self.tail.room_rule(self.feeder)):
            self.tail.on_admit(r, job)
            self.queue.reserve()
            self.fleet.watch.on_submit(r, self.now(), had_work=self.feeder.inflight[r] > 1)
            seed = zlib.crc32(f"{sp.seed}:{job.epoch}:{job.prompt_id}".encode()) & 0x7FFFFFFF
            prefix = self.tail.prefix((job.epoch, job.prompt_id))  # partial rollout: resume a failed instance's group
            if prefix is not None:
                self.log.say(f"prompt {job.prompt_id}: resuming {sum(len(p['token_ids']) for p in prefix)} "
                             f"generated token(s) on instance {r}")
            self.submit_refs.append(self.instances[r].submit.remote(
                f"{job.epoch}:{job.prompt_id}", self.task.prompts.token_ids[job.prompt_id], sp.group_size,
                sp.max_tokens, sp.temperature, sp.top_p, seed, sp.stop_token_ids,
                {"epoch": job.epoch, "prompt_id": job.prompt_id}, **({"prefix": prefix} if prefix else {})))
        self.tail.record_steals()

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
        m = next((m for m in todo if all(k in self.queue for k in mbs[m])), None)
        if m is None and self.tail.maybe_defer(self.iteration):  # partial rollout: carry the late groups over
            mbs = self.tail.members(self.iteration, planned)
            m = next((m for m in todo if all(k in self.queue for k in mbs[m])), None)
        if m is None:
            return
        self._train_whole(it, mbs, m)

    def _train_whole(self, it: IterationProgress, mbs: dict, m: int) -> None:
        """One ``train_step`` over mini-batch ``m``, all of its groups generated."""
        groups = self.queue.take(mbs[m], self.now())
        samples = self._trained_samples(it, groups)
        denom = self._denominator(mbs)
        ref = (self.trainer.train_step.remote(samples) if denom is None
               else self.trainer.train_step.remote(samples, denom))
        ids = [[g["epoch"], g["prompt_id"], s["sample"]] for g in groups for s in g["samples"]]
        self.train_call = (ref, self.iteration, m, ids)

    def _stream_groups(self, it: IterationProgress, planned: dict, mbs: dict, todo: list[int]) -> None:
        """``pipeline.stream_groups``: send the generated groups of the mini-batch being streamed to
        the trainer (``accumulate``), its step (``apply_step``) with its last group. With none
        under way: a fully generated mini-batch is trained whole (lowest index first), else
        :func:`stream_candidate` picks a partly generated one; once a group of it is sent, the
        trainer takes no other mini-batch before its step (the others need the step's weights).
        Partial rollout may defer the streamed mini-batch's unfinished groups (never a sent one:
        a sent group is finished) and swap in finished ones of the next iteration."""
        st = self.streamed
        if st is None:
            whole = lambda ms: next((m for m in todo if all(k in self.queue for k in ms[m])), None)  # noqa: E731
            m = whole(mbs)
            if m is None and self.tail.maybe_defer(self.iteration):
                mbs = self.tail.members(self.iteration, planned)
                m = whole(mbs)
            if m is not None:
                self._train_whole(it, mbs, m)
                return
            m = stream_candidate(self.stream_start, todo, lambda x: len(mbs[x]),
                                 lambda x: sum(1 for k in mbs[x] if k in self.queue))
            if m is None:
                return
            st = self.streamed = StreamedStep(m)
        elif not any(k in self.queue for k in mbs[st.mini_batch] if k not in st.sent):
            if not self.tail.maybe_defer(self.iteration):
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
            self.train_call = (ref, self.iteration, m, None)
            return
        denom = self._denominator(mbs)
        if denom is None:
            denom = step_denominator(st.samples, self.task.loss_agg)
        self.streamed = None
        self.train_call = (self.trainer.apply_step.remote(denom), self.iteration, m, st.ids, ref)

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

    def _finish_train_step(self) -> None:
        if self.train_call is None:
            return
        ref, i, m, ids, *parts = self.train_call
        ready, _ = self.ray.wait([ref], timeout=0)
        if not ready:
            return
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

    def _end_iteration(self, i: int) -> None:
        it = self.progress.pop(i)
        v = i + 1
        joining = self.fleet.joining_next_sync()
        sync = self.wsync.start(v, self.fleet.live() + joining, self.now())
        self.fleet.published(v, sync.ticket)
        self.feeder.published(v)
        for r in joining:  # restarted instances that waited for this broadcast to catch up
            self.fleet.joins(r, sync.refs.pop(r), v)
        self.syncs.add(sync)
        self.pending_rows[i] = it.row(i)
        if self.out.checkpoint_every and v % self.out.checkpoint_every == 0 and self.out.checkpoint_dir is not None:
            self.save_checkpoint(v)
        self.iteration = v

    def _finish_syncs(self) -> None:
        self.syncs.finish(self.ray, self.t0, on_synced=self.feeder.synced, on_dead=self._instance_failed,
                          on_done=self._sync_done)

    def _sync_done(self, s) -> None:
        self._event("sync", t_start=s.t_start, t_end=s.t_end, version=s.version)
        start = self._train_start.pop(s.version - 1, None)
        if start is not None:  # the iteration's trainer time, for the run-time tail rooms
            self.tail.on_iteration_time(s.t_end - start)
        self._log_iteration(s.version - 1, s.t_end)
        if self.evaluator is not None and self.evaluator.due(s.version, self.last_iteration):
            self._evaluate(s.version)

    def _log_iteration(self, i: int, t_sync_end: float) -> None:
        row = self.pending_rows.pop(i)
        row["iteration_time_s"] = t_sync_end - self.last_sync_end
        self.last_sync_end = t_sync_end
        row["throughput"] = row["tokens"] / max(row["iteration_time_s"], 1e-9)
        row["queue_len"] = len(self.queue)
        row["t"] = t_sync_end
        row.update(self.window.close(t_sync_end))  # this iteration's window only: constant work per row
        if self.evaluator is not None:
            for ev in self.evaluator.take_rows():
                row.update(ev)
        self.log.log_iteration(row)

    def _wait(self) -> None:
        refs = list(self.poll_refs.values())
        if self.train_call is not None:
            refs.append(self.train_call[0])
        refs.extend(self.syncs.waiting())
        if refs:
            self.ray.wait(refs, num_returns=1, timeout=self.opts.poll_s)

    # ------------------------------------------------------------------ evaluation, fleet
    def _evaluate(self, version: int) -> None:
        if self.evaluator is not None:
            self._send_eval(self.evaluator.start(version, self.fleet.live()))

    def _send_eval(self, requests: list[EvalRequest]) -> None:
        sp = self.sp
        for q in requests:
            self.submit_refs.append(self.instances[q.instance].submit.remote(
                q.group_id, q.token_ids, 1, sp.max_tokens, 0.0, 1.0, 0, sp.stop_token_ids, q.meta))

    def _instance_failed(self, r: int, exc: BaseException) -> None:
        running = list(self.dispatcher.running_on[r]) if r < len(self.dispatcher.running_on) else []
        lost = self.fleet.failed(r, exc)
        if lost is None:
            return
        self.tail.on_instance_failed(r, running)
        self.queue.cancel(lost)
        self.poll_refs.pop(r, None)
        if self.evaluator is not None:
            self._send_eval(self.evaluator.reassign(r, self.fleet.live()))

    def _fail_hung_instances(self) -> None:
        for r, exc in self.fleet.hung(self.ray):
            self._instance_failed(r, exc)

    def _rejoin_instances(self) -> None:
        for r, _version in self.fleet.rejoin(self.ray, self._trainer_holds_published):
            self.poll_refs[r] = self.instances[r].poll.remote(0.0)

    def _trainer_holds_published(self) -> bool:
        """No optimizer step of the current iteration started: the trainer's weights are
        exactly the newest published version."""
        it = self.progress.get(self.adm.published)
        return self.train_call is None and (it is None or not it.done)

    def _trainer_holds(self, version: int) -> bool:
        return version == self.adm.published and self._trainer_holds_published()

    def save_checkpoint(self, version: int) -> None:
        """Weights, optimizer, RNG, version, schedule cursor, length history and, with partial
        rollout, the carry-over state (who was deferred or swapped where; pipeline/checkpoint.py)."""
        from . import checkpoint

        state = checkpoint.driver_state(self.history, self.plan.iterations, version, self.last_iteration,
                                        self.tail.carry)
        checkpoint.save(self.out.checkpoint_dir, version,
                        lambda tmp: self.ray.get(self.trainer.save_checkpoint.remote(str(tmp), {"iteration": version})),
                        state)

