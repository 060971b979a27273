"""bench_tail.py's robustness grid (its docstring documents it): GRID, asp planned on the
configured costs and executed on others (``Mismatch``), against fifo and balanced executed on the
same; ``robustness`` (one planner seed, over seeds, ``--floor``, ``--chain``) and ``reestimate``
(re-estimation on and off on the same grid, and docs/scheduler.md's rule for it)."""
from __future__ import annotations

import argparse

from tail_common import (ASP_DEFAULTS, CONC_AUTO, CONC_FULL, LOSSLESS, OFF, SEED_FREE, TAIL_AUTO, _cfg, mean_present,
                         na_cells, pct, plan_seed_cells, print_na_notes, seed_runs, set_overrides, table_head)
from tail_floor import chain_inputs, floor_terms, no_steady_why, steady_floor

GRID = [("planned costs", {}), ("decode a x0.1", {"decode_a": 0.1}), ("decode a x10", {"decode_a": 10.0}),
        ("decode b x0.1", {"decode_b": 0.1}), ("decode b x10", {"decode_b": 10.0}),
        ("decode c x0.1", {"decode_c": 0.1}), ("decode c x10", {"decode_c": 10.0}),
        ("a, b, c x0.1", {"decode_a": 0.1, "decode_b": 0.1, "decode_c": 0.1}),
        ("a, b, c x10", {"decode_a": 10.0, "decode_b": 10.0, "decode_c": 10.0}),
        ("half the planned concurrency", {"concurrency": 0.5}), ("twice the planned concurrency", {"concurrency": 2.0})]


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


# robustness over planner seeds: asp's defaults against the two baselines executed on the same costs
ROBUST_ROWS = [("asp", "asp", ASP_DEFAULTS), ("fifo", "fully_async_fifo", OFF),
               ("balanced", "async_balanced", OFF)]


def _ahead(v: float) -> bool:
    """Strictly ahead as the tables print it: below -0.0 % at one decimal."""
    return round(v, 1) < 0


def robustness_seeds_row(wl: str, D: int, label: str, res: dict) -> tuple[str, list]:
    """One row of robustness's table over seeds (``res``: seed_runs over ROBUST_ROWS) and asp's
    figure against fifo per seed (%)."""
    def spread(xs, fmt, unit=""):
        return f"{sum(xs) / len(xs):{fmt}}{unit} ({min(xs):{fmt}} .. {max(xs):{fmt}})"

    t = [s["iteration_time_mean"] for s in res["asp"]]
    f = [pct(a, r) for a, r in zip(res["asp"], res["fifo"])]
    b = [pct(a, r) for a, r in zip(res["asp"], res["balanced"])]
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


def robustness_floor(args) -> None:
    """Per robustness cell, where asp's and balanced's iterations go beside their lag floor
    (breakdown's terms on the cell's true costs), each the mean over ``--plan-seeds``; ``n/a``, and
    why under the table, where a run has no steady iteration."""
    extra = set_overrides(args.set)
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


def _chain_cells(args):
    """(devices, workload, cell label, run(policy, overrides, seed) -> (SimResult, config), the true
    cost model of a result) of robustness --chain: the grid's cells, or with ``--combo-only`` that
    combination of sweep's changes (tail_combos.combo_cells)."""
    if args.combo_only:
        from tail_combos import combo_cells

        yield from combo_cells(args)
        return
    for D, wl, label, it in _grid(args):
        yield (D, wl, label, lambda name, over, s, it=it: it.run(name, over, s, it.mismatch, result=True),
               lambda res, it=it: it.mismatch.cost(res.costs.instance))


def robustness_chain(args) -> None:
    """Per robustness cell and planner seed: asp's defaults and fifo beside the publish floor of
    their own iterations on the cell's true costs (``metrics/floor.publish_floor``: no dispatch
    order or mini-batch choice on those iterations publishes earlier), and that floor over
    CHAIN_ORDERS random orders of the same iterations (``publish_floor_orders``): what the order
    of the iterations alone decides, and how often an order of them would leave room to beat
    fifo's iteration time. ``--combo-only LABEL``: on that combination of sweep's changes instead of
    the grid (``_chain_cells``)."""
    import numpy as np

    from asp_ascend.metrics.floor import publish_floor, publish_floor_orders

    print(f"planner seeds {', '.join(map(str, args.plan_seeds))} (workload built with seed 0); seconds per "
          f"iteration; floors on the cell's true costs; {CHAIN_ORDERS} random orders of each run's iterations "
          f"(numpy seed 0)\n")
    cell = "cell (sweep --combos' changes)" if args.combo_only else "true costs (plan: configured)"
    table_head(f"| workload | devices | {cell} | system | planner seed | iter. time (s) | "
               "vs fifo | publish floor of its iterations (s) | above its floor | floor over random orders of its "
               "iterations: p5 / p50 / p95 (s) | orders whose floor is below fifo's iteration time |")
    for D, wl, label, run, true_cost in _chain_cells(args):
        fifo = None
        for key, name, over in sorted(ROBUST_ROWS, key=lambda r: r[0] != "fifo"):     # fifo first
            if key == "balanced":
                continue
            for s in (args.plan_seeds[:1] if name in SEED_FREE else args.plan_seeds):
                res, cfg = run(name, over, s)
                _, _, busy, floor, shortest = chain_inputs(res, cfg, true_cost(res))
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
            rel = [100 * (x["iteration_time_mean"] / ref - 1)
                   for x, ref in ((on, f), (off, f), (off, on["iteration_time_mean"]))]
            on_f.append(rel[0])
            off_f.append(rel[1])
            d.append(rel[2])
            rd.append(100 * (on["iteration_time_mean"] / off["iteration_time_mean"] - 1))
            print(f"| {wl} | {D} | {label} | {f:.1f} | {rel[0]:+.1f}% | {rel[1]:+.1f}% | {rel[2]:+.1f}% | "
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
