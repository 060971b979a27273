"""`asp schedule`: inputs -> predictions -> plan -> estimate -> schedule.parquet + report.

Where the prompts and their lengths come from:
- ``data.path`` set: the prompts of that file; predictions from the length history
  ``lengths.path`` (predictor ``lengths.predictor``, prior for unseen prompts), or the
  prior alone when there is no history.
- otherwise ``workload.type``: ``task`` = the built-in synthetic task (its answer lengths
  are known, so the schedule is planned on the truth unless a history is given);
  ``synthetic``/``trace``/``history`` = experiment workloads whose epochs 0..E-2 are the
  history and whose last epoch is the truth the schedule is judged against.
One rule for every command (lengths/workloads.workload_from_config: ``asp simulate`` simulates
``data.path``'s prompts with the lengths of ``lengths.path``); a ``workload.*`` key set with
``data.path`` is refused when the config loads (config/explicit.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import membership_options, prefix_block_of, reads_forecasts, regroup_of, stream_groups_of
from ..errors import ConfigError, DataError
from .cost import CostModel
from .estimate import estimate
from .group_max import group_max_factor
from .microbatch import resolve_mode
from .execution import lag_bound_of
from .planner import POLICIES, SHARED_QUEUE, plan_columns, schedule_frame

log = logging.getLogger(__name__)


@dataclass
class PlanInputs:
    prompt_ids: np.ndarray
    prompt_lengths: np.ndarray
    predicted: np.ndarray
    truth: np.ndarray | None          # true mean lengths, when known (experiments)
    source: str
    prediction_quality: dict | None = None
    group_max_factor: float = 1.0
    holdout: dict | None = None      # every predictor on the history's last epoch
    workload: object | None = None   # the experiment workload (lengths/workloads.Workload), if any
    trust: object | None = None      # lengths/predictors.ForecastRecord (exact for the oracle; None: unknown, or
                                     # not measured: only config.reads_forecasts plans read it)
    prompt_length: dict | None = None  # how a real prompt set's lengths were counted (data/prompt_tokens.py)


def _trust(cfg, history: pd.DataFrame | None):
    """lengths/predictors.forecast_record of ``history`` for the configured predictor, measured only
    where it is read (``config.reads_forecasts``: ``scheduler.membership: auto``, ``scheduler.gather_top``)."""
    if not reads_forecasts(cfg):
        return None
    from ..lengths.predictors import forecast_record

    L = cfg.lengths
    return forecast_record(history, L.predictor, alpha=L.ema_alpha, q=L.quantile, prior=L.prior)


def _exact(cfg, lengths):
    """The oracle's record (its forecasts are the outcomes), where a plan reads one."""
    from ..lengths.predictors import ForecastRecord

    return ForecastRecord.exact(lengths) if reads_forecasts(cfg) else None


def inputs_from_config(cfg, prompts=None, history: pd.DataFrame | None = None, count=None) -> PlanInputs:
    """The plan's inputs. ``count``: how the prompts of ``data.path`` are counted (data/prompt_tokens.py:
    the run's tokenizer, loaded by the caller; None: the ``data.prompt_length: words`` opt-in, else an error)."""
    from ..lengths.history import load_history
    from ..lengths.predictors import evaluate, predict_lengths

    L = cfg.lengths
    if history is None and L.path:
        history = load_history(L.path, L.max_response_length)
    if prompts is not None or cfg.data.path or cfg.workload.type == "task":
        return _dataset_inputs(cfg, prompts, history, count)

    from ..lengths.workloads import workload_from_config

    w = workload_from_config(cfg)
    truth = w.mean_length[-1].astype(np.float64)
    if L.predictor == "oracle" or w.epochs < 2:
        pred, q, trust = truth.copy(), None, _exact(cfg, truth)
        if w.epochs < 2 and L.predictor != "oracle":
            log.warning("workload has one epoch: no history to predict from, planning on the truth")
    else:
        hist = w.to_history(range(w.epochs - 1))
        pred = predict_lengths(hist, w.prompt_ids, w.prompt_length, L.predictor, alpha=L.ema_alpha,
                               q=L.quantile, prior=L.prior)
        q, trust = evaluate(pred, truth), _trust(cfg, hist)
    return PlanInputs(w.prompt_ids, w.prompt_length.astype(np.float64), pred, truth, w.name, q,
                      group_max_factor(w.group_spread, w.group_size), workload=w, trust=trust)


def _dataset_inputs(cfg, prompts, history: pd.DataFrame | None, count=None) -> PlanInputs:
    """Inputs of a real prompt set (``data.path``, the built-in task or ``prompts``). For
    ``data.path`` only ids and prompt lengths are read (data/prompt_index.py: no texts)."""
    from ..lengths.history import restrict_to
    from ..lengths.predictors import evaluate, holdout_report, predict_lengths

    L = cfg.lengths
    if prompts is None and cfg.data.path:
        from ..data.prompt_index import read_prompt_index
        from ..data.prompt_tokens import rule_for

        count = rule_for(cfg, count)
        ids, plen = read_prompt_index(cfg.data.path, cfg.data.prompt_key, cfg.data.id_key, count)
        truth, source, unit = None, str(cfg.data.path), count.record
    else:
        if prompts is None:
            from ..data.datasets import prompts_from_config

            prompts, _ = prompts_from_config(cfg)
        ids, plen, source = np.asarray(prompts.ids, dtype=object), prompts.prompt_lengths, prompts.source
        unit = prompts.length_unit
        if unit is not None and unit.get("unit") == "words" and cfg.data.prompt_length != "words":
            raise ConfigError([f"data.prompt_length: 'tokens', but the prompts of {source} were counted in whitespace "
                               "words (no tokenizer counted them); count them with the run's tokenizer "
                               "(data/prompt_tokens.py) or set data.prompt_length=words"])
        truth = None if prompts.known_lengths is None else np.asarray(prompts.known_lengths, dtype=np.float64)
    plen = np.asarray(plen, dtype=np.float64)
    positions = np.arange(len(ids))
    if history is not None:  # prompt_id -> position in ids: the predictors group integers, not strings
        history = restrict_to(history, ids, str(L.path or "length history"), encode=True)
    if L.predictor == "oracle" or (history is None and truth is not None):
        if truth is None:
            raise ConfigError(["lengths.predictor: 'oracle' needs known lengths (the built-in task or an "
                               "experiment workload); use mean, ema, quantile or regression"])
        pred, trust = truth.copy(), _exact(cfg, truth)
    else:
        pred = predict_lengths(history, positions, plen, L.predictor, alpha=L.ema_alpha, q=L.quantile,
                               prior=L.prior, default=min(256.0, L.max_response_length))
        trust = _trust(cfg, history)
    q = evaluate(pred, truth) if truth is not None and L.predictor != "oracle" and history is not None else None
    holdout = None
    if history is not None and history["epoch"].nunique() >= 2:
        holdout = holdout_report(history, pd.Series(plen), alpha=L.ema_alpha, q=L.quantile)
    # a real prompt set's samples spread around their prompt's mean by workload.group_spread, as asp simulate
    # draws them for data.path (lengths/workloads.dataset_workload); the built-in task's lengths are exact
    gmf = 1.0 if truth is not None else group_max_factor(cfg.workload.group_spread, cfg.train.group_size)
    return PlanInputs(ids, plen, np.minimum(pred, L.max_response_length), truth, source, q, group_max_factor=gmf,
                      holdout=holdout, trust=trust, prompt_length=unit)


def check_sizes(cfg, num_prompts: int, source: str) -> None:
    if num_prompts == 0:
        raise DataError(f"{source}: the dataset is empty; nothing to schedule")
    if cfg.train.global_batch_size > num_prompts:
        raise ConfigError([f"train.global_batch_size: {cfg.train.global_batch_size} is larger than the dataset "
                           f"({num_prompts} prompts in {source}); use at most {num_prompts}"])


def plan_epochs(cfg, inp: PlanInputs, policy: str | None = None, epochs: int | None = None) -> pd.DataFrame:
    """The schedule of every epoch (DESIGN 6 columns); each epoch's rows in ``inp.prompt_ids`` order."""
    cols = plan_epoch_columns(cfg, inp, policy, epochs)
    n_epochs = len(cols["epoch"]) // len(inp.prompt_ids)
    ids = inp.prompt_ids if n_epochs == 1 else np.tile(inp.prompt_ids, n_epochs)
    return schedule_frame(cols, ids)


def planned_cost(cfg) -> CostModel:
    """The configured cost model as the planner and the estimate price with it (one old log-prob pass,
    plus the reference's with a KL term; the prefix cache's block)."""
    return CostModel.from_config(cfg.cost, logprob_passes=1 + (cfg.train.kl_coef > 0), prefix_block=prefix_block_of(cfg))


def plan_epoch_columns(cfg, inp: PlanInputs, policy: str | None = None, epochs: int | None = None) -> dict:
    """``plan_epochs`` as numpy columns without the prompt ids (what the estimate reads)."""
    parts, offset = [], 0
    for e in range(epochs or cfg.train.epochs):
        cols = plan_one_epoch(cfg, inp, e, offset, policy)
        offset = int(cols["iteration"].max()) + 1
        parts.append(cols)
    return parts[0] if len(parts) == 1 else {k: np.concatenate([c[k] for c in parts]) for k in parts[0]}


def plan_one_epoch(cfg, inp: PlanInputs, epoch: int, iteration_offset: int = 0, policy: str | None = None,
                   lag_bound: int | None = None) -> dict:
    """Epoch ``epoch``'s plan (``plan_columns``: its iterations numbered from ``iteration_offset``) as
    ``cfg`` asks for it: the one call behind ``asp schedule`` and the adaptive re-planners of asp train
    and verl (pipeline/planning.py, integrations/verl/plan.py), so a later epoch is planned with the
    same keys as the first (tail rooms, speculation, membership, the group's longest-sample factor).
    ``lag_bound``: the run's k where it is resolved already (default ``lag_bound_of(cfg)``)."""
    from .speculative import from_config

    t, r = cfg.train, cfg.rollout
    cost = planned_cost(cfg)
    # the mean context of a running sequence, for speculative decoding's auto threshold (as the simulator's)
    ctx = float(np.mean(inp.prompt_lengths)) + float(np.mean(inp.predicted)) / 2.0
    return plan_columns(inp.predicted, inp.prompt_lengths, policy=policy or cfg.scheduler.policy,
                        group_size=t.group_size, global_batch_size=t.global_batch_size,
                        mini_batch_size=t.mini_batch_size, num_instances=r.num_instances,
                        max_num_seqs=r.max_num_seqs, lag_bound=lag_bound_of(cfg) if lag_bound is None else lag_bound,
                        cost=cost, epoch=epoch, iteration_offset=iteration_offset, seed=cfg.seed,
                        tail=r.tail_concurrency, speculation=from_config(r, cfg.cost, cost, ctx),
                        group_max_factor=inp.group_max_factor, max_response_length=cfg.lengths.max_response_length,
                        forecasts=inp.trust, **membership_options(cfg))


def plan_epoch_frame(cfg, inp: PlanInputs, epoch: int, iteration_offset: int, lag_bound: int | None = None
                     ) -> pd.DataFrame:
    """:func:`plan_one_epoch` as a schedule frame (DESIGN 6), rows in ``inp.prompt_ids`` order."""
    return schedule_frame(plan_one_epoch(cfg, inp, epoch, iteration_offset, lag_bound=lag_bound), inp.prompt_ids)


def estimate_schedule(cfg, sched, inp: PlanInputs, lengths: np.ndarray, policy: str | None = None, *,
                      groups: bool = False) -> dict:
    """Analytic figures of ``sched`` (a schedule frame or columns from ``plan_epochs``: each epoch's
    rows in ``inp.prompt_ids`` order, planned with ``policy``, default ``scheduler.policy``) when the
    groups' mean lengths are ``lengths`` (per prompt of inp); ``groups``: see ``estimate``."""
    t, r = cfg.train, cfg.rollout
    n_rows = len(sched["epoch"])
    if n_rows % len(inp.prompt_ids):
        raise ValueError(f"schedule of {n_rows} rows is not whole epochs of {len(inp.prompt_ids)} prompts")
    pos = np.arange(n_rows) % len(inp.prompt_ids)
    cost = planned_cost(cfg)
    col = {k: np.asarray(sched[k]) for k in ("epoch", "iteration", "instance", "mini_batch", "dispatch_rank")}
    return estimate(col["iteration"], col["instance"], col["mini_batch"], col["epoch"] * (n_rows + 1) + col["dispatch_rank"],
                    np.asarray(lengths)[pos], inp.prompt_lengths[pos], group_size=t.group_size,
                    num_instances=r.num_instances, max_num_seqs=r.max_num_seqs, lag_bound=lag_bound_of(cfg),
                    micro_batch_size=t.micro_batch_size, cost=cost, group_max_factor=inp.group_max_factor,
                    kv_cache_tokens=r.kv_cache_tokens, micro_batching=resolve_mode(t.micro_batching),
                    max_tokens_per_micro_batch=t.max_tokens_per_micro_batch,
                    max_response_length=cfg.lengths.max_response_length,
                    shared_queue=SHARED_QUEUE[policy or cfg.scheduler.policy], groups=groups,
                    regroup=cfg.pipeline.mode == "async" and regroup_of(cfg, policy or cfg.scheduler.policy),
                    stream=stream_groups_of(cfg, policy or cfg.scheduler.policy))


def planned_concurrency(cfg, inp: PlanInputs) -> int:
    """Sequences per instance the dispatcher admits for an asp schedule (``scheduler.concurrency``,
    scheduler/concurrency.py): the planner's choice from the predictions, or rollout.max_num_seqs."""
    from .concurrency import configured_concurrency

    t, r = cfg.train, cfg.rollout
    return configured_concurrency(cfg, inp.predicted, inp.prompt_lengths, group_size=t.group_size,
                                  num_instances=r.num_instances, max_num_seqs=r.max_num_seqs,
                                  lag_bound=lag_bound_of(cfg),
                                  cost=planned_cost(cfg),
                                  group_max_factor=inp.group_max_factor,
                                  packed=resolve_mode(t.micro_batching) == "packed")


PREDICTED_KEYS = ("iteration_time_mean", "padding_bubble", "skew_bubble", "sorting_bubble", "lower_bound_ratio")


def _short(e: dict) -> dict:
    keep = PREDICTED_KEYS + ("iteration_time_p99", "lag_blocked", "throughput", "run_time_s", "rollout_work_cv")
    return {k: e[k] for k in keep if k in e}


def build_schedule(cfg, prompts=None, history: pd.DataFrame | None = None, *, compare: bool = True, count=None):
    """(schedule DataFrame, report dict) for ``cfg``; nothing is written. ``count``: inputs_from_config's."""
    t0 = time.perf_counter()
    inp = inputs_from_config(cfg, prompts, history, count)
    check_sizes(cfg, len(inp.prompt_ids), inp.source)
    base_cfg = cfg
    if cfg.scheduler.policy == "asp":   # plan, estimate and run at the planner's admission concurrency
        cap = planned_concurrency(cfg, inp)
        cfg = replace(cfg, rollout=replace(cfg.rollout, max_num_seqs=cap))
    sched = plan_epochs(cfg, inp)
    predicted = estimate_schedule(cfg, sched, inp, inp.predicted)
    elapsed = time.perf_counter() - t0
    report = {
        "num_prompts": int(len(inp.prompt_ids)),
        "num_instances": cfg.rollout.num_instances,
        "elapsed_s": elapsed,
        "predicted": _short(predicted),
        "policy": cfg.scheduler.policy,
        "shared_queue": SHARED_QUEUE[cfg.scheduler.policy],
        "epochs": int(sched["epoch"].nunique()),
        "iterations": int(sched["iteration"].nunique()),
        "group_size": cfg.train.group_size,
        "global_batch_size": cfg.train.global_batch_size,
        "mini_batch_size": cfg.train.mini_batch_size,
        "lag_bound": lag_bound_of(cfg),
        "source": inp.source,
        "predictor": cfg.lengths.predictor,
    }
    if inp.prompt_length is not None:   # tokens of the run's tokenizer, or the words opt-in, said here
        report["prompt_length"] = inp.prompt_length
    if cfg.scheduler.policy == "asp":
        report["admission_concurrency"] = int(cfg.rollout.max_num_seqs)
    if inp.prediction_quality is not None:
        report["prediction_quality"] = inp.prediction_quality
    if inp.holdout:
        report["history_holdout"] = inp.holdout
    if inp.truth is not None:
        report["realized"] = _short(estimate_schedule(cfg, sched, inp, inp.truth))
    if compare:
        base = {}
        for pol in POLICIES:
            if pol == cfg.scheduler.policy:
                continue
            other = plan_epoch_columns(base_cfg, inp, pol)
            base[pol] = _short(estimate_schedule(base_cfg, other, inp,
                                                 inp.truth if inp.truth is not None else inp.predicted, pol))
        report["baselines"] = base
        report["baselines_judged_on"] = "truth" if inp.truth is not None else "predictions"
    if compare:
        sim = simulated_figures(base_cfg, inp)
        if sim is not None:
            report["simulated"] = sim
    report["headline"] = headline(report)
    return sched, report


HEADLINE_TOLERANCE = 0.10   # issue 14: the analytic estimate should be within 10 % of the simulator


def headline(report: dict) -> dict:
    """The figures to quote for the configured policy: the analytic estimate (on the true lengths
    when known) where it is within HEADLINE_TOLERANCE of the event simulator's mean iteration time
    on the same workload, the simulator's figures where it is not (``source`` says which, and
    ``analytic_over_simulated`` by how much they differ). Without a simulation (a real dataset)
    the estimate is all there is: ``analytic_over_simulated`` is None."""
    analytic = report.get("realized", report["predicted"])
    sim = (report.get("simulated") or {}).get("systems", {}).get((report.get("simulated") or {}).get("system"))
    if not sim:
        return {"source": "analytic", "analytic_over_simulated": None, **analytic}
    ratio = float(analytic["iteration_time_mean"]) / max(float(sim["iteration_time_mean"]), 1e-12)
    if abs(ratio - 1.0) <= HEADLINE_TOLERANCE:
        return {"source": "analytic", "analytic_over_simulated": ratio, **analytic}
    return {"source": "simulator", "system": report["simulated"]["system"], "analytic_over_simulated": ratio, **sim}


SIMULATE_LIMIT = 1 << 19  # samples; the event simulator takes about 10 us per sample


def simulated_figures(cfg, inp: PlanInputs) -> dict | None:
    """The event simulator's figures for the configured policy and ``fully_async_fifo`` on an
    experiment workload of at most SIMULATE_LIMIT samples: the analytic estimate is within 10 % of
    the simulator on the benchmark workloads (docs/scheduler.md) but not validated beyond them, so
    the report carries the simulator's figures beside it and quotes them where the two differ by
    more. Same cost model (``cost.*``), instances and lag bound as the plan; None otherwise."""
    w = inp.workload
    if w is None or w.num_prompts * w.group_size * max(1, cfg.sim.epochs) > SIMULATE_LIMIT:
        return None
    from ..config import summary_key
    from ..sim.policies import POLICY_NAMES
    from ..sim.run import simulate_system

    name = summary_key(cfg)
    if name not in POLICY_NAMES:
        return None
    R = cfg.rollout.num_instances
    train_devices = max(1, cfg.sim.total_devices - cfg.sim.rollout_devices)
    sim_cfg = replace(cfg, sim=replace(cfg.sim, model_class="custom", infer_tp=1, rollout_devices=R,
                                       total_devices=R + train_devices,
                                       logprob_passes=1 + (cfg.train.kl_coef > 0)))
    keep = PREDICTED_KEYS + ("iteration_time_p99", "throughput")
    out = {}
    for system in dict.fromkeys((name, "fully_async_fifo")):
        s = simulate_system(sim_cfg, w, system, record_samples=False).summary
        out[system] = {k: float(s[k]) for k in keep if k in s}
    return {"systems": out, "system": name, "note": "event simulator, same workload, cost model and instances"}


def run_schedule(cfg, count=None) -> int:
    """``asp schedule`` (``count``: the prompts' counter, data/prompt_tokens.py; the CLI and the MindSpeed-RL
    entry load the run's tokenizer)."""
    from ..config import save_resolved
    from ..io import write_json_atomic, write_parquet_atomic

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    sched, report = build_schedule(cfg, count=count)
    out = Path(cfg.output_dir)
    write_parquet_atomic(out / "schedule.parquet", sched, {"policy": cfg.scheduler.policy})
    write_json_atomic(out / "schedule_report.json", report)
    save_resolved(cfg, out)
    print(format_report(report))
    print(f"wrote {out / 'schedule.parquet'} ({len(sched)} rows) and {out / 'schedule_report.json'}")
    return 0


def format_report(report: dict) -> str:
    lines = [f"asp schedule: {report['num_prompts']} prompts x {report['epochs']} epoch(s) -> "
             f"{report['iterations']} iterations on {report['num_instances']} instances "
             f"(policy {report['policy']}, lag bound {report['lag_bound']}, planned in {report['elapsed_s']:.2f} s)"]
    if "prompt_length" in report:
        u = report["prompt_length"]
        lines.append("  prompt lengths: " + (f"tokens of {u['tokenizer']}" if u["unit"] == "tokens" else
                                             "WHITESPACE WORDS (data.prompt_length=words), not the run's tokens"))
    if "admission_concurrency" in report:
        lines.append(f"  admits at most {report['admission_concurrency']} sequences per instance (scheduler.concurrency)")
    rows = [(report["policy"] + " (predicted)", report["predicted"])]
    if "realized" in report:
        rows.append((report["policy"] + " (truth)", report["realized"]))
    for pol, e in report.get("baselines", {}).items():
        rows.append((pol, e))
    for system, e in (report.get("simulated") or {}).get("systems", {}).items():
        rows.append((system + " (simulated)", e))
    h = report.get("headline")
    if h:
        r = h.get("analytic_over_simulated")
        why = ("no true lengths to simulate: the analytic estimate" if r is None else
               f"analytic / simulated = {r:.3f}: " + ("the analytic estimate" if h["source"] == "analytic" else
                                                       f"more than {HEADLINE_TOLERANCE:.0%} off, the event simulator"))
        lines.append(f"  headline ({why}): mean iteration time {h['iteration_time_mean']:.2f} s")
    lines.append(f"  {'policy':22s} {'iter time s':>11s} {'p99 s':>9s} {'padding':>8s} {'skew':>7s} "
                 f"{'sorting':>8s} {'LB ratio':>8s}")
    for name, e in rows:
        lines.append(f"  {name:22s} {e['iteration_time_mean']:11.2f} {e.get('iteration_time_p99', 0):9.2f} "
                     f"{e['padding_bubble']:8.3f} {e['skew_bubble']:7.3f} {e['sorting_bubble']:8.3f} "
                     f"{e['lower_bound_ratio']:8.3f}")
    q = report.get("prediction_quality")
    if q:
        lines.append(f"  prediction quality ({report['predictor']}): MAE {q['mae']:.1f} tokens, "
                     f"Spearman {q['spearman']:.3f}")
    for method, h in (report.get("history_holdout") or {}).items():
        lines.append(f"  history, last epoch held out, {method:10s}: MAE {h['mae']:.1f} tokens, Spearman {h['spearman']:.3f}")
    return "\n".join(lines)
