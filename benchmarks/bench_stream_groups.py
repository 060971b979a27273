"""Streaming a mini-batch's groups into the trainer (``sim.stream_groups``), asp against fifo.

    python benchmarks/bench_stream_groups.py [--data DIR] [--prompts 4096] [--devices 32 64] [--seeds 0 1 2 3 4]
    python benchmarks/bench_stream_groups.py seed [--devices 128]

The ablation's setup (benchmarks/bench_tail.py) with the workload built once and only the
planner's ``seed`` varied (benchmarks/bench_plan_seeds.py): ``fully_async_fifo`` and asp's
lossless defaults (guided dispatch + re-estimation), each without and with ``--over`` (default
``sim.stream_groups=true``) applied to every system (equal engine features). Per workload and
device count: fifo's mean iteration time, what the override gains fifo and asp (their time with
it vs without, per seed), and asp vs fifo without and with it; mean and min .. max over the
seeds. ``seed``: configs/sim_7b.yaml at 128 devices (bench_tail.py seed's setup), asp,
sync_colocated and one_step_off without and with the override. Prints markdown tables.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_plan_seeds import seed_cells  # noqa: E402
from tail_common import LOSSLESS, OFF, WORKLOADS, _run  # noqa: E402


def _stats(xs) -> str:
    return f"{statistics.mean(xs):+.1f} % ({min(xs):+.1f} .. {max(xs):+.1f})"


def _pct(a, b):
    return [100 * (x / y - 1) for x, y in zip(a, b)]


def grid(a, over: dict) -> None:
    key = ", ".join(f"{k}={v}" for k, v in over.items())
    print(f"seeds {', '.join(map(str, a.seeds))}; 'on' = {key}; mean (min .. max) over seeds\n")
    print("| workload | devices | fifo iter. time off / on (s) | fifo on vs off | asp on vs off | "
          "asp vs fifo, off | asp vs fifo, on |")
    print("|---|---|---|---|---|---|---|")
    asp = {**OFF, **LOSSLESS}
    for D, wl, t in seed_cells(a):
        f0 = [t("fully_async_fifo", OFF, s) for s in a.seeds]
        f1 = [t("fully_async_fifo", {**OFF, **over}, s) for s in a.seeds]
        a0 = [t("asp", asp, s) for s in a.seeds]
        a1 = [t("asp", {**asp, **over}, s) for s in a.seeds]
        print(f"| {wl} | {D} | {statistics.mean(f0):.1f} / {statistics.mean(f1):.1f} | {_stats(_pct(f1, f0))} | "
              f"{_stats(_pct(a1, a0))} | {_stats(_pct(a0, f0))} | {_stats(_pct(a1, f1))} |", flush=True)


def seed(a, over: dict) -> None:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import sweep_split

    CFG = ROOT / "configs" / "sim_7b.yaml"
    print("| config | devices | system | iter. time off (s) | on (s) | on vs off |")
    print("|---|---|---|---|---|---|")
    for D in a.devices:
        # exactly bench_tail.py seed's setup: the config's split rule at D devices, --prompts, asp's
        # lossless mechanisms named
        split = [f"sim.total_devices={D}", f"sim.rollout_devices={sweep_split(load_config(CFG, []), D)}",
                 f"workload.num_prompts={a.prompts}"] + [f"{k}={v}" for k, v in LOSSLESS.items()]
        cfg0 = load_config(CFG, split)
        cfg1 = load_config(CFG, split + [f"{k}={v}" for k, v in over.items()])
        w = workload_from_config(cfg0)
        for name in a.policies:
            t0 = _run(cfg0, w, name)["iteration_time_mean"]
            t1 = _run(cfg1, w, name)["iteration_time_mean"]
            print(f"| sim_7b | {D} | {name} | {t0:.1f} | {t1:.1f} | {100 * (t1 / t0 - 1):+.1f} % |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="grid", choices=("grid", "seed"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--policies", nargs="+", default=["asp", "sync_colocated", "one_step_off"])
    ap.add_argument("--over", action="append", default=None, metavar="KEY=VALUE",
                    help="config override applied to every system for the 'on' column (repeatable; "
                         "default sim.stream_groups=true)")
    a = ap.parse_args(argv)
    over = dict(o.split("=", 1) for o in (a.over or ["sim.stream_groups=true"]))
    if a.mode == "seed":
        a.devices = a.devices or [128]
        seed(a, over)
    else:
        a.devices = a.devices or [32, 64]
        grid(a, over)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
