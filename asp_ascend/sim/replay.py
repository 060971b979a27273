"""Replay a finished run in the simulator and set its phases beside the measured ones.

:func:`replay` simulates the run's own jobs (its prompts, response lengths, iterations,
mini-batches, instances and admission order) with a fitted cost model (:mod:`.calibrate`);
:func:`compare_phases` sets the measured and simulated per-iteration phases side by side.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..metrics.timeline import Timeline
from .calibrate import fit_timeline, run_micro_batching


def replay_jobs(tl: Timeline):
    """The run's own jobs as :class:`~asp_ascend.sim.engine.SimJobs`: one row per prompt group with
    its iteration (from 0), mini-batch (from the step events), instance, response lengths, and
    the order the run admitted them in as ``dispatch_rank``."""
    from .engine import SimJobs

    req = tl.frame("request")
    steps = tl.frame("step")
    mb: dict = {}
    pos: dict = {}
    if not steps.empty and "samples" in steps:
        for m, smp in zip(steps["mini_batch"].astype(int), steps["samples"]):
            for e, p, _ in smp:
                mb[(int(e), str(p))] = m
                pos.setdefault((int(e), str(p)), len(pos))
    req = req.assign(prompt_id=req["prompt_id"].astype(str)).sort_values(["epoch", "prompt_id", "sample"])
    groups = req.groupby(["epoch", "prompt_id"], sort=False)
    sizes = groups.size()
    if sizes.nunique() != 1:
        raise DataError("the timeline's prompt groups have different sizes; replay needs complete groups")
    first = groups.first()
    resp = req["response_length"].to_numpy(np.int64).reshape(len(first), int(sizes.iloc[0]))
    keys = list(first.index)
    it = first["iteration"].to_numpy(np.int64).copy()
    it -= it.min()
    rank = first["t_admit"].rank(method="first").to_numpy(np.int64) - 1
    return SimJobs(epoch=np.array([k[0] for k in keys], np.int64),
                   prompt_id=np.array([k[1] for k in keys], dtype=object), iteration=it,
                   mini_batch=np.array([mb.get((int(k[0]), k[1]), 0) for k in keys], np.int64),
                   instance=first["instance"].to_numpy(np.int64), dispatch_rank=rank,
                   prompt_length=first["prompt_length"].to_numpy(np.int64), resp=resp,
                   train_rank=np.array([pos.get((int(k[0]), k[1]), len(pos) + x) for x, k in enumerate(keys)],
                                       np.int64))


def replay(tl: Timeline, fit: dict, *, max_num_seqs: int, lag_bound: int, sync_mode: bool = False,
           micro_batch_size: int = 8, micro_batching: str = "auto", num_instances: int | None = None,
           overheads: bool = True, kv_capacity: int = 0, group_slots: bool = True):
    """Simulate the run's own jobs (:func:`replay_jobs`) with the fitted coefficients, under the
    runtime's admission rule (``group_slots``: at most ``max_num_seqs // G`` groups in flight per
    instance, a group holding its slot until its last sample finishes). ``micro_batching``: the
    run's ``train.micro_batching``; ``auto`` is what the run's steps show (:func:`run_micro_batching`)."""
    from ..scheduler.cost import CostModel
    from ..scheduler.execution import ExecutionSettings
    from .engine import Engine, TrainerSpec

    jobs = replay_jobs(tl)
    micro_batching = run_micro_batching(tl.frame("step"), micro_batching)
    cm = CostModel(decode_a=fit["decode_a"], decode_b=fit["decode_b"], decode_c=fit["decode_c"],
                   prefill_per_token=fit.get("prefill_per_token") or 0.0)
    o = (lambda k: (fit.get(k) or 0.0) if overheads else 0.0)
    tr = TrainerSpec(fit.get("train_per_token") or 0.0, fit.get("train_per_step") or 0.0, fit.get("sync_s") or 0.0,
                     micro_batch_size, micro_batching,
                     publish_s=fit.get("publish_s") if overheads else None,
                     step_latency_s=o("step_latency_s"), admit_latency_s=o("admit_latency_s"),
                     sync_busy_s=fit.get("sync_busy_s") or 0.0)
    R = max(num_instances or 0, int(jobs.instance.max()) + 1)  # the configured count, or the timeline's if more
    # the run's own placement and admission order: per-instance queues
    settings = ExecutionSettings(policy="asp", lag_bound=0 if sync_mode else lag_bound, sync_mode=sync_mode,
                                 group_size=jobs.group_size, max_num_seqs=max_num_seqs, num_instances=R)
    eng = Engine(jobs, settings, cost=cm, kv_capacity=kv_capacity, trainer=tr, stream_train=not sync_mode,
                 group_slots=group_slots)
    return eng.run()


PHASES = {
    "iteration_time": "time between consecutive weight syncs",
    "generation": "first admission to last finish of the iteration's requests",
    "first_token": "mean first-token latency of a request",
    "train": "first step start to last step end of the iteration",
    "sync": "weight-sync duration",
    "wait": "previous sync end to the iteration's first step start",
}


def iteration_phases(tl: Timeline) -> pd.DataFrame:
    """Per iteration (from 0): the phases of :data:`PHASES`, seconds."""
    req, st, sy = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    it = req.groupby("iteration").agg(adm0=("t_admit", "min"), fin1=("t_finish", "max"))
    ftl = (req["t_first_token"] - req["t_admit"]).groupby(req["iteration"]).mean()
    base = int(it.index.min())
    stp = st.groupby("iteration").agg(s0=("t_start", "min"), s1=("t_end", "max"))
    syn = sy.assign(iteration=sy["version"] - 1).groupby("iteration").agg(y0=("t_start", "min"), y1=("t_end", "max"))
    df = it.join(stp).join(syn).join(ftl.rename("ftl"))
    df.index = df.index - base
    return pd.DataFrame({"iteration_time": df["y1"].diff(), "generation": df["fin1"] - df["adm0"],
                         "first_token": df["ftl"], "train": df["s1"] - df["s0"], "sync": df["y1"] - df["y0"],
                         "wait": df["s0"] - df["y1"].shift(1)})


def compare_phases(measured: Timeline, simulated: Timeline) -> pd.DataFrame:
    """Mean of each phase, measured vs simulated, with the error in % of the measured value.

    ``iteration_time`` is the mean time between consecutive syncs (the run's first iteration,
    which has no previous sync, is not part of it)."""
    m, s = iteration_phases(measured).mean(), iteration_phases(simulated).mean()
    out = pd.DataFrame({"measured_s": m, "simulated_s": s})
    out["error_pct"] = 100 * (out["simulated_s"] - out["measured_s"]) / out["measured_s"].where(out["measured_s"] != 0)
    return out.loc[list(PHASES)]


def run_settings(run_dir: str | Path) -> dict:
    """The replay settings of a run, from its resolved ``config.yaml`` through the schema (the
    schema's defaults when the file is absent; the instance count is then the timeline's)."""
    from ..config import lag_bound_of, run_config

    cfg = run_config(run_dir)
    has_file = (Path(run_dir) / "config.yaml").is_file()
    return {"max_num_seqs": cfg.rollout.max_num_seqs, "lag_bound": lag_bound_of(cfg),
            "sync_mode": cfg.pipeline.mode == "sync", "micro_batch_size": cfg.train.micro_batch_size,
            "micro_batching": cfg.train.micro_batching,
            "num_instances": cfg.rollout.num_instances if has_file else None}


def replay_report(run_dir: str | Path, fit: dict | None = None) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(fit, phases with the overheads, phases without them) for a finished run directory."""
    tl = Timeline.read_jsonl(Path(run_dir) / "timeline.jsonl")
    fit = fit or fit_timeline(tl)
    kw = run_settings(run_dir)
    with_o = compare_phases(tl, replay(tl, fit, **kw))
    without = compare_phases(tl, replay(tl, fit, overheads=False, **kw))
    return fit, with_o, without


def format_phases(df: pd.DataFrame) -> list[str]:
    lines = [f"  {'phase (mean per iteration)':30s} {'measured':>10s} {'simulated':>10s} {'error':>8s}"]
    for name, r in df.iterrows():
        err = "" if pd.isna(r["error_pct"]) else f"{r['error_pct']:+7.1f}%"
        lines.append(f"  {name:30s} {r['measured_s']:9.4f}s {r['simulated_s']:9.4f}s {err:>8s}")
    return lines
