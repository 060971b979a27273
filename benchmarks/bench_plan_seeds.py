"""How much of ASP's gain over a shared FIFO queue is the planner's seed? (the ablation's setup)

    python benchmarks/bench_plan_seeds.py [--data DIR] [--prompts 4096] [--devices 32 64] [--seeds 0 1 2 3 4]

The planner draws random numbers (the order of equal predicted lengths, the strata's split over
iterations, mini-batch tie-breaks) from the config's ``seed``. Here the workload is built once
(seed 0: the same prompts, lengths and predictions in every row) and each system is simulated
with ``seed`` = 0, 1, ... on it, so only the plan's random draws change. Per workload and device
count: ``fully_async_fifo`` (which plans nothing at random: its time should not move),
asp's static plan and asp's lossless defaults (guided dispatch + re-estimation), each as mean
iteration time vs fifo per seed, then mean, min and max over the seeds. A gain smaller than the
spread of one system over seeds is not a gain the scheduler can promise. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from tail_common import LOSSLESS, OFF, WORKLOADS, plan_seed_cells  # noqa: E402

SYSTEMS = (("asp, static plan", "asp", OFF), ("asp, lossless defaults", "asp", {**OFF, **LOSSLESS}))


def seed_cells(a):
    """(devices, workload, time) per device count and workload of ``a``: the workload built once
    (seed 0), ``time(policy, overrides, seed)`` its mean iteration time simulated with that seed."""
    for D, wl, run in plan_seed_cells(a):
        def time_of(name, over, s, run=run):
            return run(name, over, s)["iteration_time_mean"]
        yield D, wl, time_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    a = ap.parse_args(argv)
    print(f"| workload | devices | system | vs fifo per seed ({', '.join(map(str, a.seeds))}) | mean | min .. max | "
          "fifo iter. time (s) per seed |")
    print("|---|---|---|---|---|---|---|")
    for D, wl, t in seed_cells(a):
        fifo = [t("fully_async_fifo", OFF, s) for s in a.seeds]
        for label, name, over in SYSTEMS:
            rel = [100 * (t(name, over, s) / f - 1) for s, f in zip(a.seeds, fifo)]
            print(f"| {wl} | {D} | {label} | {' / '.join(f'{x:+.1f}' for x in rel)} % | "
                  f"{statistics.mean(rel):+.1f} % | {min(rel):+.1f} .. {max(rel):+.1f} % | "
                  f"{' / '.join(f'{x:.1f}' for x in fifo)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
