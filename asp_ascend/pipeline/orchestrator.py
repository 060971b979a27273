"""The main loop: rollout instances -> sample queue -> trainer -> weight sync, on Ray.

Invariants (DESIGN 2, 7):
- Admission goes through the plan's :class:`~asp_ascend.scheduler.execution.Feeder` (the same
  rule as the simulator's and the MindSpeed-RL source's; with ``rollout.admission: sequences``
  each poll reports the instance's unfinished samples, plus G per group sent it has not
  received, and a poll returns as soon as a finish leaves room): a prompt of iteration i starts only on
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
from typing import Any, Callable

from ..algos.grpo import group_advantages
from ..metrics import Timeline, TimelineWriter
from ..scheduler.admission import LagViolation
from ..scheduler.execution import STREAM_STARTS, ExecutionPlan
from .contracts import RolloutInstance, Trainer, WeightTransport
from .evaluation import EvalRequest, Evaluator, Prompts
from .fleet import Fleet, FleetOptions
from .progress import IterationProgress, WindowMetrics, check_rewards_finite
from .sample_queue import SampleQueue
from .task import RunOutputs, Sampling, Task, score_response  # noqa: F401 - importable from here too
from ..scheduler.tail_control import TailControl, TailOptions
from .sync_retry import PendingSyncs
from .train_calls import StreamedStep, TrainerCalls
from .train_watch import TrainerBounds
from .trainer_waits import TrainerWaits

__all__ = ["Orchestrator", "Prompts", "Sampling", "Task", "RunOutputs", "FleetOptions", "Evaluator", "TailOptions",
           "StreamedStep", "TrainerBounds"]


class Orchestrator(TrainerCalls, TrainerWaits):
    """``replan`` (adaptive): epoch e + 1 is planned from the lengths observed so far once
    epoch e is dispatched. ``ticket``: the reference of version 0's weights (for restarts).
    ``trace``: a list the plan's Feeder records every admission and admission event in.
    ``bounds``: how long the trainer may take before it counts as hung (a train step:
    pipeline/train_watch.py; a publish (a catch-up copy too), a checkpoint save, an open_group:
    pipeline/trainer_waits.py; a broadcast's send: pipeline/sync_retry.py; the calls before the loop:
    pipeline/start_waits.py).

    :meth:`run` is the whole loop. A driver that steps it itself (the execution-path tests)
    calls :meth:`start`, then the phases :meth:`collect_rollouts` and :meth:`dispatch`."""

    def __init__(self, instances: list[RolloutInstance], trainer: Trainer, plan: ExecutionPlan, task: Task,
                 outputs: RunOutputs, *, weight_sync: WeightTransport, ticket: Any = None,
                 fleet: FleetOptions | None = None, evaluator: Evaluator | None = None,
                 replan: Callable | None = None, tail: TailOptions | None = None, trace: list | None = None,
                 stream_start: str | None = None, bounds: TrainerBounds | None = None):
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
        self.next_epoch = plan.next_epoch          # adaptive: the epoch re-planned next (a resumed plan's too)
        self.task, self.sp = task, task.sampling
        self.out = outputs
        self.t0, self.log = outputs.t0, outputs.logger
        self.evaluator = evaluator
        self.opts = fleet or FleetOptions()
        self.fleet = Fleet(instances, self.feeder, weight_sync, self.opts, ticket=ticket, event=self._event,
                           say=self.log.say, now=self.now, publish_sent=self._publish_sent)  # catch-ups: bounded
        self.progress: dict[int, IterationProgress] = {}
        self.timeline = Timeline()
        self.window = WindowMetrics(len(instances), plan.settings.max_num_seqs, 0.0)
        self._writer = TimelineWriter(outputs.timeline_path)
        self.queue = SampleQueue(plan.settings.queue_capacity, on_event=lambda **ev: self._event("queue", **ev))
        self.iteration = self.first_iter          # the trainer's iteration (= its version)
        self.train_call = None                    # (ref, iteration, mini_batch, keys)
        self.bounds = bounds or TrainerBounds()
        self.syncs = PendingSyncs(weight_sync, self.fleet.live, self._trainer_holds, self.log.say,  # oldest first
                                  send_slack_s=self.bounds.send_slack_s)
        self.step_watch = self.bounds.watch()   # a hung train step
        self._init_waits(self.bounds)           # a hung save, publish, open_group, node_ip
        weight_sync.wait_group = self._wait_group  # its open_group of a new broadcast group: bounded by the loop
        self.poll_refs: dict[int, Any] = {}
        self.submit_refs: list = []
        self._sent_at: dict[str, tuple[int, float]] = {}  # first group id of a submit call -> (instance, when sent)
        self.sent = [0] * len(instances)          # samples sent per instance (this life of it)
        # rollout.admission=sequences: a poll also returns once a finish leaves room to admit
        self._poll_kw = {"wake_below": plan.settings.max_num_seqs} if self.feeder.by_sequences else {}
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
            self.poll_refs[r] = self.instances[r].poll.remote(0.0, **self._poll_kw)
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
            self._check_publish()
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
            got = self.now()
            self._record_path(r, res, got)
            self.fleet.watch.on_poll(r, got, res.get("busy_s", 0.0), len(res["groups"]))
            self.tail.on_costs(r, res.get("meter"))
            self.tail.on_progress(res.get("progress", ()))
            for g in res["groups"]:
                self._on_group(g)
            if self.feeder.by_sequences:
                self.feeder.unfinished(r, res["running"] + self.sent[r] - res["received"])
            self.poll_refs[r] = self.instances[r].poll.remote(self.opts.poll_s, **self._poll_kw)
        if self.submit_refs:
            done, self.submit_refs = ray.wait(self.submit_refs, num_returns=len(self.submit_refs), timeout=0)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    pass  # the failed instance is handled through its poll

    def _record_path(self, r: int, res: dict, got: float) -> None:
        """``poll`` event for a poll that brought finished groups and ``submit`` events for the submit
        calls it reports: the times along the path from a finish to the next admission
        (``asp_ascend.metrics.admission_latency`` reads them)."""
        t0 = self.t0
        tm = res.get("timing")
        if tm and res["groups"]:
            self._event("poll", instance=r, groups=[g["group_id"] for g in res["groups"]], t_call=tm["call"] - t0,
                        t_wake=tm["wake"] - t0, t_locked=tm["locked"] - t0, t_return=tm["out"] - t0, t_got=got)
        for c in res.get("submits", ()):
            sent = self._sent_at.pop(c["groups"][0], (r, None))[1]
            self._event("submit", instance=r, groups=c["groups"], t_sent=sent, t_call=c["t_call"] - t0,
                        t_locked=c["t_locked"] - t0, t_done=c["t_done"] - t0)

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
        batches: dict[int, list[dict]] = {}   # instance -> this pass's groups, sent in one call
        for r, job, _version in self.feeder.fill(gate, self.tail.room_rule(self.feeder)):
            self.tail.on_admit(r, job)
            self.queue.reserve()
            self.fleet.watch.on_submit(r, self.now(), had_work=self.feeder.inflight[r] > 1)
            seed = zlib.crc32(f"{sp.seed}:{job.epoch}:{job.prompt_id}".encode()) & 0x7FFFFFFF
            prefix = self.tail.prefix((job.epoch, job.prompt_id))  # partial rollout: resume a failed instance's group
            if prefix is not None:
                self.log.say(f"prompt {job.prompt_id}: resuming {sum(len(p['token_ids']) for p in prefix)} "
                             f"generated token(s) on instance {r}")
            self.sent[r] += sp.group_size
            batches.setdefault(r, []).append(dict(
                group_id=f"{job.epoch}:{job.prompt_id}", prompt_token_ids=self.task.prompts.token_ids[job.prompt_id],
                n=sp.group_size, max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, seed=seed,
                stop_token_ids=sp.stop_token_ids, meta={"epoch": job.epoch, "prompt_id": job.prompt_id},
                **({"prefix": prefix} if prefix else {})))
        # one call per instance: its groups enter the engine in one lock hold, between two steps
        # (per-group calls trickled a burst in over several steps); a failed instance's call is
        # handled through its poll, as a single submit's is
        for r, groups in batches.items():
            self._sent_at[groups[0]["group_id"]] = (r, self.now())
            self.submit_refs.append(self.instances[r].submit_many.remote(groups))
        self.tail.record_steals()

    def _end_iteration(self, i: int) -> None:
        it = self.progress.pop(i)
        v = i + 1
        joining = self.fleet.joining_next_sync()
        sync = self.wsync.publish(v, self.now())
        self._publish_sent(v, sync.ticket)
        self.wsync.push(sync, self.fleet.live() + joining)
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
                          on_done=self._sync_done, on_hung=self._receiver_hung)

    def _receiver_hung(self, r: int, exc: BaseException) -> None:
        """An instance whose weight receive outlived the trainer's send by the stall bound: killed and
        failed over as a hung instance (its pending receive then ends the sync without it)."""
        self.fleet.kill(self.ray, r, str(exc))
        self._instance_failed(r, exc)

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
            self.sent[q.instance] += 1
            self._sent_at[q.group_id] = (q.instance, self.now())
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
        # its submit calls will never be reported: their send times would stay for the whole run
        self._sent_at = {g: v for g, v in self._sent_at.items() if v[0] != r}
        if self.evaluator is not None:
            self._send_eval(self.evaluator.reassign(r, self.fleet.live()))

    def _fail_hung_instances(self) -> None:
        for r, exc in self.fleet.hung(self.ray):
            self._instance_failed(r, exc)

    def _rejoin_instances(self) -> None:
        for r, _version in self.fleet.rejoin(self.ray, self._trainer_holds_published):
            self.sent[r] = 0       # a new actor: it counts what it received from 0
            self.poll_refs[r] = self.instances[r].poll.remote(0.0, **self._poll_kw)

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
        checkpoint.save(self.out.checkpoint_dir, version, lambda tmp: self._save_trainer(version, tmp), state)
