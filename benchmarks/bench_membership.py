"""Which cells does ``scheduler.membership: auto`` plan differently from ``stratified``, and what
does it change there? (docs/scheduler.md, "Settings changed several at a time", items 4-6.)

For every cell of bench_tail.py's sweep lists (``sweep``, ``sweep --more``, and ``sweep --combos 15``
with the combination seeds given), per workload and device count, asp's defaults are planned with
both memberships for every planner seed; a cell where some seed's iterations differ is simulated:
asp with ``auto``, asp with ``stratified``, fifo (once) and balanced (per seed), and its row printed
(mean (min .. max) over the seeds). Cells planned alike are counted, not simulated: the two rows
would be the same run. ``--set`` adds overrides to every cell (``workload.epochs=3`` gives every
cell a history of two epochs, so every prediction's quality is measured and ``auto`` may act).

    python benchmarks/bench_membership.py --devices 32 --lists sweep more combo0 combo1 \\
        --data ../shared/data --plan-seeds 0 1 2 [--set workload.epochs=3]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tail_combos  # noqa: E402
from tail_common import ASP_DEFAULTS, OFF, _cfg, pct, set_overrides, table_head  # noqa: E402
from tail_sweep import sweep_cells, sweep_more_cells, sweep_run  # noqa: E402

COMBOS = 15          # combinations per workload and device count, as the documented sweep --combos runs
BEHIND = 1.0         # %: a cell more than this behind fifo or balanced on the mean
WORSE = 0.5          # %: auto more than this behind stratified on the mean


def cells(wl: str, data: Path, prompts: int, D: int, lists) -> list:
    """(list, label, overrides or a function giving them, Mismatch or None) of the cells ``lists`` name
    (sweep, more, comboS for sweep --combos with --combo-seed S)."""
    out = []
    if "sweep" in lists:
        out += [("sweep", *c) for c in sweep_cells(wl, data, prompts, D)]
    if "more" in lists:
        out += [("more", *c) for c in sweep_more_cells(wl, D)[1:]]
    for name in (x for x in lists if x.startswith("combo")):
        pool = tail_combos.combo_pool(wl, data, prompts, D)
        for changes in tail_combos.draw_combos(pool, COMBOS, int(name[5:]), wl, D)[0]:
            out.append((name, *tail_combos.combo_cell(wl, data, prompts, D, changes)))
    return out


def memberships_differ(wl: str, data: Path, prompts: int, D: int, over: dict, seeds) -> list[bool]:
    """Per planner seed: do asp's defaults plan other iterations with membership auto than stratified?"""
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.predictions import Predictions
    from asp_ascend.sim.run import _planned, system_for

    w = workload_from_config(_cfg(wl, data, prompts, D, over))
    out = []
    for s in seeds:
        its = []
        for mem in ("auto", "stratified"):
            cfg = _cfg(wl, data, prompts, D, {**ASP_DEFAULTS, **over, "seed": s, "scheduler.membership": mem})
            its.append(_planned(cfg, w, system_for(cfg, "asp"), Predictions(w, cfg))[3].iteration)
        out.append(not np.array_equal(*its))
    return out


def parse(argv):
    import argparse

    from tail_common import ROOT, WORKLOADS, check_set

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                    help="directory of the Azure LLM trace CSVs")
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--devices", type=int, nargs="+", default=[64])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--plan-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lists", nargs="+", default=["sweep", "more", "combo0", "combo1"],
                    help="sweep, more (sweep --more), comboS (sweep --combos 15 --combo-seed S)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="config overrides on top of every cell (e.g. workload.epochs=3)")
    a = ap.parse_args(argv)
    check_set(ap, a.set, "workload.epochs=3")
    bad = [x for x in a.lists if x not in ("sweep", "more") and not (x.startswith("combo") and x[5:].isdigit())]
    if bad:
        ap.error(f"--lists: {', '.join(bad)} is not sweep, more or comboS (S an integer, the combination seed)")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    lists = a.lists
    extra = set_overrides(a.set)
    seeds = a.plan_seeds
    print(f"lists {' '.join(lists)}; planner seeds {', '.join(map(str, seeds))}; --set {' '.join(a.set) or '(none)'}\n")
    table_head("| workload | devices | list | cell | seeds re-planned | auto vs fifo | auto vs balanced | "
               "stratified vs fifo | stratified vs balanced | auto vs stratified |")
    counts = {}
    for D in a.devices:
        for wl in a.workloads:
            n = counts.setdefault(D, {"cells": 0, "replanned": 0, "worse": [], "better": [], "behind_auto": [],
                                      "behind_strat": []})
            for src, label, over, mm in cells(wl, a.data, a.prompts, D, lists):
                n["cells"] += 1
                try:
                    over = {**extra, **(over() if callable(over) else over)}
                    diff = memberships_differ(wl, a.data, a.prompts, D, over, seeds)
                except Exception as e:   # a refused combination is sweep's finding, not this one's
                    print(f"| {wl} | {D} | {src} | {label} | error: {type(e).__name__}: {str(e).splitlines()[0]} "
                          f"||||||", flush=True)
                    continue
                if not any(diff):
                    continue
                n["replanned"] += 1
                run = sweep_run(wl, a.data, a.prompts, D, over, mm, {})
                auto = [run("asp", {**ASP_DEFAULTS, "scheduler.membership": "auto"}, s) for s in seeds]
                strat = [run("asp", {**ASP_DEFAULTS, "scheduler.membership": "stratified"}, s) for s in seeds]
                fifo = [run("fully_async_fifo", OFF, 0)] * len(seeds)
                bal = [run("async_balanced", OFF, s) for s in seeds]

                def vs(xs, ref):
                    ys = [pct(x, r) for x, r in zip(xs, ref)]
                    return float(np.mean(ys)), f"{np.mean(ys):+.1f} % ({min(ys):+.1f} .. {max(ys):+.1f})"
                (af, afs), (ab, abs_), (sf, sfs), (sb, sbs), (d, ds) = (
                    vs(auto, fifo), vs(auto, bal), vs(strat, fifo), vs(strat, bal), vs(auto, strat))
                print(f"| {wl} | {D} | {src} | {label} | {sum(diff)} of {len(seeds)} | {afs} | {abs_} | {sfs} | {sbs} | "
                      f"{ds} |", flush=True)
                where = f"{wl} / {D} / {label}"
                if d > WORSE:
                    n["worse"].append(f"{where}: {d:+.1f} %")
                elif d < -WORSE:
                    n["better"].append(where)
                if max(af, ab) > BEHIND:
                    n["behind_auto"].append(f"{where}: {af:+.1f} / {ab:+.1f} %")
                if max(sf, sb) > BEHIND:
                    n["behind_strat"].append(f"{where}: {sf:+.1f} / {sb:+.1f} %")
    for D, n in counts.items():
        print(f"\n{D} devices: {n['cells']} cells, {n['replanned']} planned differently by auto; auto more than "
              f"{WORSE:g} % ahead of stratified in {len(n['better'])}, behind in {len(n['worse'])}"
              f"{': ' + '; '.join(n['worse']) if n['worse'] else ''}")
        print(f"  of those, more than {BEHIND:g} % behind fifo or balanced on the mean: auto {len(n['behind_auto'])}"
              f"{' (' + '; '.join(n['behind_auto']) + ')' if n['behind_auto'] else ''}, stratified "
              f"{len(n['behind_strat'])}{' (' + '; '.join(n['behind_strat']) + ')' if n['behind_strat'] else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
