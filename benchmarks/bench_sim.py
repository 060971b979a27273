"""Simulator speed: wall time against the number of samples (one epoch, 64 rollout instances).

    python benchmarks/bench_sim.py                 # 10k, 100k, 1M samples + the 100k-prompt target
    python benchmarks/bench_sim.py --sizes 10000   # just one size

Target (the simulator issue): one epoch of 100,000 prompts x G=8 (800k samples) on 64 instances
in at most 30 s wall, growing about linearly with the number of samples. Each run covers the
whole `simulate_system` path: workload lengths, length prediction, planning, the event engine,
lower bounds and the metric summary.
"""
from __future__ import annotations

import argparse
import sys
import time


def bench(samples: int, policy: str, G: int = 8, instances: int = 64) -> tuple[float, dict]:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    prompts = max(1, samples // G)
    cfg = load_config(None, [
        "workload.type=synthetic", f"workload.num_prompts={prompts}", "workload.epochs=2", "sim.epochs=1",
        "lengths.max_response_length=16384", f"train.group_size={G}", "train.global_batch_size=512",
        "train.mini_batch_size=128", "rollout.max_num_seqs=256", "sim.model_class=7b", "sim.infer_tp=1",
        f"sim.rollout_devices={instances}", f"sim.total_devices={instances + 32}", "pipeline.lag_bound=1"])
    w = workload_from_config(cfg)
    t0 = time.perf_counter()
    res = simulate_system(cfg, w, policy, record_samples=False)
    return time.perf_counter() - t0, res.summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 800_000, 1_000_000],
                   help="numbers of samples (prompts x G)")
    p.add_argument("--policy", default="asp")
    p.add_argument("--limit", type=float, default=30.0, help="seconds allowed for 800k samples (100k prompts x 8)")
    args = p.parse_args(argv)
    print(f"{'samples':>10s} {'prompts':>8s} {'wall s':>8s} {'us/sample':>10s} {'sim. run time':>14s}")
    ok = True
    for n in args.sizes:
        wall, s = bench(n, args.policy)
        print(f"{n:10d} {n // 8:8d} {wall:8.2f} {1e6 * wall / n:10.2f} {s['run_time_s']:12.0f} s", flush=True)
        if n == 800_000 and wall > args.limit:
            ok = False
    if not ok:
        print(f"FAIL: 100k prompts x 8 took longer than {args.limit:.0f} s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
