"""`asp train`: check inputs, schedule, start Ray actors, warm start, run the loop, summarise.

Order matters for the user: every check that can fail on bad input (backends missing,
dataset, model path, resources, CPU cores) runs before Ray starts any actor.
Outputs in ``output_dir`` (DESIGN 6): config.yaml, schedule.parquet, schedule_report.json,
metrics.jsonl, eval.jsonl, timeline.jsonl, summary.json, lengths.parquet, tensorboard/,
checkpoints/.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..config import stream_groups_of
from ..errors import ConfigError
from .actors import init_ray, kill_trainer, shutdown_instances, speculative_config, start_actors, warm_up
from .planning import plan_run, tail_options
from .preflight import BACKENDS, check_backends, check_resources  # noqa: F401 - the entry's checks
from .rundir import RUN_FILES, prepare_outputs

__all__ = ["BACKENDS", "RUN_FILES", "check_backends", "check_resources", "prepare_model", "run_train",
           "speculative_config", "tail_options", "write_summary"]



def prepare_model(cfg, train, ev, out: Path) -> Path:
    """``model.path``, or a tiny Qwen2 + word-level tokenizer built into ``out/model_init``."""
    if cfg.model.path:
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise ConfigError([f"model.path: {p} is not an HF model directory (no config.json); point it at a "
                               "directory written by save_pretrained, or remove the key to build the tiny model"])
        return p
    from ..engines.tiny_model import build_tiny_model, prompts_vocabulary, task_vocabulary

    if train.source.startswith("builtin:"):
        from ..data.synthetic import vocabulary

        vocab = task_vocabulary(vocabulary(cfg.data.synthetic))
    else:
        vocab = prompts_vocabulary(train, ev)
    m = cfg.model
    return build_tiny_model(vocab, out / "model_init", hidden_size=m.tiny_hidden_size,
                            num_layers=m.tiny_num_layers, num_heads=m.tiny_num_heads,
                            num_kv_heads=m.tiny_num_kv_heads, max_positions=2048, seed=cfg.seed)


def run_train(cfg, overrides: list[str] | None = None) -> int:
    """Check inputs, plan, start actors, warm start, train, write the summary. Returns 0.

    ``overrides``: the command line's ``key=value`` list; on ``resume=true`` the keys it leaves
    out keep the run's saved values (None: every key of ``cfg`` counts as given)."""
    from ..config import trained_workload_problem
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
    wl = trained_workload_problem(cfg, "asp train", "the prompts of data.path (without it, the built-in task)")
    if wl:
        raise ConfigError([wl])
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
    cleared = prepare_outputs(cfg, out, resume)
    from .logger import warnings_to_file

    restore_warnings = warnings_to_file(out / "train.log")  # library noise -> train.log, from here on
    try:
        return _run(cfg, settings, train, ev, reward_fn, cores, out, resume, attempt, cleared)
    finally:
        restore_warnings()


def _run(cfg, settings, train, ev, reward_fn, cores, out: Path, resume, attempt, cleared) -> int:
    t_start = time.time()
    logger = _open_logger(cfg, out, t_start, cleared, attempt)
    try:
        return _train(cfg, settings, train, ev, reward_fn, cores, out, resume, logger, t_start)
    finally:  # also on an error: metrics.jsonl closed, TensorBoard's writer thread and the wandb run ended
        logger.close()


def _train(cfg, settings, train, ev, reward_fn, cores, out: Path, resume, logger, t_start: float) -> int:
    from .checkpoint import clean_stale_saves

    clean_stale_saves(out / "checkpoints", logger.say)  # before this attempt's first save, said in the log
    logger.say(f"preparing: {len(train)} prompts ({train.source}), mode {cfg.pipeline.mode}, "
               f"policy {cfg.scheduler.policy}, k={settings.lag_bound}, {cfg.rollout.num_instances} rollout instance(s)")

    # -- model, tokens, schedule ---------------------------------------------------------
    model_dir = resume.path if resume is not None else prepare_model(cfg, train, ev, out)
    tok, tok_ids, ev_ids = _tokenize(cfg, model_dir, train, ev)
    plan, replan = _plan_or_resume(cfg, settings, train, out, resume, logger)
    logger.total = plan.end  # the progress line counts the run's iterations, also after a resume

    # -- actors, warm start, the loop ----------------------------------------------------
    import ray

    owns_ray = init_ray(cfg)
    instances: list = []
    trainer = None
    try:
        from .orchestrator import Orchestrator, RunOutputs, TrainerBounds

        outputs = RunOutputs(out / "timeline.jsonl", logger, t_start, cfg.train.checkpoint_every, out / "checkpoints")
        instances, trainer = start_actors(cfg, model_dir, cores, tok_ids, ev_ids, logger)
        wsync, ticket = warm_up(cfg, trainer, instances, train, tok, tok_ids, resume, outputs)
        logger.say(f"instances ready; training {plan.total_iterations} iteration(s) of {cfg.train.global_batch_size} "
                   f"prompts x {cfg.train.group_size} samples")
        task, evaluator = _task(cfg, tok, tok_ids, train, ev, ev_ids, reward_fn)
        orch = Orchestrator(instances, trainer, plan, task, outputs, weight_sync=wsync, ticket=ticket,
                            evaluator=evaluator, replan=replan, fleet=_fleet_options(cfg),
                            tail=tail_options(cfg, out / "schedule.parquet"), stream_start=_stream_start(cfg),
                            bounds=TrainerBounds.from_config(cfg))
        if resume is not None:
            orch.history = list(resume.history)  # the length history observed before the interruption
        orch.run()
        _finish(cfg, orch, plan, out, settings.lag_bound, logger, t_start)
    finally:  # also on an error or Ctrl-C: engines closed before Ray goes, so nothing stays in /dev/shm
        shutdown_instances(instances)
        kill_trainer(trainer)   # a hung one too: Ray cannot end its call, only the actor
        if owns_ray:
            ray.shutdown()
    return 0


def _open_logger(cfg, out: Path, t_start: float, cleared: list[str], attempt):
    """The run's logger, with what ``overwrite=true`` deleted and what a resume changed or kept said first."""
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
    return logger


def _plan_or_resume(cfg, settings, train, out: Path, resume, logger):
    """(the execution plan, the adaptive re-planner or None): a new schedule, or on a resume
    the iterations the run's own schedule has left after the checkpoint's version."""
    if resume is not None:
        from .checkpoint import resume_plan
        from .planning import resume_replanner

        plan = resume_plan(cfg, settings, out, resume.version, resume.carry)
        replan = resume_replanner(cfg, settings, train, out)   # adaptive, epochs still to plan
        logger.say(f"resuming from {resume.path.name}: version {resume.version}, "
                   f"{plan.total_iterations} iteration(s) left (attempt {resume.attempt + 1})")
        return plan, replan
    return plan_run(cfg, settings, train, out)


def _tokenize(cfg, model_dir: Path, train, ev):
    """(tokenizer, train prompt token ids, eval prompt token ids or None); the train prompts'
    lengths become token counts."""
    from ..data.datasets import encode_prompts
    from ..data.prompt_tokens import TokenCounter
    from ..engines.tiny_model import load_tokenizer

    tok = load_tokenizer(model_dir)
    tok_ids = encode_prompts(tok, train, cfg.data.chat_template)  # chat prompts: the model's template
    train.prompt_lengths = np.asarray([len(tok_ids[p]) for p in train.ids], dtype=np.int64)
    if train.length_unit is not None:   # a prompts file (the built-in task has its own lengths): say what counted it
        train.length_unit = TokenCounter(tok, f"the run's model ({model_dir})", cfg.data.chat_template).record
    ev_ids = None
    if ev is not None and cfg.train.eval_every:
        ev_ids = encode_prompts(tok, ev, cfg.data.chat_template)
    return tok, tok_ids, ev_ids


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


def _stream_start(cfg) -> str | None:
    """``pipeline.stream_groups`` as resolved for the run (``auto``: on for asp; config.stream_groups_of):
    its start rule, or None (steps take whole mini-batches)."""
    return str(cfg.pipeline.stream_groups_start) if stream_groups_of(cfg, cfg.scheduler.policy) else None


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
    summary = write_summary(cfg, orch, out, logger.say)
    write_parquet_atomic(out / "lengths.parquet", pd.DataFrame(orch.history))
    logger.say(f"done in {time.time() - t_start:.1f} s: throughput {summary['throughput']:.0f} tok/s, "
               f"policy lag max {summary['policy_lag_max']} (k={k}); outputs in {out}")
    return summary


def write_summary(cfg, orch, out: Path, say=print) -> dict:
    """summary.json: one entry computed by the shared metric functions, keyed by the simulator's
    name of the run's system (``config.summary_key``: ``async`` + ``asp`` -> ``asp``):
    ``pipeline/summary.run_summary``: ``metrics.summarize`` plus the simulator's tail keys from the
    run's own events (deferred groups and samples, the deferred samples' lag histograms by
    ``metrics.deferred_lags``, steals, capped groups, the length mix)."""
    from ..config import summary_key
    from ..io import write_json_atomic
    from .summary import run_summary

    s = run_summary(orch.timeline, cfg, say)
    write_json_atomic(out / "summary.json", {summary_key(cfg): s})
    return s
