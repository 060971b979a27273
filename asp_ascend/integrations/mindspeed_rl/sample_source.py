"""Feeding rollout instances by the schedule and handing complete groups to the async trainer.

:class:`DispatcherSource` is the :class:`.async_loop.SampleSource` of the MindSpeed-RL path:
it drives rollout instances (anything with the runtime's ``RolloutEngine`` methods
``submit`` / ``poll``) through an :class:`~asp_ascend.scheduler.execution.ExecutionPlan` and its
:class:`~asp_ascend.scheduler.execution.Feeder`, the admission path of the simulator and the
runtime (lag bound after the sync rule, ``max_num_seqs // G`` groups in flight per instance, the
policy's shared queue, ``scheduler.dispatch``) and the same tail glue
(:class:`~asp_ascend.scheduler.tail_control.TailControl`: the planned rooms of tail-aware
concurrency, re-estimation from the instances' progress reports), and buffers finished groups
per iteration. The lengths of the groups each iteration trains are written to
``output_dir/lengths/iteration_<i>.parquet`` as the trainer takes them (:class:`~asp_ascend.lengths.parts.LengthParts`,
as the verl bridge records them), which an adaptive run resumed mid-epoch re-plans from (:func:`source_state`).
With partial rollout the carry-over state goes to ``output_dir/carry_over/iter_<v>.json`` before the trainer's
checkpoint of version v (:meth:`DispatcherSource.checkpoint`), and a resume trains it (:func:`source_plan`).
:func:`build_async_rollout` builds it on NPUs from the runtime's rollout actor.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

from ...errors import AspError, ConfigError
from ...lengths.parts import LengthParts
from ...scheduler.execution import ExecutionPlan, ExecutionSettings
from ...scheduler.tail_control import TailControl, TailOptions
from .async_loop import LoopSettings, SampleGroup


class InstanceHandle(Protocol):
    def submit(self, group_id: str, prompt_token_ids: list[int], n: int, max_tokens: int, temperature: float,
               top_p: float, seed: int, stop_token_ids: list[int], meta: Optional[dict] = None) -> int: ...
    def poll(self) -> dict: ...


class DispatcherSource:
    """SampleSource over live instances: schedule order, lag bound, bounded in-flight work.

    ``plan``: the schedule from the resume position on (its settings carry k, G, the group
    slots, the shared queue and guided dispatch); ``tail``: the tail keys and planned rooms
    (``rollout.tail_concurrency``, ``scheduler.reestimate``, ``rollout.partial_rollout`` /
    ``max_split``); ``trace``: a list the feeder records every admission and event in.

    Partial rollout (DESIGN 9 e) is the runtime's own carry-over, :class:`TailControl`'s
    :class:`~asp_ascend.scheduler.carryover.CarryOver`: when iteration i waits only on late groups
    (re-estimated remaining tokens past its budget), they are deferred to i + 1 and the same number of
    finished groups of i + 1 take their mini-batch slots. :meth:`get_groups` hands out iteration i's
    members as the carry-over has them (every group exactly once; a group carries its planned
    iteration, so the loop allows it lag k + its deferral <= k + S). A deferred group keeps generating
    on its instance across weight pushes (tokens after a push come from the newer weights, each with its
    behaviour log-prob; its admission version is the oldest).

    ``replan`` (``scheduler.adaptive``, :func:`asp_ascend.pipeline.planning.replanner`): once every job of
    the plan is dispatched, epoch ``next_epoch`` (default: the one after the plan's last) is planned from
    the response lengths observed so far (:attr:`history`: ``history``, a resumed run's lengths of the
    iterations trained before its checkpoint, then every sample finished here) and queued, as ``asp
    train``'s orchestrator does.

    ``lengths`` (a :class:`~asp_ascend.lengths.parts.LengthParts` keyed ``iteration``): the rows of the
    groups :meth:`get_groups` hands out for iteration i are written as its part, atomically, before the
    trainer gets them, so every checkpoint of version v has the parts of iterations < v on disk
    (:func:`adaptive_replanner` reads them on a resume).

    ``carry_dir`` (partial rollout): :meth:`checkpoint` writes the carry-over state there, which a resume
    restores (:func:`source_plan`: deferred groups trained after it, swapped-in ones not again)."""

    def __init__(self, plan: ExecutionPlan, instances: Sequence[InstanceHandle],
                 prompt_of: Callable[[str], tuple[list[int], dict]], sampling: dict,
                 poll_interval_s: float = 0.01, timeout_s: float = 3600.0,
                 clock: Callable[[], float] = time.time, trace: list | None = None,
                 tail: TailOptions | None = None, max_tokens: int = 1 << 30, replan: Callable | None = None,
                 history: Sequence[dict] = (), next_epoch: int | None = None, lengths: LengthParts | None = None,
                 carry_dir: Path | None = None):
        self.instances = list(instances)
        if len(self.instances) != plan.settings.num_instances:
            raise ValueError(f"{len(self.instances)} instances for a plan over {plan.settings.num_instances}")
        self.plan, self.n, self.sampling = plan, plan.settings.group_size, dict(sampling)
        self.prompt_of, self.poll_interval_s, self.timeout_s, self.clock = prompt_of, poll_interval_s, timeout_s, clock
        self.feeder = plan.feeder(trace)
        self.tail_events: list[tuple[str, dict]] = []     # tail decisions (rooms, steals, defer/swap), for inspection
        self.timeline, self.t0 = None, 0.0                # the run's timeline, once attached (attach_timeline)
        self.tail = TailControl(plan, tail or TailOptions(), max_tokens=max_tokens, event=self._event, now=clock)
        self.done: dict[tuple, SampleGroup] = {}      # finished, not yet handed out: (epoch, prompt_id) -> group
        self.replan, self.history = replan, list(history)   # adaptive: observed lengths, one row per sample
        self.lengths, self.carry_dir = lengths, carry_dir
        self.next_epoch = next_epoch if next_epoch is not None else plan.next_epoch

    def attach_timeline(self, timeline, t0: float) -> None:
        """Write the tail mechanisms' decisions (``steal``, ``tail``, ``defer``, ``swap``: the runtime's events,
        with its fields, from the same :class:`TailControl`) and the sample queue's ``queue`` events into
        ``timeline``, times in seconds from ``t0`` (the loop's start, on this source's clock)."""
        self.timeline, self.t0 = timeline, t0

    def _event(self, kind: str, **row) -> None:
        self.tail_events.append((kind, row))
        if self.timeline is not None:
            self.timeline.add(kind, **({**row, "t": row["t"] - self.t0} if "t" in row else row))

    def _queue(self, op: str) -> None:
        """A group entered (``put``) or left (``get``) the finished-group buffer, the trainer's sample queue."""
        if self.timeline is not None:
            self.timeline.add("queue", t=self.clock() - self.t0, op=op, size=len(self.done))

    @property
    def inflight(self) -> list[int]:
        return self.feeder.inflight

    def _plan_next_epoch(self) -> None:
        plan, offset = self.plan, self.plan.next_unplanned
        if (self.replan is None or self.next_epoch >= plan.settings.epochs or plan.dispatcher.pending()
                or offset >= plan.end):
            return
        plan.add_epoch(self.replan(self.next_epoch, list(self.history), offset))
        self.tail.add_epoch(plan.iterations, offset)
        self.next_epoch += 1

    def fill(self) -> None:
        """Admit through the plan's Feeder (re-planning the next epoch first when adaptive) and submit
        each admitted group to its instance."""
        self._plan_next_epoch()
        for i, job, version in self.feeder.fill(None, self.tail.room_rule(self.feeder)):
            self.tail.on_admit(i, job)
            prompt, extras = self.prompt_of(job.prompt_id)
            meta = {"epoch": job.epoch, "prompt_id": job.prompt_id, "iteration": job.iteration,
                    "mini_batch": job.mini_batch, "prompt": list(prompt), "extras": extras, "version": version}
            self.instances[i].submit(f"{job.epoch}:{job.prompt_id}", list(prompt), self.n, meta=meta, **self.sampling)

    def collect(self) -> int:
        """Take every instance's finished groups into the per-iteration buffers; returns how many."""
        got = 0
        for i, inst in enumerate(self.instances):
            res = inst.poll()
            self.tail.on_progress(res.get("progress", ()))
            for g in res.get("groups", []):
                m = g["meta"]
                samples = g["samples"]
                self.done[(m["epoch"], m["prompt_id"])] = (SampleGroup(
                    epoch=m["epoch"], prompt_id=m["prompt_id"], iteration=m["iteration"], mini_batch=m["mini_batch"],
                    instance=i, admission_version=min(int(g["admission_version"]), int(m["version"])),
                    prompt=m["prompt"], responses=[s["token_ids"] for s in samples],
                    rollout_log_probs=[s["logprobs"] for s in samples], extras=m["extras"],
                    t_admit=float(g["t_admit"]), t_finish=max(float(s["t_finish"]) for s in samples),
                    sample_t_first_token=[float(s.get("t_first_token") or g["t_admit"]) for s in samples],
                    sample_t_finish=[float(s["t_finish"]) for s in samples],
                    planned_iteration=m["iteration"],
                    sample_segments=[[list(x) for x in s.get("segments") or ()] for s in samples],
                    finish_reasons=[s.get("finish_reason") for s in samples]))
                self._queue("put")
                self.history.extend(_rows(m["epoch"], m["prompt_id"], m["prompt"], [s["token_ids"] for s in samples]))
                self.feeder.finished(m["epoch"], m["prompt_id"])
                self.tail.on_finish((m["epoch"], m["prompt_id"]), [len(s["token_ids"]) for s in samples])
                got += 1
        return got

    def _members(self, iteration: int) -> dict:
        planned = self.plan.iterations.get(iteration)
        if planned is None:
            raise RuntimeError(f"iteration {iteration} is not in the plan (iterations {min(self.plan.iterations)}.."
                               f"{max(self.plan.iterations)})")
        return self.tail.members(iteration, planned)

    def get_groups(self, iteration: int, count: int) -> list[SampleGroup]:
        """The complete groups iteration ``iteration`` trains (with partial rollout: as carried over)."""
        deadline = self.clock() + self.timeout_s
        members = self._members(iteration)
        while not all(k in self.done for keys in members.values() for k in keys):
            self.fill()
            if self.collect() == 0:
                if self.tail.maybe_defer(iteration):        # waits only on late groups: carry them over
                    members = self._members(iteration)
                    continue
                if self.clock() > deadline:
                    have = sum(k in self.done for keys in members.values() for k in keys)
                    raise AspError(f"iteration {iteration}: {have}/{count} groups after "
                                   f"{self.timeout_s:.0f} s; instances in flight {self.inflight}")
                time.sleep(self.poll_interval_s)
        out = []
        for m in sorted(members):
            for key in members[m]:
                g = self.done.pop(key)
                self._queue("get")
                g.iteration, g.mini_batch = iteration, m
                out.append(g)
            self.tail.on_trained(iteration, m)
        if len(out) != count:
            raise RuntimeError(f"iteration {iteration}: {len(out)} groups, the schedule has {count}")
        if self.lengths is not None:   # before the trainer has them: on disk before any checkpoint after them
            import pandas as pd

            self.lengths.write(iteration, pd.DataFrame(
                [r for g in out for r in _rows(g.epoch, g.prompt_id, g.prompt, g.responses)], columns=ROW_COLUMNS))
        return out

    def checkpoint(self, version: int) -> None:
        """The trainer is about to save its checkpoint of ``version`` (iterations < ``version`` trained):
        with partial rollout, the carry-over state at that version goes to ``carry_dir`` first, atomically
        (:func:`~asp_ascend.pipeline.checkpoint.save_carry`, ``asp train``'s ``carry_over``)."""
        if self.tail.carry is not None and self.carry_dir is not None:
            from ...pipeline.checkpoint import save_carry

            save_carry(self.carry_dir, version, self.tail.carry)

    def on_published(self, version: int) -> None:
        """Every instance now holds ``version`` (call after the weight push returned)."""
        self.feeder.published(version)
        for i in range(len(self.instances)):
            self.feeder.synced(i, version)
        self.fill()


ROW_COLUMNS = ("prompt_id", "epoch", "sample", "prompt_length", "response_length")


def _rows(epoch: int, prompt_id: str, prompt: list, responses: list) -> list[dict]:
    """A group's length-history rows (DESIGN 6), one per sample."""
    return [{"prompt_id": str(prompt_id), "epoch": int(epoch), "sample": k, "prompt_length": len(prompt),
             "response_length": len(r)} for k, r in enumerate(responses)]


class _RayHandle:
    """Blocking calls on a Ray actor handle, shaped like :class:`InstanceHandle`."""

    def __init__(self, actor):
        self.actor = actor

    def submit(self, *a, **kw):
        import ray

        return ray.get(self.actor.submit.remote(*a, **kw))

    def poll(self):
        import ray

        return ray.get(self.actor.poll.remote())


RECEIVER = "asp_ascend.integrations.mindspeed_rl.vllm_receiver.MindSpeedWeightReceiver"


def wire_source(plan: ExecutionPlan, instances: Sequence[InstanceHandle], prompt_of, sampling: dict,
                push: Callable[[int], None], **source_kw) -> tuple[DispatcherSource, Callable[[int], None]]:
    """The source over ``instances`` and ``publish(version)``, after the first push.

    ``plan`` starts at the iteration the trainer resumes from (``plan.start``: its admission state
    already counts every instance as holding that version). The instances start on dummy weights,
    so before any prompt is admitted the trainer's current weights are pushed as version
    ``plan.start``; afterwards ``publish(v)`` pushes version v and opens admission up to v + k."""
    source = DispatcherSource(plan, instances, prompt_of, sampling, **source_kw)

    def publish(version: int) -> None:
        push(version)
        source.on_published(version)

    publish(plan.start)
    return source, publish


def adaptive_replanner(cfg, sched, schedule_path: Path, start_iteration: int, lag_bound: int,
                       lengths: LengthParts | None = None) -> tuple[Optional[Callable], list[dict]]:
    """``scheduler.adaptive`` with more than one epoch: (``asp train``'s re-planner, the lengths observed
    before ``start_iteration``), else (None, []). The re-planner
    (:func:`asp_ascend.pipeline.planning.replanner`) plans with ``scheduler.run.plan_epoch_frame`` from the
    observed lengths and appends each plan to ``schedule.parquet`` atomically.

    A run resumed before its last epoch is planned re-plans with the same re-planner at the same point
    (every job of the planned epochs dispatched). Its history starts with the rows of every iteration
    trained before the checkpoint, read from ``lengths`` (the parts :meth:`DispatcherSource.get_groups`
    wrote; :func:`resumed_lengths`): exactly those, none of a group that finished after the checkpoint or
    before it without being trained (it is generated again), so nothing is counted twice; then come the
    groups its own instances finish. What an uninterrupted run saw beyond that (groups of later iterations
    finished by its re-plan, which the resumed run's instances, started empty, may not have finished by
    its own) is the only difference. One resumed after the last epoch is planned replays
    ``schedule.parquet``."""
    if not (cfg.scheduler.adaptive and cfg.train.epochs > 1):
        return None, []
    planned = int(sched["epoch"].nunique())
    if planned >= cfg.train.epochs:   # replayed, if this run re-planned it (the re-planner marks what it writes)
        import pyarrow.parquet as pq

        if (pq.read_schema(schedule_path).metadata or {}).get(b"adaptive") != b"true":
            raise ConfigError([f"asp.scheduler.adaptive: true, but {schedule_path} holds all {planned} epochs, planned "
                               "before the run (not re-planned by it), so nothing would re-plan; move it away (the "
                               "entry then plans epoch 0 alone, as asp schedule on this YAML does), or set "
                               "asp.scheduler.adaptive: false to train it as planned"])
        return None, []
    from ...pipeline.planning import replanner
    from ..prompt_tokens import counter_for
    from .config_bridge import TRANSLATION

    first = int(sched["iteration"].min())
    history = resumed_lengths(lengths or LengthParts(schedule_path.parent / "lengths", "iteration"), first,
                              start_iteration) if start_iteration > first else []
    count = counter_for(cfg, TRANSLATION["model.path"])   # asp.data.path in the tokens the run's prompts have
    return replanner(cfg, None, lag_bound, schedule_path.parent, sched, count), history


def source_state(cfg, sched, schedule_path: Path, start_iteration: int, lag_bound: int) -> dict:
    """The :class:`DispatcherSource` keywords of the run's length record and its adaptive re-plan, for a run
    starting at ``start_iteration``: ``lengths`` (``lengths/`` beside ``schedule_path``, parts keyed by
    iteration; a resumed run's parts of the iterations it trains again are removed), ``replan`` and
    ``history`` (:func:`adaptive_replanner`), ``next_epoch`` (the one after the schedule's last) and
    ``carry_dir`` (with partial rollout: ``carry_over/`` beside ``schedule_path``, the states of later
    versions, an interrupted attempt's, removed)."""
    lengths = LengthParts(Path(schedule_path).parent / "lengths", "iteration")
    lengths.truncate_after(start_iteration - 1)
    replan, history = adaptive_replanner(cfg, sched, Path(schedule_path), start_iteration, lag_bound, lengths)
    carry_dir = None
    if cfg.rollout.partial_rollout:
        from ...pipeline.checkpoint import CARRY_DIR, drop_carry_after

        carry_dir = Path(schedule_path).parent / CARRY_DIR
        drop_carry_after(carry_dir, start_iteration)
    return {"lengths": lengths, "replan": replan, "history": history, "next_epoch": int(sched["epoch"].max()) + 1,
            "carry_dir": carry_dir}


def source_plan(cfg, sched, settings: ExecutionSettings, schedule_path: Path, start_iteration: int) -> ExecutionPlan:
    """The plan the source feeds from ``start_iteration`` (the trainer's checkpointed version) on. With
    partial rollout a resumed run restores the carry-over state :meth:`DispatcherSource.checkpoint` saved
    with that checkpoint (:func:`~asp_ascend.pipeline.checkpoint.carried_plan`, as ``asp train`` does): the
    groups deferred past the checkpoint are trained, the ones swapped into an iteration before it are not
    trained again, and a deferred group's lag bound k + S still counts from its planned iteration. A
    partial-rollout resume without that state is refused (from the schedule alone, a deferred group would
    never be trained and a swapped-in one twice)."""
    import json

    from ...pipeline.checkpoint import CARRY_DIR, carried_plan, carry_file

    path, carry = carry_file(Path(schedule_path).parent / CARRY_DIR, start_iteration), None
    if start_iteration > int(sched["iteration"].min()) and (cfg.rollout.partial_rollout or path.is_file()):
        if not path.is_file():
            raise ConfigError([f"resume at iteration {start_iteration}: asp.rollout.partial_rollout=true may have "
                               f"deferred groups past the checkpoint and swapped later ones into trained iterations, "
                               f"but {path} (the carry-over state the run writes with each checkpoint) does not exist, "
                               "so the schedule alone would lose the deferred groups and train the swapped ones twice; "
                               "put the file back or resume from a checkpoint that has one"])
        carry = json.loads(path.read_text())
    return carried_plan(sched, settings, start_iteration, carry, cfg.rollout.partial_rollout, schedule_path)


def resumed_lengths(parts: LengthParts, first: int, start: int) -> list[dict]:
    """The length-history rows of iterations ``first`` .. ``start`` - 1 (trained before the checkpoint
    of version ``start``), from ``parts`` (keyed by the trained iteration); a ConfigError when one is
    missing."""
    have = {n for n, _ in parts.parts()}
    missing = [i for i in range(first, start) if i not in have]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise ConfigError([f"resume at iteration {start}: asp.scheduler.adaptive=true re-plans the next epoch from the "
                           f"lengths of the iterations trained before the checkpoint, but {parts.dir} has no part of "
                           f"iteration(s) {shown} (the run writes one per trained iteration; this run's are gone or "
                           "were never written); put the folder back, or resume with asp.scheduler.adaptive=false "
                           "and megatron_training.train_iters within the planned epochs"])
    df = parts.history()
    df = df[(df[parts.key] >= first) & (df[parts.key] < start)].sort_values(parts.key, kind="stable")
    return df.drop(columns=[parts.key]).to_dict("records")


def build_async_rollout(cfg, actor_group, schedule_path: str, train_ds, tokenizer,
                        dataset_additional_keys: Sequence[str] = (), trainer_dp: int = 1, start_iteration: int = 0,
                        mindspeed_root: Optional[str] = None, trainer_devices: int = 0) -> tuple[DispatcherSource, Any, LoopSettings]:
    """Rollout instances on their own NPUs + the HCCL weight push, for ``AsyncGRPOTrainer``.

    Each instance is the runtime's rollout actor narrowed to its own devices
    (:func:`.rollout_groups.instance_actor_class`), ``tensor_parallel_size`` =
    ``rollout.devices_per_instance``, vLLM's multiprocessing executor and dummy weights. With
    ``mindspeed.weight_push: hf`` (default) its vLLM workers run the runtime's receiver
    (``engines/vllm_ext.py``) and load the HF-named full tensors of :mod:`.hf_push` with vLLM's own
    loaders (``RolloutEngine.update_weights``); with ``resharding`` they run :data:`RECEIVER` and load
    Megatron-layout shards with MindSpeed-RL's loaders (:mod:`.vllm_receiver`, :mod:`.weight_push`). The plan
    starts at ``start_iteration`` (the trainer's checkpointed iteration) and the trainer's weights are
    pushed as that version before the first admission (:func:`wire_source`).
    """
    import pandas as pd
    import ray

    from ...platforms import get_platform
    from .rollout_groups import (check_capacity, check_instances_fit_nodes, create_instance_placement_groups,
                                 instance_actor_class, instance_actor_options, instance_engine_args, instance_env)
    from ...engines.rollout import EXTENSION

    engine_free = cfg.mindspeed.weight_push == "hf"
    if not cfg.weight_sync.master_port and not engine_free:
        raise ConfigError(["asp.weight_sync.master_port: 0 (the OS picks a free port) works for the asp runtime and "
                           "asp.mindspeed.weight_push: hf; the resharding push hosts one store per inference-TP rank "
                           "from the trainer's ranks, so set a port range start that is free on the first trainer "
                           "node, e.g. 29650"])
    from .config_bridge import hf_moe_problem

    moe = hf_moe_problem(cfg.model.path)   # where the model is read (translate may have run on a login node)
    if moe:
        raise ConfigError([moe])
    settings = ExecutionSettings.from_config(cfg)
    sched = pd.read_parquet(schedule_path)   # (a refused resume stops before any instance starts)
    state = source_state(cfg, sched, Path(schedule_path), start_iteration, settings.lag_bound)
    plan = source_plan(cfg, sched, settings, Path(schedule_path), start_iteration)   # (refused before instances start)
    platform = get_platform("npu", check=False)
    r, tp = cfg.rollout.num_instances, cfg.rollout.devices_per_instance
    check_instances_fit_nodes([n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")], platform, tp)
    check_capacity(ray.cluster_resources(), platform, r, tp, trainer_devices)
    if engine_free:   # HF-named full tensors, vLLM's own loaders: the runtime's receiver, no loader patch
        env, receiver = None, EXTENSION
    else:
        from .vllm_receiver import loaders_path

        env, receiver = instance_env(str(loaders_path(mindspeed_root))), RECEIVER
    pgs = create_instance_placement_groups(platform, r, tp)
    cls = instance_actor_class()
    actors = []
    for i, pg in enumerate(pgs):
        actors.append(cls.options(**instance_actor_options(platform, pg, tp, env)).remote(
            cfg.model.path, max_num_seqs=cfg.rollout.max_num_seqs, max_model_len=cfg.lengths.max_response_length * 2,
            seed=cfg.seed + i, dtype="bfloat16", instance=i, worker_extension_cls=receiver, platform="npu",
            tensor_parallel_size=tp, engine_args=instance_engine_args()))
    ray.get([a.ready.remote() for a in actors])
    from ...pipeline.run import tail_options

    fetch = train_ds.__getitem__

    def prompt_of(pid):
        item = fetch(int(pid))
        return [int(t) for t in item["input_ids"]], {k: item[k] for k in dataset_additional_keys}

    n = settings.group_size

    class _Instance:
        def __init__(self, a, idx):
            self.a, self.idx = a, idx

        def receive_weights(self, manifests, version, base_port, rank, world, stall_timeout_s):
            return self.a.collective_rpc.remote("asp_recv_megatron_weights",
                                                (manifests, version, base_port, self.idx, world, tp, stall_timeout_s))

    if engine_free:
        import json

        from .hf_push import hf_push_fn

        hf_config = json.loads((Path(cfg.model.path) / "config.json").read_text())
        push = hf_push_fn(actor_group, actors, platform="npu", base_port=cfg.weight_sync.master_port, tp=tp,
                          bucket_bytes=cfg.weight_sync.bucket_mb << 20, hf_config=hf_config,
                          timeout_s=max(600.0, cfg.weight_sync.timeout_s),
                          stall_timeout_s=cfg.weight_sync.stall_timeout_s)
    else:
        from .weight_push import weight_push_fn

        push = weight_push_fn(actor_group, [_Instance(a, i) for i, a in enumerate(actors)],
                              cfg.weight_sync.master_port, cfg.weight_sync.bucket_mb << 20,
                              stall_timeout_s=cfg.weight_sync.stall_timeout_s)
    source, publish = wire_source(
        plan, [_RayHandle(a) for a in actors], prompt_of,
        sampling={"max_tokens": cfg.lengths.max_response_length, "temperature": cfg.rollout.temperature,
                  "top_p": cfg.rollout.top_p, "seed": cfg.seed, "stop_token_ids": [int(tokenizer.eod)]},
        push=push, tail=tail_options(cfg, Path(schedule_path), bridge=True), max_tokens=cfg.lengths.max_response_length,
        **state)
    settings = LoopSettings(global_batch_size=cfg.train.global_batch_size, group_size=n,
                            lag_bound=settings.lag_bound, iterations=0, off_policy=cfg.train.off_policy,
                            tis_cap=cfg.train.tis_cap, dataset_additional_keys=tuple(dataset_additional_keys),
                            mini_batch_size=cfg.train.mini_batch_size, trainer_dp=trainer_dp,
                            max_split=cfg.rollout.max_split if cfg.rollout.partial_rollout else 0)
    return source, publish, settings
