"""Chunked prefill (``rollout.max_num_batched_tokens``) against the stall model: what it moves.

    python benchmarks/bench_chunked.py [--data DIR] [--prompts 4096] [--devices 64]
                                       [--workloads azure_code_x8 azure_conv_x6 reasoning]
                                       [--budgets 0 8192 2048] [--plan-seeds 0 1 2]

The ablation's setup (``bench_tail.py``: 8 rollout instances per 32 devices, G = 8, k = 1,
previous-epoch predictions), ``fully_async_fifo`` as shipped and asp's defaults
(``tail_common.ASP_DEFAULTS``), each with every step budget of ``--budgets`` (0: the stall model,
an admitted sequence's prefill stalls its instance; N: vLLM V1's chunked prefill with
``max_num_batched_tokens`` = N, ``sim/chunked.py``). Per workload, system and budget, means over
the planner seeds (fifo's plan draws nothing from the seed: run once): the mean iteration time,
asp against fifo at the same budget, and the first token's latency after admission (mean, median and
99th percentile over all samples). Prints markdown (docs/scheduler.md, "Chunked prefill at 64 devices").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tail_common import ASP_DEFAULTS, OFF, ROOT, WORKLOADS, _cfg  # noqa: E402

SYSTEMS = [("fully_async_fifo", "fully_async_fifo", OFF), ("asp's defaults", "asp", ASP_DEFAULTS)]
HEAD = ("| workload | devices | system | budget | iter. time (s) | asp vs fifo | first token after admission: "
        "mean / median / p99 (s) |")


def run_one(cfg, w, name: str) -> dict:
    """Iteration time and first-token latencies of one simulated run."""
    from asp_ascend.sim.run import simulate_system

    res = simulate_system(cfg, w, name, record_samples=True)
    r = res.timeline.frame("request")
    d = (r["t_first_token"] - r["t_admit"]).to_numpy(float)
    return {"it": res.summary["iteration_time_mean"], "ttft": d.mean(), "p50": float(np.median(d)),
            "p99": float(np.percentile(d, 99))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=[64])
    ap.add_argument("--workloads", nargs="+", default=["azure_code_x8", "azure_conv_x6", "reasoning"],
                    choices=list(WORKLOADS))
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 8192, 2048],
                    help="rollout.max_num_batched_tokens values (0: the stall model)")
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args(argv)
    from asp_ascend.lengths.workloads import workload_from_config

    print(f"planner seeds {', '.join(map(str, a.plan_seeds))}: means over them (fifo run once)\n")
    print(HEAD)
    print("|---|---|---|---|---|---|---|")
    for D in a.devices:
        for wl in a.workloads:
            w = workload_from_config(_cfg(wl, a.data, a.prompts, D, {}))
            for b in a.budgets:
                res = {}
                for label, name, over in SYSTEMS:
                    seeds = a.plan_seeds[:1] if name == "fully_async_fifo" else a.plan_seeds
                    runs = [run_one(_cfg(wl, a.data, a.prompts, D, {**over, "rollout.max_num_batched_tokens": b,
                                                                    "seed": s}), w, name) for s in seeds]
                    res[label] = {k: float(np.mean([x[k] for x in runs])) for k in runs[0]}
                for label, _, _ in SYSTEMS:
                    m = res[label]
                    rel = 100 * (m["it"] / res["fully_async_fifo"]["it"] - 1)
                    print(f"| {wl} | {D} | {label} | {b or 'off (stall)'} | {m['it']:.2f} | {rel:+.1f}% | "
                          f"{m['ttft']:.2f} / {m['p50']:.2f} / {m['p99']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
