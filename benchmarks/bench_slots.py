"""Where rollout's slot-time goes: per simulated run, the seconds an instance holds fewer sequences
than its ``max_num_seqs``, split by cause (docs/scheduler.md, "Beyond the four workloads", item 4).

    python benchmarks/bench_slots.py [--workloads bimodal] [--devices 64] [--plan-seeds 0 1 2]
                                     [--set rollout.max_num_seqs=32 scheduler.pull_forward=rounded]

For fifo as shipped, fifo with asp's trainer-side rules (regroup, heaviest first, streaming) and asp's
defaults (``--set`` on top of every row), from the simulator's request and sync records: per iteration,
in seconds of all slots (slot-seconds / (instances x max_num_seqs) / iterations; the columns sum to
the run time / iterations), the time the slots hold sequences (running or waiting: vLLM's own queue)
and the time they are free because

- lag-blocked: groups are left to admit, none of them admissible yet (the lag bound waits for a
  publish); also how much of that falls before the first publish (the pipeline fill);
- waiting: an admissible group is queued (on another instance, or arriving: admission latency);
- sync: a weight sync pauses the instances while groups are left;
- drain: nothing is left to admit (the run's end);

and the least / most lag-blocked instance's share. Means over the planner seeds (fifo runs once).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

CAUSES = ("busy", "lag_blocked", "waiting", "sync", "drain")


def slot_time(req, sync, *, num_instances: int, max_num_seqs: int, lag_bound: int) -> dict:
    """Slot-seconds of one run by cause (``CAUSES``), ``fill_lag`` (lag-blocked before the first
    publish) and ``lag_by_instance`` (lag-blocked slot-seconds per instance). ``req``: the timeline's
    request frame (one row per sequence: iteration, instance, prompt_id, t_admit, t_finish); ``sync``:
    its sync frame (t_start, t_end, version). Iteration i is admissible once version i - k is
    published (the end of its sync)."""
    grp = req.groupby(["epoch", "prompt_id"]).agg(it=("iteration", "first"), ta=("t_admit", "min"))
    pub = sync.groupby("version")["t_end"].max()
    n_it = int(grp["it"].max()) + 1
    open_at = np.array([0.0 if i - lag_bound <= 0 else float(pub.get(i - lag_bound, np.inf)) for i in range(n_it)])
    g_open = np.sort(open_at[grp["it"].to_numpy()])
    g_adm = np.sort(grp["ta"].to_numpy())
    t_end = float(req["t_finish"].max())
    cuts = np.unique(np.concatenate([req["t_admit"].to_numpy(), req["t_finish"].to_numpy(), g_open[np.isfinite(g_open)],
                                     sync["t_start"].to_numpy(), sync["t_end"].to_numpy(), [0.0, t_end]]))
    cuts = cuts[(cuts >= 0.0) & (cuts <= t_end)]
    mid, dt = (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)
    admitted = np.searchsorted(g_adm, mid, side="right")
    left = g_adm.size - admitted                                        # groups not yet admitted
    admissible = np.searchsorted(g_open, mid, side="right") - admitted   # ... of them admissible now
    paused = np.zeros(mid.shape, dtype=bool)
    for a, b in zip(sync["t_start"].to_numpy(), sync["t_end"].to_numpy()):
        paused |= (mid >= a) & (mid < b)
    first_pub = float(pub.get(1, np.inf))
    out = {c: 0.0 for c in CAUSES}
    out["fill_lag"] = 0.0
    per = []
    inst, ta, tf = req["instance"].to_numpy(), req["t_admit"].to_numpy(), req["t_finish"].to_numpy()
    for r in range(num_instances):
        on = inst == r
        held = (np.searchsorted(np.sort(ta[on]), mid, side="right")
                - np.searchsorted(np.sort(tf[on]), mid, side="right"))
        free = np.clip(max_num_seqs - held, 0, None) * dt
        lag = free * ((left > 0) & ~paused & (admissible <= 0))
        out["busy"] += float((np.minimum(held, max_num_seqs) * dt).sum())
        out["lag_blocked"] += float(lag.sum())
        out["waiting"] += float((free * (~paused & (admissible > 0))).sum())
        out["sync"] += float((free * ((left > 0) & paused)).sum())
        out["drain"] += float((free * (left == 0)).sum())
        out["fill_lag"] += float((lag * (mid < first_pub)).sum())
        per.append(float(lag.sum()))
    out["lag_by_instance"] = per
    return out


def rows():
    from tail_common import ASP_DEFAULTS, HEAVY, OFF, REGROUP

    return [("fully_async_fifo (as shipped)", "fully_async_fifo", OFF),
            ("fifo + rules (regroup, heaviest first, streaming)", "fully_async_fifo",
             {**OFF, **REGROUP, **HEAVY, "pipeline.stream_groups": "on"}),
            ("asp's defaults", "asp", ASP_DEFAULTS)]


def main(argv=None) -> int:
    from tail_common import SEED_FREE, cell_args, plan_seed_cells, table_head

    a = cell_args(argv, __doc__.splitlines()[0], "bimodal", "every row", "rollout.max_num_seqs=32")
    print(f"planner seeds {', '.join(map(str, a.plan_seeds))}; per iteration, seconds of all slots, mean (min .. max) "
          f"over the seeds ({' and '.join(SEED_FREE)} run once)\n")
    table_head("| workload | devices | system | iter. time (s) | slots busy | lag-blocked (of it before the first "
               "publish) | waiting | sync | drain | lag-blocked, least / most blocked instance |")
    for D, wl, run in plan_seed_cells(a, workloads_outer=True):
        for label, name, over in rows():
            got = []
            for s in (a.plan_seeds[:1] if name in SEED_FREE else a.plan_seeds):
                res, cfg = run(name, over, s, result=True)
                S, R, n = cfg.rollout.max_num_seqs, res.spec.num_instances, res.summary["iterations"]
                st = slot_time(res.timeline.frame("request"), res.timeline.frame("sync"), num_instances=R,
                               max_num_seqs=S, lag_bound=cfg.pipeline.lag_bound)
                norm = {k: st[k] / (R * S * n) for k in (*CAUSES, "fill_lag")}
                norm["least"], norm["most"] = (min(st["lag_by_instance"]) / (S * n), max(st["lag_by_instance"]) / (S * n))
                norm["time"] = res.summary["iteration_time_mean"]
                got.append(norm)

            def f(k):
                xs = [g[k] for g in got]
                m = sum(xs) / len(xs)
                return f"{m:.1f}" if len(xs) == 1 else f"{m:.1f} ({min(xs):.1f} .. {max(xs):.1f})"
            print(f"| {wl} | {D} | {label} | {f('time')} | {f('busy')} | {f('lag_blocked')} ({f('fill_lag')}) | "
                  f"{f('waiting')} | {f('sync')} | {f('drain')} | {f('least')} / {f('most')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
