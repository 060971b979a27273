"""How well does `asp simulate --calibrate` reproduce real runs? Measured vs simulated, per phase.

    python benchmarks/bench_calibration.py RUN_DIR [RUN_DIR ...]
    python benchmarks/bench_calibration.py --cross RUN_DIR RUN_DIR [RUN_DIR ...] [--tolerance 15]

``--cross`` (out of sample): fit the cost model on each run and replay every *other* run's jobs
with it (its prompts, lengths, placement and admission order, its own mode, lag bound and
``max_num_seqs``), e.g. fit on async fifo, predict async asp with the mechanisms and the sync run,
and the other way round; prints the mean iteration time measured vs predicted for every
(fit, predicted) pair, the diagonal being the in-sample replay, and the phases of each pair.

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


def cross(run_dirs: list[str], tolerance: float) -> dict:
    """Fit on each run, replay every run with it: {(fit run, predicted run): phases frame}."""
    tls = {d: Timeline.read_jsonl(Path(d) / "timeline.jsonl") for d in run_dirs}
    fits = {d: cal.fit_timeline(tl) for d, tl in tls.items()}
    out = {}
    for f in run_dirs:
        print(f"== fit on {Path(f).name}: " + ", ".join(f"{k}={v:.4g}" for k, v in fits[f].items()
                                                        if isinstance(v, float)))
        for d in run_dirs:
            df = rp.compare_phases(tls[d], rp.replay(tls[d], fits[f], **rp.run_settings(d)))
            out[(f, d)] = df
            print(f"   -- predict {Path(d).name}{' (in sample)' if d == f else ''}")
            print("\n".join("   " + line for line in rp.format_phases(df)))
    names = [Path(d).name for d in run_dirs]
    w = max(12, *map(len, names))
    print(f"\nmean iteration time, predicted vs measured (rows: fitted on; columns: predicted run; "
          f"* = out of sample and off by more than {tolerance:g} %):")
    print(f"  {'fit on':{w}s} " + " ".join(f"{n:>{w}s}" for n in names))
    print(f"  {'measured':{w}s} " + " ".join(f"{out[(run_dirs[0], d)].loc['iteration_time', 'measured_s']:>{w - 1}.3f}s"
                                            for d in run_dirs))
    for f, n in zip(run_dirs, names):
        cells = []
        for d in run_dirs:
            r = out[(f, d)].loc["iteration_time"]
            miss = d != f and abs(r["error_pct"]) > tolerance
            cells.append(f"{r['simulated_s']:.3f}s {r['error_pct']:+6.1f}%{'*' if miss else ' '}".rjust(w))
        print(f"  {n:{w}s} " + " ".join(cells))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--cross", action="store_true", help="fit on each run, predict every other (out of sample)")
    ap.add_argument("--tolerance", type=float, default=15.0, help="%% error that marks an out-of-sample miss")
    args = ap.parse_args(argv)
    if args.cross:
        cross(args.run_dirs, args.tolerance)
        return 0
    summary = {d: bench(d) for d in args.run_dirs}
    print("\nmean iteration time error (simulated vs measured, %):")
    names = list(next(iter(summary.values())))
    print(f"  {'run':40s} " + " ".join(f"{n:>22s}" for n in names))
    for d, errs in summary.items():
        print(f"  {Path(d).name:40s} " + " ".join(f"{errs[n]:+21.1f}%" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
