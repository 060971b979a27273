"""The tail mechanisms (DESIGN 9) in the simulator: ablation, robustness, the seed comparison.

    python benchmarks/bench_tail.py ablation   [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--set scheduler.concentrate_tail=0.02 ...]
    python benchmarks/bench_tail.py robustness [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--set pipeline.regroup=off] [--cells 'a, b, c x10' ...] [--floor | --chain]
                                               [--chain --combo-only 'CHANGE + CHANGE ...']
    python benchmarks/bench_tail.py seed       [--devices 128] [--set pipeline.regroup_heavy=off]
    python benchmarks/bench_tail.py breakdown  [--devices 128] [--per-iteration] [--plan-seeds 0 1 2]
    python benchmarks/bench_tail.py speed      [--prompts 100000] [--policies asp asp_partial ...] [--set KEY=VALUE ...]
    python benchmarks/bench_tail.py admission  [--devices 32 64] [--prompts N]
    python benchmarks/bench_tail.py reestimate [--data DIR] [--prompts N] [--devices 32 64]
    python benchmarks/bench_tail.py bound      [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2] [--set ...]
                                               [--combo-only 'CHANGE + CHANGE ...']
    python benchmarks/bench_tail.py sweep      [--data DIR] [--prompts N] [--devices 32 64] [--plan-seeds 0 1 2]
                                               [--workloads reasoning ...] [--set KEY=VALUE ...] [--more]
                                               [--combos N [--combo-seed S] | --combo-only 'CHANGE + CHANGE ...']

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
the share of orders whose floor is below fifo's iteration time); ``--chain --combo-only 'LABEL'``: the same on that
combination of sweep's changes (``sweep --combos``'s cell, run as sweep runs it) instead of the grid, its floors on the
combination's true costs (an unplanned-cost change's). ``seed``: configs/sim_7b.yaml and sim_32b.yaml at 128 devices
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
target's 11 %, no dispatch order or mini-batch choice on that membership reaches the target. ``bound --combo-only
'LABEL'``: the same on that combination of sweep's changes (as sweep runs the cell), floors on its true costs.
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
sweep's cells and numbers stay as they were. ``sweep --combos N``: the same rows and table on N cells per
workload and device count, each several settings changed at once: 2-4 of the single changes of both lists
(tail_combos.py's ``combo_pool``), drawn at random with a generator seeded by ``--combo-seed S`` (default 0),
the workload and the device count (the same cells on every run); a draw that sets a config key twice or holds two
unplanned-cost (Mismatch) or two known-cost changes is skipped (the counts under the table). A known-cost change is
the combination's own costs scaled (``custom_costs`` of the config the other changes make: 32b x10 is 32b's
costs x10). Each cell's label is its changes joined by `` + ``; ``--combo-only 'LABEL'`` runs that one combination
(on ``--workloads`` and ``--devices``). A config the combination makes that the config check refuses is a row
(``refused: ConfigError: ...``) and counted with the failed cells. Every sweep ends with the cells where asp is
ahead of fifo and of balanced (below -0.0 % as printed) on the mean and for every seed.
Prints markdown tables (docs/scheduler.md holds a copy). This file is the command line; the
subcommands live beside it: tail_common.py (the setup, runs and table cells they share),
tail_ablation.py (ablation, admission, seed, speed), tail_robustness.py (robustness, reestimate),
tail_floor.py (bound, breakdown and the floor terms), tail_sweep.py (sweep) and tail_combos.py (sweep --combos).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tail_ablation import ablation, admission, seed, speed
from tail_combos import combo_sweep
from tail_common import ROOT, WORKLOADS, check_set
from tail_floor import bound, breakdown
from tail_robustness import GRID, reestimate, robustness
from tail_sweep import sweep

# the subcommands that take --set KEY=VALUE overrides
SET_TAKERS = ("ablation", "bound", "breakdown", "robustness", "seed", "speed", "sweep")


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
    ap.add_argument("--combos", type=int, default=None, metavar="N",
                    help="sweep: N cells per workload and device count, each 2-4 changes of both lists at once, drawn "
                         "at random (reproducibly: --combo-seed)")
    ap.add_argument("--combo-seed", type=int, default=0, metavar="S", help="sweep --combos: the draws' seed (default 0)")
    ap.add_argument("--combo-only", default=None, metavar="LABEL",
                    help="sweep: only this combination (a --combos cell's label as printed, changes joined by ' + '); "
                         "robustness --chain, bound: on this combination instead of the grid / the ablation's setup")
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
    if args.combos is not None and (args.what != "sweep" or args.more):
        ap.error(f"--combos applies to sweep only, without --more (got {args.what}{' --more' if args.more else ''})")
    if args.combo_only and not ((args.what == "sweep" and not args.more) or args.what == "bound"
                                or (args.what == "robustness" and args.chain)):
        ap.error(f"--combo-only applies to sweep (without --more), robustness --chain and bound only (got {args.what}"
                 f"{' --more' if args.more else ''}{' --floor' if args.floor else ''})")
    if args.combo_only and args.cells:
        ap.error("--combo-only and --cells: give one of them (--combo-only is the cell)")
    if args.combos is not None and args.combos < 1:
        ap.error(f"--combos {args.combos}: give a count of 1 or more")
    if args.combos is not None and args.combo_only:
        ap.error("--combos and --combo-only: give one of them (--combo-only runs one combination)")
    if args.combo_seed and args.combos is None:
        ap.error("--combo-seed applies to sweep --combos only")
    check_set(ap, args.set, "lengths.predictor=oracle")
    args.plan_seeds = args.plan_seeds or [0]
    if len(set(args.plan_seeds)) != len(args.plan_seeds):
        ap.error(f"--plan-seeds: {' '.join(map(str, args.plan_seeds))} names a seed twice; give each seed once")
    args.devices = args.devices or ([128] if args.what in ("seed", "breakdown") else [256] if args.what == "speed" else [32])
    args.prompts = args.prompts or (100000 if args.what == "speed" else 4096)
    {"ablation": ablation, "robustness": robustness, "seed": seed, "speed": speed,
     "admission": admission, "reestimate": reestimate, "breakdown": breakdown, "bound": bound,
     "sweep": combo_sweep if args.combos or args.combo_only else sweep}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
