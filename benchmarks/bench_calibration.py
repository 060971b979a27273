"""How well does `asp simulate --calibrate` reproduce real runs? Measured vs simulated, per phase.

    python benchmarks/bench_calibration.py RUN_DIR [RUN_DIR ...]

For each finished `asp train` run directory: fit the cost model to its timeline.jsonl, simulate
the run's own jobs (its prompts, response lengths, iterations, mini-batches, instances and
admission order; :func:`asp_ascend.sim.replay.replay`) and print the mean of each
per-iteration phase, measured vs simulated, for three fits:

- ``request-fit``: the earlier method (decode from per-request mean step times, prefill from
  the lower envelope of first-token latency), no runtime overheads;
- ``step-fit``: decode and prefill from the reconstructed engine steps, no runtime overheads;
- ``step-fit + overheads``: the same plus the fitted step/admission latencies and the trainer's
  share of a sync (what `asp simulate --calibrate` uses).

Figures are printed, not asserted. Imports no torch/ray/vllm.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asp_ascend.metrics.timeline import Timeline  # noqa: E402
from asp_ascend.sim import calibrate as cal  # noqa: E402
from asp_ascend.sim import replay as rp  # noqa: E402
from asp_ascend.sim.decode_fit import fit_decode_requests  # noqa: E402


def bench(run_dir: str) -> dict:
    tl = Timeline.read_jsonl(Path(run_dir) / "timeline.jsonl")
    kw = rp.run_settings(run_dir)
    fit = cal.fit_timeline(tl)
    old = dict(fit, **fit_decode_requests(tl.frame("request")))
    rows = {"request-fit": rp.compare_phases(tl, rp.replay(tl, old, overheads=False, **kw)),
            "step-fit": rp.compare_phases(tl, rp.replay(tl, fit, overheads=False, **kw)),
            "step-fit + overheads": rp.compare_phases(tl, rp.replay(tl, fit, **kw))}
    print(f"== {run_dir}  ({len(tl.frame('request'))} requests, {len(tl.frame('sync'))} syncs, "
          f"mode {'sync' if kw['sync_mode'] else 'async'}, lag bound {0 if kw['sync_mode'] else kw['lag_bound']}, "
          f"max_num_seqs {kw['max_num_seqs']})")
    print("   fit: " + ", ".join(f"{k}={v:.4g}" for k, v in fit.items() if isinstance(v, float)))
    print(f"   request-fit (earlier method): decode_a={old['decode_a']:.4g} decode_c={old['decode_c']:.4g} "
          f"prefill_per_token={old['prefill_per_token']:.4g} R^2={old['decode_r2']:.3f}")
    for name, df in rows.items():
        print(f"   -- {name}")
        print("\n".join("   " + line for line in rp.format_phases(df)))
    return {k: float(v.loc["iteration_time", "error_pct"]) for k, v in rows.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    args = ap.parse_args(argv)
    summary = {d: bench(d) for d in args.run_dirs}
    print("\nmean iteration time error (simulated vs measured, %):")
    names = list(next(iter(summary.values())))
    print(f"  {'run':40s} " + " ".join(f"{n:>22s}" for n in names))
    for d, errs in summary.items():
        print(f"  {Path(d).name:40s} " + " ".join(f"{errs[n]:+21.1f}%" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
