"""The pipeline fill: where iteration 0's time goes, and what steering the next iteration could gain.

    python benchmarks/bench_fill.py probe [--data DIR] [--devices 64] [--workloads azure_conv_x6 azure_code_x8]
                                          [--plan-seeds 0 1 2 3 4] [--set scheduler.fill_first=false]
    python benchmarks/bench_fill.py steer [--by oracle | predicted] [--top 1] [--workloads azure_conv_x6] ...
    python benchmarks/bench_fill.py cap   [--caps 0.5 0.75] ...
    python benchmarks/bench_fill.py first [--devices 32] [--workloads reasoning bimodal azure_code_x8 azure_conv_x6] ...

The ablation's setup (``bench_tail.py``: 8 rollout instances per 32 devices, G = 8, k = 1,
previous-epoch predictions, 4,096 prompts), asp's defaults (``tail_common.ASP_DEFAULTS``) and
fifo with asp's trainer-side rules (regroup, heaviest first, streaming).

``probe``: per system and planner seed, for iterations 0 and 1: the publish V_{i+1}, the critical
(last-finishing) group's latency alone (``CostModel.group_latency_exact``) and in the run, its
instance, ``metrics/floor.corunning``'s terms (what the other sequences' tokens on its instance
cost it: its own iteration's, the next's, the prompts prefilled there; ``even``: the window's tokens
spread evenly), the trainer's first step and its idle time inside the iteration, and the critical
group's rank by predicted length within its iteration (1 = predicted longest).

``steer``: asp's defaults run twice per seed; the second run's plan moves iteration 1's groups
planned on the chosen instances to the other instances in turn (a measurement variant of the
plan's placement: the jobs are changed between planning and simulation, the library is not). The
instances: ``oracle``, those of iteration 0's ``--top`` last-finishing groups in the first run (what
no executor knows before the run); ``predicted``, those of iteration 0's ``--top`` predicted-longest
groups (what the plan knows). Prints the mean iteration time and the ends of iterations 0 and 1.

``cap``: a measurement variant of the simulator's admission (``Engine._has_room`` wrapped):
until the first version is published, an instance admits a group of a later iteration than 0 only
while it holds fewer than ``cap`` x max_num_seqs sequences; asp's defaults, mean over the seeds
against fifo as shipped.

``first``: asp's defaults with ``scheduler.fill_first`` (the default: no later group ranked into the
run's first window) and without it, mean (per seed) over the seeds against fifo as shipped.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tail_common import ASP_DEFAULTS, HEAVY, OFF, REGROUP, ROOT, WORKLOADS, _cfg  # noqa: E402

SYSTEMS = {"asp": ("asp", ASP_DEFAULTS),
           "fifo + rules": ("fully_async_fifo", {**OFF, **REGROUP, **HEAVY, "pipeline.stream_groups": "on"})}


def _predicted(w, cfg) -> pd.Series:
    """Each prompt's predicted length as the simulator plans with it (previous-epoch predictions)."""
    from asp_ascend.sim.predictions import Predictions, epoch_split

    hist, sim = epoch_split(w, cfg.sim.epochs)
    return pd.Series(Predictions(w, cfg).predict(tuple(hist), sim[0]), index=[str(p) for p in w.prompt_ids])


def probe_rows(res, pred: pd.Series, group_size: int, iterations=(0, 1)) -> list[dict]:
    from asp_ascend.metrics.floor import corunning, group_table

    tl = res.timeline
    req, st, sy = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    cm = res.costs.instance
    c = corunning(req, cm.decode_b, cm.decode_c, res.spec.num_instances, cm.prefill_per_token,
                  cm.prefill_share(req["prompt_length"].to_numpy(float), group_size))
    g = group_table(req)
    g["pred"] = [pred[p] for p in g.index.get_level_values("prompt_id")]
    pub = dict(zip(sy["version"], sy["t_end"]))
    out = []
    for i in iterations:
        gi = g[g.iteration == i]
        key = gi["t_finish"].idxmax()
        crit = gi.loc[key]
        solo = float(cm.group_latency_exact(np.array([crit.prompt_length]), np.array([crit.response_lengths]))[0])
        ci = c[c.iteration == i].iloc[0]
        steps = st[st.iteration == i].sort_values("t_start")
        idle, free = 0.0, pub.get(i, 0.0)
        for s in steps.itertuples():
            idle += max(0.0, s.t_start - free)
            free = s.t_end
        out.append({"iteration": i, "published": pub.get(i + 1, float("nan")), "solo": solo,
                    "latency": crit.t_finish - crit.t_admit, "instance": int(crit.instance),
                    "same": ci.same, "next": ci.next, "prefill": ci.prefill, "even": ci.even,
                    "first step": steps.t_start.min(), "idle": idle,
                    "predicted rank": int((gi.pred > crit.pred).sum()) + 1})
    return out


def probe(a) -> None:
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    print("| workload | devices | system | seed | iteration | V_{i+1} (s) | critical alone (s) | critical in the run (s) | "
          "its instance | co-running: its iteration | the next | prefill | even spread | first step (s) | "
          "trainer idle in it (s) | critical's predicted rank | mean iteration (s) |")
    print("|" + "---|" * 17)
    for wl in a.workloads:
        w = workload_from_config(_cfg(wl, a.data, a.prompts, a.devices, {}))
        for label, (name, over) in SYSTEMS.items():
            for s in (a.plan_seeds if name == "asp" else a.plan_seeds[:1]):
                extra = dict(x.split("=", 1) for x in a.set) if name == "asp" else {}
                cfg = _cfg(wl, a.data, a.prompts, a.devices, {**over, **extra, "seed": s})
                res = simulate_system(cfg, w, name, record_samples=True)
                for r in probe_rows(res, _predicted(w, cfg), w.group_size):
                    print(f"| {wl} | {a.devices} | {label} | {s} | {r['iteration']} | {r['published']:.1f} | "
                          f"{r['solo']:.1f} | {r['latency']:.1f} | {r['instance']} | {r['same']:.1f} | {r['next']:.1f} | "
                          f"{r['prefill']:.1f} | {r['even']:.1f} | {r['first step']:.1f} | {r['idle']:.1f} | "
                          f"{r['predicted rank']} | {res.summary['iteration_time_mean']:.2f} |", flush=True)


@contextlib.contextmanager
def steered(instances: set):
    """Within it, simulate_system's plans move iteration 1's groups planned on ``instances`` to the others in turn."""
    from asp_ascend.sim import run as sr

    plain = sr.build_jobs

    def build_jobs(*args, **kw):
        jobs = plain(*args, **kw)
        inst = jobs.instance.copy()
        others = [r for r in range(int(inst.max()) + 1) if r not in instances]
        moved = np.flatnonzero((jobs.iteration == 1) & np.isin(inst, list(instances)))
        inst[moved] = np.array(others)[np.arange(moved.size) % len(others)]
        return replace(jobs, instance=inst)

    sr.build_jobs = build_jobs
    try:
        yield
    finally:
        sr.build_jobs = plain


def steer(a) -> None:
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.metrics.floor import group_table
    from asp_ascend.sim.run import simulate_system

    print(f"| workload | devices | seed | instances freed of iteration 1 ({a.by}, top {a.top}) | mean iteration (s) | "
          f"iteration 0 generated (s) | iteration 1 generated (s) |")
    print("|" + "---|" * 7)
    for wl in a.workloads:
        w = workload_from_config(_cfg(wl, a.data, a.prompts, a.devices, {}))
        before, after = [], []
        for s in a.plan_seeds:
            cfg = _cfg(wl, a.data, a.prompts, a.devices, {**ASP_DEFAULTS, "seed": s})
            r0 = simulate_system(cfg, w, "asp", record_samples=True)
            g0 = group_table(r0.timeline.frame("request"))
            it0 = g0[g0.iteration == 0]
            if a.by == "oracle":
                chosen = it0.sort_values("t_finish", ascending=False)
            else:
                pred = _predicted(w, cfg)
                chosen = it0.assign(pred=[pred[p] for p in it0.index.get_level_values("prompt_id")]).sort_values(
                    "pred", ascending=False, kind="stable")
            pick = set(int(x) for x in chosen.instance.head(a.top))
            with steered(pick):
                r1 = simulate_system(cfg, w, "asp", record_samples=True)
            g1 = group_table(r1.timeline.frame("request"))
            t0, t1 = r0.summary["iteration_time_mean"], r1.summary["iteration_time_mean"]
            before.append(t0)
            after.append(t1)

            def ends(g):
                return f"{g[g.iteration == 0].t_finish.max():.1f}", f"{g[g.iteration == 1].t_finish.max():.1f}"
            (a0, a1), (b0, b1) = ends(g0), ends(g1)
            print(f"| {wl} | {a.devices} | {s} | {sorted(pick)} | {t0:.2f} -> {t1:.2f} | {a0} -> {b0} | {a1} -> {b1} |",
                  flush=True)
        print(f"| {wl} | {a.devices} | mean | | {np.mean(before):.2f} -> {np.mean(after):.2f} | | |")


@contextlib.contextmanager
def fill_cap(cap: float):
    """Within it, the simulator's instances admit a later iteration's group during the fill only below ``cap``."""
    from asp_ascend.sim.engine import Engine

    plain = Engine._has_room

    def has_room(self, r):
        if not plain(self, r):
            return False
        if cap <= 0 or self.adm.published > 0:
            return True
        job = self.dispatcher.peek(r, True)
        return job is None or job.iteration == 0 or self.inst.held(r) < cap * self.mns

    Engine._has_room = has_room
    try:
        yield
    finally:
        Engine._has_room = plain


def _asp_rows(a, column: str, variants) -> None:
    """One row per workload and variant: asp's defaults (mean over --plan-seeds) against fifo.
    ``variants``: (label, config overrides, a context manager to run it in)."""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    print(f"| workload | devices | {column} | asp's defaults, mean (s) | vs fifo | per seed (s) |")
    print("|---|---|---|---|---|---|")
    for wl in a.workloads:
        w = workload_from_config(_cfg(wl, a.data, a.prompts, a.devices, {}))
        fifo = simulate_system(_cfg(wl, a.data, a.prompts, a.devices, {**OFF, "seed": 0}), w, "fully_async_fifo",
                               record_samples=False).summary["iteration_time_mean"]
        for label, over, ctx in variants:
            with ctx:
                ts = [simulate_system(_cfg(wl, a.data, a.prompts, a.devices, {**ASP_DEFAULTS, **over, "seed": s}), w,
                                      "asp", record_samples=False).summary["iteration_time_mean"] for s in a.plan_seeds]
            m = float(np.mean(ts))
            print(f"| {wl} | {a.devices} | {label} | {m:.2f} | {100 * (m / fifo - 1):+.2f} % | "
                  f"{' / '.join(f'{t:.1f}' for t in ts)} |", flush=True)


def cap(a) -> None:
    _asp_rows(a, "fill cap (x max_num_seqs; 0 = none)", [(f"{c:g}", {}, fill_cap(c)) for c in [0.0, *a.caps]])


def first(a) -> None:
    _asp_rows(a, "scheduler.fill_first",
              [(on, {"scheduler.fill_first": on}, contextlib.nullcontext()) for on in ("true", "false")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("probe", "steer", "cap", "first"))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--workloads", nargs="+", default=["azure_conv_x6", "azure_code_x8"], choices=list(WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--by", choices=("oracle", "predicted"), default="oracle")
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--caps", type=float, nargs="+", default=[0.5, 0.75])
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="probe: overrides of asp's defaults")
    a = ap.parse_args(argv)
    {"probe": probe, "steer": steer, "cap": cap, "first": first}[a.what](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
