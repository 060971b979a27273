"""How well does `asp simulate --calibrate` reproduce real runs? Measured vs simulated, per phase.

    python benchmarks/bench_calibration.py RUN_DIR [RUN_DIR ...]
    python benchmarks/bench_calibration.py --cross RUN_DIR RUN_DIR [RUN_DIR ...] [--tolerance 15]
        [--one-sync-mean] [--no-tail-caps] [--no-admit-each] [--explain] [--json PATH]
    python benchmarks/bench_calibration.py --decode-split RUN_DIR [RUN_DIR ...]

``--cross`` (out of sample): fit the cost model on each run and replay every *other* run's jobs
with it (its prompts, lengths, placement and admission order, its own mode, lag bound and
``max_num_seqs``), e.g. fit on async fifo, predict async asp with the mechanisms and the sync run,
and the other way round; prints the mean iteration time measured vs predicted for every
(fit, predicted) pair, the diagonal being the in-sample replay, and the phases of each pair.
Run directories with the same name under different parents (``A/async_fifo_seed0`` and
``B/async_fifo_seed0``: the same config run twice) are also compared with each other: the
measured run-to-run difference of each phase and of the fitted coefficients, the machine's noise
that an out-of-sample error has to be read against. The **noise floor** of a system (run
directories named ``<system>_seed<S>``) is the largest relative difference of the measured mean
iteration time between two runs of it with the same seed (and, printed beside it, with other
seeds): a pair off by more than ``--tolerance`` is marked ``~`` where its error is within the
predicted system's same-seed floor, ``*`` where it is beyond it. ``--one-sync-mean`` fits the weight sync as
one mean (no ``sync_busy_s`` term, the fit before that term) to show what the term changes;
``--no-tail-caps`` replays without the runs' recorded tail caps (``sim/replay.recorded_caps``), to
show what modelling them changes; ``--no-admit-each`` sets every fit's ``admit_each_s`` (an
admission's hand-over to its engine, one at a time per instance) to 0, the replay before that term. ``--explain`` prints, for each out-of-sample miss, the error with one group of coefficients
(decode, trainer, sync, overheads) taken from the predicted run's own fit: the terms that carry
the miss. ``--json PATH`` also writes the table.

``--decode-split`` looks at the decode fit's own rows (the reconstructed engine intervals,
``sim/decode_fit.step_intervals``, without the idle and sync-overlapping ones): per run, measured
over fitted time of the intervals that overlap an optimizer step and of those that do not (does
the trainer slow the instance?), of the intervals that hold an admission stamp and of those that
do not, and the per-admission cost a fit with a fifth column (admission stamps per interval)
finds; then, for every pair of runs, the fitted run's four- and five-column fits' prediction of
the other run's decode time (fitted / measured), split the same way.

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
import re
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


def one_sync_mean(fit: dict, tl: Timeline) -> dict:
    """``fit`` with the weight sync as one mean over all the run's syncs (no ``sync_busy_s``)."""
    sy = tl.frame("sync")
    return dict(fit, sync_s=float((sy["t_end"] - sy["t_start"]).mean()) if not sy.empty else fit["sync_s"],
                sync_busy_s=0.0)


COEFS = ("decode_a", "decode_b", "decode_c", "prefill_per_token", "admit_engine_s", "train_per_token", "train_per_step",
         "sync_s", "sync_busy_s",
         "step_latency_s", "publish_s", "admit_latency_s", "admit_each_s")


def _label(d: str, run_dirs: list[str]) -> str:
    p = Path(d)
    twice = sum(Path(x).name == p.name for x in run_dirs) > 1
    return f"{p.parent.name}/{p.name}" if twice else p.name


def noise(run_dirs: list[str], fits: dict, out: dict) -> list[dict]:
    """Same-named runs (the same config run twice): measured phase and fitted coefficient differences."""
    rows = []
    for i, a in enumerate(run_dirs):
        for b in run_dirs[i + 1:]:
            if Path(a).name != Path(b).name:
                continue
            ma, mb = out[(a, a)]["measured_s"], out[(b, b)]["measured_s"]
            rows.append({"run": Path(a).name, "a": a, "b": b,
                         "phases": {k: [float(ma[k]), float(mb[k]), float(100 * (mb[k] - ma[k]) / ma[k]) if ma[k] else None]
                                    for k in ma.index},
                         "coefs": {k: [fits[a].get(k), fits[b].get(k)] for k in COEFS}})
    if rows:
        print("\nrun-to-run noise: the same config and seed run twice (measured, first run -> second run):")
        for r in rows:
            ph = r["phases"]
            print(f"  {r['run']}: " + ", ".join(f"{k} {v[0]:.3f} -> {v[1]:.3f} s ({v[2]:+.1f} %)" for k, v in ph.items()
                                                 if v[2] is not None))
            print("    fitted: " + ", ".join(f"{k} {v[0]:.4g} -> {v[1]:.4g}" for k, v in r["coefs"].items()
                                           if v[0] is not None and v[1] is not None))
    return rows


def _system(d: str) -> tuple[str, str]:
    """(system, seed) of a run directory named ``<system>_seed<S>`` (bench_convergence's names)."""
    m = re.fullmatch(r"(.+)_seed(\d+)", Path(d).name)
    return (m.group(1), m.group(2)) if m else (Path(d).name, "")


def noise_floor(run_dirs: list[str], measured: dict) -> dict:
    """Run-to-run spread of the measured mean iteration time, per system (the run directory's name
    without ``_seed<S>``): over repeats of the same config and seed (same-named directories under
    different parents) and over the same config with other seeds. The spread of a set is the
    largest ``|m_a - m_b| / m_b`` over its ordered pairs: what a prediction of run b from run a
    would be off by if the model were perfect and run a's time were the prediction. A prediction
    of run b cannot be judged closer than the spread of b's own config (its noise floor)."""
    by_sys: dict = {}
    for d in run_dirs:
        sysname, seed = _system(d)
        by_sys.setdefault(sysname, []).append((seed, d))

    def spread(pairs):
        v = [abs(measured[a] - measured[b]) / measured[b] * 100 for a, b in pairs if measured[b]]
        return max(v) if v else None

    out = {}
    for sysname, runs in by_sys.items():
        same = [(a, b) for sa, a in runs for sb, b in runs if a != b and sa == sb]
        other = [(a, b) for sa, a in runs for sb, b in runs if a != b and sa != sb]
        out[sysname] = {"runs": {d: measured[d] for _, d in runs},
                        "same_seed_pct": spread(same), "same_seed_pairs": len(same) // 2,
                        "other_seed_pct": spread(other), "other_seed_pairs": len(other) // 2,
                        "any_pct": spread(same + other)}
    return out


def print_noise_floor(floor: dict) -> None:
    print("\nnoise floor: run-to-run spread of the measured mean iteration time (largest |m_a - m_b| / m_b "
          "over the pairs of runs of one system):")
    print(f"  {'system':16s} {'runs (measured s)':40s} {'same seed':>16s} {'other seeds':>16s}")
    for sysname, f in floor.items():
        runs = ", ".join(f"{v:.3f}" for v in f["runs"].values())
        cell = (lambda p, n: "-" if p is None else f"{p:5.1f} % ({n} pr)")
        print(f"  {sysname:16s} {runs:40s} {cell(f['same_seed_pct'], f['same_seed_pairs']):>16s} "
              f"{cell(f['other_seed_pct'], f['other_seed_pairs']):>16s}")


TERMS = {"decode": ("decode_a", "decode_b", "decode_c", "prefill_per_token", "admit_engine_s"),
         "trainer": ("train_per_token", "train_per_step"),
         "sync": ("sync_s", "sync_busy_s"),
         "overheads": ("step_latency_s", "publish_s", "admit_latency_s", "admit_each_s")}


def explain(run_dirs: list[str], tls: dict, fits: dict, out: dict, tolerance: float, caps: bool = True) -> dict:
    """For each out-of-sample pair off by more than ``tolerance``: the mean iteration time error
    with one group of coefficients (:data:`TERMS`) taken from the predicted run's own fit instead,
    the others left at the fitted run's: how much of the miss each group carries."""
    res = {}
    misses = [(f, d) for f in run_dirs for d in run_dirs
              if f != d and abs(float(out[(f, d)].loc["iteration_time", "error_pct"])) > tolerance]
    if not misses:
        return res
    print(f"\nmisses by term (error with one group of coefficients from the predicted run's own fit):")
    for f, d in misses:
        row = {"fitted": float(out[(f, d)].loc["iteration_time", "error_pct"])}
        for name, keys in TERMS.items():
            fit = dict(fits[f], **{k: fits[d].get(k) for k in keys})
            df = rp.compare_phases(tls[d], rp.replay(tls[d], fit, tail_caps=caps, **rp.run_settings(d)))
            row[name] = float(df.loc["iteration_time", "error_pct"])
        res[(f, d)] = row
        print(f"  {_label(f, run_dirs)} -> {_label(d, run_dirs)}: {row['fitted']:+.1f} %; with its own "
              + ", ".join(f"{k} {v:+.1f} %" for k, v in row.items() if k != "fitted"))
    return res


def cross(run_dirs: list[str], tolerance: float, one_mean: bool = False, json_path: str | None = None,
          explain_misses: bool = False, caps: bool = True, admit_each: bool = True) -> dict:
    """Fit on each run, replay every run with it: {(fit run, predicted run): phases frame}."""
    tls = {d: Timeline.read_jsonl(Path(d) / "timeline.jsonl") for d in run_dirs}
    fits = {d: cal.fit_timeline(tl) for d, tl in tls.items()}
    if one_mean:
        fits = {d: one_sync_mean(f, tls[d]) for d, f in fits.items()}
    if not admit_each:
        fits = {d: dict(f, admit_each_s=0.0) for d, f in fits.items()}
    out = {}
    for f in run_dirs:
        print(f"== fit on {Path(f).name}: " + ", ".join(f"{k}={v:.4g}" for k, v in fits[f].items()
                                                        if isinstance(v, float))
              + (" (admit_engine_s: the hand-over, no admission in the step fit's rows)"
                 if fits[f].get("admit_engine_from") == "handover" else ""))
        for d in run_dirs:
            df = rp.compare_phases(tls[d], rp.replay(tls[d], fits[f], tail_caps=caps, **rp.run_settings(d)))
            out[(f, d)] = df
            print(f"   -- predict {Path(d).name}{' (in sample)' if d == f else ''}")
            print("\n".join("   " + line for line in rp.format_phases(df)))
    names = [_label(d, run_dirs) for d in run_dirs]
    measured = {d: float(out[(d, d)].loc["iteration_time", "measured_s"]) for d in run_dirs}
    floor = noise_floor(run_dirs, measured)
    floor_of = {d: floor[_system(d)[0]]["same_seed_pct"] for d in run_dirs}

    def verdict(f, d):
        err = abs(float(out[(f, d)].loc["iteration_time", "error_pct"]))
        if d == f or err <= tolerance:
            return "ok"
        return "within noise" if floor_of[d] is not None and err <= floor_of[d] else "miss"

    w = max(12, *map(len, names))
    print(f"\nmean iteration time, predicted vs measured (rows: fitted on; columns: predicted run; "
          f"out of sample and off by more than {tolerance:g} %: * beyond the predicted system's noise floor, "
          f"~ within it; noise floor: the same config and seed run again, below):")
    print(f"  {'fit on':{w}s} " + " ".join(f"{n:>{w}s}" for n in names))
    print(f"  {'measured':{w}s} " + " ".join(f"{measured[d]:>{w - 1}.3f}s" for d in run_dirs))
    print(f"  {'noise floor':{w}s} " + " ".join(("-" if floor_of[d] is None else f"{floor_of[d]:.1f} %").rjust(w)
                                              for d in run_dirs))
    for f, n in zip(run_dirs, names):
        cells = []
        for d in run_dirs:
            r = out[(f, d)].loc["iteration_time"]
            mark = {"ok": " ", "within noise": "~", "miss": "*"}[verdict(f, d)]
            cells.append(f"{r['simulated_s']:.3f}s {r['error_pct']:+6.1f}%{mark}".rjust(w))
        print(f"  {n:{w}s} " + " ".join(cells))
    print_noise_floor(floor)
    rows = noise(run_dirs, fits, out)
    terms = explain(run_dirs, tls, fits, out, tolerance, caps) if explain_misses else {}
    if json_path:
        from asp_ascend.io import write_json_atomic

        write_json_atomic(Path(json_path), {
            "schema_version": 1, "tolerance_pct": tolerance, "one_sync_mean": one_mean, "tail_caps": caps,
            "admit_each": admit_each,
            "runs": dict(zip(names, run_dirs)),
            "fits": {n: {k: fits[d].get(k) for k in (*COEFS, "admit_engine_from")} for n, d in zip(names, run_dirs)},
            "iteration_time": {fn: {dn: {"measured_s": float(out[(f, d)].loc["iteration_time", "measured_s"]),
                                         "predicted_s": float(out[(f, d)].loc["iteration_time", "simulated_s"]),
                                         "error_pct": float(out[(f, d)].loc["iteration_time", "error_pct"]),
                                         "verdict": verdict(f, d)}
                                    for dn, d in zip(names, run_dirs)} for fn, f in zip(names, run_dirs)},
            "phases": {fn: {dn: {k: {c: (None if v != v else float(v)) for c, v in r.items()}
                                 for k, r in out[(f, d)].iterrows()}
                            for dn, d in zip(names, run_dirs)} for fn, f in zip(names, run_dirs)},
            "noise_floor": {k: dict(v, runs={_label(d, run_dirs): m for d, m in v["runs"].items()})
                            for k, v in floor.items()},
            "noise": rows,
            "explain": {f"{_label(f, run_dirs)} -> {_label(d, run_dirs)}": v for (f, d), v in terms.items()}})
        print(f"wrote {json_path}")
    return out


def _decode_rows(run_dir: str):
    """The decode fit's rows of a run: X (steps, contexts, running counts, prompt tokens), admission
    stamps per interval, share of each interval spent in an optimizer step, durations."""
    import numpy as np

    from asp_ascend.sim.decode_fit import step_intervals

    tl = Timeline.read_jsonl(Path(run_dir) / "timeline.jsonl")
    req, sy, st = tl.frame("request"), tl.frame("sync"), tl.frame("step")
    iv, _ = step_intervals(req)
    use = iv["k"].notna() & (iv["n_through"] > 0)
    t0, t1 = iv["t0"].to_numpy(float), iv["t1"].to_numpy(float)
    for s0, s1 in zip(sy.get("t_start", []), sy.get("t_end", [])):
        use &= ~((t0 < s1) & (t1 > s0))
    iv = iv[use]
    t0, t1 = iv["t0"].to_numpy(float), iv["t1"].to_numpy(float)
    adm = iv["A"].to_numpy(float)
    train = np.zeros(len(iv))
    for s0, s1 in zip(st.get("t_start", []), st.get("t_end", [])):
        train += np.clip(np.minimum(t1, s1) - np.maximum(t0, s0), 0, None)
    return iv[["k", "C", "N", "P"]].to_numpy(float), adm, train / (t1 - t0), iv["y"].to_numpy(float)


def decode_split(run_dirs: list[str]) -> dict:
    """``--decode-split`` (module doc). Returns {run: per-run figures, (fit run, run): ratios}."""
    import numpy as np

    from asp_ascend.sim.decode_fit import fit_total

    rows = {d: _decode_rows(d) for d in run_dirs}
    fits, out = {}, {}

    def ratio(pred, y, m):
        return float(pred[m].sum() / y[m].sum()) if m.any() else float("nan")

    print("decode fit rows: measured / fitted time, per run (own four-column fit)")
    for d, (X, A, tr, y) in rows.items():
        c4 = fit_total(X, y)
        c5 = fit_total(np.column_stack([X, A]), y)
        fits[d] = (c4, c5)
        p4 = X @ c4
        busy, idle, with_a = tr > 0.5, tr == 0, A > 0
        out[d] = {"rows": int(len(y)), "admissions_in_rows": int(A.sum()), "admission_time_share": float(y[with_a].sum() / y.sum()),
                  "trainer_busy": 1 / ratio(p4, y, busy), "trainer_idle": 1 / ratio(p4, y, idle),
                  "with_admission": 1 / ratio(p4, y, with_a), "without_admission": 1 / ratio(p4, y, ~with_a),
                  "per_admission_s": float(c5[4])}
        o = out[d]
        print(f"  {_label(d, run_dirs)}: {o['rows']} rows; during an optimizer step {o['trainer_busy']:.3f}, "
              f"without one {o['trainer_idle']:.3f}; with an admission stamp {o['with_admission']:.3f} "
              f"({o['admissions_in_rows']} admissions, {100 * o['admission_time_share']:.0f} % of the time), "
              f"without {o['without_admission']:.3f}; five-column fit: {1e3 * o['per_admission_s']:.2f} ms per admission")
    print("decode time of each run predicted by each fit (fitted / measured; four columns, five columns; "
          "all rows, rows with an admission stamp, rows without):")
    for f in run_dirs:
        c4, c5 = fits[f]
        for d, (X, A, tr, y) in rows.items():
            p4, p5 = X @ c4, np.column_stack([X, A]) @ c5
            m = A > 0
            r = [ratio(p, y, s) for p in (p4, p5) for s in (np.ones_like(m), m, ~m)]
            out[(f, d)] = r
            print(f"  {_label(f, run_dirs)} -> {_label(d, run_dirs)}: four {r[0]:.3f} ({r[1]:.3f}, {r[2]:.3f}); "
                  f"five {r[3]:.3f} ({r[4]:.3f}, {r[5]:.3f})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--cross", action="store_true", help="fit on each run, predict every other (out of sample)")
    ap.add_argument("--tolerance", type=float, default=15.0, help="%% error that marks an out-of-sample miss")
    ap.add_argument("--one-sync-mean", action="store_true",
                    help="--cross: fit the sync as one mean (no sync_busy_s), to see what that term changes")
    ap.add_argument("--no-tail-caps", action="store_true",
                    help="--cross: replay without the runs' recorded tail caps (the replay before it modelled them)")
    ap.add_argument("--no-admit-each", action="store_true",
                    help="--cross: replay with admit_each_s = 0 (the replay before that term)")
    ap.add_argument("--explain", action="store_true",
                    help="--cross: for each miss, the error with each group of coefficients from the predicted run's fit")
    ap.add_argument("--json", default=None, help="--cross: also write the table to this JSON file")
    ap.add_argument("--decode-split", action="store_true",
                    help="the decode fit's rows split by trainer overlap and admissions, and each fit's "
                         "prediction of every run's decode time")
    args = ap.parse_args(argv)
    if args.decode_split:
        decode_split(args.run_dirs)
        return 0
    if args.cross:
        cross(args.run_dirs, args.tolerance, args.one_sync_mean, args.json, args.explain, not args.no_tail_caps,
              not args.no_admit_each)
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
