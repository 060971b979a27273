"""The analytic estimate of `asp schedule` beside the event simulator (issue 14's target: within 10 %).

    python benchmarks/bench_schedule_estimate.py [--n 4096] [--data DIR] [--predictor mean]
    python benchmarks/bench_schedule_estimate.py --seed-setups [--n 4096] [--devices 128]
    python benchmarks/bench_schedule_estimate.py --breakdown ROW [--drawn]   (ROW: 7b:asp_auto, 32b:fifo, code:asp, ...)
    ... [--set KEY=VALUE ...]   (config overrides for the estimate and the simulator alike)

For each workload (synthetic heavy tail; the Azure conversation and code traces of DIR, default
../shared/data) and policy: the mean iteration time the analytic estimate gives
(``schedule_report.json``: ``realized``, i.e. the schedule judged on the true lengths, and the
baselines) beside the event simulator's on the same workload, cost model, predictions and policy;
their ratio; and each one's gain of ASP over ``fifo``. The last line prints the worst ratio.
The simulator plans through the same planner; it executes with its own dispatch (guided,
shared queue for fifo/random/sorted) and samples each group's G lengths. Figures, not asserts.

``--seed-setups``: configs/sim_7b.yaml and sim_32b.yaml at ``--devices`` (their split rule, their
model's cost model at its tensor-parallel size, asp's lossless mechanisms), one history and one
simulated epoch: ``asp schedule``'s estimate (``schedule_report.json``'s ``realized``, and its
``fifo`` baseline) beside the simulator for asp with ``scheduler.concurrency`` auto (the configs')
and full, and for ``fully_async_fifo``. The estimate gets the simulated system's own coefficients
(``cost.*`` = one TP instance's decode and prefill, the trainer's per-token cost on its devices,
``rollout.num_instances`` = its instances, ``rollout.kv_cache_tokens`` = its KV capacity).

``--breakdown ROW``: one row taken apart per iteration (``asp_ascend/metrics/floor.py``'s terms):
for the iteration's last-finishing (critical) group, its wait after V_{i-k}, its latency alone, what
running beside other sequences added, and the trainer's time after it to V_{i+1}, the estimate's
beside the simulator's; then each term summed over the iterations whose periods make up V_n (n - 1,
n - 1 - (k + 1), ...) and divided by n, so the four add up to the difference in mean iteration
time. ROW: ``7b`` or ``32b`` (the seed setups) with ``asp_auto``, ``asp_full`` or ``fifo``; or
``syn8``, ``syn32``, ``conv``, ``code`` (the workloads above) with a policy. ``--drawn``: the estimate
on the simulator's drawn lengths (each group's sample mean, longest / mean), no cap left to apply.

``--set``: config overrides applied to every row, the estimate's config and the simulator's alike
(e.g. ``pipeline.stream_groups=off pipeline.regroup_heavy=off``: asp's trainer-side rules as they
were before they became its defaults).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIM_NAME = {"asp": "asp", "fifo": "fully_async_fifo", "random": "async_random", "sorted": "async_sorted",
            "balanced": "async_balanced"}


SKIPPED: list[str] = []  # the traces setups() did not find, named beside the worst ratio


def setups(data: Path, only: str | None = None):
    rows = {"syn8": ("synthetic heavy tail, R=8", ["workload.type=synthetic"], 8),
            "syn32": ("synthetic heavy tail, R=32", ["workload.type=synthetic"], 32)}
    for key, row in rows.items():
        if only in (None, key):
            yield row
    for name, scale, R in (("conv", 6, 32), ("code", 8, 16)):
        if only not in (None, name):
            continue
        trace = data / f"azure_llm_trace_2023_{name}.csv"
        if trace.exists():
            yield (f"Azure {name} trace x{scale}, R={R}",
                   ["workload.type=trace", f"workload.trace_path={trace}", f"workload.length_scale={scale}"], R)
        else:
            SKIPPED.append(name)
            print(f"({trace} not found: {name} trace skipped; pass --data DIR, the folder of the Azure trace CSVs)")


LOSSLESS = ["scheduler.dispatch=guided", "scheduler.reestimate=true", "rollout.tail_concurrency=off"]


def seed_config(model: str, devices: int, n: int, extra: list[str], overrides: tuple = ()):
    """(simulator config, estimate config) of configs/sim_<model>.yaml at ``devices``: the second
    states the first's simulated costs as ``cost.*`` of a custom model class (same simulation)."""
    from asp_ascend.config import load_config
    from asp_ascend.sim.run import costs_for, sweep_split, system_for

    path = ROOT / "configs" / f"sim_{model}.yaml"
    Dr = sweep_split(load_config(path, []), devices)
    common = [f"sim.total_devices={devices}", f"sim.rollout_devices={Dr}", f"workload.num_prompts={n}",
              "workload.epochs=2", "sim.epochs=1", "output_dir=unused"] + LOSSLESS + extra + list(overrides)
    cfg = load_config(path, common)
    spec = system_for(cfg, "asp")
    c = costs_for(cfg, spec)
    R, cm = spec.num_instances, c.instance
    custom = [f"cost.decode_a={cm.decode_a!r}", f"cost.decode_b={cm.decode_b!r}", f"cost.decode_c={cm.decode_c!r}",
              f"cost.prefill_per_token={cm.prefill_per_token!r}", f"cost.train_per_token={c.train_per_token!r}",
              "cost.logprob_per_token=0.0", f"cost.train_per_step={c.train_per_step!r}", f"cost.sync_s={c.sync_s!r}",
              f"rollout.kv_cache_tokens={c.kv_capacity}", f"rollout.num_instances={R}", "sim.model_class=custom",
              "sim.infer_tp=1", f"sim.rollout_devices={R}", f"sim.total_devices={R + spec.train_devices}"]
    return cfg, load_config(path, common + custom)


def seed_setups(a) -> None:
    """The estimate beside the simulator on the seed setups (see the module docstring)."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.scheduler.run import build_schedule
    from asp_ascend.sim.run import simulate_system

    print(f"{'setup':8s} {'system':28s} {'analytic s':>10s} {'simulated s':>11s} {'ratio':>6s} {'admits':>6s}")
    worst = 1.0
    for model in ("7b", "32b"):
        for label, extra in (("asp, concurrency auto", []), ("asp, concurrency full", ["scheduler.concurrency=full"])):
            cfg, est_cfg = seed_config(model, a.devices, a.n, extra, a.set)
            w = workload_from_config(cfg)
            _, rep = build_schedule(est_cfg, compare=label.endswith("auto"))
            rows = [(label, rep["realized"], simulate_system(cfg, w, "asp", record_samples=False).summary)]
            if "baselines" in rep:
                rows.append(("fully_async_fifo", rep["baselines"]["fifo"],
                             simulate_system(cfg, w, "fully_async_fifo", record_samples=False).summary))
            for name, an, sim in rows:
                x, y = an["iteration_time_mean"], sim["iteration_time_mean"]
                worst = x / y if abs(x / y - 1) > abs(worst - 1) else worst
                print(f"sim_{model:4s} {name:28s} {x:10.1f} {y:11.1f} {x / y:6.3f} {sim['admission_concurrency']:6d}",
                      flush=True)
    print(f"worst analytic / simulated iteration time: {worst:.3f} (target within 0.90..1.10)")


def workload_config(a, ov: list[str], R: int):
    """The config of one workload row (module docstring)."""
    from asp_ascend.config import load_config

    common = [f"workload.num_prompts={a.n}", "lengths.max_response_length=8192", "train.global_batch_size=512",
              "train.mini_batch_size=64", "rollout.max_num_seqs=256", "pipeline.lag_bound=1", "output_dir=unused",
              "workload.epochs=2", "sim.epochs=1", "sim.model_class=custom", "sim.infer_tp=1", "sim.logprob_passes=1",
              f"lengths.predictor={a.predictor}"]
    return load_config(None, common + ov + [f"rollout.num_instances={R}", f"sim.total_devices={2 * R}",
                                            f"sim.rollout_devices={R}"] + a.set)


def breakdown(a) -> None:
    """One row's estimate beside the simulator, term by term (module docstring)."""
    from dataclasses import replace

    import numpy as np
    import pandas as pd

    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.metrics.floor import floor_breakdown, group_table
    from asp_ascend.scheduler import run as srun
    from asp_ascend.sim.run import simulate_system

    where, pol = a.breakdown.split(":")
    if where in ("7b", "32b"):
        if pol not in ("asp_auto", "asp_full", "fifo"):
            raise SystemExit(f"--breakdown {a.breakdown}: a seed setup takes asp_auto, asp_full or fifo")
        cfg, ecfg = seed_config(where, a.devices, a.n, ["scheduler.concurrency=full"] if pol == "asp_full" else [],
                                a.set)
        pol = "fifo" if pol == "fifo" else "asp"
    else:
        rows = list(setups(Path(a.data), where))
        if not rows or pol not in SIM_NAME:
            raise SystemExit(f"--breakdown {a.breakdown}: expected syn8|syn32|conv|code:{'|'.join(SIM_NAME)}")
        cfg = ecfg = workload_config(a, rows[0][1], rows[0][2])
    inp = srun.inputs_from_config(ecfg)
    if pol == "asp":
        ecfg = replace(ecfg, rollout=replace(ecfg.rollout, max_num_seqs=srun.planned_concurrency(ecfg, inp)))
    cols = srun.plan_epoch_columns(ecfg, inp, pol)
    res = simulate_system(cfg, workload_from_config(cfg), SIM_NAME[pol], record_samples=False)
    req = res.timeline.frame("request")
    g = group_table(req)
    solo = pd.Series(res.costs.instance.group_latency_exact(g["prompt_length"].to_numpy(float),
                                                            np.array(g["response_lengths"].tolist(), dtype=float)),
                     index=g.index)
    k = srun.lag_bound_of(ecfg)
    sim = floor_breakdown(req, res.timeline.frame("sync"), solo, k).set_index("iteration")
    lengths = inp.truth
    if a.drawn:   # the simulator's samples: their mean and longest / mean per group, already cut at the cap
        drawn = req.assign(pid=req["prompt_id"].astype(str)).groupby("pid")["response_length"].agg(["mean", "max"])
        drawn = drawn.reindex(np.asarray(inp.prompt_ids).astype(str))
        lengths = drawn["mean"].to_numpy(float)
        inp = replace(inp, group_max_factor=(drawn["max"] / drawn["mean"]).to_numpy(float))
        ecfg = replace(ecfg, lengths=replace(ecfg.lengths, max_response_length=0))
    e = srun.estimate_schedule(ecfg, cols, inp, lengths, pol, groups=True)
    it = np.asarray(cols["iteration"]) - np.min(cols["iteration"])
    V, gr = e["versions"], e["groups"]
    n = int(it.max()) + 1
    print(f"{a.breakdown}{' (drawn lengths)' if a.drawn else ''}: analytic {e['iteration_time_mean']:.1f} s, "
          f"simulated {res.summary['iteration_time_mean']:.1f} s; per iteration, analytic / simulated (s):")
    print(f"{'i':>3} {'wait':>13} {'alone':>15} {'beside':>13} {'after':>13} {'period':>15}")
    terms = {}
    pub = np.r_[0.0, np.sort(res.timeline.frame("sync")["t_end"].to_numpy(float))]
    for i in range(n):
        if i not in sim.index:
            continue
        m = np.flatnonzero(it == i)
        j = m[np.argmax(gr["finish"][m])]
        st, fin, alone = gr["start"][j], gr["finish"][j], gr["solo"][j]
        q = sim.loc[i]
        est = (st - V[max(0, i - k)], alone, fin - st - alone, V[i + 1] - fin)
        got = (q["critical_wait"], q["critical_solo"], q["critical_latency"] - q["critical_solo"], q["after"])
        terms[i] = np.subtract(est, got)
        print(f"{i:3d} " + " ".join(f"{x:6.1f}/{y:6.1f}" for x, y in zip(est, got)) +
              f" {V[i + 1] - V[i]:7.1f}/{pub[i + 1] - pub[i]:7.1f}")
    chain = [terms[i] for i in range(n - 1, -1, -(k + 1)) if i in terms]
    tot = np.sum(chain, axis=0) / n
    print("analytic - simulated, per iteration over V_n's periods: " +
          ", ".join(f"{name} {x:+.2f}" for name, x in zip(("wait", "alone", "beside", "after"), tot)) +
          f" = {tot.sum():+.2f} s")


def main() -> None:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.scheduler.run import build_schedule
    from asp_ascend.sim.run import simulate_system

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--predictor", default="mean", help="lengths.predictor (mean = previous epoch)")
    ap.add_argument("--seed-setups", action="store_true",
                    help="configs/sim_7b.yaml and sim_32b.yaml at --devices instead of the workloads above")
    ap.add_argument("--devices", type=int, default=128, help="--seed-setups: total devices")
    ap.add_argument("--breakdown", metavar="ROW", help="one row term by term (7b:asp_auto, 32b:fifo, code:asp, ...)")
    ap.add_argument("--drawn", action="store_true", help="--breakdown: the estimate on the simulator's drawn lengths")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for every row, estimate and simulator alike")
    a = ap.parse_args()
    if a.breakdown:
        return breakdown(a)
    if a.seed_setups:
        return seed_setups(a)
    print(f"{'workload':30s} {'policy':9s} {'analytic s':>10s} {'simulated s':>11s} {'ratio':>6s} "
          f"{'gain vs fifo: analytic':>22s} {'simulated':>9s}")
    worst, n_rows = 1.0, 0
    for name, ov, R in setups(Path(a.data)):
        cfg = workload_config(a, ov, R)
        _, rep = build_schedule(cfg)
        analytic = {"asp": rep.get("realized", rep["predicted"]), **rep["baselines"]}
        w = workload_from_config(cfg)
        sim = {p: simulate_system(cfg, w, SIM_NAME[p], record_samples=False).summary for p in SIM_NAME}
        fa, fs = analytic["fifo"]["iteration_time_mean"], sim["fifo"]["iteration_time_mean"]
        for p in SIM_NAME:
            x, y = analytic[p]["iteration_time_mean"], sim[p]["iteration_time_mean"]
            worst = x / y if abs(x / y - 1) > abs(worst - 1) else worst
            n_rows += 1
            print(f"{name:30s} {p:9s} {x:10.1f} {y:11.1f} {x / y:6.3f} {100 * (1 - x / fa):21.1f}% "
                  f"{100 * (1 - y / fs):8.1f}%", flush=True)
    skipped = f"; NOT the {' and '.join(SKIPPED)} trace (not found under --data)" if SKIPPED else ""
    print(f"worst analytic / simulated iteration time: {worst:.3f} of {n_rows} rows{skipped} "
          f"(target within 0.90..1.10)")


if __name__ == "__main__":
    main()
