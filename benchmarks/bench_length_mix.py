"""Issue 14's length-mix condition (every iteration's KS <= 0.05): where its floor is, and per seed.

    python benchmarks/bench_length_mix.py floor  [--data DIR] [--prompts 4096] [--plan-seeds 0 1 2 3 4]
                                                 [--draws 200] [--epoch-correlation 0.8 0.9 0.95] [--setups]
    python benchmarks/bench_length_mix.py target [--data DIR] [--prompts 4096] [--devices 32 64]
                                                 [--plan-seeds 0 1 2 3 4] [--set KEY=VALUE ...]

The statistic is the simulator's (``sim/mechanisms.py``: ``tail_summary``): per iteration, the
Kolmogorov-Smirnov distance of its trained samples' true response lengths to the whole run's. With
the lossless mechanisms an iteration trains exactly the plan's groups, so it is a function of the
plan's membership and the workload alone; ``floor`` computes it from the plan without simulating.

``floor``: on bench_tail.py's ablation workloads (workload built with seed 0, asp planned as the
ablation runs it, previous-epoch predictions), per planner seed the largest KS over iterations of
the plan measured on the PREDICTED lengths (what the planner controls: each sample counted at its
group's prediction, against the run's predictions) and on the true ones, and the same plan made
with ``lengths.predictor=oracle`` (each prompt's expected length this epoch). Then Monte-Carlo
floors (``--draws`` memberships each): the ideal stratified membership (prompts by descending
predicted length cut into strata of one iteration's worth of consecutive prompts, one per
iteration per stratum, at random within a stratum), stratified on the previous-epoch predictions,
on the oracle's expected lengths and on the realised group means (the statistic's own floor: only
the spread of samples within a group is left), and a random membership; per floor the mean, 5th
and 95th percentile of the largest KS over a run's iterations and the share of draws in which
every iteration is <= 0.05. ``--epoch-correlation``: the stratified floor again on workloads
whose prompts keep their length rank between epochs with that correlation
(``workload.epoch_correlation``; 0.8 by default), i.e. with better predictions, with the
predictions' Spearman correlation to the realised group means. ``--setups``: the planner's KS on
configs/sim_7b.yaml and sim_32b.yaml (two simulated epochs, drift 0.05), against the run's lengths
(the summary's figure) and against the iteration's own epoch.

``target``: issue 14's target (b) per planner seed: asp (its defaults, guided dispatch,
re-estimation and regroup, plus ``pipeline.regroup_heavy``; ``--set`` adds overrides) against
``async_sorted`` as shipped, without and with ngram speculative decoding on both sides: per seed
the largest iteration KS, throughput / async_sorted's, and whether both hold (KS <= 0.05,
throughput >= 1.00 at three decimals). Prints markdown tables.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from tail_common import HEAVY, LOSSLESS, OFF, REGROUP, SPEC, WORKLOADS, _cfg, plan_seed_cells  # noqa: E402

KS_TARGET = 0.05
ASP = {**OFF, **LOSSLESS, **REGROUP, **HEAVY}          # asp's defaults with pipeline.regroup_heavy
ASP_SPEC = {**LOSSLESS, **SPEC, **HEAVY}


def iteration_ks(iteration: np.ndarray, lengths: np.ndarray, ref: np.ndarray | None = None) -> np.ndarray:
    """KS distance of each iteration's samples to ``ref``'s (default: all of ``lengths``), in
    iteration order. ``iteration``: (n,) per group; ``lengths``: (n, G) its samples' lengths."""
    from asp_ascend.sim.mechanisms import ks_distance

    ref = np.sort((lengths if ref is None else ref).ravel())
    return np.array([ks_distance(lengths[iteration == i].ravel(), ref) for i in np.unique(iteration)])


def stratified_draw(key: np.ndarray, batch: int, rng: np.random.Generator) -> np.ndarray:
    """An ideal stratified membership: prompts by descending ``key`` cut into strata of
    ``len(key) // batch`` consecutive prompts, each stratum's prompts over the iterations in a random
    order (one per iteration). Iteration of each prompt; ``len(key)`` must be a multiple of ``batch``."""
    n = key.shape[0]
    if n % batch:
        raise ValueError(f"{n} prompts do not fill iterations of {batch}: use a multiple of the global batch")
    n_iter = n // batch
    order = np.argsort(-key, kind="stable")
    it = np.empty(n, dtype=np.int64)
    it[order] = (rng.permuted(np.tile(np.arange(n_iter), (batch, 1)), axis=1)).ravel()
    return it


def floor_stats(maxima) -> str:
    x = np.asarray(maxima, dtype=float)
    return (f"{x.mean():.3f} ({np.percentile(x, 5):.3f} .. {np.percentile(x, 95):.3f}) | "
            f"{np.mean(x <= KS_TARGET):.2f}")


def _plan(cfg, w, name: str = "asp"):
    """The jobs ``simulate_system`` would simulate for ``name`` (its plan, true lengths attached)."""
    from asp_ascend.sim import run as sr

    spec = sr.system_for(cfg, name)
    costs = sr.costs_for(cfg, spec)
    preds = sr.Predictions(w, cfg)
    spec = sr.with_admission_concurrency(cfg, spec, costs, w, preds)
    mech = sr.mechanisms_for(cfg, spec, costs, w)
    return sr.build_jobs(w, cfg, spec, sr.planning_cost(costs), preds, tail=mech.tail_concurrency,
                         speculation=mech.speculation)


def _epoch_inputs(cfg, w):
    """(predictions, oracle expected lengths, true samples) of the first simulated epoch, in workload order."""
    from asp_ascend.sim.predictions import Predictions, epoch_split

    hist, sim = epoch_split(w, cfg.sim.epochs)
    return (Predictions(w, cfg).predict(tuple(hist), sim[0]), w.mean_length[sim[0]].astype(float),
            w.samples(sim[0]).astype(float))


def _history_samples(cfg, w) -> np.ndarray:
    """(N, G) samples of the last history epoch (what the previous-epoch predictions average)."""
    from asp_ascend.sim.run import epoch_split

    hist, _ = epoch_split(w, cfg.sim.epochs)
    return w.samples(hist[-1]).astype(float)


def _spearman(a, b) -> float:
    from asp_ascend.lengths.predictors import spearman

    return spearman(a, b)


def floor(args) -> None:
    from asp_ascend.lengths.workloads import workload_from_config

    print("| workload | plan seed | KS max on predicted lengths | KS mean / max on true lengths | "
          "oracle predictions: KS mean / max |")
    print("|---|---|---|---|---|")
    mc, corr = [], []
    for wl in args.workloads:
        cfg0 = _cfg(wl, args.data, args.prompts, 32, {**ASP, "seed": 0})
        w = workload_from_config(cfg0)
        for s in args.plan_seeds:
            figs = []
            for pred in ("mean", "oracle"):
                jobs = _plan(_cfg(wl, args.data, args.prompts, 32, {**ASP, "seed": s, "lengths.predictor": pred}), w)
                ks = iteration_ks(jobs.iteration, jobs.resp.astype(float))
                if pred == "mean":
                    p = np.repeat(jobs.predicted_length[:, None], jobs.resp.shape[1], axis=1)
                    figs.append(f"{iteration_ks(jobs.iteration, p).max():.4f}")
                figs.append(f"{ks.mean():.3f} / {ks.max():.3f}")
            print(f"| {wl} | {s} | {' | '.join(figs)} |", flush=True)
        pred, oracle, true = _epoch_inputs(cfg0, w)
        hist = _history_samples(cfg0, w)
        B = cfg0.train.global_batch_size
        rng = np.random.default_rng(2026)
        keys = {"previous-epoch predictions": pred, "the history samples' log-mean": np.log(hist).mean(axis=1),
                "oracle expected lengths": oracle, "realised group means": true.mean(axis=1)}
        for label, key in keys.items():
            draws = [stratified_draw(key, B, rng) for _ in range(args.draws)]
            m = [iteration_ks(it, true).max() for it in draws]
            mc.append(f"| {wl} | stratified on {label} | {_spearman(key, true.mean(axis=1)):.3f} | {floor_stats(m)} |")
            if key is pred:  # would matching the history's samples (not only their means) help?
                h = [iteration_ks(it, hist).max() for it in draws]
                corr.append(f"{wl} {np.corrcoef(h, m)[0, 1]:+.2f}")
        m = [iteration_ks(rng.permutation(true.shape[0]) // B, true).max() for _ in range(args.draws)]
        mc.append(f"| {wl} | random membership | - | {floor_stats(m)} |")
        for rho in args.epoch_correlation:
            cfg = _cfg(wl, args.data, args.prompts, 32, {**ASP, "seed": 0, "workload.epoch_correlation": rho})
            p, _, t = _epoch_inputs(cfg, workload_from_config(cfg))
            m = [iteration_ks(stratified_draw(p, B, rng), t).max() for _ in range(args.draws)]
            mc.append(f"| {wl} | stratified on predictions, epoch correlation {rho} | "
                      f"{_spearman(p, t.mean(axis=1)):.3f} | {floor_stats(m)} |")
    print(f"\nMonte-Carlo floors ({args.draws} memberships each): largest KS over a run's iterations\n")
    print("| workload | membership | Spearman (key, realised group mean) | KS max: mean (p5 .. p95) | "
          "share with every iteration <= 0.05 |")
    print("|---|---|---|---|---|")
    for line in mc:
        print(line, flush=True)
    print("\nCorrelation over the stratified draws on the predictions of the largest KS on the history's "
          f"samples and on the true ones: {', '.join(corr)}")
    if args.setups:
        setups(args)


def setups(args) -> None:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config

    print("\n| setup | plan seed | KS mean / max against the run | against the iteration's epoch |")
    print("|---|---|---|---|")
    for model in ("7b", "32b"):
        path = ROOT / "configs" / f"sim_{model}.yaml"
        w = workload_from_config(load_config(path, []))
        for s in args.plan_seeds:
            over = [f"{k}={v}" for k, v in {**LOSSLESS, "seed": s}.items()]
            jobs = _plan(load_config(path, over), w)
            L = jobs.resp.astype(float)
            run = iteration_ks(jobs.iteration, L)
            own = np.concatenate([iteration_ks(jobs.iteration[jobs.epoch == e], L[jobs.epoch == e])
                                  for e in np.unique(jobs.epoch)])
            print(f"| sim_{model} | {s} | {run.mean():.3f} / {run.max():.3f} | {own.mean():.3f} / {own.max():.3f} |",
                  flush=True)


def target(args) -> None:
    print("| workload | devices | speculative (both) | per seed: KS max, throughput / async_sorted | "
          "seeds meeting both | seeds with KS <= 0.05 | seeds with throughput >= 1.00 |")
    print("|---|---|---|---|---|---|---|")
    extra = dict(kv.split("=", 1) for kv in args.set)       # asp's rows only: async_sorted as shipped
    cells = argparse.Namespace(**{**vars(args), "set": []})
    for D, wl, run in plan_seed_cells(cells, workloads_outer=True):
        for spec, asp_over, srt_over in (("no", ASP, OFF), ("ngram", ASP_SPEC, {**OFF, **SPEC})):
            srt = run("async_sorted", srt_over, args.plan_seeds[0])["throughput"]
            per = [run("asp", {**asp_over, **extra}, s) for s in args.plan_seeds]
            ks = [p["length_mix_ks_max"] for p in per]
            thr = [round(p["throughput"] / srt, 3) for p in per]
            ok_ks, ok_thr = [k <= KS_TARGET for k in ks], [t >= 1.0 for t in thr]
            cells = " / ".join(f"{k:.3f}, {t:.3f}" for k, t in zip(ks, thr))
            n = len(per)
            print(f"| {wl} | {D} | {spec} | {cells} | {sum(a and b for a, b in zip(ok_ks, ok_thr))} of {n} | "
                  f"{sum(ok_ks)} of {n} | {sum(ok_thr)} of {n} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("floor", "target"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096, help="prompts per epoch (a multiple of the global batch)")
    ap.add_argument("--devices", type=int, nargs="+", default=[32, 64], help="target: device counts")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--draws", type=int, default=200, help="floor: memberships per Monte-Carlo floor")
    ap.add_argument("--epoch-correlation", type=float, nargs="*", default=[0.9, 0.95],
                    help="floor: workload.epoch_correlation values of the extra stratified floors")
    ap.add_argument("--setups", action="store_true", help="floor: also the sim_7b / sim_32b configs' plans")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="target: overrides of asp's rows")
    args = ap.parse_args(argv)
    if args.draws < 1:
        ap.error(f"--draws {args.draws}: give at least 1")
    {"floor": floor, "target": target}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
