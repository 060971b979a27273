"""Tail-aware concurrency's planned rooms by iteration (``rollout.tail_concurrency: auto``), with the
first iteration relieved (``scheduler.relieve_first``, asp's default) and without.

    python benchmarks/bench_tail_rooms.py [--data DIR] [--prompts 4096] [--devices 32 64]
                                          [--workloads reasoning bimodal azure_code_x8 azure_conv_x6]
                                          [--plan-seeds 0] [--set KEY=VALUE ...]

Per workload, device count and planner seed (the workloads and asp's defaults as bench_tail.py's
ablation builds them): asp's defaults with ``rollout.tail_concurrency=auto``, ``relieve_first`` as
shipped and 0, simulated; the groups capped at admission (the run's ``tail`` events with the
plan's rooms) in iteration 0 and per later iteration (mean), and the iteration time against
``fully_async_fifo`` (as shipped) and against the same defaults with tail-aware concurrency off.
``--set``: config overrides on top of the workload and asp's defaults, for every run of the table
(the table's own keys, tail concurrency, ``relieve_first`` and the planner seed, stay its own).
docs/scheduler.md, "Tail rooms for an iteration whose top is a crowd".
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tail_common as tc  # noqa: E402

DEFAULTS = tc.ASP_DEFAULTS
AUTO = {"rollout.tail_concurrency": "auto"}
OFF = {"rollout.tail_concurrency": "off"}


def capped_by_iteration(res) -> tuple[int, float]:
    """(groups capped at admission in iteration 0, mean per later iteration) of a recorded run."""
    tail = res.timeline.frame("tail")
    if tail.empty:
        return 0, 0.0
    plan = tail[tail["reason"] == "plan"] if "reason" in tail else tail
    per = plan.groupby(["epoch", "iteration"]).size()
    first = int(per.get((per.index.min()[0], 0), 0)) if len(per) else 0
    later = per[[it != 0 for _, it in per.index]]
    return first, float(later.mean()) if len(later) else 0.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=tc.ROOT.parent / "shared" / "data")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--workloads", nargs="+", default=list(tc.WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="config overrides on top of the workload (e.g. workload.tail_fraction=0.01, with "
                         "--workloads reasoning bimodal: a trace workload refuses the synthetic generator's keys)")
    a = ap.parse_args(argv)
    tc.check_set(ap, a.set, "workload.tail_fraction=0.01")
    over = tc.set_overrides(a.set)
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    print("| workload | devices | seed | relieve_first | capped in iteration 0 | capped per later iteration "
          "(mean) | capped | auto vs fifo | auto vs tail off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for D in a.devices:
        for wl in a.workloads:
            w = workload_from_config(tc._cfg(wl, a.data, a.prompts, D, over))
            fifo = tc._run(tc._cfg(wl, a.data, a.prompts, D, {**tc.OFF, **over}), w, "fully_async_fifo")
            for s in a.plan_seeds:
                for relief in ("shipped", 0):
                    rf = {} if relief == "shipped" else {"scheduler.relieve_first": relief}
                    off = tc._run(tc._cfg(wl, a.data, a.prompts, D, {**DEFAULTS, **over, **rf, "seed": s, **OFF}), w, "asp")
                    cfg = tc._cfg(wl, a.data, a.prompts, D, {**DEFAULTS, **over, **AUTO, **rf, "seed": s})
                    res = simulate_system(cfg, w, "asp", record_samples=True)
                    first, later = capped_by_iteration(res)
                    t = res.summary["iteration_time_mean"]
                    print(f"| {wl} | {D} | {s} | {relief} | {first} | {later:.1f} | "
                          f"{res.summary.get('tail_capped_groups', 0)} | {tc.pct(res.summary, fifo):+.1f}% | "
                          f"{100 * (t / off['iteration_time_mean'] - 1):+.1f}% |", flush=True)


if __name__ == "__main__":
    main()
