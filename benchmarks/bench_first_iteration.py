"""The publish floor of a plan's iteration membership on the true lengths, without simulating it.

    python benchmarks/bench_first_iteration.py [--data DIR] [--devices 64] [--workload-seeds 0 1 ... 7]
                                               [--plan-seeds 0 1 2 3 4] [--relieve 0 0.02 0.03]
                                               [--workloads azure_conv_x6 azure_code_x8]

``metrics/floor.publish_floor`` depends only on which groups each iteration holds: the trainer's busy
time per iteration (its optimizer steps on the iteration's true tokens, packed as the simulator prices
them, plus the weight sync) and each iteration's longest group alone (the true lengths), the trainer
starting after iteration 0's shortest group. ``bench_tail.py bound`` reports it for simulated runs of
one workload draw (seed 0); here it is computed from the plans alone, so it can be averaged over
many draws of the workload (``--workload-seeds``: the ablation's setup built with that ``seed``: other
prompts sampled from the trace, other lengths, other previous-epoch predictions) and planner seeds.
Per workload: ``fully_async_fifo``'s and ``random``'s membership, and asp's for each
``scheduler.relieve_first`` of ``--relieve`` (scheduler/first_iteration.py), each the mean (min ..
max) over the draws of the floor / iterations, and of iteration 0's longest group alone (what the
first iteration pays in full; the other iterations hide theirs within k + 1 trainer periods).
Prints markdown (docs/scheduler.md, "The first iteration's floor").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tail_common import LOSSLESS, ROOT, _cfg  # noqa: E402


def membership_floor(iteration, solo, tokens, costs, mini_batch_size: int, lag_bound: int) -> tuple[float, float]:
    """(publish floor / iterations, iteration 0's longest group alone) of a membership: ``solo``,
    each group's latency alone; ``tokens``, its samples' prompt + response tokens."""
    from asp_ascend.metrics.floor import publish_floor
    from asp_ascend.sim.costs import trainer_slots

    n_iter = int(iteration.max()) + 1
    steps = -(-np.bincount(iteration, minlength=n_iter) // mini_batch_size)
    busy = (costs.train_per_token * trainer_slots(np.bincount(iteration, weights=tokens, minlength=n_iter), 0, "packed")
            + costs.train_per_step * steps + costs.sync_s)
    floor = np.zeros(n_iter)
    np.maximum.at(floor, iteration, solo)
    shortest = np.full(n_iter, np.inf)
    np.minimum.at(shortest, iteration, solo)
    return float(publish_floor(busy, floor + costs.sync_s, lag_bound, shortest[0])[-1] / n_iter), float(floor[0])


def draws(wl: str, a) -> dict:
    """{(system, relieve_first): [(floor / iterations, iteration 0's floor) per draw]} for workload ``wl``."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.scheduler.planner import plan_columns
    from asp_ascend.scheduler.group_max import group_max_factor
    from asp_ascend.sim.predictions import Predictions, epoch_split
    from asp_ascend.sim.run import costs_for, planning_cost, system_for

    out: dict = {}
    for ws in a.workload_seeds:
        cfg = _cfg(wl, a.data, a.prompts, a.devices, {**LOSSLESS, "seed": ws})
        w = workload_from_config(cfg)
        spec = system_for(cfg, "asp")
        costs = costs_for(cfg, spec)
        hist, sim = epoch_split(w, cfg.sim.epochs)
        pred = Predictions(w, cfg).predict(tuple(hist), sim[0])
        resp = w.samples(sim[0]).astype(float)
        plen = w.prompt_length.astype(float)
        solo = costs.instance.group_latency_exact(plen, resp)
        tokens = (plen[:, None] + resp).sum(axis=1)
        t = cfg.train
        kw = dict(group_size=w.group_size, global_batch_size=t.global_batch_size, mini_batch_size=t.mini_batch_size,
                  num_instances=spec.num_instances, max_num_seqs=spec.max_num_seqs, lag_bound=spec.lag_bound,
                  cost=planning_cost(costs), group_max_factor=group_max_factor(w.group_spread, w.group_size),
                  max_response_length=cfg.lengths.max_response_length)

        def floor(it):
            return membership_floor(it, solo, tokens, costs, t.mini_batch_size, spec.lag_bound)
        out.setdefault(("fifo", None), []).append(floor(plan_columns(pred, plen, policy="fifo", **kw)["iteration"]))
        for s in a.plan_seeds:
            out.setdefault(("random", None), []).append(
                floor(plan_columns(pred, plen, policy="random", seed=s, **kw)["iteration"]))
            for r in a.relieve:
                out.setdefault(("asp", r), []).append(
                    floor(plan_columns(pred, plen, policy="asp", seed=s, relieve_first=r, **kw)["iteration"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--workloads", nargs="+", default=["azure_conv_x6", "azure_code_x8", "reasoning", "bimodal"])
    ap.add_argument("--workload-seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--relieve", type=float, nargs="+", default=[0.0, 0.02])
    a = ap.parse_args(argv)
    print(f"{a.devices} devices; workload seeds {a.workload_seeds[0]}..{a.workload_seeds[-1]}, planner seeds "
          f"{', '.join(map(str, a.plan_seeds))} (fifo: once per workload draw); mean (min .. max) over the draws\n")
    print("| workload | membership | publish floor / iterations (s) | iteration 0's longest group alone (s) |")
    print("|---|---|---|---|")
    for wl in a.workloads:
        for (name, r), xs in draws(wl, a).items():
            x = np.array(xs)
            label = name if r is None else f"asp, relieve_first={r:g}"
            print(f"| {wl} | {label} | {x[:, 0].mean():.2f} ({x[:, 0].min():.1f} .. {x[:, 0].max():.1f}) | "
                  f"{x[:, 1].mean():.0f} ({x[:, 1].min():.0f} .. {x[:, 1].max():.0f}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
