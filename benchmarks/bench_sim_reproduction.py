"""The reproduction table of docs/reproduction.md: ASP against the baselines, 16-128 devices.

    python benchmarks/bench_sim_reproduction.py            # simulate both setups, print the tables
    python benchmarks/bench_sim_reproduction.py --no-run   # only print, from runs/repro_* of a previous call

Runs `asp simulate configs/sim_7b.yaml` and `configs/sim_32b.yaml` (their `sim.sweep_devices`
are 16, 32, 64, 128) into runs/repro_7b and runs/repro_32b, then prints, per device count, the
seed paper's headline comparisons computed from the simulated summaries.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {"7b": "configs/sim_7b.yaml", "32b": "configs/sim_32b.yaml"}


def _load(p: Path) -> dict:
    d = json.loads(p.read_text())
    d.pop("schema_version", None)
    return d


def rows(out: Path, best: str = "asp_adaptive"):
    for p in sorted((out / "sweep").glob("devices_*/summary.json"), key=lambda q: int(q.parent.name.split("_")[1])):
        s = _load(p)
        D = int(p.parent.name.split("_")[1])
        a = s[best]

        def it_cut(base):
            return 100 * (1 - a["iteration_time_mean"] / s[base]["iteration_time_mean"])

        yield (D, a["throughput"] / s["sync_colocated"]["throughput"], it_cut("sync_colocated"), it_cut("one_step_off"),
               it_cut("fully_async_fifo"), it_cut("async_sorted"),
               s["single_instance"]["throughput"] / s["fully_async_fifo"]["throughput"] if "single_instance" in s else float("nan"),
               a["lower_bound_ratio"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="do not simulate; print from existing run directories")
    ap.add_argument("--out", default=str(ROOT / "runs"), help="parent of the repro_<model> run directories")
    args = ap.parse_args(argv)
    from asp_ascend.config import load_config
    from asp_ascend.sim.run import run_simulate

    for model, path in SETUPS.items():
        out = Path(args.out) / f"repro_{model}"
        if not args.no_run:
            run_simulate(load_config(ROOT / path, [f"output_dir={out}"]))
        print(f"\n{model} ({path}); ASP = asp_adaptive\n")
        print("| devices | throughput x sync_colocated | iter. time vs sync_colocated | vs one_step_off | "
              "vs fully_async_fifo (scheduling alone) | vs async_sorted | single / multi-instance throughput | "
              "ASP LB ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for D, x, c, o, f, srt, si, lb in rows(out):
            print(f"| {D} | {x:.2f} | {-c:+.1f}% | {-o:+.1f}% | {-f:+.1f}% | {-srt:+.1f}% | {si:.2f} | {lb:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
