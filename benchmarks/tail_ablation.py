"""bench_tail.py's comparisons (its docstring documents them): ``ablation`` (ABLATION: the
baselines as they ship, then asp adding one mechanism at a time, then equal engine features),
``admission`` (scheduler.concurrency full and auto), ``seed`` (the seed configs at 128 devices
against sync_colocated and one_step_off) and ``speed`` (the issue-14 speed target)."""
from __future__ import annotations

import time

from tail_common import (HEAVY, LOSSLESS, NO_HEAVY, OFF, REGROUP, SEED_FREE, SPEC, STREAM, TAIL_AUTO, TAIL_REACTIVE,
                         CONC_AUTO, _cfg, _run, pct, plan_seed_cells, seed_cfg, seed_runs, set_overrides, table_head)

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
    # planned tail rooms on asp's defaults (the "+ tail-aware concurrency auto" row above has none of
    # regroup, its heaviest-first take or streaming)
    ("asp's defaults + tail-aware concurrency auto (rollout.tail_concurrency=auto)", "asp",
     {**OFF, **LOSSLESS, **REGROUP, **HEAVY, **STREAM, **TAIL_AUTO}),
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


def ablation_runs(run, seeds) -> dict:
    """seed_runs over every ABLATION row."""
    return seed_runs(run, seeds, ABLATION)

def _refs(res: dict, over: dict, i: int):
    """Seed ``i``'s fifo and async_sorted summaries with the row's engine features."""
    spec = over.get("rollout.speculative", "none") != "none"
    fifo = res["fully_async_fifo + speculative" if spec else "fully_async_fifo (as shipped)"][i]
    srt = res["async_sorted + speculative" if spec else "async_sorted (as shipped)"][i]
    return fifo, srt

ABLATION_HEAD = ("| workload | devices | system | iter. time (s) | vs fifo, equal engine | throughput vs async_sorted "
                 "(equal engine) | KS mean / max | lag max | stolen | capped | deferred | regrouped | wall (s) |")
ABLATION_SEEDS_HEAD = ("| workload | devices | system | iter. time (s), mean (min .. max) | vs fifo, equal engine, "
                       "mean (min .. max) | throughput vs async_sorted (equal engine), mean | KS mean / max, mean | "
                       "lag max, all seeds | stolen, mean | capped, mean | deferred, mean | regrouped, mean | wall (s), all runs |")

def ablation_row(wl: str, D: int, label: str, over: dict, res: dict) -> str:
    """One row of the single-seed table (the first seed of ``res``)."""
    s = res[label][0]
    fifo, srt = _refs(res, over, 0)
    return (f"| {wl} | {D} | {label} | {s['iteration_time_mean']:.1f} | {pct(s, fifo):+.1f}% | "
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
    rel = [pct(s, _refs(res, over, i)[0]) for i, s in enumerate(runs)]
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


def seed(args) -> None:
    from asp_ascend.lengths.workloads import workload_from_config

    table_head("| setup | devices | asp vs sync_colocated (throughput) | asp iter. time vs one_step_off | "
               "asp_partial (S = 1) vs sync_colocated | asp_partial lag max | lower-bound ratio asp | "
               "asp admits (sequences per instance) |")
    for model in ("7b", "32b"):
        for D in args.devices:
            cfg = seed_cfg(model, D, args.prompts, set_overrides(args.set))
            w = workload_from_config(cfg)
            s = {n: _run(cfg, w, n) for n in ("sync_colocated", "one_step_off", "asp", "asp_partial")}
            a = s["asp"]
            print(f"| sim_{model} | {D} | {a['throughput'] / s['sync_colocated']['throughput']:.2f}x | "
                  f"{pct(a, s['one_step_off']):+.1f}% | "
                  f"{s['asp_partial']['throughput'] / s['sync_colocated']['throughput']:.2f}x | "
                  f"{s['asp_partial']['policy_lag_max']} | {a['lower_bound_ratio']:.2f} | "
                  f"{a['admission_concurrency']} of {cfg.rollout.max_num_seqs} |", flush=True)


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
    over = {**LOSSLESS, **SPEC, "rollout.max_split": 1, **set_overrides(args.set)}
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
