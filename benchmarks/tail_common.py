"""What bench_tail.py's subcommands share (its docstring documents them): the ablation's setup
(BASE, WORKLOADS, the mechanism overrides and asp's defaults), one run's config and summary
(``_cfg``, ``_run``), the workload built once per cell and run per planner seed
(``plan_seed_cells``, ``seed_runs``), ``--set`` and the cell options (``set_overrides``,
``check_set``, ``cell_args``), and the table helpers (``table_head``, ``pct``, the ``n/a`` cells).
The other tail benchmarks (bench_tail_corun.py, bench_slots.py, ...) import these too."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = {"train.group_size": 8, "train.global_batch_size": 256, "train.mini_batch_size": 64,
        "train.micro_batch_size": 4, "rollout.max_num_seqs": 256, "pipeline.lag_bound": 1,
        "sim.model_class": "7b", "sim.total_devices": 32, "sim.rollout_devices": 16, "sim.infer_tp": 2,
        "sim.epochs": 1, "workload.epochs": 2, "lengths.predictor": "mean", "seed": 0}
WORKLOADS = {
    "reasoning": {"workload.type": "synthetic", "lengths.max_response_length": 16384, "workload.body_median": 1200,
                  "workload.body_sigma": 0.6, "workload.tail_fraction": 0.15, "workload.tail_alpha": 1.3,
                  "workload.tail_scale": 3000},
    "bimodal": {"workload.type": "synthetic", "lengths.max_response_length": 8192, "workload.body_median": 300,
                "workload.body_sigma": 0.4, "workload.tail_fraction": 0.3, "workload.tail_alpha": 6.0,
                "workload.tail_scale": 3500},
    "azure_code_x8": {"workload.type": "trace", "workload.trace_path": "{data}/azure_llm_trace_2023_code.csv",
                      "workload.length_scale": 8, "lengths.max_response_length": 16384},
    "azure_conv_x6": {"workload.type": "trace", "workload.trace_path": "{data}/azure_llm_trace_2023_conv.csv",
                      "workload.length_scale": 6, "lengths.max_response_length": 16384},
}
OFF = {"scheduler.dispatch": "static", "scheduler.reestimate": "false", "rollout.tail_concurrency": "off",
       "rollout.speculative": "none", "pipeline.regroup": "off", "pipeline.regroup_heavy": "off",
       "pipeline.stream_groups": "off"}
SPEC = {"rollout.speculative": "ngram"}
# asp's lossless defaults: guided dispatch and re-estimation; tail-aware concurrency is opt-in
# (rollout.tail_concurrency defaults to off): on asp's defaults over planner seeds 0-4, with its rooms
# priced at the sequences an instance runs (0043033), auto caps nothing on three workloads at 32 and 64
# devices and 1-3 groups a run on the conversation trace at 64: level with off everywhere (before it,
# 5.5 % behind on reasoning-like at 64 for every seed; docs/scheduler.md, "Why `auto` lost on
# reasoning-like at 64 devices, and the fix")
LOSSLESS = {"scheduler.dispatch": "guided", "scheduler.reestimate": "true", "rollout.tail_concurrency": "off"}
TAIL_AUTO = {**LOSSLESS, "rollout.tail_concurrency": "auto"}
# the run-time mini-batch fill within an iteration (scheduler/regroup.py), lossless; asp's default
# (pipeline.regroup: auto) since it was ahead of asp's other defaults for every planner seed 0-4 on
# every workload at 32 devices (docs/scheduler.md, "Filling a mini-batch within its iteration");
# OFF pins it off so that the rows measured before it stay reproducible
REGROUP = {"pipeline.regroup": "on"}
# regroup's step takes the heaviest generated groups of its iteration while one is not generated
# (pipeline.regroup_heavy); asp's default (auto: on wherever regroup is) since it was ahead of regroup
# alone for every planner seed 0-4 on every workload, or level (docs/scheduler.md, "Heaviest
# generated groups first"); OFF pins it off, NO_HEAVY turns it off on asp's defaults. auto, not on:
# with regroup on it is on, and --set pipeline.regroup=off turns both off instead of a refused config
HEAVY = {"pipeline.regroup_heavy": "auto"}
NO_HEAVY = {"pipeline.regroup_heavy": "off"}
# the trainer takes the groups of the mini-batch it trains as they are generated
# (pipeline.stream_groups); asp's default (auto: on for asp) since 2026-12-03: on top of asp's other
# defaults it was behind in no robustness cell for any planner seed 0-4 (docs/scheduler.md,
# "Against the seed"); OFF pins it off so that the rows measured before it stay reproducible
STREAM = {"pipeline.stream_groups": "auto"}
# run-time tail caps from re-estimated progress (scheduler/tail_reactive.py, ReactiveCaps); opt-in
TAIL_REACTIVE = {"rollout.tail_concurrency": "reactive"}
# asp's admission concurrency (scheduler/concurrency.py), both modes named explicitly
CONC_FULL = {"scheduler.concurrency": "full"}
CONC_AUTO = {"scheduler.concurrency": "auto"}

# asp's defaults on robustness's grid: guided dispatch, re-estimation, regroup and its heaviest-first
# take, streaming groups into the trainer (pipeline.regroup, pipeline.regroup_heavy and
# pipeline.stream_groups: auto are on for asp, off for the baselines); the grids before 2026-12-03
# ran asp without regroup (--set pipeline.regroup=off), the earlier ones of that day without the
# heaviest-first take (--set pipeline.regroup_heavy=off) or without streaming
# (--set pipeline.stream_groups=off)
ASP_DEFAULTS = {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM}


def _cfg(workload: str, data: Path, prompts: int, devices: int, over: dict):
    from asp_ascend.config import load_config

    w = {k: (v.format(data=data) if isinstance(v, str) else v) for k, v in WORKLOADS[workload].items()}
    split = {"sim.total_devices": devices, "sim.rollout_devices": devices // 2}
    allk = {**BASE, **w, "workload.num_prompts": prompts, **split, **over}
    return load_config(None, [f"{k}={v}" for k, v in allk.items()])


def _run(cfg, w, name, mismatch=None, result=False):
    """The summary of ``name`` simulated on ``w`` (with ``result``: the SimResult and its cfg)."""
    from asp_ascend.sim.run import simulate_system

    t = time.perf_counter()
    res = simulate_system(cfg, w, name, record_samples=False, mismatch=mismatch)
    res.summary["wall_s"] = time.perf_counter() - t
    return (res, cfg) if result else res.summary


def seed_cfg(model: str, D: int, prompts: int, over: dict):
    """The seed setup ``configs/sim_{model}.yaml`` at ``D`` devices (the config's split rule,
    ``sim/run.sweep_split``) with ``prompts`` prompts an epoch and asp's lossless defaults, then
    ``over`` (``seed`` and ``breakdown``)."""
    from asp_ascend.config import load_config
    from asp_ascend.sim.run import sweep_split

    path = ROOT / "configs" / f"sim_{model}.yaml"
    Dr = sweep_split(load_config(path, []), D)
    allk = {"sim.total_devices": D, "sim.rollout_devices": Dr, "workload.num_prompts": prompts, **LOSSLESS, **over}
    return load_config(path, [f"{k}={v}" for k, v in allk.items()])


# system policies whose plan draws nothing from the config's seed (scheduler/planner.py: fifo is
# the dataset order, sorted a stable argsort; balanced orders equal work by a seeded shuffle and
# asp draws throughout); the simulator draws nothing else from it
SEED_FREE = ("fully_async_fifo", "async_sorted")


def set_overrides(kvs) -> dict:
    """``--set KEY=VALUE ...`` as overrides (main refuses an item without ``=``)."""
    return dict(kv.split("=", 1) for kv in kvs)


def check_set(ap, kvs, example: str) -> None:
    """Refuse ``--set`` items without ``=`` (``ap.error`` names them; ``example``: a KEY=VALUE)."""
    bad = [kv for kv in kvs if "=" not in kv]
    if bad:
        ap.error(f"--set: {' '.join(bad)} is not KEY=VALUE (e.g. {example})")


def cell_args(argv, description: str, workloads: str, set_on: str, set_example: str):
    """The command line of a benchmark over device counts, workloads and planner seeds (the options
    plan_seed_cells reads): --data, --prompts (4096), --devices (64), --workloads (``workloads``),
    --plan-seeds (0), --set KEY=VALUE ... (config overrides on top of ``set_on``, e.g.
    ``set_example``; refused without ``=``: check_set)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=[64])
    ap.add_argument("--workloads", nargs="+", default=[workloads], choices=list(WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help=f"config overrides on top of {set_on} (e.g. {set_example})")
    a = ap.parse_args(argv)
    check_set(ap, a.set, set_example)
    return a


def plan_seed_cells(a, workloads_outer: bool = False):
    """(devices, workload, run) per device count and workload of ``a`` (device counts outer unless
    ``workloads_outer``): the workload built once (seed 0: the same prompts, lengths and predictions
    for every seed), ``run(policy, overrides, seed)`` its summary simulated with that planner seed
    (``result=True``: its SimResult and config). ``--set`` applies to the workload's build as well as
    to every run."""
    from asp_ascend.lengths.workloads import workload_from_config

    cells = ([(D, wl) for wl in a.workloads for D in a.devices] if workloads_outer
             else [(D, wl) for D in a.devices for wl in a.workloads])
    extra = set_overrides(getattr(a, "set", []))
    # the workload is built from --set too (workload.*, train.group_size, lengths.* shape it), with
    # seed 0 whatever --set says of the seed
    shape = {k: v for k, v in extra.items() if k != "seed"}
    for D, wl in cells:
        w = workload_from_config(_cfg(wl, a.data, a.prompts, D, shape))

        def run(name, over, s, mismatch=None, result=False, wl=wl, w=w, D=D):
            cfg = _cfg(wl, a.data, a.prompts, D, {**over, **extra, "seed": s})
            return _run(cfg, w, name, mismatch, result=True) if result else _run(cfg, w, name, mismatch)
        yield D, wl, run


def seed_runs(run, seeds, rows) -> dict:
    """{row label: [summary per seed]} for every (label, policy, overrides) of ``rows``, ``run`` as
    plan_seed_cells's; a SEED_FREE row is simulated once (with ``seeds[0]``) and that summary stands
    for every seed."""
    res = {}
    for label, name, over in rows:
        if name in SEED_FREE:
            res[label] = [run(name, over, seeds[0])] * len(seeds)
        else:
            res[label] = [run(name, over, s) for s in seeds]
    return res


def table_head(header: str) -> None:
    """Print a markdown table's header row and its separator, one ``---`` per column of ``header``."""
    print(header)
    print("|" + "---|" * len(header.strip().strip("|").split("|")))


def pct(x: dict, ref: dict) -> float:
    """``x``'s mean iteration time against ``ref``'s, in % (negative: ``x`` is faster)."""
    return 100 * (x["iteration_time_mean"] / ref["iteration_time_mean"] - 1)


def na(x, fmt: str = ".1f", scale: float = 1) -> str:
    """A table cell: ``scale * x`` in ``fmt``, ``n/a`` for None (a figure the run has no steady
    iteration for)."""
    return "n/a" if x is None else format(scale * x, fmt)


def na_cells(xs, fmt: str = ".1f") -> str:
    """Table cells of ``xs`` (``na``)."""
    return " | ".join(na(x, fmt) for x in xs)


def mean_present(rows) -> list[float | None]:
    """Per column, the mean over the rows that have it: not None, not nan (None where none has)."""
    import numpy as np

    cols = [[x for x in col if x is not None and x == x] for col in zip(*rows)]
    return [float(np.mean(v)) if v else None for v in cols]


def print_na_notes(notes) -> None:
    """Under a table: why its ``n/a`` cells have no figure (``no_steady_why``'s lines, each once)."""
    for why in dict.fromkeys(n for n in notes if n):
        print(f"\nn/a: no steady iteration: {why}")
