"""What running beside other sequences costs each iteration's critical group, and where it comes from.

    python benchmarks/bench_tail_corun.py [--data DIR] [--prompts 4096] [--devices 64] [--workloads reasoning]
                                          [--plan-seeds 0 1 2 3 4] [--set rollout.tail_concurrency=reactive]

The ablation's setup (``bench_tail.py``: 8 rollout instances per 32 devices, G = 8, k = 1,
previous-epoch predictions), asp's defaults (``tail_common.ASP_DEFAULTS``) plus ``--set``
overrides. Per workload, device count and planner seed, over the steady iterations (from k + 1
on), per iteration (/ (k + 1), as ``bench_tail.py breakdown``): the mean iteration time and the
publish floor of the run's iterations (``tail_floor.bound_terms``), the critical
(last-finishing) group's latency beside other sequences minus alone (``beside``), and
``metrics/floor.corunning``'s terms: the cost of the other sequences' tokens on its instance
while it ran (``on its instance``; it models ``beside``), their decode split by their iteration
(earlier / the same / later) and the prompts prefilled there meanwhile, and ``even``: the cost
had the window's other tokens been spread evenly over all instances. ``beside - even`` is what a dispatch that moves other tokens off the critical
group's instance could still gain; ``even`` is what one that cannot tell the critical group
apart while it runs pays. Prints markdown.

The steady columns need at least one steady iteration: more than (k + 1) x
``train.global_batch_size`` prompts (k = 1, 256 prompts an iteration: --prompts 768 or more). A
smaller run prints its iteration time and publish floor and ``n/a`` in the steady columns, and
says why under the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tail_common import (ASP_DEFAULTS, _cfg, cell_args, mean_present, na_cells, print_na_notes,  # noqa: E402
                         set_overrides)
from tail_floor import bound_terms, floor_terms, no_steady_why  # noqa: E402

HEAD = ("| workload | devices | seed | iter. time (s) | publish floor (s) | critical alone | beside (latency - alone) "
        "| on its instance | of it: decode, earlier iterations | the same | later | prefill | even spread |")


def corun_row(wl: str, D: int, data, prompts: int, seed: int, extra: dict) -> tuple[list[float | None], str]:
    """(the table's figures for one run (module docstring), per iteration; "" or why its steady
    columns are None: the run has no iteration from k + 1 on)."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.metrics.floor import corunning
    from asp_ascend.sim.run import simulate_system

    w = workload_from_config(_cfg(wl, data, prompts, D, {}))
    cfg = _cfg(wl, data, prompts, D, {**ASP_DEFAULTS, **extra, "seed": seed})
    res = simulate_system(cfg, w, "asp", record_samples=True)
    k1 = cfg.pipeline.lag_bound + 1
    b, _ = floor_terms(res, cfg)
    cm = res.costs.instance
    req = res.timeline.frame("request")
    c = corunning(req, cm.decode_b, cm.decode_c, res.spec.num_instances, cm.prefill_per_token,
                  cm.prefill_share(req["prompt_length"].to_numpy(float), w.group_size))
    n_it = int(res.summary["iterations"])
    b, c = b[b["iteration"] >= k1], c[c["iteration"] >= k1]
    bt = bound_terms(res, cfg)
    if b.empty or c.empty:      # a mean over no iteration would print nan
        why = no_steady_why(wl, prompts, n_it, cfg)
        return [bt["time"], bt["chain"], *([None] * 8)], why
    return [bt["time"], bt["chain"], b["critical_solo"].mean() / k1,
            (b["critical_latency"] - b["critical_solo"]).mean() / k1,
            *(c[x].mean() / k1 for x in ("on_instance", "previous", "same", "next", "prefill", "even"))], ""


def main(argv=None) -> int:
    a = cell_args(argv, __doc__.splitlines()[0], "reasoning", "asp's defaults", "rollout.tail_concurrency=reactive")
    extra = set_overrides(a.set)
    print(f"asp's defaults{' + ' + ' '.join(a.set) if a.set else ''}; seconds per iteration (/ (k+1)), steady "
          f"iterations\n")
    print(HEAD)
    print("|---|---|---|" + "---|" * 10)
    notes = []
    for D in a.devices:
        for wl in a.workloads:
            rows = []
            for s in a.plan_seeds:
                row, why = corun_row(wl, D, a.data, a.prompts, s, extra)
                rows.append(row)
                notes.append(why)
                print(f"| {wl} | {D} | {s} | {na_cells(row)} |", flush=True)
            if len(rows) > 1:
                print(f"| {wl} | {D} | mean | {na_cells(mean_present(rows))} |", flush=True)
    print_na_notes(notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
