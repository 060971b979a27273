"""Where a system's trainer waits: per iteration of one simulated run, from the timeline.

    python benchmarks/bench_tail_waits.py [--workload azure_code_x8] [--systems asp fully_async_fifo]
                                          [--mismatch decode_b=10] [--devices 32] [--prompts 4096]
                                          [--over pipeline.regroup=on]

The ablation's setup (``bench_tail.py``: 8 rollout instances per 32 devices, G = 8, k = 1,
previous-epoch predictions; asp with its lossless defaults, the baselines as they ship), executed
on the true costs of ``--mismatch`` (``sim.run.Mismatch`` fields). Per iteration: when the trainer
could start it (``ready``: the version it trains was published and the previous iteration trained),
when its last group was generated, when its training ended, the seconds the trainer stood idle
inside it (and on which mini-batch), and the group generated last: its longest sample, admission
time, latency and mini-batch, and how long the trainer still trained after it. ``--over``: config
overrides on top of every system's (e.g. ``pipeline.regroup=true``). Prints markdown.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tail_common import LOSSLESS, OFF, ROOT, WORKLOADS, _cfg  # noqa: E402

OVERRIDES = {"asp": {**OFF, **LOSSLESS}}


def waits(tl) -> pd.DataFrame:
    """Per iteration of a timeline: the trainer's idle seconds and the group generated last."""
    req, st, sy = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    g = req.groupby(["iteration", "prompt_id"]).agg(t_admit=("t_admit", "min"), t_fin=("t_finish", "max"),
                                                     longest=("response_length", "max")).reset_index()
    mb = {p: int(s.mini_batch) for s in st.itertuples() for (_, p, _) in s.samples}
    g["mini_batch"] = g["prompt_id"].map(mb)
    published = dict(zip(sy["version"], sy["t_end"]))
    rows, free = [], 0.0
    for it, s_it in st.sort_values("t_start").groupby("iteration", sort=True):
        ready = free = max(free, published.get(it, 0.0))
        idle = []
        for s in s_it.sort_values("t_start").itertuples():
            if s.t_start - free > 0.05:
                idle.append(f"{s.t_start - free:.1f} (mb {s.mini_batch})")
            free = s.t_end
        gi = g[g.iteration == it]
        last = gi.loc[gi.t_fin.idxmax()]
        rows.append({"iteration": it, "ready (s)": round(ready, 1), "generated (s)": round(gi.t_fin.max(), 1),
                     "trained (s)": round(free, 1), "trainer idle (s)": ", ".join(idle) or "0",
                     "last group: longest sample": int(last.longest), "admitted (s)": round(last.t_admit, 1),
                     "latency (s)": round(last.t_fin - last.t_admit, 1), "its mini-batch": int(last.mini_batch),
                     "trained after it (s)": round(free - last.t_fin, 1)})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import Mismatch, simulate_system

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="azure_code_x8", choices=list(WORKLOADS))
    ap.add_argument("--systems", nargs="+", default=["asp", "fully_async_fifo"])
    ap.add_argument("--mismatch", nargs="*", default=[], help="Mismatch fields, e.g. decode_b=10 concurrency=2")
    ap.add_argument("--devices", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--over", nargs="*", default=[], help="config overrides for every system, e.g. pipeline.regroup=true")
    args = ap.parse_args(argv)
    extra = dict(x.split("=", 1) for x in args.over)
    mm = Mismatch(**{k: float(v) for k, v in (x.split("=") for x in args.mismatch)})
    w = workload_from_config(_cfg(args.workload, args.data, args.prompts, args.devices, {}))
    for name in args.systems:
        cfg = _cfg(args.workload, args.data, args.prompts, args.devices, {**OVERRIDES.get(name, OFF), **extra})
        res = simulate_system(cfg, w, name, record_samples=True, mismatch=mm)
        df = waits(res.timeline)
        idle = sum(float(x.split(" ")[0]) for cell in df["trainer idle (s)"] if cell != "0" for x in cell.split(", "))
        print(f"\n{name} {' '.join(args.over)} on {args.workload}, {args.devices} devices, {mm}: mean iteration "
              f"{res.summary['iteration_time_mean']:.1f} s, trainer idle {idle:.1f} s in all\n")
        print("| " + " | ".join(df.columns) + " |")
        print("|" + "---|" * len(df.columns))
        for row in df.itertuples(index=False):
            print("| " + " | ".join(str(x) for x in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
