"""bench_tail.py's floors (its docstring documents them): where a simulated run's iterations go
beside their lag floor (``floor_terms``, ``steady_floor``: DESIGN 5's terms and the critical
group's wait, co-running and the trainer after it), the publish floor of its iterations
(``chain_inputs``, ``bound_terms``), and the subcommands that print them: ``bound`` (how far
below fifo any schedule could go) and ``breakdown`` (asp on the seed setups). robustness --floor
and --chain (tail_robustness.py) and bench_tail_corun.py price the same terms."""
from __future__ import annotations

from tail_ablation import ABLATION
from tail_common import (SEED_FREE, mean_present, na, na_cells, plan_seed_cells, print_na_notes, seed_cfg, seed_runs,
                         set_overrides, table_head)

def steady_floor(b, lag_bound: int):
    """(the steady iterations' rows, from k + 1 on; their floor terms per iteration, / (k + 1)) of
    ``floor_terms``'s breakdown ``b``: the longest group alone, the critical group's wait, what
    running beside other sequences added, critical alone - longest alone, the trainer after the
    last group, and the sequences beside the critical group (not divided). Every term is None when
    there is no steady iteration (a mean over none would be nan)."""
    k1 = lag_bound + 1
    m = b[b["iteration"] >= k1]
    if m.empty:
        return m, dict.fromkeys(("floor", "wait", "beside", "alone", "after", "seqs"))
    return m, {"floor": m["floor_group_solo"].mean() / k1, "wait": m["critical_wait"].mean() / k1,
               "beside": (m["critical_latency"] - m["critical_solo"]).mean() / k1,
               "alone": (m["critical_solo"] - m["floor_group_solo"]).mean() / k1, "after": m["after"].mean() / k1,
               "seqs": m["critical_beside"].mean()}


def no_steady_why(wl: str, prompts: int, iterations: int, cfg) -> str:
    """Why a run of ``wl`` at ``prompts`` prompts (config ``cfg``) has no steady iteration (from
    k + 1 on) to average over, and the size that has one: k + 2 iterations over ``sim.epochs``
    epochs of ``train.global_batch_size`` prompts an iteration (printed by ``print_na_notes``)."""
    k1, gbs, E = cfg.pipeline.lag_bound + 1, cfg.train.global_batch_size, cfg.sim.epochs
    need = gbs * -(-(k1 + 1) // E)
    return (f"{wl} at {prompts} prompts runs {iterations} iteration(s) ({E} epoch(s) of {gbs} prompts an "
            f"iteration); the steady ones start at k + 1 = {k1}: needs --prompts >= {need}")


def floor_terms(res, cfg, cost=None):
    """(per-iteration floor breakdown, DESIGN 5's terms per iteration) of a simulated run; beside the
    decode-work and trainer terms, ``shortest``: the iteration's shortest group alone. ``cost``: the
    instances' true cost model where it differs from the planned one (a robustness cell's
    ``Mismatch.cost``), else the run's own."""
    import numpy as np
    import pandas as pd

    from asp_ascend.metrics.floor import floor_breakdown, group_table

    tl, cm = res.timeline, cost or res.costs.instance
    req = tl.frame("request")
    g = group_table(req)
    solo = pd.Series(cm.group_latency_exact(g["prompt_length"].to_numpy(float),
                                            np.array(g["response_lengths"].tolist(), dtype=float)), index=g.index)
    b = floor_breakdown(req, tl.frame("sync"), solo, cfg.pipeline.lag_bound)
    # DESIGN 5's decode-work and trainer terms, as sim/bounds.py computes them
    it = req["iteration"].to_numpy()
    n_it = int(it.max()) + 1
    tok = np.bincount(it, weights=req["response_length"].to_numpy(float), minlength=n_it)
    ctx = np.bincount(it, weights=(req["prompt_length"] + req["response_length"] / 2.0).to_numpy(float),
                      minlength=n_it) / np.maximum(np.bincount(it, minlength=n_it), 1)
    conc = np.full(n_it, float(max(cfg.rollout.max_num_seqs, res.summary["admission_concurrency"])))
    if res.costs.kv_capacity:
        conc = np.maximum(1.0, np.minimum(conc, res.costs.kv_capacity / np.maximum(ctx, 1.0)))
    decode = tok / (res.spec.num_instances * cm.peak_throughput(conc, ctx))
    st = tl.frame("step")
    train = np.bincount(st["iteration"].to_numpy(np.int64), weights=(st["t_end"] - st["t_start"]).to_numpy(float),
                        minlength=n_it)
    shortest = solo.groupby(g["iteration"]).min().reindex(range(n_it)).to_numpy(float)
    return b, pd.DataFrame({"decode": decode, "train": train, "shortest": shortest})


# bound's systems (ABLATION rows): fifo as shipped, asp's defaults, fifo with asp's trainer-side rules
BOUND_ROWS = [r for r in ABLATION if r[0] in (
    "fully_async_fifo (as shipped)", "+ streaming groups into the trainer (pipeline.stream_groups: asp's lossless default)",
    "fully_async_fifo + regroup heaviest first + streaming (asp's trainer-side defaults)")]


def chain_inputs(res, cfg, cost=None):
    """(floor_terms's breakdown and terms, then per iteration of the run the trainer's busy time:
    its optimizer steps plus the weight sync, and its floor: the longest group alone plus that
    sync, and iteration 0's shortest group alone): what ``metrics.floor.publish_floor`` chains.
    ``cost``: the instances' true cost model where it differs from the planned one."""
    b, terms = floor_terms(res, cfg, cost)
    sy, n = res.timeline.frame("sync"), res.summary["iterations"]
    sync = (sy["t_end"] - sy["t_start"]).groupby(sy["version"]).sum().reindex(range(1, n + 1)).to_numpy(float)
    busy = terms["train"].to_numpy()[:n] + sync
    floor = b.set_index("iteration")["floor_group_solo"].reindex(range(n)).to_numpy(float) + sync
    return b, terms, busy, floor, float(terms["shortest"].iloc[0])


def bound_terms(res, cfg, cost=None) -> dict:
    """Per iteration of one simulated run (seconds): the iteration time; the trainer's busy time
    (its optimizer steps plus the weight syncs: a trainer that never waited would take this), its
    idle time before its first step (the pipeline fill) and after it; the means of the LB_i terms
    (decode work, trainer, the longest group alone / (k + 1); ``floor_terms``) and sum LB_i /
    iterations (the summary's ``lower_bound_ratio``'s denominator); and ``chain``: the last publish
    ``metrics.floor.publish_floor`` allows these iterations / iterations (the trainer's busy time,
    each iteration's longest group alone plus its sync within k + 1 periods, the shortest group of
    iteration 0 alone before the first step). ``cost``: the instances' true cost model where it
    differs from the planned one (a ``--combo-only`` cell's unplanned-cost change)."""
    from asp_ascend.metrics.floor import publish_floor

    b, terms, busy, floor, shortest = chain_inputs(res, cfg, cost)
    tl, sm = res.timeline, res.summary
    st = tl.frame("step")
    n, W = sm["iterations"], sm["run_time_s"]
    first = st["t_first"].fillna(st["t_start"]) if "t_first" in st else st["t_start"]
    fill = float(first.min()) - float(tl.frame("request")["t_admit"].min())
    chain = publish_floor(busy, floor, cfg.pipeline.lag_bound, shortest)[-1]
    return {"time": sm["iteration_time_mean"], "busy": busy.sum() / n, "fill": fill / n,
            "idle": (W - busy.sum() - fill) / n, "decode": float(terms["decode"].mean()),
            "train": float(terms["train"].mean()), "floor": float(b["floor_group_solo"].mean()) / (cfg.pipeline.lag_bound + 1),
            "lb": W / sm["lower_bound_ratio"] / n, "ratio": sm["lower_bound_ratio"], "chain": chain / n}


def _bound_cells(args):
    """(devices, workload, run(policy, overrides, seed) -> (SimResult, config), the true cost model of
    a result or None) of bound, workloads outer: the ablation's setup, or with ``--combo-only`` that
    combination of sweep's changes on it (tail_combos.combo_cells)."""
    import functools

    if args.combo_only:
        from tail_combos import combo_cells

        for D, wl, _label, run, cost in combo_cells(args, workloads_outer=True):
            yield D, wl, run, cost
        return
    for D, wl, run in plan_seed_cells(args, workloads_outer=True):
        yield D, wl, functools.partial(run, result=True), lambda res: None


def bound(args) -> None:
    """How far any schedule could go below fifo (bench_tail.py's docstring): per workload and system, the
    trainer's busy time, sum LB_i and the publish floor beside the iteration time, each as room left
    vs fifo."""
    import numpy as np

    if args.combo_only:
        print(f"bound --combo-only {args.combo_only!r}: the ablation's setup with these changes (as sweep --combos "
              f"runs the cell; floors on its true costs)")
    print(f"planner seeds {', '.join(map(str, args.plan_seeds))}: means over them ({' and '.join(SEED_FREE)} run "
          f"once; the publish floor's room also min .. max); seconds per iteration; room left = 1 - bound / fifo's "
          f"iteration time\n")
    table_head("| workload | devices | system | iter. time (s) | vs fifo | trainer busy: steps + syncs (s) | "
               "trainer idle: fill / after it (s) | LB_i terms: decode work / trainer / longest alone / (k+1) (s) | "
               "sum LB_i / iterations (s) | lower_bound_ratio | publish floor / iterations (s) | "
               "room left vs fifo: trainer busy / sum LB_i / publish floor |")
    for D, wl, run, true_cost in _bound_cells(args):
        res = seed_runs(run, args.plan_seeds, BOUND_ROWS)
        fifo = None
        for label, name, _over in BOUND_ROWS:
            terms = [bound_terms(*r, true_cost(r[0])) for r in res[label]]
            t = {k: float(np.mean([x[k] for x in terms])) for k in terms[0]}
            fifo = fifo or t["time"]
            room = [100 * (1 - x["chain"] / fifo) for x in terms]
            spread = "" if name in SEED_FREE or len(room) == 1 else f" ({min(room):.1f} .. {max(room):.1f})"
            print(f"| {wl} | {D} | {label} | {t['time']:.1f} | {100 * (t['time'] / fifo - 1):+.1f}% | {t['busy']:.1f} | "
                  f"{t['fill']:.1f} / {t['idle']:.1f} | {t['decode']:.1f} / {t['train']:.1f} / {t['floor']:.1f} | "
                  f"{t['lb']:.1f} | {t['ratio']:.3f} | {t['chain']:.1f} | {100 * (1 - t['busy'] / fifo):.1f} % / "
                  f"{100 * (1 - t['lb'] / fifo):.1f} % / {100 * (1 - t['chain'] / fifo):.1f} %{spread} |", flush=True)


def breakdown(args) -> None:
    """asp's iterations beside their lag floor on the seed setups (bench_tail.py's docstring); ``n/a``, and why
    under the table, where a run has no steady iteration or no iteration of a kind."""
    from asp_ascend.lengths.workloads import workload_from_config

    table_head("| setup | plan seed | iter. time (s) | bound LB_i (s) | floor: longest alone / (k+1) | decode-work term | "
               "trainer term | critical group's wait | beside other sequences | critical alone - longest alone | "
               "trainer after the last group | critical = longest | sequences beside the critical group | "
               "last step forced (its groups = those not generated when the step before began) | "
               "trainer after the last group: forced / other iterations | last step (s): forced / other | "
               "last step's tokens / the iteration's mean step: forced / other | heavy_first moves |")
    notes = []
    over = set_overrides(args.set)
    for model in ("7b", "32b"):
        for D in args.devices:
            setup = f"sim_{model} ({D})"
            w = workload_from_config(seed_cfg(model, D, args.prompts, {**over, "seed": 0}))
            runs = []
            for s in args.plan_seeds:
                cfg = seed_cfg(model, D, args.prompts, {**over, "seed": s})
                row, n, why, per_iteration = breakdown_run(cfg, w, f"sim_{model}", args.prompts)
                notes.append(why)
                runs.append((row, n))
                print(_breakdown_row(setup, str(s), row, n), flush=True)
                if args.per_iteration and per_iteration is not None:
                    print(per_iteration.round(2).to_string(index=False))
            if len(runs) > 1:
                print(_breakdown_row(setup, "mean", *breakdown_mean(runs)), flush=True)
    print_na_notes(notes)


def breakdown_run(cfg, w, setup: str, prompts: int):
    """(breakdown's values of asp simulated on ``w`` with ``cfg``, its steady iterations (from k + 1
    on), "" or why it has none (every value but its time, bound and moves is then None), and its
    per-iteration table, None without steady iterations)."""
    from asp_ascend.metrics.floor import last_steps
    from asp_ascend.sim.run import simulate_system

    res = simulate_system(cfg, w, "asp", record_samples=False)
    b, terms = floor_terms(res, cfg)
    k1 = cfg.pipeline.lag_bound + 1
    m, st = steady_floor(b, cfg.pipeline.lag_bound)
    sm = res.summary
    time, moves = sm["iteration_time_mean"], sm.get("regrouped_heavy_first", 0)
    bound = time / sm["lower_bound_ratio"]
    if m.empty:     # every column but the run's time, bound and moves is over the steady iterations
        return [time, bound, *([None] * 16), moves], 0, no_steady_why(setup, prompts, int(sm["iterations"]), cfg), None
    t = terms.iloc[m["iteration"].to_numpy()]
    ls = last_steps(res.timeline.frame("request"), res.timeline.frame("step"))
    ls = ls[ls["iteration"] >= k1].merge(m[["iteration", "after"]], on="iteration")
    f, o = ls[ls["left_at_last_but_one"] >= ls["last_groups"]], ls[ls["left_at_last_but_one"] < ls["last_groups"]]
    row = [time, bound, st["floor"], t["decode"].mean(), t["train"].mean(), st["wait"], st["beside"], st["alone"],
           st["after"], m["critical_is_floor_group"].mean(), st["seqs"],
           len(f) / max(len(ls), 1), *(_mean_or_none(x["after"] / k1) for x in (f, o)),
           *(_mean_or_none(x[c]) for c in ("last_step_s", "last_tokens_share") for x in (f, o)), moves]
    per_iteration = (b.assign(**{c: terms[c].to_numpy()[b["iteration"].to_numpy()] for c in terms})
                     .merge(ls.drop(columns="after"), on="iteration", how="left"))
    return row, len(m), "", per_iteration


def breakdown_mean(runs) -> tuple[list, float]:
    """The mean line of one setup's ``runs`` ((values, steady iterations) per planner seed): per
    column the mean over the seeds that have it (``mean_present``), and the mean steady-iteration
    count of the seeds that have steady iterations (those its steady columns average; 0 if none)."""
    counts = [n for _, n in runs if n]
    return mean_present([row for row, _ in runs]), sum(counts) / len(counts) if counts else 0


def _mean_or_none(x) -> float | None:
    """The mean of ``x``, None when it is empty (no iteration of that kind: ``n/a``, not nan)."""
    return float(x.mean()) if len(x) else None


def _breakdown_row(setup: str, seed: str, r: list, n: float) -> str:
    """One breakdown line from its values (breakdown's order); ``n``: the run's steady iterations
    (the mean line: their mean over the seeds, at one decimal where it is not whole); ``n/a`` for None."""
    return (f"| {setup} | {seed} | {na_cells(r[:9])} | {na(r[9], '.0f', 100)}{' %' * (r[9] is not None)} "
            f"of {round(n, 1):g} | "
            f"{na(r[10])} | {na(r[11], '.0f', 100)}{' %' * (r[11] is not None)} | {na(r[12])} / {na(r[13])} | "
            f"{na(r[14])} / {na(r[15])} | "
            f"{na(r[16], '.2f')} / {na(r[17], '.2f')} | {na(r[18], '.0f')} |")
