"""`asp train`: check inputs, schedule, start Ray actors, warm start, run the loop, summarise.

Order matters for the user: every check that can fail on bad input (backends missing,
dataset, model path, resources, CPU cores) runs before Ray starts any actor.
Outputs in ``output_dir`` (DESIGN 6): config.yaml, schedule.parquet, schedule_report.json,
metrics.jsonl, eval.jsonl, timeline.jsonl, summary.json, lengths.parquet, tensorboard/,
checkpoints/.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .preflight import BACKENDS, check_backends, check_resources  # noqa: F401 - the entry's checks

__all__ = ["BACKENDS", "RUN_FILES", "check_backends", "check_resources", "prepare_model", "run_train"]

RUN_FILES = ("metrics.jsonl", "eval.jsonl", "timeline.jsonl", "warm_start.jsonl", "summary.json", "lengths.parquet",
             "instances.jsonl")


def prepare_model(cfg, train, ev, out: Path) -> Path:
    """``model.path``, or a tiny Qwen2 + word-level tokenizer built into ``out/model_init``."""
    if cfg.model.path:
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise ConfigError([f"model.path: {p} is not an HF model directory (no config.json); point it at a "
                               "directory written by save_pretrained, or remove the key to build the tiny model"])
        return p
    from ..engines.tiny_model import build_tiny_model, task_vocabulary

    if train.source.startswith("builtin:"):
        from ..data.synthetic import vocabulary

        words = vocabulary(cfg.data.synthetic)
    else:
        words = list(train.prompts) + [a for a in train.answers if a]
        if ev is not None:
            words += list(ev.prompts) + [a for a in ev.answers if a]
    m = cfg.model
    return build_tiny_model(task_vocabulary(words), out / "model_init", hidden_size=m.tiny_hidden_size,
                            num_layers=m.tiny_num_layers, num_heads=m.tiny_num_heads,
                            num_kv_heads=m.tiny_num_kv_heads, max_positions=2048, seed=cfg.seed)


def run_train(cfg, overrides: list[str] | None = None) -> int:
    """Check inputs, plan, start actors, warm start, train, write the summary. Returns 0.

    ``overrides``: the command line's ``key=value`` list; on ``resume=true`` the keys it leaves
    out keep the run's saved values (None: every key of ``cfg`` counts as given)."""
    from ..data.datasets import prompts_from_config
    from ..data.rewards import get_reward_fn
    from ..io import check_output_dir
    from ..scheduler.execution import ExecutionSettings
    from .rundir import check_run_dir, resolve_resume

    # -- everything that can fail on bad input, before Ray starts -----------------------
    check_output_dir(cfg.output_dir)
    check_run_dir(cfg)  # a run already there: resume=true or overwrite=true, never mixed
    resume = attempt = None
    if cfg.resume:  # the newest complete checkpoint and the run's own schedule (pipeline/checkpoint.py)
        from .checkpoint import find_resume

        resume = find_resume(Path(cfg.output_dir))
        attempt = resolve_resume(cfg, overrides)  # the saved config + the changes allowed
        cfg = attempt.cfg
    check_backends()
    settings = ExecutionSettings.from_config(cfg)  # k after the sync rule, slots, shared queue: once, here
    train, ev = prompts_from_config(cfg)
    reward_fn = get_reward_fn(cfg.train.reward, train.source.startswith("builtin:"))
    cores = check_resources(cfg)
    speculative_config(cfg)  # rollout.speculative: refused where the recorded log-probs would be wrong
    if cfg.train.warmup_sft_steps > 0 and not any(train.answers):
        raise ConfigError(["train.warmup_sft_steps: the dataset has no reference answers "
                           f"(data.answer_key={cfg.data.answer_key!r}); set it to 0 or add answers"])
    out = Path(cfg.output_dir)
    cleared = _clear_outputs(cfg, out, resume)
    t_start = time.time()
    from .logger import RunLogger

    logger = RunLogger(out, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                       progress=cfg.logging.progress, total_iterations=0)
    logger.t0 = t_start
    if cleared:
        logger.say(f"overwrite=true: deleted the previous run's {', '.join(cleared)}")
    if attempt is not None:
        for key, (a, b) in attempt.changed.items():
            logger.say(f"resume: {key} changed from {a!r} to {b!r}")
        if attempt.kept:
            logger.say("resume: kept the run's own " + ", ".join(f"{k}={a!r}" for k, (a, _) in attempt.kept.items())
                       + " (the command left them out)")
    logger.say(f"preparing: {len(train)} prompts ({train.source}), mode {cfg.pipeline.mode}, "
               f"policy {cfg.scheduler.policy}, k={settings.lag_bound}, {cfg.rollout.num_instances} rollout instance(s)")

    # -- model, tokens, schedule ---------------------------------------------------------
    model_dir = resume.path if resume is not None else prepare_model(cfg, train, ev, out)
    tok, tok_ids, ev_ids = _tokenize(cfg, model_dir, train, ev)
    if resume is not None:
        from .checkpoint import resume_plan

        plan, replan = resume_plan(cfg, settings, out, resume.version), None
        logger.say(f"resuming from {resume.path.name}: version {resume.version}, "
                   f"{plan.total_iterations} iteration(s) left (attempt {resume.attempt + 1})")
    else:
        plan, replan = _plan(cfg, settings, train, out)
    logger.total = plan.end  # the progress line counts the run's iterations, also after a resume

    # -- actors, warm start, the loop ----------------------------------------------------
    import ray

    from .logger import warnings_to_file

    restore_warnings = warnings_to_file(out / "train.log")
    owns_ray = _ray_init(cfg)
    instances: list = []
    try:
        instances, trainer = _start_actors(cfg, model_dir, cores, tok_ids, ev_ids, logger)
        wsync, ticket = _warm_up(cfg, trainer, instances, train, tok, tok_ids, resume, logger)
        logger.say(f"instances ready; training {plan.total_iterations} iteration(s) of {cfg.train.global_batch_size} "
                   f"prompts x {cfg.train.group_size} samples")
        from .orchestrator import Orchestrator, RunOutputs

        t = cfg.train
        task, evaluator = _task(cfg, tok, tok_ids, train, ev, ev_ids, reward_fn)
        orch = Orchestrator(instances, trainer, plan, task,
                            RunOutputs(out / "timeline.jsonl", logger, t_start, t.checkpoint_every, out / "checkpoints"),
                            weight_sync=wsync, ticket=ticket, evaluator=evaluator, replan=replan,
                            fleet=_fleet_options(cfg), tail=tail_options(cfg, out / "schedule.parquet"))
        if resume is not None:
            orch.history = list(resume.history)  # the length history observed before the interruption
        orch.run()
        _finish(cfg, orch, plan, out, settings.lag_bound, logger, t_start)
    finally:  # also on an error or Ctrl-C: engines closed before Ray goes, so nothing stays in /dev/shm
        _shutdown(instances)
        if owns_ray:
            ray.shutdown()
        restore_warnings()
    return 0


def _clear_outputs(cfg, out: Path, resume) -> list[str]:
    """The run's own files start empty; a resumed attempt's are kept under previous/attempt_<n>/
    (with the config it ran with; the new attempt's resolved config becomes config.yaml).
    ``overwrite=true``: the old run's outputs are deleted first (their names are returned)."""
    from ..config import save_resolved
    from .rundir import clear_run

    cleared = clear_run(out) if cfg.overwrite and out.is_dir() else []
    out.mkdir(parents=True, exist_ok=True)
    if resume is not None:
        from .checkpoint import archive_run_files

        archive_run_files(out, RUN_FILES + ("config.yaml",), resume.attempt)
        save_resolved(cfg, out)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    return cleared


def _tokenize(cfg, model_dir: Path, train, ev):
    """(tokenizer, train prompt token ids, eval prompt token ids or None); the train prompts'
    lengths become token counts."""
    from ..data.datasets import encode_prompts
    from ..engines.tiny_model import load_tokenizer

    tok = load_tokenizer(model_dir)
    tok_ids = encode_prompts(tok, train, cfg.data.chat_template)  # chat prompts: the model's template
    train.prompt_lengths = np.asarray([len(tok_ids[p]) for p in train.ids], dtype=np.int64)
    ev_ids = None
    if ev is not None and cfg.train.eval_every:
        ev_ids = encode_prompts(tok, ev, cfg.data.chat_template)
    return tok, tok_ids, ev_ids


def _warm_up(cfg, trainer, instances, train, tok, tok_ids: dict, resume, logger):
    """Checkpoint or supervised warm start, engines ready, version 0 on every instance.
    Returns (the weight transport, version 0's ticket)."""
    import ray

    v0 = 0 if resume is None else ray.get(trainer.load_checkpoint.remote(str(resume.path)))
    if cfg.train.warmup_sft_steps > 0 and resume is None:
        _warm_start(cfg, trainer, train, tok, tok_ids, logger)
    ray.get([i.ready.remote() for i in instances])
    for r, w in enumerate(ray.get([i.workers.remote() for i in instances])):
        logger.log_side("instances.jsonl", {"instance": r, "workers": w})
    wsync = _weight_sync(cfg, trainer, instances)
    # version 0 = the weights after the warm start (or the checkpoint's)
    first = wsync.start(v0, list(range(len(instances))))
    ray.get(first.waiting())
    logger.say(f"weights synced to the instances ({wsync.transport})")
    return wsync, first.ticket


def _task(cfg, tok, tok_ids: dict, train, ev, ev_ids: dict | None, reward_fn):
    """What the instances generate and how it is scored; the evaluator when there are eval prompts."""
    from .orchestrator import Evaluator, Prompts, Sampling, Task

    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    task = Task(Prompts(tok_ids, dict(zip(train.ids, train.answers))), reward_fn, decode,
                Sampling(cfg.train.group_size, cfg.lengths.max_response_length, cfg.rollout.temperature,
                         cfg.rollout.top_p, [tok.eos_token_id], cfg.seed),
                truncated=cfg.train.truncated, loss_agg=cfg.train.loss_agg,
                adv_unbiased=cfg.train.adv_std == "unbiased")
    evaluator = (Evaluator(Prompts(ev_ids, dict(zip(ev.ids, ev.answers))), cfg.train.eval_every, reward_fn, decode)
                 if ev_ids else None)
    return task, evaluator


def tail_options(cfg, schedule_path: Path):
    """The tail keys for the loop (DESIGN 9); the planned rooms come from the schedule's
    ``room`` column (0: no cap)."""
    import pandas as pd

    from ..scheduler.tail_control import TailOptions

    rooms = {}
    if schedule_path.is_file():
        sched = pd.read_parquet(schedule_path)
        if "room" in sched:
            capped = sched[sched["room"] > 0]
            rooms = {(int(e), str(p)): int(n) for e, p, n in zip(capped["epoch"], capped["prompt_id"], capped["room"])}
    r = cfg.rollout
    return TailOptions(reestimate=cfg.scheduler.reestimate, tail_concurrency=str(r.tail_concurrency),
                       partial_rollout=r.partial_rollout, max_split=r.max_split, rooms=rooms)


def speculative_config(cfg) -> dict | None:
    """vLLM's ``speculative_config`` for ``rollout.speculative`` (None: off). ``ngram`` needs no
    draft model (prompt lookup); the other methods need ``model.speculative_model``-style setup
    that vLLM documents per method and are passed through by name only.
    ``rollout.speculative_max_batch`` becomes vLLM's ``disable_by_batch_size`` (``auto``: the
    cost model's break-even batch, scheduler/speculative.py)."""
    from ..config import parse_speculative_max_batch

    r = cfg.rollout
    if r.speculative == "none":
        return None
    if r.temperature != 1.0 or r.top_p != 1.0:
        raise ConfigError([f"rollout.speculative: {r.speculative} needs rollout.temperature=1 and rollout.top_p=1 "
                           f"(got {r.temperature} and {r.top_p}): with speculative decoding vLLM 0.32 returns log-prob "
                           "0.0 or NaN for drafted tokens in its processed_logprobs mode (measured, docs/runtime.md), "
                           "so the instances record raw log-probs, which are the sampling distribution's only without "
                           "temperature and nucleus; set both to 1 or rollout.speculative=none"])
    spec = {"method": r.speculative, "num_speculative_tokens": int(r.num_speculative_tokens)}
    if r.speculative == "ngram":
        spec.update(prompt_lookup_max=max(1, int(r.num_speculative_tokens)), prompt_lookup_min=1)
    mode = parse_speculative_max_batch(r.speculative_max_batch)
    if mode == "auto":
        from ..scheduler.cost import CostModel
        from ..scheduler.speculative import from_config

        ctx = cfg.lengths.max_response_length / 2.0
        sp = from_config(r, cfg.cost, CostModel.from_config(cfg.cost), ctx)
        if sp is None:
            return None          # the cost model says it never pays: off
        mode = sp.max_batch
    if isinstance(mode, int) and mode > 0 and mode < r.max_num_seqs:
        spec["disable_by_batch_size"] = int(mode)
    return spec


def _fleet_options(cfg):
    from .orchestrator import FleetOptions

    return FleetOptions(request_timeout_s=cfg.rollout.request_timeout_s, max_restarts=cfg.rollout.max_restarts)


def _finish(cfg, orch, plan, out: Path, k: int, logger, t_start: float) -> dict:
    """The final checkpoint, summary.json and lengths.parquet."""
    import pandas as pd

    from ..io import write_parquet_atomic

    final, every = plan.end, cfg.train.checkpoint_every
    if not (every and final % every == 0):
        orch.save_checkpoint(final)
    summary = write_summary(cfg, orch, out, k, logger.say)
    write_parquet_atomic(out / "lengths.parquet", pd.DataFrame(orch.history))
    logger.close()
    logger.say(f"done in {time.time() - t_start:.1f} s: throughput {summary['throughput']:.0f} tok/s, "
               f"policy lag max {summary['policy_lag_max']} (k={k}); outputs in {out}")
    return summary


def _shutdown(instances) -> None:
    """Every instance stops its vLLM engine (its engine-core process unlinks its shared memory);
    in parallel, best effort (an instance may be dead)."""
    import ray

    refs = []
    for i in instances:
        try:
            refs.append(i.shutdown.remote())
        except Exception:  # noqa: BLE001
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=30)
    except Exception:  # noqa: BLE001 - best effort at shutdown
        pass


def _plan(cfg, settings, train, out: Path):
    """(the execution plan, the adaptive re-planner or None): the schedule of all epochs, or of
    epoch 0 when adaptive (the later ones are planned during the run)."""
    from ..config import save_resolved
    from ..io import write_json_atomic, write_parquet_atomic
    from ..scheduler.execution import ExecutionPlan
    from ..scheduler.run import build_schedule

    plan_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1)) if settings.adaptive else cfg
    sched, report = build_schedule(plan_cfg, train, None, compare=False)
    # schedule.parquet keeps the whole plan: a run stopped by train.max_iterations can be resumed
    write_parquet_atomic(out / "schedule.parquet", sched, {"policy": cfg.scheduler.policy})
    plan = ExecutionPlan.from_schedule(sched, settings, max_iterations=cfg.train.max_iterations)
    write_json_atomic(out / "schedule_report.json", report)
    save_resolved(cfg, out)
    return plan, (_replanner(cfg, train, settings.lag_bound, out, sched) if settings.adaptive else None)


def _ray_init(cfg) -> bool:
    """Start (or join) Ray; False when the caller had already connected (then it is left running)."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster (`ray start` on every node)
        ray.init(log_to_driver=True)
    else:
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=True)
    return True


def _start_actors(cfg, model_dir: Path, cores, tok_ids: dict, ev_ids: dict | None, logger):
    """R rollout instances (engines start in the background) and the trainer (ready on return)."""
    import ray

    from ..algos.grpo import LossConfig
    from ..engines.rollout import rollout_actor_class
    from ..engines.trainer import trainer_actor_class
    from ..platforms import get_platform

    inst_cores, tr_cores, inst_cpus, tr_cpus = cores
    R = cfg.rollout.num_instances
    have = ray.cluster_resources().get("CPU", 0)
    if sum(inst_cpus) + tr_cpus > have + 1e-9:
        raise ConfigError([f"rollout.num_instances: {R} instance(s) + trainer ({cfg.train.devices} rank(s), train.devices) "
                           f"need {sum(inst_cpus) + tr_cpus:g} CPUs; "
                           f"the Ray cluster has {have:g}"])
    max_prompt = max(len(v) for v in list(tok_ids.values()) + list((ev_ids or {}).values()))
    max_model_len = -(-(max_prompt + cfg.lengths.max_response_length + 8) // 16) * 16
    plat = get_platform(cfg.platform)  # device resources per actor: {} on CPU, GPUs or NPUs otherwise
    inst_opts = dict(plat.ray_actor_options(cfg.rollout.devices_per_instance)) if plat.ray_resource else {}
    tr_opts = dict(plat.ray_actor_options(1)) if plat.ray_resource else {}
    dev_need = R * cfg.rollout.devices_per_instance + cfg.train.devices
    dev_have = ray.cluster_resources().get(plat.ray_resource, 0) if plat.ray_resource else dev_need
    if dev_need > dev_have + 1e-9:
        raise ConfigError([f"rollout.num_instances / train.devices: {R} instance(s) x {cfg.rollout.devices_per_instance} "
                           f"{plat.ray_resource} + {cfg.train.devices} trainer rank(s) need {dev_need} "
                           f"{plat.ray_resource}s; the Ray cluster has {dev_have:g}"])
    gib = str(max(1, int(round(cfg.rollout.kv_cache_space_gib))))
    from .logger import actor_env

    env = {"env_vars": actor_env(gib, sys.stderr.isatty())}
    inst_opts["runtime_env"] = tr_opts["runtime_env"] = env
    logger.say(f"starting {R} vLLM instance(s) and the trainer (engine start takes ~20-40 s)")
    Rollout = rollout_actor_class()
    # named per run, so tools (and the fault-injection test) can find an instance
    instances = [Rollout.options(num_cpus=inst_cpus[r], name=f"asp-rollout-{os.getpid()}-{r}",
                                 max_restarts=cfg.rollout.max_restarts, **inst_opts).remote(
        str(model_dir), max_num_seqs=cfg.rollout.max_num_seqs, max_model_len=max_model_len, seed=cfg.seed + r,
        kv_cache_gib=cfg.rollout.kv_cache_space_gib, dtype=cfg.model.dtype, cpu_cores=inst_cores[r], instance=r,
        tensor_parallel_size=cfg.rollout.devices_per_instance, platform=plat.name,
        speculative=speculative_config(cfg))
        for r in range(R)]
    t = cfg.train
    loss = LossConfig(clip_eps=t.clip_eps, off_policy=t.off_policy, cap=t.tis_cap, kl_coef=t.kl_coef,
                      loss_agg=t.loss_agg)
    kw = dict(lr=t.lr, weight_decay=t.weight_decay, loss=loss, micro_batch_size=t.micro_batch_size,
              temperature=cfg.rollout.temperature, seed=cfg.seed, dtype=cfg.model.dtype,
              platform=cfg.platform, bucket_bytes=cfg.weight_sync.bucket_mb << 20, top_p=cfg.rollout.top_p,
              micro_batching=t.micro_batching, max_tokens_per_micro_batch=t.max_tokens_per_micro_batch)
    if t.devices > 1:  # data-parallel FSDP2 ranks behind the one-actor call surface (engines/fsdp_trainer.py)
        from ..engines.fsdp_trainer import TrainerGroup

        trainer = TrainerGroup(str(model_dir), t.devices, actor_options={"num_cpus": tr_cpus / t.devices, **tr_opts},
                               cores_per_rank=tr_cores, **kw)
    else:
        trainer = trainer_actor_class().options(num_cpus=tr_cpus, **tr_opts).remote(
            str(model_dir), cpu_cores=tr_cores[0], **kw)
    ray.get(trainer.ready.remote())
    return instances, trainer


def _weight_sync(cfg, trainer, instances):
    """``weight_sync.transport``: auto = the object store on CPU, the broadcast on devices."""
    from ..platforms import get_platform
    from .weight_sync import WeightSync

    plat = get_platform(cfg.platform).name
    kind = cfg.weight_sync.transport
    if kind == "auto":
        kind = "object_store" if plat == "cpu" else "broadcast"
    return WeightSync(trainer, instances, kind, plat, tp=cfg.rollout.devices_per_instance,
                      base_port=cfg.weight_sync.master_port, timeout_s=cfg.weight_sync.timeout_s)


def _warm_start(cfg, trainer, train, tok, tok_ids: dict, logger) -> None:
    """Supervised steps on the reference answers (while the vLLM engines start)."""
    import ray

    t = cfg.train
    eos = tok.eos_token_id
    examples = [(tok_ids[pid], tok(a, add_special_tokens=False).input_ids + [eos])
                for pid, a in zip(train.ids, train.answers) if a]
    logger.say(f"supervised warm start: {t.warmup_sft_steps} steps x {t.warmup_sft_batch_size} prompts")
    t0 = time.time()
    losses = ray.get(trainer.sft.remote(examples, t.warmup_sft_steps, t.warmup_sft_batch_size, t.warmup_sft_lr,
                                        cfg.seed))
    row = {"steps": t.warmup_sft_steps, "loss_first": losses[0], "loss_last": float(np.mean(losses[-5:])),
           "time_s": time.time() - t0}
    logger.log_side("warm_start.jsonl", row)
    logger.say(f"warm start done: loss {row['loss_first']:.3f} -> {row['loss_last']:.3f} in {row['time_s']:.1f} s")


def _replanner(cfg, train, k: int, out: Path, first):
    """``scheduler.adaptive``: plan epoch e from the response lengths observed so far."""
    import pandas as pd

    from ..io import write_parquet_atomic
    from ..scheduler.admission import Job
    from ..scheduler.cost import CostModel
    from ..scheduler.execution import jobs_from_schedule
    from ..scheduler.planner import plan
    from ..scheduler.run import inputs_from_config

    frames = [first]
    t, r = cfg.train, cfg.rollout

    def replan(epoch: int, history: list[dict], offset: int) -> list[Job]:
        inp = inputs_from_config(cfg, train, pd.DataFrame(history) if history else None)
        df = plan(inp.prompt_ids, inp.predicted, inp.prompt_lengths, policy=cfg.scheduler.policy,
                  group_size=t.group_size, global_batch_size=t.global_batch_size, mini_batch_size=t.mini_batch_size,
                  num_instances=r.num_instances, max_num_seqs=r.max_num_seqs, lag_bound=k,
                  cost=CostModel.from_config(cfg.cost, logprob_passes=1 + (t.kl_coef > 0)), epoch=epoch,
                  iteration_offset=offset, seed=cfg.seed)
        frames.append(df)
        write_parquet_atomic(out / "schedule.parquet", pd.concat(frames, ignore_index=True),
                             {"policy": cfg.scheduler.policy, "adaptive": "true"})
        return jobs_from_schedule(df)

    return replan


def write_summary(cfg, orch, out: Path, k: int, say=print) -> dict:
    """summary.json: one entry computed by the shared metric functions, keyed by the simulator's
    name of the run's system (``config.summary_key``: ``async`` + ``asp`` -> ``asp``)."""
    from ..config import summary_key
    from ..errors import DataError
    from ..io import write_json_atomic
    from ..metrics import summarize
    from .bounds import run_lower_bounds

    try:  # the ratio needs a cost model fitted to the run; a run too small to fit has none
        lb = run_lower_bounds(orch.timeline, cfg, k)
    except DataError as exc:
        say(f"lower_bound_ratio left out: {exc}")
        lb = None
    s = summarize(orch.timeline, num_instances=cfg.rollout.num_instances, max_num_seqs=cfg.rollout.max_num_seqs,
                  lag_bound=k, lower_bounds=lb)
    write_json_atomic(out / "summary.json", {summary_key(cfg): s})
    return s
