"""`asp simulate`: every system policy on the same workload and devices; sweeps; report.

Epochs: a workload of E epochs (``workload.epochs``) gives the length history (its first
``E - sim.epochs`` epochs) and the simulated epochs (the last ``sim.epochs``). Predictions
come from the history with ``lengths.predictor``; ``asp_adaptive`` adds each simulated
epoch's observed lengths to the history before planning the next one.

Outputs in ``output_dir``: ``summary.json`` (DESIGN 6: one entry per system policy),
``simulation.json`` (the simulated setups and cost coefficients), ``timeline_<policy>.jsonl``
(small runs, see ``sim.write_timeline``), ``sweep/devices_<D>/summary.json`` for each
``sim.sweep_devices`` point, ``split/rollout_<Dr>/summary.json`` for each
``sim.sweep_rollout_devices`` entry (same total, another rollout/trainer split),
``calibration.json`` with ``--calibrate``, ``report.md`` and PNGs.
"""
from __future__ import annotations

import copy
import gc
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import (membership_options, prefix_block_of, reads_forecasts, regroup_heavy_of, regroup_of,
                      stream_groups_of)
from ..errors import AspError
from ..metrics import summarize
from .bounds import lower_bounds
from .costs import SimCosts, check_kv_capacity, system_costs
from .engine import Engine, SimJobs, SimTimeline, TrainerSpec
from .mechanisms import SimMechanisms, tail_summary
from .policies import SystemSpec, system_spec
from .predictions import Predictions, epoch_split
from .trainer import micro_batch_table, resolve_micro_batching

log = logging.getLogger(__name__)
TIMELINE_AUTO_LIMIT = 50_000
GANTT_SAMPLES = 20_000


@dataclass
class SimResult:
    name: str
    spec: SystemSpec
    costs: SimCosts
    timeline: SimTimeline
    summary: dict
    preemptions: int
    wall_s: float


def stream_settings(cfg, policy: str) -> dict:
    """The simulated trainer's streaming (``TrainerSpec`` keys) for a system dispatching with
    ``policy``: ``sim.stream_groups`` (every streaming system) with its start rule, else
    ``pipeline.stream_groups`` as ``asp train`` resolves it (``auto``: asp's; ``config.stream_groups_of``)
    with its own."""
    if cfg.sim.stream_groups:
        return {"stream_groups": True, "stream_start": str(cfg.sim.stream_groups_start)}
    return {"stream_groups": stream_groups_of(cfg, policy), "stream_start": str(cfg.pipeline.stream_groups_start)}


def build_jobs(workload, cfg, spec: SystemSpec, cm, preds: Predictions | None = None, *, tail="off",
               speculation=None) -> SimJobs:
    """Plan every simulated epoch with the spec's dispatch policy; attach true lengths.
    ``tail`` (``rollout.tail_concurrency``, asp only) gives each group its planned room."""
    from ..scheduler.planner import plan
    from ..scheduler.group_max import group_max_factor

    preds = preds or Predictions(workload, cfg)
    hist, sim = epoch_split(workload, cfg.sim.epochs)
    t = cfg.train
    frames, resp = [], []
    offset = 0
    index = pd.Index(workload.prompt_ids)
    for k, we in enumerate(sim):
        h = tuple(hist + (sim[:k] if spec.adaptive else []))
        pred = preds.predict(h, we)
        sched = plan(workload.prompt_ids, pred, workload.prompt_length, policy=spec.dispatch,
                     group_size=workload.group_size, global_batch_size=t.global_batch_size,
                     mini_batch_size=t.mini_batch_size, num_instances=spec.num_instances,
                     max_num_seqs=spec.max_num_seqs, lag_bound=spec.lag_bound, cost=cm, epoch=k,
                     iteration_offset=offset, seed=cfg.seed, tail=tail if spec.dispatch == "asp" else "off",
                     group_max_factor=group_max_factor(workload.group_spread, workload.group_size),
                     speculation=speculation, max_response_length=cfg.lengths.max_response_length,
                     forecasts=preds.forecasts(h, we) if reads_forecasts(cfg) else None,
                     **membership_options(cfg))
        rows = index.get_indexer(sched["prompt_id"].astype(str))
        if (rows < 0).any():
            raise RuntimeError("planner returned prompt ids outside the workload; this is a bug")
        frames.append(sched.assign(_row=rows))
        resp.append(workload.samples(we)[rows])
        offset = int(sched["iteration"].max()) + 1
    s = pd.concat(frames, ignore_index=True)
    return SimJobs(epoch=s["epoch"].to_numpy(np.int64), prompt_id=s["prompt_id"].astype(str).to_numpy(object),
                   iteration=s["iteration"].to_numpy(np.int64), mini_batch=s["mini_batch"].to_numpy(np.int64),
                   instance=s["instance"].to_numpy(np.int64), dispatch_rank=s["dispatch_rank"].to_numpy(np.int64),
                   prompt_length=workload.prompt_length[s["_row"].to_numpy()].astype(np.int64),
                   resp=np.concatenate(resp, axis=0).astype(np.int64),
                   predicted_length=s["predicted_length"].to_numpy(float),
                   room=s["room"].to_numpy(np.int64) if "room" in s else None)


def system_for(cfg, name: str, total_devices: int | None = None, rollout_devices: int | None = None) -> SystemSpec:
    s = cfg.sim
    return system_spec(name, total_devices=total_devices or s.total_devices,
                       rollout_devices=rollout_devices or s.rollout_devices, infer_tp=s.infer_tp,
                       lag_bound=cfg.pipeline.lag_bound, max_num_seqs=cfg.rollout.max_num_seqs)


def costs_for(cfg, spec: SystemSpec) -> SimCosts:
    """System ``spec``'s costs; its instances prefix-cache (``rollout.prefix_caching``) as vLLM does."""
    c = system_costs(cfg.cost, cfg.sim, tp=spec.tp, train_devices=spec.train_devices,
                     kv_cache_tokens=cfg.rollout.kv_cache_tokens, colocated=spec.colocated,
                     logprob_passes=cfg.sim.logprob_passes)
    return replace(c, instance=replace(c.instance, prefix_block=prefix_block_of(cfg)))


@dataclass(frozen=True)
class Mismatch:
    """Execute with other costs than the plan assumed (robustness, DESIGN 9 / issue grid):
    the true decode coefficients are the planned ones times ``decode_a``/``decode_b``/``decode_c``,
    and the instances run ``concurrency`` times the planned ``max_num_seqs``."""
    decode_a: float = 1.0
    decode_b: float = 1.0
    decode_c: float = 1.0
    concurrency: float = 1.0

    def cost(self, cm):
        return cm.with_decode(cm.decode_a * self.decode_a, cm.decode_b * self.decode_b, cm.decode_c * self.decode_c)


def planning_cost(costs: SimCosts):
    """The planner's cost model: the instance's decode model with the simulated trainer's costs."""
    from dataclasses import replace

    return replace(costs.instance, train_per_token=costs.train_per_token, logprob_per_token=0.0,
                   train_per_step=costs.train_per_step, sync_s=costs.sync_s)


def with_admission_concurrency(cfg, spec: SystemSpec, costs: SimCosts, workload, preds: Predictions) -> SystemSpec:
    """``spec`` with asp's admission concurrency (``scheduler.concurrency: auto``,
    scheduler/concurrency.py): the planner's choice from the first simulated epoch's predictions,
    as ``asp schedule`` makes it; other systems (and ``full``) keep ``rollout.max_num_seqs``."""
    from ..scheduler.concurrency import configured_concurrency
    from ..scheduler.group_max import group_max_factor

    if spec.dispatch != "asp" or cfg.scheduler.concurrency != "auto":
        return spec
    hist, sim = epoch_split(workload, cfg.sim.epochs)
    n = configured_concurrency(cfg, preds.predict(tuple(hist), sim[0]), workload.prompt_length,
                               group_size=workload.group_size, num_instances=spec.num_instances,
                               max_num_seqs=spec.max_num_seqs, lag_bound=spec.lag_bound, cost=planning_cost(costs),
                               group_max_factor=group_max_factor(workload.group_spread, workload.group_size),
                               packed=system_micro_batching(cfg, spec) == "packed")
    return replace(spec, max_num_seqs=n)


def system_micro_batching(cfg, spec: SystemSpec) -> str:
    """How system ``spec``'s trainer cuts micro-batches: what the run's ``train.micro_batching``
    resolves to (``sim.micro_batching``), except ``sync_colocated`` with
    ``sim.colocated_micro_batching`` set (the MindSpeed-RL baseline as it ships)."""
    own = resolve_micro_batching(cfg.sim.micro_batching, cfg.train.micro_batching)
    if spec.colocated and cfg.sim.colocated_micro_batching != "auto":
        return cfg.sim.colocated_micro_batching
    return own


def mechanisms_for(cfg, spec: SystemSpec, costs: SimCosts, workload) -> SimMechanisms:
    """The tail mechanisms (DESIGN 9) that system ``spec`` runs with under ``cfg``: tail rooms and
    guided dispatch for per-instance schedules (asp; balanced gets guided dispatch too), carry-over
    for asp_partial or any streaming system with ``rollout.partial_rollout``, regroup for the
    streaming systems ``pipeline.regroup`` names (``auto``: asp's; ``config.regroup_of``) and with it
    ``pipeline.regroup_heavy`` (``auto``: wherever regroup is; ``config.regroup_heavy_of``), speculative
    decoding on every system's instances (equal engine features)."""
    from ..scheduler.speculative import from_config

    per_instance = spec.dispatch in ("asp", "balanced")
    guided = per_instance and cfg.scheduler.dispatch == "guided"
    partial = (spec.partial or cfg.rollout.partial_rollout) and spec.stream_train and not spec.colocated
    # regroup acts where a step may start before its iteration is generated (a streaming trainer)
    regroup = regroup_of(cfg, spec.dispatch) and spec.stream_train and not spec.colocated
    ctx = float(np.mean(workload.prompt_length)) + float(np.mean(workload.samples(workload.epochs - 1))) / 2.0
    # carry-over decides lateness from re-estimated remaining lengths: it always re-estimates
    return SimMechanisms(reestimate=(bool(cfg.scheduler.reestimate) and guided) or partial,
                         tail_concurrency=str(cfg.rollout.tail_concurrency) if spec.dispatch == "asp" else "off",
                         partial_rollout=partial, max_split=int(cfg.rollout.max_split),
                         speculation=from_config(cfg.rollout, cfg.cost, costs.instance, ctx),
                         max_tokens=int(cfg.lengths.max_response_length), regroup=regroup,
                         regroup_heavy=regroup and regroup_heavy_of(cfg, spec.dispatch))


def simulate_system(cfg, workload, name: str, *, total_devices: int | None = None,
                    rollout_devices: int | None = None, record_samples: bool | None = None,
                    preds: Predictions | None = None, mismatch: Mismatch | None = None,
                    fast_path: bool = True) -> SimResult:
    """Simulate system policy ``name`` on ``workload`` (DESIGN 6 summary entry + timeline);
    ``mismatch``: the instances' true costs differ from the planned ones; ``fast_path=False``
    runs a system without tail mechanisms through the general admission path (same results).

    The cyclic garbage collector pauses meanwhile: a run allocates millions of small objects
    (jobs, events, heap entries) that live until its end and form no cycles to speak of; the
    collector's passes over them took about 6 % of ``asp_partial``'s time at 100k prompts
    (docs/simulator.md, "Performance"). It resumes once the run's objects are released."""
    collect = gc.isenabled()
    gc.disable()
    try:
        return _simulate(cfg, workload, name, total_devices=total_devices, rollout_devices=rollout_devices,
                         record_samples=record_samples, preds=preds, mismatch=mismatch, fast_path=fast_path)
    finally:
        if collect:
            gc.enable()


def _planned(cfg, workload, spec: SystemSpec, preds: Predictions):
    """(spec with asp's admission concurrency, costs, mechanisms, planned jobs) of a run."""
    costs = costs_for(cfg, spec)
    check_kv_capacity(cfg, costs.kv_capacity, workload.prompt_length)
    spec = with_admission_concurrency(cfg, spec, costs, workload, preds)
    mech = mechanisms_for(cfg, spec, costs, workload)
    jobs = build_jobs(workload, cfg, spec, planning_cost(costs), preds, tail=mech.tail_concurrency,
                      speculation=mech.speculation)
    return spec, costs, mech, jobs


def planned_tail_models(cfg, workload, name: str = "asp", *, total_devices: int | None = None,
                        rollout_devices: int | None = None) -> list:
    """Per simulated epoch, the ``TailModel`` system ``name``'s planner (asp) sizes tail rooms with
    (``scheduler.planner.plan_tail_model``), on the schedule, predictions and costs
    ``simulate_system`` plans that run with: what ``rollout.tail_concurrency: auto`` predicts."""
    from ..scheduler.planner import plan_tail_model
    from ..scheduler.group_max import group_max_factor

    preds = Predictions(workload, cfg)
    spec, costs, mech, jobs = _planned(cfg, workload, system_for(cfg, name, total_devices, rollout_devices), preds)
    hist, sim = epoch_split(workload, cfg.sim.epochs)
    index, models = pd.Index(workload.prompt_ids), []
    for k, we in enumerate(sim):
        on = jobs.epoch == k
        pred = preds.predict(tuple(hist + (sim[:k] if spec.adaptive else [])), we)
        rows = index.get_indexer(jobs.prompt_id[on])
        models.append(plan_tail_model(
            jobs.iteration[on], pred[rows], workload.prompt_length[rows],
            group_size=workload.group_size, mini_batch_size=cfg.train.mini_batch_size,
            num_instances=spec.num_instances, max_num_seqs=spec.max_num_seqs, lag_bound=spec.lag_bound,
            cost=planning_cost(costs), group_max_factor=group_max_factor(workload.group_spread, workload.group_size),
            speculation=mech.speculation, max_response_length=cfg.lengths.max_response_length))
    return models


def _simulate(cfg, workload, name: str, *, total_devices, rollout_devices, record_samples, preds, mismatch,
              fast_path) -> SimResult:
    t0 = time.perf_counter()
    spec = system_for(cfg, name, total_devices, rollout_devices)
    engine_seqs = spec.max_num_seqs            # what the engine could run (the lower bound's peak)
    spec, costs, mech, jobs = _planned(cfg, workload, spec, preds or Predictions(workload, cfg))
    if record_samples is None:
        record_samples = jobs.resp.size <= TIMELINE_AUTO_LIMIT
    tr = TrainerSpec(costs.train_per_token, costs.train_per_step, costs.sync_s, cfg.train.micro_batch_size,
                     system_micro_batching(cfg, spec), costs.switch_s, publish_s=costs.publish_s,
                     step_latency_s=costs.step_latency_s, admit_latency_s=costs.admit_latency_s,
                     sync_busy_s=costs.sync_busy_s, admit_each_s=costs.admit_each_s,
                     admit_engine_s=costs.admit_engine_s,
                     max_tokens_per_micro_batch=int(cfg.train.max_tokens_per_micro_batch),
                     **stream_settings(cfg, spec.dispatch))
    settings = spec.execution(jobs.group_size, dispatch=cfg.scheduler.dispatch)
    true_cm = costs.instance
    if mismatch is not None:
        true_cm = mismatch.cost(costs.instance)
        # the engine runs concurrency x what was planned; asp's admission cap (the dispatcher's) stays
        admitted = spec.max_num_seqs if spec.max_num_seqs < engine_seqs else None
        engine_seqs = max(1, int(round(engine_seqs * mismatch.concurrency)))
        settings = replace(settings, max_num_seqs=min(engine_seqs, admitted or engine_seqs),
                           planned_max_num_seqs=spec.max_num_seqs)
    eng = Engine(jobs, settings, cost=true_cm, kv_capacity=costs.kv_capacity, trainer=tr,
                 stream_train=spec.stream_train, barrier=spec.barrier,
                 sync_pause=cfg.sim.rollout_sync_pause and not spec.colocated, record_samples=record_samples,
                 mechanisms=mech, fast_path=fast_path, batched_tokens=cfg.rollout.max_num_batched_tokens or 0)
    tl = eng.run()
    mbt = micro_batch_table(jobs, tr.micro_batch_size, tr.micro_batching, tr.max_tokens_per_micro_batch,
                            per_group=tr.stream_groups and spec.stream_train)
    lb = lower_bounds(jobs, mbt, tr.train_per_token, tr.train_per_step, true_cm, spec.num_instances,
                      max(engine_seqs, settings.max_num_seqs), costs.kv_capacity, spec.lag_bound, tr.micro_batching)
    lag_bound = spec.lag_bound + (mech.max_split if mech.partial_rollout else 0)
    summ = summarize(tl, num_instances=spec.num_instances, max_num_seqs=settings.max_num_seqs,
                     lag_bound=lag_bound, lower_bounds=lb)
    summ["devices"] = spec.devices
    summ["throughput_per_device"] = summ["throughput"] / max(1, spec.devices)
    summ["preemptions"] = int(sum(eng.preemptions))
    summ["stolen_groups"] = int(eng.dispatcher.stolen)
    summ["admission_concurrency"] = int(settings.max_num_seqs)
    # every system: the mechanisms' counters (0 when off) and the per-iteration length mix (KS)
    summ.update(tail_summary(tl.frame("request"), np.repeat(jobs.iteration, jobs.group_size),
                             eng.inst.ver_fin, spec.lag_bound, eng.log))
    return SimResult(name, spec, costs, tl, summ, int(sum(eng.preemptions)), time.perf_counter() - t0)


def _setup_entry(res: SimResult) -> dict:
    c = res.costs
    return {"spec": asdict(res.spec), "devices": res.spec.devices,
            "instance_cost": {"decode_a": c.instance.decode_a, "decode_b": c.instance.decode_b,
                              "decode_c": c.instance.decode_c, "prefill_per_token": c.instance.prefill_per_token,
                              "prefix_block": c.instance.prefix_block},
            "kv_capacity_tokens": c.kv_capacity, "train_per_token": c.train_per_token,
            "train_per_step": c.train_per_step, "sync_s": c.sync_s, "switch_s": c.switch_s,
            "publish_s": c.publish_s, "step_latency_s": c.step_latency_s, "admit_latency_s": c.admit_latency_s,
            "sync_busy_s": c.sync_busy_s, "admit_each_s": c.admit_each_s,
            "admit_engine_s": c.admit_engine_s, "preemptions": res.preemptions,
            "wall_s": res.wall_s}


def run_points(cfg, workload, names, out: Path, *, total_devices=None, rollout_devices=None,
               write_timelines: bool = True, echo=print) -> dict:
    """Simulate ``names``; write summary.json + simulation.json (+ timelines) into ``out``."""
    from ..io import write_json_atomic
    from ..report.decisions import decisions_title, tail_decisions

    preds = Predictions(workload, cfg)
    summary, setup, views = {}, {}, {}
    mode = cfg.sim.write_timeline
    hist, sim = epoch_split(workload, cfg.sim.epochs)
    n = workload.num_prompts * workload.group_size * len(sim)
    write = write_timelines and (mode == "always" or (mode == "auto" and n <= TIMELINE_AUTO_LIMIT))
    for name in names:
        res = simulate_system(cfg, workload, name, total_devices=total_devices, rollout_devices=rollout_devices,
                              preds=preds, record_samples=write)
        summary[name] = res.summary
        setup[name] = _setup_entry(res)
        if write:
            res.timeline.write_jsonl(out / f"timeline_{name}.jsonl")
        req = res.timeline.frame("request")
        views[name] = {"queue": res.timeline.frame("queue"), "sync": res.timeline.frame("sync"),
                       "request": req.nsmallest(GANTT_SAMPLES, "t_admit") if len(req) > GANTT_SAMPLES else req,
                       "decisions": tail_decisions(res.timeline, decisions_title(name)) if write else []}
        s = res.summary
        echo(f"  {name:18s} devices={res.spec.devices:4d} R={res.spec.num_instances:3d} "
             f"throughput={s['throughput']:10.1f} tok/s  iter={s['iteration_time_mean']:8.1f}s  "
             f"pad={s['padding_bubble']:.3f} skew={s['skew_bubble']:.3f} sort={s['sorting_bubble']:.3f}  "
             f"LB-ratio={s['lower_bound_ratio']:.2f} lag<={s['policy_lag_max']}  ({res.wall_s:.1f}s)")
    write_json_atomic(out / "summary.json", summary)
    write_json_atomic(out / "simulation.json", {"total_devices": total_devices or cfg.sim.total_devices,
                                                "rollout_devices": rollout_devices or cfg.sim.rollout_devices,
                                                "workload": _workload_stats(workload, cfg), "systems": setup})
    return views


def _workload_stats(w, cfg) -> dict:
    hist, sim = epoch_split(w, cfg.sim.epochs)
    L = np.concatenate([w.samples(e).reshape(-1) for e in sim])
    return {"name": w.name, "prompts": int(w.num_prompts), "group_size": int(w.group_size),
            "history_epochs": hist, "simulated_epochs": sim,
            "response_length": {"mean": float(L.mean()), "p50": float(np.percentile(L, 50)),
                                "p90": float(np.percentile(L, 90)), "p99": float(np.percentile(L, 99)),
                                "max": int(L.max())},
            "prompt_length_mean": float(np.mean(w.prompt_length))}


def sweep_split(cfg, D: int) -> int:
    """Rollout devices at ``D`` total: the configured share, a multiple of infer_tp, >= 1 instance."""
    s = cfg.sim
    share = s.rollout_devices / s.total_devices
    tp = s.infer_tp
    Dr = int(round(D * share / tp)) * tp
    return min(max(tp, Dr), D - 1)


def apply_calibration(cfg, fit: dict):
    """A copy of ``cfg`` simulating with fitted coefficients (``sim.model_class=custom``)."""
    cfg = copy.deepcopy(cfg)
    for k in ("decode_a", "decode_b", "decode_c", "prefill_per_token", "train_per_token", "train_per_step", "sync_s",
              "sync_busy_s", "publish_s", "step_latency_s", "admit_latency_s", "admit_each_s", "admit_engine_s"):
        if fit.get(k) is not None:
            setattr(cfg.cost, k, float(fit[k]))
    cfg.cost.logprob_per_token = 0.0    # the fitted trainer cost already includes the log-prob passes
    cfg.sim.model_class = "custom"
    return cfg


def own_system(cfg, names: list[str]) -> list[str]:
    """The config's own system (pipeline.mode, scheduler.policy, scheduler.adaptive as
    ``asp train`` would run it, ``config.system_policy_name``) when sim.policies lacks it, so a
    run and its simulation share a summary key."""
    from ..config import system_policy_name

    own = system_policy_name(cfg.pipeline.mode, cfg.scheduler.policy, cfg.scheduler.adaptive)
    if own is None:
        print(f"asp simulate: note: pipeline.mode={cfg.pipeline.mode} with scheduler.policy={cfg.scheduler.policy} "
              "has no simulated counterpart (a sync run trains whole iterations at k = 0 on separate devices); "
              "sync_colocated is the closest")
        return []
    if own in names:
        return []
    print(f"asp simulate: also simulating {own} (pipeline.mode={cfg.pipeline.mode}, scheduler.policy="
          f"{cfg.scheduler.policy}, scheduler.adaptive={cfg.scheduler.adaptive}: what `asp train` runs)")
    return [own]


def run_simulate(cfg, count=None) -> int:
    """Entry point of ``asp simulate`` (see module doc). ``count``: how the prompts of ``data.path`` are
    counted (data/prompt_tokens.py; the CLI loads the run's tokenizer)."""
    from ..config import save_resolved
    from ..io import write_json_atomic
    from ..lengths.workloads import workload_from_config

    from .policies import check_points

    names = list(cfg.sim.policies)
    check_points(cfg, names)  # every key, sweeps included, before any output exists
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    names += own_system(cfg, names)
    if cfg.sim.calibrate:
        from .calibrate import calibrate_run
        from .replay import format_phases, replay_report

        fit = calibrate_run(cfg.sim.calibrate)
        print(f"asp simulate: calibrated from {cfg.sim.calibrate}: " +
              ", ".join(f"{k}={v:.4g}" for k, v in fit.items() if isinstance(v, float)))
        try:  # the check: the run's own jobs re-simulated with the fit, phase by phase
            _, phases, _ = replay_report(cfg.sim.calibrate, fit)
            has_cfg = (Path(cfg.sim.calibrate) / "config.yaml").is_file()
            print("asp simulate: the run's own jobs simulated with the fitted model (replay"
                  + ("" if has_cfg else "; no config.yaml in the run directory: the schema's rollout.max_num_seqs, "
                     "pipeline.lag_bound and train.micro_batch_size assumed") + "):")
            print("\n".join(format_phases(phases)))
            fit["replay"] = {k: {c: (None if pd.isna(v) else float(v)) for c, v in r.items()}
                             for k, r in phases.iterrows()}
        except (AspError, ValueError, RuntimeError, KeyError) as exc:
            print(f"asp simulate: note: could not replay the run with the fitted model ({exc})")
        write_json_atomic(out / "calibration.json", fit)
        cfg = apply_calibration(cfg, fit)
    save_resolved(cfg, out)
    w = workload_from_config(cfg, count)
    t0 = time.perf_counter()
    print(f"asp simulate: {w.name}, {w.num_prompts} prompts x G={w.group_size}, {cfg.sim.epochs} epoch(s), "
          f"{cfg.sim.total_devices} devices ({cfg.sim.rollout_devices} rollout when decoupled), model {cfg.sim.model_class}")
    hist, _ = epoch_split(w, cfg.sim.epochs)
    if not hist and cfg.lengths.predictor != "oracle":
        print("asp simulate: note: no history epochs (workload.epochs <= sim.epochs), so every prediction is the "
              "prior; raise workload.epochs to give the planner a length history")
    views = run_points(cfg, w, names, out)
    for D in cfg.sim.sweep_devices:
        D = int(D)
        Dr = sweep_split(cfg, D)
        pt = out / "sweep" / f"devices_{D}"
        pt.mkdir(parents=True, exist_ok=True)
        print(f"sweep: {D} devices ({Dr} rollout)")
        sweep_names = names + (["single_instance"] if "single_instance" not in names else [])
        run_points(cfg, w, sweep_names, pt, total_devices=D, rollout_devices=Dr, write_timelines=False)
    decoupled = [n for n in names if n != "sync_colocated"]
    for Dr in cfg.sim.sweep_rollout_devices:
        Dr = int(Dr)
        pt = out / "split" / f"rollout_{Dr}"
        pt.mkdir(parents=True, exist_ok=True)
        print(f"split: {Dr} of {cfg.sim.total_devices} devices for rollout")
        run_points(cfg, w, decoupled, pt, rollout_devices=Dr, write_timelines=False)
    from ..report.sim_report import write_sim_report

    write_sim_report(out, views)
    print(f"asp simulate: wrote {out}/summary.json, report.md and plots in {time.perf_counter() - t0:.1f}s")
    return 0
