"""The run's Ray actors: start Ray, the rollout instances and the trainer, the warm start and
the first weight sync, and their shutdown (used by ``pipeline/run.py: run_train``)."""
from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["engine_args", "init_ray", "kill_trainer", "make_weight_sync", "shutdown_instances", "speculative_config",
           "start_actors", "warm_start", "warm_up", "warm_up_engines"]


def init_ray(cfg) -> bool:
    """Start (or join) Ray; False when the caller had already connected (then it is left running)."""
    import ray

    if ray.is_initialized():
        return False
    # Ray's driver starts an OpenTelemetry metric-export thread that ray.shutdown() leaves running;
    # one that wakes while the process exits crashes it (SIGSEGV after the run finished:
    # docs/reliability.md, "Tests"). The run's metrics are asp's own (metrics.jsonl, TensorBoard);
    # a user who wants Ray's exported metrics sets RAY_enable_open_telemetry=1.
    os.environ.setdefault("RAY_enable_open_telemetry", "0")
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster (`ray start` on every node)
        ray.init(log_to_driver=True)
    else:
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=True)
    return True


def start_actors(cfg, model_dir: Path, cores, tok_ids: dict, ev_ids: dict | None, logger):
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
    eargs = engine_args(cfg)
    plat.rollout_engine_args(eargs, max_model_len)  # a budget the device cannot run fails here, before any actor starts
    gib = str(max(1, int(round(cfg.rollout.kv_cache_space_gib))))
    from .logger import actor_runtime_env

    log = Path(cfg.output_dir) / "train.log" if cfg.logging.actor_output == "log" else None
    inst_opts["runtime_env"] = tr_opts["runtime_env"] = actor_runtime_env(gib, sys.stderr.isatty(), log)
    logger.say(f"starting {R} vLLM instance(s) and the trainer (engine start takes ~20-40 s)")
    Rollout = rollout_actor_class()
    # named per run, so tools (and the fault-injection test) can find an instance; the run's own
    # token keeps a second run in one process (a resume) clear of names Ray has not released yet
    run_token = uuid.uuid4().hex[:8]
    instances = [Rollout.options(num_cpus=inst_cpus[r], name=f"asp-rollout-{os.getpid()}-{run_token}-{r}",
                                 max_restarts=cfg.rollout.max_restarts, **inst_opts).remote(
        str(model_dir), max_num_seqs=cfg.rollout.max_num_seqs, max_model_len=max_model_len, seed=cfg.seed + r,
        kv_cache_gib=cfg.rollout.kv_cache_space_gib, dtype=cfg.model.dtype, cpu_cores=inst_cores[r], instance=r,
        tensor_parallel_size=cfg.rollout.devices_per_instance, platform=plat.name,
        speculative=speculative_config(cfg), engine_args=eargs)
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


def make_weight_sync(cfg, trainer, instances):
    """``weight_sync.transport``: auto = the object store on CPU, the broadcast on devices."""
    from ..platforms import get_platform
    from .weight_sync import WeightSync

    plat = get_platform(cfg.platform).name
    kind = cfg.weight_sync.transport
    if kind == "auto":
        kind = "object_store" if plat == "cpu" else "broadcast"
    return WeightSync(trainer, instances, kind, plat, tp=cfg.rollout.devices_per_instance,
                      base_port=cfg.weight_sync.master_port, timeout_s=cfg.weight_sync.timeout_s,
                      stall_timeout_s=cfg.weight_sync.stall_timeout_s)


def warm_up(cfg, trainer, instances, train, tok, tok_ids: dict, resume, outputs):
    """Checkpoint or supervised warm start, engines ready, version 0 on every instance. The
    trainer's ``load_checkpoint``, first publish, ``node_ip`` and ``open_group`` are bounded as the
    loop's calls are (pipeline/start_waits.py). ``outputs``: the run's ``RunOutputs`` (log, timeline,
    checkpoints). Returns (the weight transport, version 0's ticket)."""
    import ray

    from .start_waits import StartWaits
    from .train_watch import TrainerBounds

    logger = outputs.logger
    wsync = make_weight_sync(cfg, trainer, instances)
    waits = StartWaits(trainer, wsync, TrainerBounds.from_config(cfg), outputs)
    v0 = 0 if resume is None else waits.load_checkpoint(resume.path, resume.version)
    if cfg.train.warmup_sft_steps > 0 and resume is None:
        warm_start(cfg, trainer, train, tok, tok_ids, logger)
    ray.get([i.ready.remote() for i in instances])
    for r, w in enumerate(ray.get([i.workers.remote() for i in instances])):
        logger.log_side("instances.jsonl", {"instance": r, "workers": w})
    warm_up_engines(cfg, instances, [tok_ids[p] for p in train.ids], logger)
    # version 0 = the weights after the warm start (or the checkpoint's)
    first = waits.first_sync(v0, list(range(len(instances))))
    logger.say(f"weights synced to the instances ({wsync.transport})")
    return wsync, first.ticket


def warm_up_engines(cfg, instances, prompts: list[list[int]], logger) -> list[dict]:
    """A throw-away generation on every instance at once (``RolloutEngine.warm_up``: batch sizes
    ``rollout.max_num_seqs`` down to 1, sampled with the run's temperature and top-p and
    log-probs), so the engines' one-time costs (vLLM compiles its log-prob kernel at the first
    request) are paid before the run's clock starts, not in iteration 0. The longest warm-up
    sequence decodes min(``lengths.max_response_length``, ``rollout.max_num_seqs``) tokens: enough
    for the batch to pass through every size, and start-up does not grow with the response cap
    (a 16k-token cap would otherwise cost minutes of decoding on a device before iteration 0).
    Logged to ``warm_start.jsonl`` (``engine_warm_up``). Returns each instance's figures."""
    import ray

    if not prompts:
        return []
    ro = cfg.rollout
    n = int(ro.max_num_seqs)
    budget = min(int(cfg.lengths.max_response_length), n)
    stats = ray.get([i.warm_up.remote(prompts[:n], n, budget, ro.temperature, ro.top_p)
                     for i in instances])
    logger.log_side("warm_start.jsonl", {"engine_warm_up": stats})
    logger.say("engine warm-up: " + ", ".join(f"instance {r} {s['tokens']} tokens in {s['seconds']:.1f} s"
                                              for r, s in enumerate(stats)))
    return stats


def warm_start(cfg, trainer, train, tok, tok_ids: dict, logger) -> None:
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


def shutdown_instances(instances) -> None:
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
    # then the actors themselves, so their CPUs are free for a next run in this process at once
    # (handles going out of scope release them only when Ray gets round to it)
    for i in instances:
        try:
            ray.kill(i, no_restart=True)
        except Exception:  # noqa: BLE001
            pass


def kill_trainer(trainer) -> None:
    """End the trainer's actor (every rank of a ``TrainerGroup``) at once, whatever it is doing: a
    call hung in a collective or on its device never returns, so the actor is killed rather than
    asked to stop; its resources are free for a next run in this process, also when Ray was
    already running (``RAY_ADDRESS``) and is not shut down here. Best effort; None: no trainer."""
    if trainer is None:
        return
    import ray

    try:
        if callable(getattr(type(trainer), "kill", None)):   # a TrainerGroup: its ranks
            trainer.kill()
        else:
            ray.kill(trainer, no_restart=True)
    except Exception:  # noqa: BLE001 - best effort at shutdown
        pass


def engine_args(cfg) -> dict:
    """Further vLLM engine arguments from the config: ``enable_prefix_caching``
    (``rollout.prefix_caching``) always, ``max_num_batched_tokens`` when
    ``rollout.max_num_batched_tokens`` is set (> 0; else vLLM picks its own default). The device's own
    arguments come on top, in the instance (``Platform.rollout_engine_args``: chunked prefill off on CPU)."""
    args = {"enable_prefix_caching": bool(cfg.rollout.prefix_caching)}
    if cfg.rollout.max_num_batched_tokens:
        args["max_num_batched_tokens"] = int(cfg.rollout.max_num_batched_tokens)
    return args


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
