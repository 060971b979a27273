"""bench_tail.py's ``sweep`` (its docstring documents it): asp's defaults against fifo, balanced
and fifo with asp's trainer-side rules on settings none of them was tuned on, one thing changed
at a time from each workload's ablation setup (SWEEP_KEYS, the device count, decode and trainer
costs known to the planner or not: ``custom_costs``, ``sweep_cells``)."""
from __future__ import annotations

from pathlib import Path

from tail_common import (ASP_DEFAULTS, BASE, HEAVY, OFF, REGROUP, WORKLOADS, _cfg, _run, pct, seed_runs, set_overrides,
                         table_head)

SWEEP_BEHIND = 1.0    # %: a cell where asp's mean iteration time is more than this above fifo's or balanced's

# sweep: asp's defaults against the baselines on settings none of them was tuned on (one key at a time
# from each workload's ablation setup); "fifo + rules" is fifo with asp's trainer-side rules (regroup,
# heaviest first, streaming), so "asp vs fifo + rules" is what asp's dispatch adds on top of them
SWEEP_ROWS = [("asp", "asp", ASP_DEFAULTS), ("fifo", "fully_async_fifo", OFF), ("balanced", "async_balanced", OFF),
              ("fifo + rules", "fully_async_fifo", {**OFF, **REGROUP, **HEAVY, "pipeline.stream_groups": "on"})]
# keys of the synthetic generator only (the traces take their lengths from the trace)
SYNTHETIC_ONLY = ("workload.tail_fraction", "workload.tail_alpha", "workload.body_sigma",
                  "workload.prompt_response_correlation")
SWEEP_KEYS = [("workload.tail_fraction", (0.02, 0.3)), ("workload.tail_alpha", (1.1, 3.0)),
              ("workload.body_sigma", (0.2, 1.2)), ("workload.group_spread", (0.05, 0.8)),
              ("workload.epoch_correlation", (0.3, 0.95)), ("workload.drift", (0.1,)),
              ("workload.prompt_response_correlation", (0.8,)), ("train.group_size", (4, 16)),
              ("pipeline.lag_bound", (0, 2, 3)), ("lengths.max_response_length", (4096, 32768)),
              ("rollout.max_num_seqs", (32, 512)), ("train.mini_batch_size", (256, 128, 32, 16)),
              ("lengths.predictor", ("oracle", "regression")), ("sim.infer_tp", (1, 8))]
SWEEP_DECODE = [("a", (1, 0, 0)), ("b", (0, 1, 0)), ("c", (0, 0, 1)), ("a, b, c", (1, 1, 1))]


def custom_costs(cfg, decode=(1.0, 1.0, 1.0), train: float = 1.0) -> dict:
    """``cost.*`` overrides of ``sim.model_class: custom`` that reproduce the costs ``cfg`` simulates
    (its model class at its TP and split), the decode coefficients times ``decode`` (a, b, c) and
    the trainer's per-token cost times ``train``: planner and simulator both see them."""
    from asp_ascend.sim.run import costs_for, system_for

    c = costs_for(cfg, system_for(cfg, "asp"))
    cm = c.instance
    return {"sim.model_class": "custom", "cost.decode_a": cm.decode_a * decode[0],
            "cost.decode_b": cm.decode_b * decode[1], "cost.decode_c": cm.decode_c * decode[2],
            "cost.prefill_per_token": cm.prefill_per_token, "cost.train_per_token": c.train_per_token * train,
            "cost.logprob_per_token": 0.0, "cost.train_per_step": c.train_per_step, "cost.sync_s": c.sync_s,
            "rollout.kv_cache_tokens": c.kv_capacity}


def sweep_cells(wl: str, data: Path, prompts: int, D: int) -> list:
    """(label, overrides, Mismatch or None) of sweep's cells on workload ``wl`` at ``D`` devices: the
    base, then one key at a time (SWEEP_KEYS, the device count, decode and trainer costs): costs x0.1 /
    x10 known to the planner (``custom_costs``) and unknown to it (planned on the model class's,
    executed on the scaled ones: robustness's Mismatch), the trainer 4x slower / faster per token."""
    from asp_ascend.sim.run import Mismatch

    synthetic = WORKLOADS[wl]["workload.type"] == "synthetic"
    out = [("base", {}, None)]
    out += [(f"{k}={v}", {k: v}, None) for k, vs in SWEEP_KEYS if synthetic or k not in SYNTHETIC_ONLY for v in vs]
    out += [(f"devices={n}", {"sim.total_devices": n, "sim.rollout_devices": n // 2}, None) for n in (16, 128)]
    from asp_ascend.config import load_config

    # the setup's costs (no workload key moves them; the traces' paths need not be read here)
    split = {**BASE, "sim.total_devices": D, "sim.rollout_devices": D // 2}
    base = load_config(None, [f"{k}={v}" for k, v in split.items()])
    for label, x, train, planned in cost_changes():
        out.append((label, custom_costs(base, x, train), None) if planned else (label, {}, Mismatch(*x)))
    return out


def cost_changes() -> list:
    """(label, decode factors (a, b, c), trainer factor, planned) of sweep's cost cells, in its order:
    each decode coefficient and all three x0.1 / x10 known to the planner and not, then the trainer
    4x slower / faster per token (known)."""
    out = []
    for name, which in SWEEP_DECODE:
        for f in (0.1, 10.0):
            x = tuple(f if w else 1.0 for w in which)
            out.append((f"decode {name} x{f:g}, planned", x, 1.0, True))
            out.append((f"decode {name} x{f:g}, unplanned", x, 1.0, False))
    out += [(f"trainer x{f:g} per token", (1.0, 1.0, 1.0), f, True) for f in (4.0, 0.25)]
    return out


# sweep --more: a second list of settings, none in the documented sweep (SWEEP_KEYS and its cost cells), that an
# independent checker's own configs would plausibly change: the model class and its setup, the prompt lengths and
# their correlation with the response's, the weight sync's cost, the rollout / trainer split and the instances'
# count at a fixed device count, the iteration's size and the epoch count, other predictors and predictions that
# carry no information, G = 16 in one mini-batch, a clipped heavy tail, a scarce KV cache, prefix caching off,
# padded micro-batches, every length x0.5 / x2, chunked prefill. Kept apart so the documented sweep's numbers stay
# reproducible; each cell is (label, overrides), the overrides a function of the workload and the device count.
def sweep_more_cells(wl: str, D: int) -> list:
    """(label, overrides, None) of ``sweep --more``'s cells on workload ``wl`` at ``D`` devices (the base first)."""
    w = WORKLOADS[wl]
    synthetic = w["workload.type"] == "synthetic"
    out = [("base", {})]
    out += [("model 32b (TP 2)", {"sim.model_class": "32b"}),
            ("model 32b, TP 4", {"sim.model_class": "32b", "sim.infer_tp": 4}),
            ("sim_32b.yaml's setup (32b, TP 4, 128 prompts x 4 mini-batches, 128 seqs)",
             {"sim.model_class": "32b", "sim.infer_tp": 4, "train.global_batch_size": 128,
              "train.mini_batch_size": 32, "train.micro_batch_size": 2, "rollout.max_num_seqs": 128})]
    if synthetic:
        out += [("workload.prompt_median=2000", {"workload.prompt_median": 2000}),
                ("workload.prompt_sigma=1.2", {"workload.prompt_sigma": 1.2})]
        out += [(f"workload.prompt_response_correlation={v:g}", {"workload.prompt_response_correlation": v})
                for v in (-0.5, 0.0, 0.95)]
    out += [("weight sync 1 GB/s (15 s)", {"sim.sync_bandwidth_gbps": 1.0}),
            ("instances decode through weight syncs (sim.rollout_sync_pause=false)", {"sim.rollout_sync_pause": "false"}),
            ("sim.infer_tp=4", {"sim.infer_tp": 4}),
            ("rollout 1/4 of the devices", {"sim.rollout_devices": D // 4}),
            ("rollout 3/4 of the devices", {"sim.rollout_devices": 3 * D // 4}),
            ("64 prompts an iteration (64 iterations an epoch)",
             {"train.global_batch_size": 64, "train.mini_batch_size": 16}),
            ("1024 prompts an iteration (4 iterations an epoch)",
             {"train.global_batch_size": 1024, "train.mini_batch_size": 256}),
            ("two simulated epochs", {"sim.epochs": 2, "workload.epochs": 3}),
            ("lengths.predictor=ema over two epochs of history", {"lengths.predictor": "ema", "workload.epochs": 3}),
            ("lengths.predictor=quantile 0.9", {"lengths.predictor": "quantile", "lengths.quantile": 0.9}),
            ("workload.epoch_correlation=0 (predictions carry nothing)", {"workload.epoch_correlation": 0.0}),
            ("G = 16 in one mini-batch", {"train.group_size": 16, "train.mini_batch_size": 256})]
    if synthetic:
        out.append(("heavier tail clipped (tail_alpha 1.1, cap 4096)",
                    {"workload.tail_alpha": 1.1, "lengths.max_response_length": 4096}))
    else:
        out.append(("cap 2048 (the trace's tail clipped)", {"lengths.max_response_length": 2048}))
    out += [("KV cache 200k tokens an instance", {"rollout.kv_cache_tokens": 200000}),
            ("rollout.prefix_caching=false", {"rollout.prefix_caching": "false"}),
            ("padded micro-batches (sim.micro_batching=padded)", {"sim.micro_batching": "padded"})]
    for f in (0.5, 2.0):
        if synthetic:
            o = {"workload.body_median": w["workload.body_median"] * f, "workload.tail_scale": w["workload.tail_scale"] * f}
        else:
            o = {"workload.length_scale": w["workload.length_scale"] * f}
        out.append((f"every length x{f:g}", o))
    out.append(("chunked prefill (rollout.max_num_batched_tokens=8192)", {"rollout.max_num_batched_tokens": 8192}))
    return [(label, o, None) for label, o in out]


def sweep_run(wl: str, data: Path, prompts: int, D: int, cell: dict, mismatch, extra: dict):
    """seed_runs's ``run(policy, overrides, seed)`` for one sweep cell: the row's overrides, then
    ``extra`` (``--set``), then the cell's own change; the workload built once from ``extra`` and the
    cell, so a ``--set`` of a key the workload reads (``workload.epochs=3``: two history epochs) reaches
    the lengths simulated as well as the config (``result=True``: the SimResult and its config)."""
    from asp_ascend.lengths.workloads import workload_from_config

    w = workload_from_config(_cfg(wl, data, prompts, D, {**extra, **cell}))

    def run(name, o, s, result=False):
        return _run(_cfg(wl, data, prompts, D, {**o, **extra, **cell, "seed": s}), w, name, mismatch, result=result)
    return run


def sweep(args, cells_of=None) -> None:
    """asp's defaults vs fifo, balanced and fifo + rules on every sweep cell (bench_tail.py's docstring);
    ``cells_of(wl, D)``: the cells instead of sweep_cells / sweep_more_cells (``sweep --combos``), a
    cell's overrides a dict or a function that returns them (a refused config raises there and is
    reported as the cell's finding)."""
    from asp_ascend.errors import ConfigError

    seeds = args.plan_seeds
    print(f"planner seeds {', '.join(map(str, seeds))} (each cell's workload built with seed 0); mean (min .. max) "
          f"over the seeds; fifo and fifo + rules plan nothing at random: run once\n")
    table_head("| workload | devices | cell | asp iter. time (s) | asp vs fifo | asp vs balanced | asp vs fifo + rules | "
               "asp throughput / fifo's | lag max (asp) |")
    behind, ahead, n = [], {"fifo": [0, 0], "balanced": [0, 0]}, 0
    extra = set_overrides(args.set)
    if cells_of is None:
        cells_of = (lambda wl, D: sweep_more_cells(wl, D)) if args.more else \
            (lambda wl, D: sweep_cells(wl, args.data, args.prompts, D))
    for D in args.devices:
        for wl in args.workloads:
            for label, over, mm in cells_of(wl, D):
                try:
                    over = over() if callable(over) else over
                    res = seed_runs(sweep_run(wl, args.data, args.prompts, D, over, mm, extra), seeds, SWEEP_ROWS)
                except Exception as e:  # a crash or a refused config is a finding of the sweep
                    what = "refused" if isinstance(e, ConfigError) else "error"
                    why = "; ".join(e.problems) if isinstance(e, ConfigError) else str(e).splitlines()[0]
                    print(f"| {wl} | {D} | {label} | {what}: {type(e).__name__}: {why} |||||", flush=True)
                    behind.append(f"{wl} / {D} / {label}: {what}")
                    continue

                def vs(ref):
                    xs = [pct(a, r) for a, r in zip(res["asp"], res[ref])]
                    if ref in ahead:    # ahead as printed: below -0.0 %
                        ahead[ref][0] += round(sum(xs) / len(xs), 1) < 0
                        ahead[ref][1] += all(round(x, 1) < 0 for x in xs)
                    return sum(xs) / len(xs), f"{sum(xs) / len(xs):+.1f} % ({min(xs):+.1f} .. {max(xs):+.1f})"

                n += 1
                t = sum(s["iteration_time_mean"] for s in res["asp"]) / len(seeds)
                thr = sum(a["throughput"] / f["throughput"] for a, f in zip(res["asp"], res["fifo"])) / len(seeds)
                (f, fs), (b, bs), (_, rs) = vs("fifo"), vs("balanced"), vs("fifo + rules")
                print(f"| {wl} | {D} | {label} | {t:.1f} | {fs} | {bs} | {rs} | {thr:.3f} | "
                      f"{max(s['policy_lag_max'] for s in res['asp'])} |", flush=True)
                if max(f, b) > SWEEP_BEHIND:
                    behind.append(f"{wl} / {D} / {label}: {f:+.1f} % vs fifo, {b:+.1f} % vs balanced")
    print(f"\nasp ahead (below -0.0 % as printed) of fifo in {ahead['fifo'][0]} of {n} cells that ran on the mean, "
          f"{ahead['fifo'][1]} for every seed; of balanced in {ahead['balanced'][0]} on the mean, "
          f"{ahead['balanced'][1]} for every seed")
    print(f"cells where asp is more than {SWEEP_BEHIND:g} % behind fifo or balanced on the mean, or failed "
          f"({len(behind)}): {'; '.join(behind) or 'none'}")
