"""The tail mechanisms (DESIGN 9) in the simulator: ablation, robustness, the seed comparison.

    python benchmarks/bench_tail.py ablation   [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--set scheduler.concentrate_tail=0.02 ...]
    python benchmarks/bench_tail.py robustness [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--set pipeline.regroup=off] [--cells 'a, b, c x10' ...] [--floor | --chain]
    python benchmarks/bench_tail.py seed       [--devices 128] [--set pipeline.regroup_heavy=off]
    python benchmarks/bench_tail.py breakdown  [--devices 128] [--per-iteration] [--plan-seeds 0 1 2]
    python benchmarks/bench_tail.py speed      [--prompts 100000] [--policies asp asp_partial ...] [--set KEY=VALUE ...]
    python benchmarks/bench_tail.py admission  [--devices 32 64] [--prompts N]
    python benchmarks/bench_tail.py reestimate [--data DIR] [--prompts N] [--devices 32 64]
    python benchmarks/bench_tail.py bound      [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2] [--set ...]
    python benchmarks/bench_tail.py sweep      [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--workloads reasoning ...] [--set KEY=VALUE ...] [--more]

``ablation``: per heavy-tailed workload (reasoning-like synthetic, bimodal synthetic, Azure
code trace x8 and conversation trace x6 from ``--data``, the repository's ../shared/data by
default), 8 rollout instances per 32 devices, G = 8, k = 1, previous-epoch predictions: the
baselines as they ship, then ASP adding one mechanism at a time, then the baselines with the
same engine features (speculative decoding); ``--set KEY=VALUE ...`` adds config overrides on top of
every row (as robustness's: a key a row names is replaced; the baselines ignore asp's keys), e.g.
``scheduler.concentrate_tail=0.02`` to measure a candidate default. ``--plan-seeds S [S ...]`` (ablation and robustness;
default 0): each row simulated with every planner ``seed`` on the same workload (built with seed 0), then
per row the mean and (min .. max) over the seeds of its iteration time and of its "vs fifo"
figure; the rows of systems whose plan draws nothing from the seed (``SEED_FREE``: the shared
FIFO queue and the sorted one) are simulated once. ``robustness``: ASP (every lossless mechanism)
planned on the configured costs and executed on other ones (decode coefficients x0.1 / x10,
half / twice the planned concurrency) against ``fully_async_fifo`` and ``async_balanced``
executed on the same (asp's defaults include regroup and its heaviest-first take since 2026-12-03;
``--set KEY=VALUE ...`` adds overrides to every row, e.g. ``pipeline.regroup=off`` for the earlier
grids, ``pipeline.regroup_heavy=off`` for those of 2026-12-03 before the heaviest-first take), with asp at ``scheduler.concurrency`` full and auto (planned on the configured
costs, so auto's cap is chosen from the planned, not the true, costs) and asp with
``rollout.tail_concurrency=auto`` beside it; one grid per ``--devices``. With more than one
``--plan-seeds``: asp's defaults and balanced per seed, fifo once (``SEED_FREE``), then per cell
the mean and (min .. max) over the seeds of asp against fifo and against balanced, and per device
count the cells where asp is strictly ahead of fifo (below -0.0 % as printed) on the mean, for
every seed, and for some seeds only. ``--cells LABEL ...`` (robustness, reestimate): only those rows
of the grid (labels as printed). ``robustness --floor``: instead of the grid, per cell asp's defaults
and balanced beside their lag floor, breakdown's terms (below) priced on the cell's true costs, each
the mean over the planner seeds. ``robustness --chain``: instead of the grid, per cell and planner
seed asp's defaults and fifo (run once) beside the publish floor of their own iterations on the
cell's true costs (``metrics/floor.publish_floor``, as ``bound``), how far above it they run, and
that floor over random orders of the same iterations (``publish_floor_orders``; p5 / p50 / p95 and
the share of orders whose floor is below fifo's iteration time). ``seed``: configs/sim_7b.yaml and sim_32b.yaml at 128 devices
(asp as those configs run it: guided dispatch, re-estimation, ``scheduler.concurrency: auto``, and
regroup with its heaviest-first take, ``pipeline.regroup`` and ``pipeline.regroup_heavy: auto``;
``--set KEY=VALUE ...`` adds overrides).
``breakdown``: asp on the same seed setups, where its iterations go beside their lag floor
(``asp_ascend/metrics/floor.py``): over the k + 1 periods from version i - k to version i + 1, the
wait of iteration i's last-finishing (critical) group after the lag bound allowed it, what running
beside other sequences cost it (its latency minus its latency alone), how much shorter alone it is
than the iteration's longest group, and the trainer's time after it; per iteration and averaged
over the steady iterations (from k + 1 on), divided by k + 1 (seconds per iteration), beside DESIGN
5's three bound terms; with several ``--plan-seeds``, one line per seed and their mean. Beside them, per
steady iteration, its last optimizer step (``metrics/floor.last_steps``): how many of the iteration's
groups were not generated when the step before it began: when that is all of the step's own groups
(*forced*), the last step is exactly the groups generated last, and ``pipeline.regroup_heavy``, which
chooses among generated groups, cannot lighten it; the share of forced iterations, and for forced
and other iterations the trainer's time after the last group (per iteration, / (k + 1)), the last
step's seconds and its tokens against the iteration's mean step; and the moves
``pipeline.regroup_heavy`` made in the run (``regrouped_heavy_first``). ``breakdown`` and
``robustness --floor`` average over the steady iterations: a run with none (k + 2 iterations needed;
k = 1, one simulated epoch of 256 prompts an iteration: --prompts 768 or more) prints ``n/a`` there
and, under the table, its iteration count and the size that has one; so does a column with no
iteration of its kind (forced / other).
``speed``: the issue-14 speed target, seconds of ``simulate_system`` per policy (workload
generation and planning included) for 100k prompts x G = 8 on 64 rollout instances (TP 2, 128
rollout of 256 devices) on the reasoning-like workload with every mechanism on (guided dispatch,
re-estimation, tail-aware concurrency, ngram speculative decoding; asp_partial adds carry-over);
target <= 30 s per policy. ``admission``: asp with ``scheduler.concurrency`` full and auto beside
``fully_async_fifo`` on the ablation's workloads and split. ``reestimate``: on every cell of
``robustness``'s grid, asp's defaults (guided dispatch and re-estimation) beside guided dispatch
without re-estimation (``scheduler.reestimate=false``) and ``fully_async_fifo``, then per device
count the cells where turning re-estimation off is ahead / level / behind (0.5 % of iteration
time) and the decision rule of docs/scheduler.md ("Does re-estimation still pay?").
``bound``: how far below ``fully_async_fifo`` any schedule could go, on the ablation's workloads
and split: per workload and device count, fifo as shipped, asp's defaults and fifo with asp's
trainer-side rules (regroup heaviest first, streaming; ``BOUND_ROWS``), means over the planner
seeds, per iteration: the iteration time, the trainer's busy time (optimizer steps plus weight
syncs; with packed micro-batches it prices tokens and steps, so every schedule of the same epoch
has the same), its idle time before its first step (the pipeline fill) and after, DESIGN 5's LB_i
terms (``floor_terms``: decode work, trainer, the longest group alone / (k + 1)), sum LB_i /
iterations and ``lower_bound_ratio``, the publish floor of the run's iterations
(``metrics/floor.publish_floor``: the trainer's busy time and each iteration's longest group alone
within its k + 1 periods together, for the system's iteration membership) / iterations, and the
room each bound leaves below fifo (1 - bound / fifo's iteration time): where it is under the
target's 11 %, no dispatch order or mini-batch choice on that membership reaches the target.
``sweep``: asp's defaults on settings they were not tuned on: per workload and device count, from
the ablation's setup one thing changed at a time (``SWEEP_KEYS``: the synthetic generator's tail,
body and correlations, the within-group spread, epoch correlation and drift, G, k, the generation
cap, the instances' concurrency, the mini-batch count, the predictor, TP; the device count; decode
coefficients x0.1 / x10 known to the planner or not; a 4x slower / faster trainer), asp's defaults
against fifo and balanced as shipped and fifo with asp's trainer-side rules (``SWEEP_ROWS``), mean
(min .. max) over the planner seeds, then the cells where asp is more than 1 % behind fifo or
balanced or the run failed; ``--set KEY=VALUE ...`` adds config overrides on top of every row's, each
cell's own change applied last (it is what the cell varies), e.g. a candidate default for asp. ``sweep
--more``: the same rows and table on a second list of cells instead (``sweep_more_cells``: the model class
and sim_32b.yaml's setup, prompt lengths and their correlation with the response's, a slow weight sync, decoding
through syncs, TP 4, the rollout / trainer split, 64 / 1024 prompts an iteration, two epochs, the ema and
quantile predictors, predictions that carry nothing, G = 16 in one mini-batch, a clipped tail, a scarce KV
cache, prefix caching off, padded micro-batches, every length x0.5 / x2, chunked prefill), so the documented
sweep's cells and numbers stay as they were.
Prints markdown tables (docs/scheduler.md holds a copy).
"""
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
# (rollout.tail_concurrency defaults to off): over planner seeds 0-4 auto is ahead of off on the
# mean only on reasoning-like at 32 devices (0.7 points) and the conversation trace at 64 (1.7),
# each for 4 of 5 seeds, within about half a point elsewhere, and behind by 10.9 points
# (8.3 .. 14.2) on reasoning-like at 64 for every seed (docs/scheduler.md, "The ablation over
# planner seeds 0-4")
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
# (row label, system policy, overrides): one mechanism added at a time
ABLATION = [
    ("fully_async_fifo (as shipped)", "fully_async_fifo", OFF),
    ("async_sorted (as shipped)", "async_sorted", OFF),
    ("async_balanced (as shipped)", "async_balanced", OFF),
    ("asp, static plan (before DESIGN 9)", "asp", OFF),
    ("+ guided dispatch", "asp", {**OFF, "scheduler.dispatch": "guided"}),
    ("+ re-estimation (asp's lossless default before regroup)", "asp", {**OFF, **LOSSLESS}),
    ("+ tail-aware concurrency auto (opt-in)", "asp", {**OFF, **TAIL_AUTO}),
    ("+ admission concurrency auto (scheduler.concurrency)", "asp", {**OFF, **LOSSLESS, **CONC_AUTO}),
    ("+ regroup (asp's lossless default before regroup_heavy)", "asp", {**OFF, **LOSSLESS, **REGROUP}),
    ("fully_async_fifo + regroup", "fully_async_fifo", {**OFF, **REGROUP}),
    ("+ regroup heaviest first (asp's lossless default before streaming)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY}),
    ("+ streaming groups into the trainer (pipeline.stream_groups: asp's lossless default)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM}),
    # the planner relieves the first iteration by default (scheduler.relieve_first, a membership rule:
    # every asp row has it; --set scheduler.relieve_first=0 gives the rows measured before it)
    ("asp's defaults without relieving the first iteration (scheduler.relieve_first=0)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.relieve_first": 0}),
    # and dispatches the run's first iteration ahead of every later one (scheduler.fill_first, a dispatch-rank
    # rule: every asp row has it; --set scheduler.fill_first=false gives the rows measured before it)
    ("asp's defaults pulling later groups into the fill (scheduler.fill_first=false)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.fill_first": "false"}),
    # and pulls a group ahead of its iteration only where its latency exceeds k + 1 periods (scheduler.pull_forward:
    # needed, a dispatch-rank rule: every asp row has it; --set scheduler.pull_forward=rounded gives the rows before it)
    ("asp's defaults pulling every group of half a period or more forward (scheduler.pull_forward=rounded)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.pull_forward": "rounded"}),
    ("+ gathering the longest groups (scheduler.concentrate_tail=0.01, opt-in)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.concentrate_tail": 0.01}),
    ("+ gathering the longest groups (scheduler.concentrate_tail=0.02, opt-in)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.concentrate_tail": 0.02}),
    ("+ reactive tail caps (rollout.tail_concurrency: reactive, opt-in)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, **TAIL_REACTIVE}),
    ("+ both: gathering (0.02) and reactive tail caps (opt-in)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, "scheduler.concentrate_tail": 0.02, **TAIL_REACTIVE}),
    ("fully_async_fifo + regroup heaviest first", "fully_async_fifo", {**OFF, **REGROUP, **HEAVY}),
    ("fully_async_fifo + regroup heaviest first + streaming (asp's trainer-side defaults)", "fully_async_fifo",
     {**OFF, **REGROUP, **HEAVY, "pipeline.stream_groups": "on"}),
    ("asp default + speculative decoding (ngram)", "asp", {**LOSSLESS, **SPEC}),
    ("asp default without regroup heaviest first + speculative", "asp", {**LOSSLESS, **SPEC, **NO_HEAVY}),
    ("fully_async_fifo + speculative", "fully_async_fifo", {**OFF, **SPEC}),
    ("async_sorted + speculative", "async_sorted", {**OFF, **SPEC}),
    ("async_balanced + speculative", "async_balanced", {**OFF, **SPEC}),
    ("asp_partial (S = 1), + speculative", "asp_partial", {**LOSSLESS, **SPEC, "rollout.max_split": 1}),
    ("fully_async_fifo + speculative + partial (S = 1)", "fully_async_fifo",
     {**OFF, **SPEC, "rollout.partial_rollout": "true", "rollout.max_split": 1}),
]


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


def ablation_runs(run, seeds) -> dict:
    """seed_runs over every ABLATION row."""
    return seed_runs(run, seeds, ABLATION)


def _refs(res: dict, over: dict, i: int):
    """Seed ``i``'s fifo and async_sorted summaries with the row's engine features."""
    spec = over.get("rollout.speculative", "none") != "none"
    fifo = res["fully_async_fifo + speculative" if spec else "fully_async_fifo (as shipped)"][i]
    srt = res["async_sorted + speculative" if spec else "async_sorted (as shipped)"][i]
    return fifo, srt


def _vs_fifo(s: dict, fifo: dict) -> float:
    return 100 * (s["iteration_time_mean"] / fifo["iteration_time_mean"] - 1)


ABLATION_HEAD = ("| workload | devices | system | iter. time (s) | vs fifo, equal engine | throughput vs async_sorted "
                 "(equal engine) | KS mean / max | lag max | stolen | capped | deferred | regrouped | wall (s) |")
ABLATION_SEEDS_HEAD = ("| workload | devices | system | iter. time (s), mean (min .. max) | vs fifo, equal engine, "
                       "mean (min .. max) | throughput vs async_sorted (equal engine), mean | KS mean / max, mean | "
                       "lag max, all seeds | stolen, mean | capped, mean | deferred, mean | regrouped, mean | wall (s), all runs |")


def ablation_row(wl: str, D: int, label: str, over: dict, res: dict) -> str:
    """One row of the single-seed table (the first seed of ``res``)."""
    s = res[label][0]
    fifo, srt = _refs(res, over, 0)
    return (f"| {wl} | {D} | {label} | {s['iteration_time_mean']:.1f} | {_vs_fifo(s, fifo):+.1f}% | "
            f"{s['throughput'] / srt['throughput']:.3f} | "
            f"{s.get('length_mix_ks_mean', float('nan')):.3f} / {s.get('length_mix_ks_max', float('nan')):.3f} | "
            f"{s['policy_lag_max']} | {s['stolen_groups']} | {s.get('tail_capped_groups', 0)} | "
            f"{s.get('deferred_groups', 0)} | {s.get('regrouped_groups', 0)} | {s['wall_s']:.1f} |")


def ablation_seeds_row(wl: str, D: int, label: str, name: str, over: dict, res: dict) -> str:
    """One row of the table over seeds: per-seed figures of ``res`` averaged (lag: the maximum);
    a SEED_FREE row says "run once" instead of a range, and its wall time counts once."""
    runs = res[label]
    n = len(runs)

    def mean(f):
        return sum(f(i, s) for i, s in enumerate(runs)) / n

    def spread(xs, fmt, unit=""):
        if name in SEED_FREE:
            return f"{xs[0]:{fmt}}{unit} (run once)"
        return f"{sum(xs) / n:{fmt}}{unit} ({min(xs):{fmt}} .. {max(xs):{fmt}})"

    t = [s["iteration_time_mean"] for s in runs]
    rel = [_vs_fifo(s, _refs(res, over, i)[0]) for i, s in enumerate(runs)]
    nan = float("nan")
    return (f"| {wl} | {D} | {label} | {spread(t, '.1f')} | {spread(rel, '+.1f', '%')} | "
            f"{mean(lambda i, s: s['throughput'] / _refs(res, over, i)[1]['throughput']):.3f} | "
            f"{mean(lambda i, s: s.get('length_mix_ks_mean', nan)):.3f} / "
            f"{mean(lambda i, s: s.get('length_mix_ks_max', nan)):.3f} | "
            f"{max(s['policy_lag_max'] for s in runs)} | {mean(lambda i, s: s['stolen_groups']):.0f} | "
            f"{mean(lambda i, s: s.get('tail_capped_groups', 0)):.0f} | "
            f"{mean(lambda i, s: s.get('deferred_groups', 0)):.0f} | "
            f"{mean(lambda i, s: s.get('regrouped_groups', 0)):.0f} | "
            f"{(runs[0]['wall_s'] if name in SEED_FREE else sum(s['wall_s'] for s in runs)):.1f} |")


def ablation(args) -> None:
    seeds = args.plan_seeds
    if len(seeds) > 1:
        print(f"planner seeds {', '.join(map(str, seeds))} (workload built with seed 0); mean (min .. max) over "
              f"the seeds; {' and '.join(SEED_FREE)} plan nothing at random: run once\n")
    table_head(ABLATION_SEEDS_HEAD if len(seeds) > 1 else ABLATION_HEAD)
    for D, wl, run in plan_seed_cells(args, workloads_outer=True):
        res = ablation_runs(run, seeds)
        for label, name, over in ABLATION:
            print(ablation_seeds_row(wl, D, label, name, over, res) if len(seeds) > 1
                  else ablation_row(wl, D, label, over, res), flush=True)


GRID = [("planned costs", {}), ("decode a x0.1", {"decode_a": 0.1}), ("decode a x10", {"decode_a": 10.0}),
        ("decode b x0.1", {"decode_b": 0.1}), ("decode b x10", {"decode_b": 10.0}),
        ("decode c x0.1", {"decode_c": 0.1}), ("decode c x10", {"decode_c": 10.0}),
        ("a, b, c x0.1", {"decode_a": 0.1, "decode_b": 0.1, "decode_c": 0.1}),
        ("a, b, c x10", {"decode_a": 10.0, "decode_b": 10.0, "decode_c": 10.0}),
        ("half the planned concurrency", {"concurrency": 0.5}), ("twice the planned concurrency", {"concurrency": 2.0})]


def table_head(header: str) -> None:
    """Print a markdown table's header row and its separator, one ``---`` per column of ``header``."""
    print(header)
    print("|" + "---|" * len(header.strip().strip("|").split("|")))


def _grid(args):
    """(devices, workload, grid label, run) for every cell of robustness's grid, devices outermost
    (:func:`_grid_cells` at each of ``args.devices``)."""
    for D in args.devices:
        for wl, label, it in _grid_cells(args, D):
            yield D, wl, label, it


def _grid_cells(args, D: int):
    """(workload, grid label, run) for every cell of robustness's grid at ``D`` devices:
    ``run(policy, overrides, seed=0)`` simulates ``policy`` planned on the configured costs with
    planner ``seed`` and executed on the cell's (plan_seed_cells: the workload built once per
    workload, with seed 0)."""
    from asp_ascend.sim.run import Mismatch

    cells = getattr(args, "cells", None)
    for _, wl, run in plan_seed_cells(argparse.Namespace(**{**vars(args), "devices": [D]})):
        for label, mm in GRID:
            if cells and label not in cells:
                continue

            def cell(name, over, s=0, run=run, m=Mismatch(**mm)):
                return run(name, over, s, m)
            cell.mismatch = Mismatch(**mm)
            cell.run = run
            yield wl, label, cell


# asp's defaults on robustness's grid: guided dispatch, re-estimation, regroup and its heaviest-first
# take, streaming groups into the trainer (pipeline.regroup, pipeline.regroup_heavy and
# pipeline.stream_groups: auto are on for asp, off for the baselines); the grids before 2026-12-03
# ran asp without regroup (--set pipeline.regroup=off), the earlier ones of that day without the
# heaviest-first take (--set pipeline.regroup_heavy=off) or without streaming
# (--set pipeline.stream_groups=off)
ASP_DEFAULTS = {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM}
# robustness over planner seeds: asp's defaults against the two baselines executed on the same costs
ROBUST_ROWS = [("asp", "asp", ASP_DEFAULTS), ("fifo", "fully_async_fifo", OFF),
               ("balanced", "async_balanced", OFF)]


def _pct(x: dict, ref: dict) -> float:
    return 100 * (x["iteration_time_mean"] / ref["iteration_time_mean"] - 1)


def _ahead(v: float) -> bool:
    """Strictly ahead as the tables print it: below -0.0 % at one decimal."""
    return round(v, 1) < 0


def robustness_seeds_row(wl: str, D: int, label: str, res: dict) -> tuple[str, list]:
    """One row of robustness's table over seeds (``res``: seed_runs over ROBUST_ROWS) and asp's
    figure against fifo per seed (%)."""
    def spread(xs, fmt, unit=""):
        return f"{sum(xs) / len(xs):{fmt}}{unit} ({min(xs):{fmt}} .. {max(xs):{fmt}})"

    t = [s["iteration_time_mean"] for s in res["asp"]]
    f = [_pct(a, r) for a, r in zip(res["asp"], res["fifo"])]
    b = [_pct(a, r) for a, r in zip(res["asp"], res["balanced"])]
    return (f"| {wl} | {D} | {label} | {spread(t, '.1f')} | {spread(f, '+.1f', '%')} | {spread(b, '+.1f', '%')} | "
            f"{sum(map(_ahead, f))} of {len(f)} |"), f


def robustness_counts(D: int, seeds: list, cells: list) -> list[str]:
    """The count lines for one device count; ``cells``: (workload, grid label, asp vs fifo per seed)."""
    n = len(cells)
    mean = sum(_ahead(sum(f) / len(f)) for _, _, f in cells)
    every = sum(all(map(_ahead, f)) for _, _, f in cells)
    per = ", ".join(f"seed {s}: {sum(_ahead(f[i]) for _, _, f in cells)}" for i, s in enumerate(seeds))
    some = [f"{wl} / {label} ({' '.join(f'{v:+.1f}' for v in f)})" for wl, label, f in cells
            if any(map(_ahead, f)) and not all(map(_ahead, f))]
    return [f"{D} devices: asp strictly ahead of fifo on the mean over seeds {' '.join(map(str, seeds))} in "
            f"{mean} of {n} cells, for every seed in {every} of {n} ({per})",
            f"{D} devices: ahead for some seeds only ({len(some)}): {'; '.join(some) or 'none'}"]


def robustness_seeds(args) -> None:
    seeds = args.plan_seeds
    print(f"planner seeds {', '.join(map(str, seeds))} (workload built with seed 0); mean (min .. max) over the "
          f"seeds; fully_async_fifo plans nothing at random: run once\n")
    table_head("| workload | devices | true costs (plan: configured) | asp iter. time (s), mean (min .. max) | "
               "asp vs fifo (shared queue), mean (min .. max) | asp vs balanced, mean (min .. max) | "
               "seeds asp ahead of fifo |")
    lines = []
    for D in args.devices:
        cells = []
        for wl, label, it in _grid_cells(args, D):
            row, f = robustness_seeds_row(wl, D, label, seed_runs(it, seeds, ROBUST_ROWS))
            cells.append((wl, label, f))
            print(row, flush=True)
        lines += robustness_counts(D, seeds, cells)
    print()
    for line in lines:
        print(line)


FLOOR_COLUMNS = ("iter. time (s)", "longest alone / (k+1)", "critical group's wait", "beside other sequences",
                 "critical alone - longest alone", "trainer after the last group", "sequences beside the critical group")


def robustness_floor_terms(wl: str, D: int, data, prompts: int, name: str, over: dict, seed: int, mismatch,
                           extra: dict | None = None) -> tuple[list[float | None], str]:
    """(FLOOR_COLUMNS of one robustness run (``name`` planned on the configured costs with planner
    ``seed``, executed on ``mismatch``'s): breakdown's terms over the steady iterations (from k + 1
    on) per iteration (/ (k + 1)), the critical group's solo latency priced on the true costs; "" or
    ``no_steady_why``: the run has no steady iteration and its steady terms are None)."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    w = workload_from_config(_cfg(wl, data, prompts, D, {}))
    cfg = _cfg(wl, data, prompts, D, {**over, **(extra or {}), "seed": seed})
    res = simulate_system(cfg, w, name, record_samples=True, mismatch=mismatch)
    b, _ = floor_terms(res, cfg, mismatch.cost(res.costs.instance))
    m, st = steady_floor(b, cfg.pipeline.lag_bound)
    why = "" if len(m) else no_steady_why(wl, prompts, int(res.summary["iterations"]), cfg)
    return [res.summary["iteration_time_mean"], st["floor"], st["wait"], st["beside"], st["alone"], st["after"],
            st["seqs"]], why


def steady_floor(b, lag_bound: int):
    """(the steady iterations' rows, from k + 1 on; their floor terms per iteration, / (k + 1)) of
    ``floor_terms``'s breakdown ``b``: the longest group alone, the critical group's wait, what
    running beside other sequences added, critical alone - longest alone, the trainer after the
    last group, and the sequences beside the critical group (not divided). Every term is None when
    there is no steady iteration (a mean over none would be nan)."""
    k1 = lag_bound + 1
    m = b[b["iteration"] >= k1]
    if m.empty:
        return m, dict.fromkeys(("floor", "wait", "beside", "alone", "after", "seqs"))
    return m, {"floor": m["floor_group_solo"].mean() / k1, "wait": m["critical_wait"].mean() / k1,
               "beside": (m["critical_latency"] - m["critical_solo"]).mean() / k1,
               "alone": (m["critical_solo"] - m["floor_group_solo"]).mean() / k1, "after": m["after"].mean() / k1,
               "seqs": m["critical_beside"].mean()}


def no_steady_why(wl: str, prompts: int, iterations: int, cfg) -> str:
    """Why a run of ``wl`` at ``prompts`` prompts (config ``cfg``) has no steady iteration (from
    k + 1 on) to average over, and the size that has one: k + 2 iterations over ``sim.epochs``
    epochs of ``train.global_batch_size`` prompts an iteration (printed by ``print_na_notes``)."""
    k1, gbs, E = cfg.pipeline.lag_bound + 1, cfg.train.global_batch_size, cfg.sim.epochs
    need = gbs * -(-(k1 + 1) // E)
    return (f"{wl} at {prompts} prompts runs {iterations} iteration(s) ({E} epoch(s) of {gbs} prompts an "
            f"iteration); the steady ones start at k + 1 = {k1}: needs --prompts >= {need}")


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


def robustness_floor(args) -> None:
    """Per robustness cell, where asp's and balanced's iterations go beside their lag floor
    (breakdown's terms on the cell's true costs), each the mean over ``--plan-seeds``; ``n/a``, and
    why under the table, where a run has no steady iteration."""
    extra = dict(kv.split("=", 1) for kv in args.set)
    print(f"planner seeds {', '.join(map(str, args.plan_seeds))} (workload built with seed 0); per iteration, "
          f"mean over the seeds and the steady iterations; / (k+1) as in breakdown\n")
    table_head("| workload | devices | true costs (plan: configured) | system | " + " | ".join(FLOOR_COLUMNS)
               + " |")
    notes = []
    for D, wl, label, it in _grid(args):
        for key, name, over in ROBUST_ROWS:
            if key == "fifo":
                continue
            runs = [robustness_floor_terms(wl, D, args.data, args.prompts, name, over, s, it.mismatch, extra)
                    for s in args.plan_seeds]
            notes += [why for _, why in runs]
            r = mean_present([row for row, _ in runs])
            print(f"| {wl} | {D} | {label} | {key} | {na_cells(r[:6])} | {na_cells(r[6:], '.0f')} |", flush=True)
    print_na_notes(notes)


CHAIN_ORDERS = 2000     # random orders of a plan's iterations per run (robustness --chain)


def robustness_chain(args) -> None:
    """Per robustness cell and planner seed: asp's defaults and fifo beside the publish floor of
    their own iterations on the cell's true costs (``metrics/floor.publish_floor``: no dispatch
    order or mini-batch choice on those iterations publishes earlier), and that floor over
    CHAIN_ORDERS random orders of the same iterations (``publish_floor_orders``): what the order
    of the iterations alone decides, and how often an order of them would leave room to beat
    fifo's iteration time."""
    import numpy as np

    from asp_ascend.metrics.floor import publish_floor, publish_floor_orders

    print(f"planner seeds {', '.join(map(str, args.plan_seeds))} (workload built with seed 0); seconds per "
          f"iteration; floors on the cell's true costs; {CHAIN_ORDERS} random orders of each run's iterations "
          f"(numpy seed 0)\n")
    table_head("| workload | devices | true costs (plan: configured) | system | planner seed | iter. time (s) | "
               "vs fifo | publish floor of its iterations (s) | above its floor | floor over random orders of its "
               "iterations: p5 / p50 / p95 (s) | orders whose floor is below fifo's iteration time |")
    for D, wl, label, it in _grid(args):
        fifo = None
        for key, name, over in sorted(ROBUST_ROWS, key=lambda r: r[0] != "fifo"):     # fifo first
            if key == "balanced":
                continue
            for s in (args.plan_seeds[:1] if name in SEED_FREE else args.plan_seeds):
                res, cfg = it.run(name, over, s, it.mismatch, result=True)
                _, _, busy, floor, shortest = chain_inputs(res, cfg, it.mismatch.cost(res.costs.instance))
                n, k = busy.size, cfg.pipeline.lag_bound
                t = res.summary["iteration_time_mean"]
                fifo = fifo or t
                chain = publish_floor(busy, floor, k, shortest)[-1] / n
                rng = np.random.default_rng(0)
                orders = publish_floor_orders(busy, floor, k, (rng.permutation(n) for _ in range(CHAIN_ORDERS)),
                                              shortest) / n
                p5, p50, p95 = np.percentile(orders, [5, 50, 95])
                print(f"| {wl} | {D} | {label} | {key} | {'-' if name in SEED_FREE else s} | {t:.1f} | "
                      f"{100 * (t / fifo - 1):+.1f}% | {chain:.1f} | {100 * (t / chain - 1):+.1f}% | "
                      f"{p5:.1f} / {p50:.1f} / {p95:.1f} | {100 * np.mean(orders < fifo):.0f} % |", flush=True)


def robustness(args) -> None:
    if args.floor:
        return robustness_floor(args)
    if args.chain:
        return robustness_chain(args)
    if len(args.plan_seeds) > 1:
        return robustness_seeds(args)
    table_head("| workload | devices | true costs (plan: configured) | asp iter. time (s) | vs fifo (shared queue) | "
               "vs balanced | asp static plan vs fifo | asp + tail auto vs fifo | asp, concurrency full vs fifo | "
               "asp, concurrency auto vs fifo | auto vs full | auto admits |")
    for D, wl, label, it in _grid(args):
        asp = it("asp", ASP_DEFAULTS)        # asp's defaults (scheduler.concurrency as configured)
        static = it("asp", OFF)
        fifo = it("fully_async_fifo", OFF)
        bal = it("async_balanced", OFF)
        tail = it("asp", {**ASP_DEFAULTS, **TAIL_AUTO})
        full = it("asp", {**ASP_DEFAULTS, **CONC_FULL})
        auto = it("asp", {**ASP_DEFAULTS, **CONC_AUTO})
        a, f = asp["iteration_time_mean"], fifo["iteration_time_mean"]

        def vs(x, ref=f):
            return f"{100 * (x['iteration_time_mean'] / ref - 1):+.1f}%"

        print(f"| {wl} | {D} | {label} | {a:.1f} | {vs(asp)} | {vs(asp, bal['iteration_time_mean'])} | "
              f"{vs(static)} | {vs(tail)} | {vs(full)} | {vs(auto)} | "
              f"{vs(auto, full['iteration_time_mean'])} | {auto['admission_concurrency']} |", flush=True)


LEVEL = 0.5       # % of iteration time: closer than this is level
WORST = 1.0       # %: the most a variant that beats the other may be behind it in any cell


def _beats(d: list, x_fifo: list, y_fifo: list) -> bool:
    """docs/scheduler.md "Does re-estimation still pay?": X beats Y on one device count's cells, where
    d[i] = X / Y - 1 and x_fifo / y_fifo are X's and Y's iteration times vs fifo (all in %)."""
    ahead = sum(v < -LEVEL for v in d)
    behind = sum(v > LEVEL for v in d)
    flips = sum(y < 0 and x > LEVEL for x, y in zip(x_fifo, y_fifo))
    return len(d) - behind >= 2 * len(d) / 3 and ahead > behind and max(d) <= WORST and flips == 0


def reestimate(args) -> None:
    """asp's defaults vs guided dispatch without re-estimation, on robustness's grid."""
    NOREEST = {**OFF, **LOSSLESS, "scheduler.reestimate": "false"}
    table_head("| workload | devices | true costs (plan: configured) | fifo iter. time (s) | asp defaults vs fifo | "
               "no re-estimation vs fifo | no re-estimation vs defaults | steals (defaults / no re-est.) |")
    summary = []
    for D in args.devices:
        d, rd, on_f, off_f = [], [], [], []
        for wl, label, it in _grid_cells(args, D):
            fifo = it("fully_async_fifo", OFF)
            on = it("asp", {**OFF, **LOSSLESS})       # asp's defaults
            off = it("asp", NOREEST)
            f = fifo["iteration_time_mean"]
            pct = [100 * (x["iteration_time_mean"] / ref - 1)
                   for x, ref in ((on, f), (off, f), (off, on["iteration_time_mean"]))]
            on_f.append(pct[0])
            off_f.append(pct[1])
            d.append(pct[2])
            rd.append(100 * (on["iteration_time_mean"] / off["iteration_time_mean"] - 1))
            print(f"| {wl} | {D} | {label} | {f:.1f} | {pct[0]:+.1f}% | {pct[1]:+.1f}% | {pct[2]:+.1f}% | "
                  f"{on['stolen_groups']} / {off['stolen_groups']} |", flush=True)
        ahead, behind = sum(v < -LEVEL for v in d), sum(v > LEVEL for v in d)
        summary.append(
            f"{D} devices, no re-estimation vs defaults: ahead in {ahead}, level in {len(d) - ahead - behind}, "
            f"behind in {behind} of {len(d)} cells (level = within {LEVEL} %), range {min(d):+.1f} % .. "
            f"{max(d):+.1f} %; no re-estimation beats defaults: {_beats(d, off_f, on_f)}; "
            f"defaults beat no re-estimation: {_beats(rd, on_f, off_f)}")
    print()
    for line in summary:
        print(line)


def seed(args) -> None:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import sweep_split

    table_head("| setup | devices | asp vs sync_colocated (throughput) | asp iter. time vs one_step_off | "
               "asp_partial (S = 1) vs sync_colocated | asp_partial lag max | lower-bound ratio asp | "
               "asp admits (sequences per instance) |")
    for model in ("7b", "32b"):
        for D in args.devices:
            base = load_config(ROOT / "configs" / f"sim_{model}.yaml", [])
            Dr = sweep_split(base, D)
            over = [f"sim.total_devices={D}", f"sim.rollout_devices={Dr}",
                    f"workload.num_prompts={args.prompts}"] + [f"{k}={v}" for k, v in LOSSLESS.items()] + args.set
            cfg = load_config(ROOT / "configs" / f"sim_{model}.yaml", over)
            w = workload_from_config(cfg)
            s = {n: _run(cfg, w, n) for n in ("sync_colocated", "one_step_off", "asp", "asp_partial")}
            a = s["asp"]
            print(f"| sim_{model} | {D} | {a['throughput'] / s['sync_colocated']['throughput']:.2f}x | "
                  f"{100 * (a['iteration_time_mean'] / s['one_step_off']['iteration_time_mean'] - 1):+.1f}% | "
                  f"{s['asp_partial']['throughput'] / s['sync_colocated']['throughput']:.2f}x | "
                  f"{s['asp_partial']['policy_lag_max']} | {a['lower_bound_ratio']:.2f} | "
                  f"{a['admission_concurrency']} of {cfg.rollout.max_num_seqs} |", flush=True)


def _seed_cfg(model: str, D: int, prompts: int, over: dict):
    from asp_ascend.config import load_config
    from asp_ascend.sim.run import sweep_split

    path = ROOT / "configs" / f"sim_{model}.yaml"
    Dr = sweep_split(load_config(path, []), D)
    allk = {"sim.total_devices": D, "sim.rollout_devices": Dr, "workload.num_prompts": prompts, **LOSSLESS, **over}
    return load_config(path, [f"{k}={v}" for k, v in allk.items()])


def floor_terms(res, cfg, cost=None):
    """(per-iteration floor breakdown, DESIGN 5's terms per iteration) of a simulated run; beside the
    decode-work and trainer terms, ``shortest``: the iteration's shortest group alone. ``cost``: the
    instances' true cost model where it differs from the planned one (a robustness cell's
    ``Mismatch.cost``), else the run's own."""
    import numpy as np
    import pandas as pd

    from asp_ascend.metrics.floor import floor_breakdown, group_table

    tl, cm = res.timeline, cost or res.costs.instance
    req = tl.frame("request")
    g = group_table(req)
    solo = pd.Series(cm.group_latency_exact(g["prompt_length"].to_numpy(float),
                                            np.array(g["response_lengths"].tolist(), dtype=float)), index=g.index)
    b = floor_breakdown(req, tl.frame("sync"), solo, cfg.pipeline.lag_bound)
    # DESIGN 5's decode-work and trainer terms, as sim/bounds.py computes them
    it = req["iteration"].to_numpy()
    n_it = int(it.max()) + 1
    tok = np.bincount(it, weights=req["response_length"].to_numpy(float), minlength=n_it)
    ctx = np.bincount(it, weights=(req["prompt_length"] + req["response_length"] / 2.0).to_numpy(float),
                      minlength=n_it) / np.maximum(np.bincount(it, minlength=n_it), 1)
    conc = np.full(n_it, float(max(cfg.rollout.max_num_seqs, res.summary["admission_concurrency"])))
    if res.costs.kv_capacity:
        conc = np.maximum(1.0, np.minimum(conc, res.costs.kv_capacity / np.maximum(ctx, 1.0)))
    decode = tok / (res.spec.num_instances * cm.peak_throughput(conc, ctx))
    st = tl.frame("step")
    train = np.bincount(st["iteration"].to_numpy(np.int64), weights=(st["t_end"] - st["t_start"]).to_numpy(float),
                        minlength=n_it)
    shortest = solo.groupby(g["iteration"]).min().reindex(range(n_it)).to_numpy(float)
    return b, pd.DataFrame({"decode": decode, "train": train, "shortest": shortest})


# bound's systems (ABLATION rows): fifo as shipped, asp's defaults, fifo with asp's trainer-side rules
BOUND_ROWS = [r for r in ABLATION if r[0] in (
    "fully_async_fifo (as shipped)", "+ streaming groups into the trainer (pipeline.stream_groups: asp's lossless default)",
    "fully_async_fifo + regroup heaviest first + streaming (asp's trainer-side defaults)")]


def chain_inputs(res, cfg, cost=None):
    """(floor_terms's breakdown and terms, then per iteration of the run the trainer's busy time:
    its optimizer steps plus the weight sync, and its floor: the longest group alone plus that
    sync, and iteration 0's shortest group alone): what ``metrics.floor.publish_floor`` chains.
    ``cost``: the instances' true cost model where it differs from the planned one."""
    b, terms = floor_terms(res, cfg, cost)
    sy, n = res.timeline.frame("sync"), res.summary["iterations"]
    sync = (sy["t_end"] - sy["t_start"]).groupby(sy["version"]).sum().reindex(range(1, n + 1)).to_numpy(float)
    busy = terms["train"].to_numpy()[:n] + sync
    floor = b.set_index("iteration")["floor_group_solo"].reindex(range(n)).to_numpy(float) + sync
    return b, terms, busy, floor, float(terms["shortest"].iloc[0])


def bound_terms(res, cfg) -> dict:
    """Per iteration of one simulated run (seconds): the iteration time; the trainer's busy time
    (its optimizer steps plus the weight syncs: a trainer that never waited would take this), its
    idle time before its first step (the pipeline fill) and after it; the means of the LB_i terms
    (decode work, trainer, the longest group alone / (k + 1); ``floor_terms``) and sum LB_i /
    iterations (the summary's ``lower_bound_ratio``'s denominator); and ``chain``: the last publish
    ``metrics.floor.publish_floor`` allows these iterations / iterations (the trainer's busy time,
    each iteration's longest group alone plus its sync within k + 1 periods, the shortest group of
    iteration 0 alone before the first step)."""
    from asp_ascend.metrics.floor import publish_floor

    b, terms, busy, floor, shortest = chain_inputs(res, cfg)
    tl, sm = res.timeline, res.summary
    st = tl.frame("step")
    n, W = sm["iterations"], sm["run_time_s"]
    first = st["t_first"].fillna(st["t_start"]) if "t_first" in st else st["t_start"]
    fill = float(first.min()) - float(tl.frame("request")["t_admit"].min())
    chain = publish_floor(busy, floor, cfg.pipeline.lag_bound, shortest)[-1]
    return {"time": sm["iteration_time_mean"], "busy": busy.sum() / n, "fill": fill / n,
            "idle": (W - busy.sum() - fill) / n, "decode": float(terms["decode"].mean()),
            "train": float(terms["train"].mean()), "floor": float(b["floor_group_solo"].mean()) / (cfg.pipeline.lag_bound + 1),
            "lb": W / sm["lower_bound_ratio"] / n, "ratio": sm["lower_bound_ratio"], "chain": chain / n}


def bound(args) -> None:
    """How far any schedule could go below fifo (module docstring): per workload and system, the
    trainer's busy time, sum LB_i and the publish floor beside the iteration time, each as room left
    vs fifo."""
    import functools

    import numpy as np

    print(f"planner seeds {', '.join(map(str, args.plan_seeds))}: means over them ({' and '.join(SEED_FREE)} run "
          f"once; the publish floor's room also min .. max); seconds per iteration; room left = 1 - bound / fifo's "
          f"iteration time\n")
    table_head("| workload | devices | system | iter. time (s) | vs fifo | trainer busy: steps + syncs (s) | "
               "trainer idle: fill / after it (s) | LB_i terms: decode work / trainer / longest alone / (k+1) (s) | "
               "sum LB_i / iterations (s) | lower_bound_ratio | publish floor / iterations (s) | "
               "room left vs fifo: trainer busy / sum LB_i / publish floor |")
    for D, wl, run in plan_seed_cells(args, workloads_outer=True):
        res = seed_runs(functools.partial(run, result=True), args.plan_seeds, BOUND_ROWS)
        fifo = None
        for label, name, _over in BOUND_ROWS:
            terms = [bound_terms(*r) for r in res[label]]
            t = {k: float(np.mean([x[k] for x in terms])) for k in terms[0]}
            fifo = fifo or t["time"]
            room = [100 * (1 - x["chain"] / fifo) for x in terms]
            spread = "" if name in SEED_FREE or len(room) == 1 else f" ({min(room):.1f} .. {max(room):.1f})"
            print(f"| {wl} | {D} | {label} | {t['time']:.1f} | {100 * (t['time'] / fifo - 1):+.1f}% | {t['busy']:.1f} | "
                  f"{t['fill']:.1f} / {t['idle']:.1f} | {t['decode']:.1f} / {t['train']:.1f} / {t['floor']:.1f} | "
                  f"{t['lb']:.1f} | {t['ratio']:.3f} | {t['chain']:.1f} | {100 * (1 - t['busy'] / fifo):.1f} % / "
                  f"{100 * (1 - t['lb'] / fifo):.1f} % / {100 * (1 - t['chain'] / fifo):.1f} %{spread} |", flush=True)


def breakdown(args) -> None:
    """asp's iterations beside their lag floor on the seed setups (module docstring); ``n/a``, and why
    under the table, where a run has no steady iteration or no iteration of a kind."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.metrics.floor import last_steps
    from asp_ascend.sim.run import simulate_system

    table_head("| setup | plan seed | iter. time (s) | bound LB_i (s) | floor: longest alone / (k+1) | decode-work term | "
               "trainer term | critical group's wait | beside other sequences | critical alone - longest alone | "
               "trainer after the last group | critical = longest | sequences beside the critical group | "
               "last step forced (its groups = those not generated when the step before began) | "
               "trainer after the last group: forced / other iterations | last step (s): forced / other | "
               "last step's tokens / the iteration's mean step: forced / other | heavy_first moves |")
    notes = []
    for model in ("7b", "32b"):
        for D in args.devices:
            over = dict(kv.split("=", 1) for kv in args.set)
            w = workload_from_config(_seed_cfg(model, D, args.prompts, {**over, "seed": 0}))
            rows = []
            for s in args.plan_seeds:
                cfg = _seed_cfg(model, D, args.prompts, {**over, "seed": s})
                res = simulate_system(cfg, w, "asp", record_samples=False)
                b, terms = floor_terms(res, cfg)
                k1 = cfg.pipeline.lag_bound + 1
                m, st = steady_floor(b, cfg.pipeline.lag_bound)
                sm = res.summary
                if m.empty:     # every column but the run's time, bound and moves is over the steady iterations
                    notes.append(no_steady_why(f"sim_{model}", args.prompts, int(sm["iterations"]), cfg))
                    rows.append([sm["iteration_time_mean"], sm["iteration_time_mean"] / sm["lower_bound_ratio"],
                                 *([None] * 16), sm.get("regrouped_heavy_first", 0)])
                    print(_breakdown_row(f"sim_{model} ({D})", str(s), rows[-1], 0), flush=True)
                    continue
                t = terms.iloc[m["iteration"].to_numpy()]
                ls = last_steps(res.timeline.frame("request"), res.timeline.frame("step"))
                ls = ls[ls["iteration"] >= k1].merge(m[["iteration", "after"]], on="iteration")
                f, o = ls[ls["left_at_last_but_one"] >= ls["last_groups"]], ls[ls["left_at_last_but_one"] < ls["last_groups"]]
                row = [sm["iteration_time_mean"], sm["iteration_time_mean"] / sm["lower_bound_ratio"],
                       st["floor"], t["decode"].mean(), t["train"].mean(), st["wait"], st["beside"], st["alone"],
                       st["after"], m["critical_is_floor_group"].mean(), st["seqs"],
                       len(f) / max(len(ls), 1), *(_mean_or_none(x["after"] / k1) for x in (f, o)),
                       *(_mean_or_none(x[c]) for c in ("last_step_s", "last_tokens_share") for x in (f, o)),
                       sm.get("regrouped_heavy_first", 0)]
                rows.append(row)
                print(_breakdown_row(f"sim_{model} ({D})", str(s), row, len(m)), flush=True)
                if args.per_iteration:
                    print(b.assign(**{c: terms[c].to_numpy()[b["iteration"].to_numpy()] for c in terms})
                          .merge(ls.drop(columns="after"), on="iteration", how="left").round(2).to_string(index=False))
            if len(rows) > 1:
                print(_breakdown_row(f"sim_{model} ({D})", "mean", mean_present(rows), len(m)), flush=True)
    print_na_notes(notes)


def _mean_or_none(x) -> float | None:
    """The mean of ``x``, None when it is empty (no iteration of that kind: ``n/a``, not nan)."""
    return float(x.mean()) if len(x) else None


def _breakdown_row(setup: str, seed: str, r: list, n: int) -> str:
    """One breakdown line from its values (breakdown's order); ``n``: steady iterations per run;
    ``n/a`` for None."""
    return (f"| {setup} | {seed} | {na_cells(r[:9])} | {na(r[9], '.0f', 100)}{' %' * (r[9] is not None)} of {n} | "
            f"{na(r[10])} | {na(r[11], '.0f', 100)}{' %' * (r[11] is not None)} | {na(r[12])} / {na(r[13])} | "
            f"{na(r[14])} / {na(r[15])} | "
            f"{na(r[16], '.2f')} / {na(r[17], '.2f')} | {na(r[18], '.0f')} |")


def admission(args) -> None:
    """asp with scheduler.concurrency full (default) and auto beside fully_async_fifo, per workload
    and device count (lossless defaults otherwise)."""
    from asp_ascend.lengths.workloads import workload_from_config

    table_head("| workload | devices | fully_async_fifo iter. time (s) | asp, full | asp, auto | auto admits | "
               "KS max (auto) |")
    for D in args.devices:
        for wl in args.workloads:
            cfg = _cfg(wl, args.data, args.prompts, D, LOSSLESS)
            w = workload_from_config(cfg)
            fifo = _run(cfg, w, "fully_async_fifo")["iteration_time_mean"]
            full = _run(cfg, w, "asp")["iteration_time_mean"]
            auto = _run(_cfg(wl, args.data, args.prompts, D, {**LOSSLESS, "scheduler.concurrency": "auto"}), w, "asp")
            a = auto["iteration_time_mean"]
            print(f"| {wl} | {D} | {fifo:.1f} | {full:.1f} ({100 * (full / fifo - 1):+.1f}%) | "
                  f"{a:.1f} ({100 * (a / fifo - 1):+.1f}%) | {auto['admission_concurrency']} of "
                  f"{cfg.rollout.max_num_seqs} | {auto['length_mix_ks_max']:.3f} |", flush=True)


SPEED_TARGET_S = 30.0


def speed(args) -> None:
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    D = args.devices[0]
    over = {**LOSSLESS, **SPEC, "rollout.max_split": 1, **dict(kv.split("=", 1) for kv in args.set)}
    cfg = _cfg("reasoning", args.data, args.prompts, D, over)
    t = time.perf_counter()
    w = workload_from_config(cfg)
    print(f"workload: {args.prompts} prompts x {cfg.train.group_size} on {D // 2 // cfg.sim.infer_tp} instances, "
          f"{time.perf_counter() - t:.1f} s to generate")
    table_head("| policy | wall (s) | target (s) | met | iter. time (s) | stolen | capped | deferred |")
    for name in args.policies:
        t = time.perf_counter()
        s = simulate_system(cfg, w, name, record_samples=False).summary
        wall = time.perf_counter() - t
        print(f"| {name} | {wall:.1f} | {SPEED_TARGET_S:.0f} | {'yes' if wall <= SPEED_TARGET_S else 'NO'} | "
              f"{s['iteration_time_mean']:.1f} | {s['stolen_groups']} | {s.get('tail_capped_groups', 0)} | "
              f"{s.get('deferred_groups', 0)} |", flush=True)



# sweep: asp's defaults against the baselines on settings none of them was tuned on (one key at a time
# from each workload's ablation setup); "fifo + rules" is fifo with asp's trainer-side rules (regroup,
# heaviest first, streaming), so "asp vs fifo + rules" is what asp's dispatch adds on top of them
SWEEP_ROWS = [("asp", "asp", ASP_DEFAULTS), ("fifo", "fully_async_fifo", OFF), ("balanced", "async_balanced", OFF),
              ("fifo + rules", "fully_async_fifo", {**OFF, **REGROUP, **HEAVY, "pipeline.stream_groups": "on"})]
# keys of the synthetic generator only (the traces take their lengths from the trace)
SYNTHETIC_ONLY = ("workload.tail_fraction", "workload.tail_alpha", "workload.body_sigma",
                  "workload.prompt_response_correlation")
SWEEP_KEYS = [("workload.tail_fraction", (0.02, 0.3)), ("workload.tail_alpha", (1.1, 3.0)),
              ("workload.body_sigma", (0.2, 1.2)), ("workload.group_spread", (0.05, 0.8)),
              ("workload.epoch_correlation", (0.3, 0.95)), ("workload.drift", (0.1,)),
              ("workload.prompt_response_correlation", (0.8,)), ("train.group_size", (4, 16)),
              ("pipeline.lag_bound", (0, 2, 3)), ("lengths.max_response_length", (4096, 32768)),
              ("rollout.max_num_seqs", (32, 512)), ("train.mini_batch_size", (256, 128, 32, 16)),
              ("lengths.predictor", ("oracle", "regression")), ("sim.infer_tp", (1, 8))]
SWEEP_DECODE = [("a", (1, 0, 0)), ("b", (0, 1, 0)), ("c", (0, 0, 1)), ("a, b, c", (1, 1, 1))]


def custom_costs(cfg, decode=(1.0, 1.0, 1.0), train: float = 1.0) -> dict:
    """``cost.*`` overrides of ``sim.model_class: custom`` that reproduce the costs ``cfg`` simulates
    (its model class at its TP and split), the decode coefficients times ``decode`` (a, b, c) and
    the trainer's per-token cost times ``train``: planner and simulator both see them."""
    from asp_ascend.sim.run import costs_for, system_for

    c = costs_for(cfg, system_for(cfg, "asp"))
    cm = c.instance
    return {"sim.model_class": "custom", "cost.decode_a": cm.decode_a * decode[0],
            "cost.decode_b": cm.decode_b * decode[1], "cost.decode_c": cm.decode_c * decode[2],
            "cost.prefill_per_token": cm.prefill_per_token, "cost.train_per_token": c.train_per_token * train,
            "cost.logprob_per_token": 0.0, "cost.train_per_step": c.train_per_step, "cost.sync_s": c.sync_s,
            "rollout.kv_cache_tokens": c.kv_capacity}


def sweep_cells(wl: str, data: Path, prompts: int, D: int) -> list:
    """(label, overrides, Mismatch or None) of sweep's cells on workload ``wl`` at ``D`` devices: the
    base, then one key at a time (SWEEP_KEYS, the device count, decode and trainer costs): costs x0.1 /
    x10 known to the planner (``custom_costs``) and unknown to it (planned on the model class's,
    executed on the scaled ones: robustness's Mismatch), the trainer 4x slower / faster per token."""
    from asp_ascend.sim.run import Mismatch

    synthetic = WORKLOADS[wl]["workload.type"] == "synthetic"
    out = [("base", {}, None)]
    out += [(f"{k}={v}", {k: v}, None) for k, vs in SWEEP_KEYS if synthetic or k not in SYNTHETIC_ONLY for v in vs]
    out += [(f"devices={n}", {"sim.total_devices": n, "sim.rollout_devices": n // 2}, None) for n in (16, 128)]
    from asp_ascend.config import load_config

    # the setup's costs (no workload key moves them; the traces' paths need not be read here)
    split = {**BASE, "sim.total_devices": D, "sim.rollout_devices": D // 2}
    base = load_config(None, [f"{k}={v}" for k, v in split.items()])
    for name, which in SWEEP_DECODE:
        for f in (0.1, 10.0):
            x = tuple(f if w else 1.0 for w in which)
            out.append((f"decode {name} x{f:g}, planned", custom_costs(base, x), None))
            out.append((f"decode {name} x{f:g}, unplanned", {}, Mismatch(*x)))
    out += [(f"trainer x{f:g} per token", custom_costs(base, train=f), None) for f in (4.0, 0.25)]
    return out


# sweep --more: a second list of settings, none in the documented sweep (SWEEP_KEYS and its cost cells), that an
# independent checker's own configs would plausibly change: the model class and its setup, the prompt lengths and
# their correlation with the response's, the weight sync's cost, the rollout / trainer split and the instances'
# count at a fixed device count, the iteration's size and the epoch count, other predictors and predictions that
# carry no information, G = 16 in one mini-batch, a clipped heavy tail, a scarce KV cache, prefix caching off,
# padded micro-batches, every length x0.5 / x2, chunked prefill. Kept apart so the documented sweep's numbers stay
# reproducible; each cell is (label, overrides), the overrides a function of the workload and the device count.
def sweep_more_cells(wl: str, D: int) -> list:
    """(label, overrides, None) of ``sweep --more``'s cells on workload ``wl`` at ``D`` devices (the base first)."""
    w = WORKLOADS[wl]
    synthetic = w["workload.type"] == "synthetic"
    out = [("base", {})]
    out += [("model 32b (TP 2)", {"sim.model_class": "32b"}),
            ("model 32b, TP 4", {"sim.model_class": "32b", "sim.infer_tp": 4}),
            ("sim_32b.yaml's setup (32b, TP 4, 128 prompts x 4 mini-batches, 128 seqs)",
             {"sim.model_class": "32b", "sim.infer_tp": 4, "train.global_batch_size": 128,
              "train.mini_batch_size": 32, "train.micro_batch_size": 2, "rollout.max_num_seqs": 128})]
    if synthetic:
        out += [("workload.prompt_median=2000", {"workload.prompt_median": 2000}),
                ("workload.prompt_sigma=1.2", {"workload.prompt_sigma": 1.2})]
        out += [(f"workload.prompt_response_correlation={v:g}", {"workload.prompt_response_correlation": v})
                for v in (-0.5, 0.0, 0.95)]
    out += [("weight sync 1 GB/s (15 s)", {"sim.sync_bandwidth_gbps": 1.0}),
            ("instances decode through weight syncs (sim.rollout_sync_pause=false)", {"sim.rollout_sync_pause": "false"}),
            ("sim.infer_tp=4", {"sim.infer_tp": 4}),
            ("rollout 1/4 of the devices", {"sim.rollout_devices": D // 4}),
            ("rollout 3/4 of the devices", {"sim.rollout_devices": 3 * D // 4}),
            ("64 prompts an iteration (64 iterations an epoch)",
             {"train.global_batch_size": 64, "train.mini_batch_size": 16}),
            ("1024 prompts an iteration (4 iterations an epoch)",
             {"train.global_batch_size": 1024, "train.mini_batch_size": 256}),
            ("two simulated epochs", {"sim.epochs": 2, "workload.epochs": 3}),
            ("lengths.predictor=ema over two epochs of history", {"lengths.predictor": "ema", "workload.epochs": 3}),
            ("lengths.predictor=quantile 0.9", {"lengths.predictor": "quantile", "lengths.quantile": 0.9}),
            ("workload.epoch_correlation=0 (predictions carry nothing)", {"workload.epoch_correlation": 0.0}),
            ("G = 16 in one mini-batch", {"train.group_size": 16, "train.mini_batch_size": 256})]
    if synthetic:
        out.append(("heavier tail clipped (tail_alpha 1.1, cap 4096)",
                    {"workload.tail_alpha": 1.1, "lengths.max_response_length": 4096}))
    else:
        out.append(("cap 2048 (the trace's tail clipped)", {"lengths.max_response_length": 2048}))
    out += [("KV cache 200k tokens an instance", {"rollout.kv_cache_tokens": 200000}),
            ("rollout.prefix_caching=false", {"rollout.prefix_caching": "false"}),
            ("padded micro-batches (sim.micro_batching=padded)", {"sim.micro_batching": "padded"})]
    for f in (0.5, 2.0):
        if synthetic:
            o = {"workload.body_median": w["workload.body_median"] * f, "workload.tail_scale": w["workload.tail_scale"] * f}
        else:
            o = {"workload.length_scale": w["workload.length_scale"] * f}
        out.append((f"every length x{f:g}", o))
    out.append(("chunked prefill (rollout.max_num_batched_tokens=8192)", {"rollout.max_num_batched_tokens": 8192}))
    return [(label, o, None) for label, o in out]


def sweep_run(wl: str, data: Path, prompts: int, D: int, cell: dict, mismatch, extra: dict):
    """seed_runs's ``run(policy, overrides, seed)`` for one sweep cell: the row's overrides, then
    ``extra`` (``--set``), then the cell's own change; the workload built once from the cell
    (``result=True``: the SimResult and its config)."""
    from asp_ascend.lengths.workloads import workload_from_config

    w = workload_from_config(_cfg(wl, data, prompts, D, cell))

    def run(name, o, s, result=False):
        return _run(_cfg(wl, data, prompts, D, {**o, **extra, **cell, "seed": s}), w, name, mismatch, result=result)
    return run


def sweep(args) -> None:
    """asp's defaults vs fifo, balanced and fifo + rules on every sweep cell (module docstring)."""
    seeds = args.plan_seeds
    print(f"planner seeds {', '.join(map(str, seeds))} (each cell's workload built with seed 0); mean (min .. max) "
          f"over the seeds; fifo and fifo + rules plan nothing at random: run once\n")
    table_head("| workload | devices | cell | asp iter. time (s) | asp vs fifo | asp vs balanced | asp vs fifo + rules | "
               "asp throughput / fifo's | lag max (asp) |")
    behind = []
    extra = set_overrides(args.set)
    for D in args.devices:
        for wl in args.workloads:
            cells = sweep_more_cells(wl, D) if args.more else sweep_cells(wl, args.data, args.prompts, D)
            for label, over, mm in cells:
                try:
                    res = seed_runs(sweep_run(wl, args.data, args.prompts, D, over, mm, extra), seeds, SWEEP_ROWS)
                except Exception as e:  # a crash or a refused config is a finding of the sweep
                    print(f"| {wl} | {D} | {label} | error: {type(e).__name__}: {str(e).splitlines()[0]} |||||",
                          flush=True)
                    behind.append(f"{wl} / {D} / {label}: error")
                    continue

                def vs(ref):
                    xs = [_pct(a, r) for a, r in zip(res["asp"], res[ref])]
                    return sum(xs) / len(xs), f"{sum(xs) / len(xs):+.1f} % ({min(xs):+.1f} .. {max(xs):+.1f})"

                t = sum(s["iteration_time_mean"] for s in res["asp"]) / len(seeds)
                thr = sum(a["throughput"] / f["throughput"] for a, f in zip(res["asp"], res["fifo"])) / len(seeds)
                (f, fs), (b, bs), (_, rs) = vs("fifo"), vs("balanced"), vs("fifo + rules")
                print(f"| {wl} | {D} | {label} | {t:.1f} | {fs} | {bs} | {rs} | {thr:.3f} | "
                      f"{max(s['policy_lag_max'] for s in res['asp'])} |", flush=True)
                if max(f, b) > SWEEP_BEHIND:
                    behind.append(f"{wl} / {D} / {label}: {f:+.1f} % vs fifo, {b:+.1f} % vs balanced")
    print(f"\ncells where asp is more than {SWEEP_BEHIND:g} % behind fifo or balanced on the mean, or failed "
          f"({len(behind)}): {'; '.join(behind) or 'none'}")


# the subcommands that take --set KEY=VALUE overrides
SET_TAKERS = ("ablation", "bound", "breakdown", "robustness", "seed", "speed", "sweep")
SWEEP_BEHIND = 1.0    # %: a cell where asp's mean iteration time is more than this above fifo's or balanced's

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("ablation", "robustness", "seed", "speed", "admission", "reestimate", "breakdown",
                                     "bound", "sweep"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per epoch (default 4096; speed: 100000)")
    ap.add_argument("--policies", nargs="+", default=["fully_async_fifo", "async_sorted", "asp", "asp_partial"],
                    help="speed: the system policies to time")
    ap.add_argument("--devices", type=int, nargs="+", default=None)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=None,
                    help="ablation, robustness, breakdown: planner seeds, each row simulated with every one (default "
                         "0); with more than one, the mean and (min .. max) over them (breakdown: a line per seed)")
    ap.add_argument("--cells", nargs="+", default=None, choices=[label for label, _ in GRID], metavar="LABEL",
                    help="robustness, reestimate: only these rows of the grid (labels as printed, e.g. "
                         "'a, b, c x10' 'decode b x10'); default all")
    ap.add_argument("--floor", action="store_true",
                    help="robustness: instead of the grid, where asp's and balanced's iterations go beside their lag "
                         "floor in each cell (breakdown's terms on the cell's true costs), mean over --plan-seeds")
    ap.add_argument("--chain", action="store_true",
                    help="robustness: instead of the grid, per cell and planner seed asp's defaults and fifo beside "
                         "the publish floor of their iterations on the cell's true costs, and that floor over random "
                         "orders of the same iterations")
    ap.add_argument("--more", action="store_true",
                    help="sweep: the second list of settings (sweep_more_cells: model class, prompt lengths, weight "
                         "sync, split, iteration size, ...) instead of SWEEP_KEYS and the cost cells")
    ap.add_argument("--per-iteration", action="store_true", help="breakdown: also print every iteration's row")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="breakdown, seed: config overrides on top of the seed setup (e.g. lengths.predictor=oracle, "
                         "pipeline.regroup=off); robustness, ablation, bound: on top of every row (pipeline.regroup=off: "
                         "the grids before asp regrouped; scheduler.concentrate_tail=0.02: a candidate default); "
                         "sweep: on top of every row, under each cell's own change; speed: on top of its setup "
                         "(rollout.tail_concurrency=reactive)")
    args = ap.parse_args(argv)
    if args.plan_seeds is not None and args.what not in ("ablation", "robustness", "breakdown", "bound", "sweep"):
        ap.error(f"--plan-seeds applies to ablation, robustness, breakdown, bound and sweep only, not to {args.what}")
    if args.set and args.what not in SET_TAKERS:
        ap.error(f"--set applies to {', '.join(SET_TAKERS)} only, not to {args.what}")
    if args.floor and args.what != "robustness":
        ap.error(f"--floor applies to robustness only, not to {args.what}")
    if args.chain and (args.what != "robustness" or args.floor):
        ap.error(f"--chain applies to robustness only, without --floor (got {args.what}"
                 f"{' --floor' if args.floor else ''})")
    if args.more and args.what != "sweep":
        ap.error(f"--more applies to sweep only, not to {args.what}")
    if args.cells and args.what not in ("robustness", "reestimate"):
        ap.error(f"--cells applies to robustness and reestimate only, not to {args.what}")
    check_set(ap, args.set, "lengths.predictor=oracle")
    args.plan_seeds = args.plan_seeds or [0]
    if len(set(args.plan_seeds)) != len(args.plan_seeds):
        ap.error(f"--plan-seeds: {' '.join(map(str, args.plan_seeds))} names a seed twice; give each seed once")
    args.devices = args.devices or ([128] if args.what in ("seed", "breakdown") else [256] if args.what == "speed" else [32])
    args.prompts = args.prompts or (100000 if args.what == "speed" else 4096)
    {"ablation": ablation, "robustness": robustness, "seed": seed, "speed": speed,
     "admission": admission, "reestimate": reestimate, "breakdown": breakdown, "bound": bound,
     "sweep": sweep}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
