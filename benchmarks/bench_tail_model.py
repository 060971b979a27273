"""What ``TailModel`` (scheduler/tail.py, the model ``rollout.tail_concurrency: auto`` decides with)
predicts beside what the simulator's timeline measures.

    python benchmarks/bench_tail_model.py [--data DIR] [--prompts 4096] [--devices 32 64]
                                          [--workloads reasoning ...] [--plan-seeds 0 1 2 3 4]
                                          [--set KEY=VALUE ...]

Per workload, device count and planner seed (the workloads as bench_tail.py's ablation builds
them, the workload built once with seed 0), asp's defaults (``tail_common.ASP_DEFAULTS``, then
``--set``) simulated with the per-sample timeline, beside the planner's ``TailModel`` for the same
plan (``sim.run.planned_tail_models``). Per iteration:

- period: the model's, the target's period (``target / (k + 1)``: the best its longest group
  allows); the run's, the iteration's last optimizer step's end minus the previous iteration's;
- batch beside the longest group: the model's ``target_batch`` (what an uncapped instance runs at
  that period); the run's, the mean sequences on the instance of the iteration's longest group (by
  latency: last sample finished - first admitted) over that group's life, the group's own included;
- longest group's latency: the model's for the iteration's longest predicted group beside its
  batch; the run's, that group's finish - admit; and the model's latency of the run's group (its
  longest sample and prompt) beside the batch the run measured;
- trainer after the last group: the run's iteration end minus its last group's finish (the model
  has no such term: its period is ``max(work / R, train, latency / (k + 1))``);
- (longest group's latency + trainer after the last group) / (k + 1): the model's period rule
  (latency / (k + 1)) with the trainer's time after the last group added, on the run's figures;
- iteration 0: the model's period and the run's first iteration end.

Printed: per cell, each figure's mean over the steady iterations (k + 1 up to the last but one, which
drains the pipeline), min .. max over the planner seeds. docs/scheduler.md, "What the model still
misses at 32 devices".
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tail_common as tc  # noqa: E402

ROWS = (("period (s)", "period"), ("batch beside the longest group", "batch"),
        ("longest group's latency (s)", "latency"), ("the model's latency at the run's batch (s)", "latency_at"),
        ("trainer after the last group (s)", "after"),
        ("(longest group's latency + trainer after it) / (k + 1) (s)", "chained"), ("iteration 0 (s)", "first"))


def model_of(models, i: int):
    """The epoch's TailModel that plans iteration ``i``."""
    for tm in models:
        if tm.loads.first <= i < tm.loads.first + tm.loads.work.size:
            return tm
    raise ValueError(f"iteration {i} is in no planned epoch")


def per_iteration(res, models, lag_bound: int):
    """One dict per iteration of a recorded run: the model's and the run's figures (module docstring)."""
    import numpy as np

    req, step = res.timeline.frame("request"), res.timeline.frame("step")
    g = req.groupby(["epoch", "prompt_id"]).agg(it=("iteration", "first"), inst=("instance", "first"),
                                               ta=("t_admit", "min"), tf=("t_finish", "max"),
                                               L=("response_length", "max"), p=("prompt_length", "first"))
    g["lat"] = g["tf"] - g["ta"]
    end = step.groupby("iteration")["t_end"].max()
    ta, tf, inst = (req[c].to_numpy(float) for c in ("t_admit", "t_finish", "instance"))
    rows = []
    for i in range(int(end.index.max()) + 1):
        gi = g[g["it"] == i]
        top = gi.loc[gi["lat"].idxmax()]
        on = inst == top["inst"]
        beside = float(np.clip(np.minimum(tf[on], top["tf"]) - np.maximum(ta[on], top["ta"]), 0, None).sum()
                       / top["lat"])
        tm = model_of(models, i)
        x = i - tm.loads.first
        ctx = float(tm.loads.context[x])
        batch = tm.target_batch(i)
        rows.append({
            "iteration": i,
            "period": (tm.target(i) / (lag_bound + 1), float(end[i] - (end[i - 1] if i else 0.0))),
            "batch": (batch, beside),
            "latency": (float(tm.latency(tm.loads.longest[x], tm.loads.longest_prompt[x], batch, ctx)),
                        float(top["lat"])),
            "latency_at": (float(tm.latency(top["L"], top["p"], beside, ctx)), None),
            "after": (None, float(end[i] - gi["tf"].max())),
            "chained": (None, float(top["lat"] + end[i] - gi["tf"].max()) / (lag_bound + 1)),
        })
    return rows


def cell(rows, lag_bound: int) -> dict:
    """{figure: (model, run)} means over the steady iterations (k + 1 to the last but one), and
    ``first``: iteration 0's; ``steady``: the iterations averaged."""
    steady = [r for r in rows if lag_bound + 1 <= r["iteration"] < len(rows) - 1]
    out = {"steady": (steady[0]["iteration"], steady[-1]["iteration"]) if steady else None,
           "first": rows[0]["period"]}
    for _, key in ROWS[:-1]:
        out[key] = tuple(None if not steady or steady[0][key][j] is None
                         else sum(r[key][j] for r in steady) / len(steady) for j in (0, 1))
    return out


def span(xs) -> str:
    """min .. max of ``xs`` (one figure where they print alike; ``-`` where there is none)."""
    if not xs or xs[0] is None:
        return "-"
    lo, hi = f"{min(xs):.1f}", f"{max(xs):.1f}"
    return lo if lo == hi else f"{lo} .. {hi}"


def main(argv=None) -> None:
    a = tc.cell_args(argv, __doc__.splitlines()[0], "reasoning", "asp's defaults",
                     "rollout.tail_concurrency=auto")
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import planned_tail_models, simulate_system

    extra = tc.set_overrides(a.set)
    shape = {k: v for k, v in extra.items() if k != "seed"}
    for D in a.devices:
        for wl in a.workloads:
            w = workload_from_config(tc._cfg(wl, a.data, a.prompts, D, shape))
            cells = []
            for s in a.plan_seeds:
                cfg = tc._cfg(wl, a.data, a.prompts, D, {**tc.ASP_DEFAULTS, **extra, "seed": s})
                res = simulate_system(cfg, w, "asp", record_samples=True)
                k = cfg.pipeline.lag_bound
                cells.append(cell(per_iteration(res, planned_tail_models(cfg, w, "asp"), k), k))
            steady = cells[0]["steady"]
            it = f"iterations {steady[0]}-{steady[1]}" if steady else "no steady iteration"
            print(f"\n{wl}, {D} devices, planner seeds {' '.join(map(str, a.plan_seeds))} "
                          f"({it}: per-seed means, min .. max)\n")
            print("| | model | simulator |")
            print("|---|---|---|")
            for label, key in ROWS:
                print(f"| {label} | {span([c[key][0] for c in cells])} | {span([c[key][1] for c in cells])} |",
                      flush=True)


if __name__ == "__main__":
    main()
