"""Scheduler benchmarks: planning speed/memory at 1M prompts, and schedule quality.

    python benchmarks/bench_schedule.py speed            # 1M prompts, G=8, 64 instances
    python benchmarks/bench_schedule.py quality [--md F] [--data DIR] # policies x workloads x predictions

``speed`` times planning + the analytic estimate on one core and compares it with a
straightforward pure-Python implementation of the same planner measured in the same
run. ``quality`` prints the table that docs/scheduler.md holds. Figures, not asserts.
"""
from __future__ import annotations

import argparse
import heapq
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asp_ascend.scheduler.cost import CostModel  # noqa: E402
from asp_ascend.scheduler.estimate import estimate  # noqa: E402
from asp_ascend.scheduler.planner import POLICIES, plan  # noqa: E402


def workload(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    body = rng.lognormal(np.log(600), 0.6, n)
    tail = 1500 * (1 - rng.random(n)) ** (-1 / 1.5)
    pred = np.minimum(np.where(rng.random(n) < 0.1, tail, body), 8192)
    plen = np.maximum(1, rng.lognormal(np.log(200), 0.5, n))
    return np.array([f"p{i}" for i in range(n)], dtype=object), pred, plen


def naive_plan(pred, plen, B, m, R, G, S, cost, seed=0):
    """The same ASP decisions written plainly: Python loops, a heap per decision."""
    rng = np.random.default_rng(seed)
    n = len(pred)
    order = sorted(range(n), key=lambda i: (-pred[i], rng.random()))
    n_iter = -(-n // B)
    work = [G * float(cost.work(plen[i], pred[i], S)) for i in range(n)]
    place_load = [max(work[i], 0.5 * float(cost.group_latency(plen[i], pred[i], G))) for i in range(n)]
    iteration = [0] * n
    heap = [(0.0, j) for j in range(n_iter)]
    counts = [0] * n_iter
    for t in range(0, n, n_iter):  # strata of n_iter prompts, one per iteration
        taken = []
        for i in order[t:t + n_iter]:
            load, j = heapq.heappop(heap)
            while counts[j] >= B:
                load, j = heapq.heappop(heap)
            iteration[i] = j
            counts[j] += 1
            taken.append((load + work[i], j))
        for x in taken:
            heapq.heappush(heap, x)
    by_iter = [[] for _ in range(n_iter)]
    for i in range(n):
        by_iter[iteration[i]].append(i)
    instance, mini_batch = [0] * n, [0] * n
    cum = [(0.0, r) for r in range(R)]
    for j, members in enumerate(by_iter):
        members.sort(key=lambda i: -pred[i])
        for pos, i in enumerate(members):
            mini_batch[i] = (len(members) - 1 - pos) // m
        inst_heap = list(cum)
        heapq.heapify(inst_heap)
        for i in sorted(members, key=lambda i: -place_load[i]):
            load, r = heapq.heappop(inst_heap)
            instance[i] = r
            heapq.heappush(inst_heap, (load + place_load[i], r))
        cum = sorted(inst_heap)
    dispatch = sorted(range(n), key=lambda i: (iteration[i], -pred[i]))
    rank = [0] * n
    for r, i in enumerate(dispatch):
        rank[i] = r
    return iteration, mini_batch, instance, rank


def speed(n: int, R: int, G: int, B: int, m: int, S: int, naive_n: int) -> None:
    ids, pred, plen = workload(n)
    cost = CostModel()
    t0 = time.perf_counter()
    df = plan(ids, pred, plen, policy="asp", group_size=G, global_batch_size=B, mini_batch_size=m,
              num_instances=R, max_num_seqs=S, lag_bound=1, cost=cost)
    t1 = time.perf_counter()
    est = estimate(df["iteration"].to_numpy(), df["instance"].to_numpy(), df["mini_batch"].to_numpy(),
                   df["dispatch_rank"].to_numpy(), pred, plen, group_size=G, num_instances=R, max_num_seqs=S,
                   lag_bound=1, micro_batch_size=16, cost=cost)
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"vectorised ASP: {n:,} prompts, G={G}, {R} instances, global batch {B}, mini-batch {m}")
    print(f"  plan {t1 - t0:.2f} s + analytic estimate {t2 - t1:.2f} s = {t2 - t0:.2f} s wall (one core), "
          f"peak RSS {peak:.0f} MiB (whole process, data included)")
    print(f"  predicted iteration time {est['iteration_time_mean']:.1f} s, LB ratio {est['lower_bound_ratio']:.3f}")
    # the straightforward implementation on a subset, scaled linearly (it is O(n log n) too)
    sub = slice(0, naive_n)
    t3 = time.perf_counter()
    naive_plan(pred[sub], plen[sub], B, m, R, G, S, cost)
    t4 = time.perf_counter()
    t5 = time.perf_counter()
    plan(ids[sub], pred[sub], plen[sub], policy="asp", group_size=G, global_batch_size=B, mini_batch_size=m,
         num_instances=R, max_num_seqs=S, lag_bound=1, cost=cost)
    t6 = time.perf_counter()
    print(f"straightforward Python planner on {naive_n:,} prompts: {t4 - t3:.2f} s; vectorised on the same: "
          f"{t6 - t5:.3f} s -> {((t4 - t3) / (t6 - t5)):.0f}x faster "
          f"(naive at {n:,} extrapolated: {(t4 - t3) * n / naive_n:.0f} s)")


SIM_NAME = {"asp": "asp", "fifo": "fully_async_fifo", "random": "async_random", "sorted": "async_sorted",
            "balanced": "async_balanced"}


def quality(md_path: str | None, n: int, shared: Path) -> None:
    """Analytic estimate (what the planner optimises) beside the event simulator (the same
    cost model, the same workload and schedule) for every policy."""
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.scheduler.run import build_schedule
    from asp_ascend.sim.run import simulate_system

    setups = [
        ("synthetic heavy tail, R=8", ["workload.type=synthetic"], 8),
        ("synthetic heavy tail, R=32", ["workload.type=synthetic"], 32),
        ("Azure conv trace x6, R=32", ["workload.type=trace", f"workload.trace_path={shared / 'azure_llm_trace_2023_conv.csv'}",
                                       "workload.length_scale=6"], 32),
        ("Azure code trace x8, R=16", ["workload.type=trace", f"workload.trace_path={shared / 'azure_llm_trace_2023_code.csv'}",
                                       "workload.length_scale=8"], 16),
    ]
    common = [f"workload.num_prompts={n}", "lengths.max_response_length=8192", "train.global_batch_size=512",
              "train.mini_batch_size=64", "rollout.max_num_seqs=256", "pipeline.lag_bound=1", "output_dir=/tmp/unused",
              "workload.epochs=2", "sim.epochs=1", "sim.model_class=custom", "sim.infer_tp=1", "sim.logprob_passes=1"]
    lines = ["| workload | predictions | policy | analytic iter time (s) | vs fifo | simulated iter time (s) | vs fifo "
             "| p99 sim (s) | padding | skew | sorting | lag-blocked | LB ratio (analytic) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, ov, R in setups:
        for pred_name, pov in (("exact", ["lengths.predictor=oracle"]), ("previous epoch", ["lengths.predictor=mean"])):
            cfg = load_config(None, common + ov + pov + [f"rollout.num_instances={R}", f"sim.total_devices={2 * R}",
                                                        f"sim.rollout_devices={R}"])
            _, rep = build_schedule(cfg)
            rows = {"asp": rep.get("realized", rep["predicted"]), **rep["baselines"]}
            w = workload_from_config(cfg)
            sims = {pol: simulate_system(cfg, w, SIM_NAME[pol], record_samples=False).summary for pol in POLICIES}
            fifo, fifo_sim = rows["fifo"]["iteration_time_mean"], sims["fifo"]["iteration_time_mean"]
            q = rep.get("prediction_quality")
            pname = pred_name + (f" (Spearman {q['spearman']:.2f})" if q else "")
            for pol in POLICIES:
                e, m = rows[pol], sims[pol]
                lines.append(f"| {name} | {pname} | {pol} | {e['iteration_time_mean']:.1f} | "
                             f"{100 * (e['iteration_time_mean'] / fifo - 1):+.1f}% | {m['iteration_time_mean']:.1f} | "
                             f"{100 * (m['iteration_time_mean'] / fifo_sim - 1):+.1f}% | {m['iteration_time_p99']:.1f} | "
                             f"{m['padding_bubble']:.3f} | {m['skew_bubble']:.3f} | {m['sorting_bubble']:.3f} | "
                             f"{m['rollout_breakdown']['lag_blocked']:.3f} | {e['lower_bound_ratio']:.3f} |")
            print("\n".join(lines[-5:]), flush=True)
    table = "\n".join(lines)
    if md_path:
        Path(md_path).write_text(table + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("speed", "quality"))
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--md")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="folder with the Azure traces (quality; default ../shared/data from the project root)")
    a = ap.parse_args()
    if a.what == "speed":
        speed(a.n or 1_000_000, R=64, G=8, B=1024, m=256, S=256, naive_n=100_000)
    else:
        quality(a.md, a.n or 16384, a.data)
