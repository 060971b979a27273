"""Real CPU runs of the embedded default: sync vs async-fifo vs async-ASP, and convergence.

    python benchmarks/bench_runtime.py throughput [--out runs/bench_runtime] [key=value ...]
    python benchmarks/bench_runtime.py tail [--out runs/bench_tail] [--systems a,b] [--repeats 2] [key=value ...]
    python benchmarks/bench_runtime.py convergence [--seeds 0 1 2] [--out ...] [key=value ...]

``throughput``: one rollout instance and the trainer pinned to the two cores
(configs/cpu_tiny_grpo.yaml), three runs on one code path; prints each run's summary.json
figures (computed by asp_ascend.metrics.summarize) and the throughput ratios.
``tail`` (DESIGN 9, on a task with a heavier length tail, two instances and the trainer sharing
the cores, same seed): sync, async fifo, async asp with the lossless mechanisms (guided dispatch,
re-estimation, tail-aware concurrency) and async asp + partial rollout, one full epoch each,
``--repeats`` times interleaved; prints per run the mean iteration time and tokens/s (also
without iteration 0, the engines' warm-up), lag, the mechanisms' decisions, the trainer's
seconds and the longest group's latency per iteration (the tail floor), then per repeat each
system's tokens/s over async fifo's.
``convergence``: sync and async-ASP with lag bound 1 and 2, several seeds; prints the final
mean rewards and writes ``convergence.png`` (mean reward against trained samples, one band per
system: mean +- std over seeds). Figures are printed, not asserted.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEMS = {
    "sync_fifo": ["pipeline.mode=sync", "scheduler.policy=fifo"],
    "async_fifo": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo"],
    "async_asp": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp"],
}
CONVERGENCE = {
    "sync": ["pipeline.mode=sync", "scheduler.policy=asp"],
    "async_asp_k1": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp"],
    "async_asp_k2": ["pipeline.mode=async", "pipeline.lag_bound=2", "scheduler.policy=asp"],
}
# the lossless mechanisms of DESIGN 9 (a-c), then bounded off-policy carry-over (e)
LOSSLESS = ["scheduler.dispatch=guided", "scheduler.reestimate=true", "rollout.tail_concurrency=auto"]
TAIL_TASK = ["data.synthetic.tail_alpha=0.8", "rollout.num_instances=2", "rollout.cpu_cores=[]", "train.cpu_cores=[]",
             "rollout.num_cpus=0.5", "train.num_cpus=1", "train.eval_every=0", "train.max_iterations=16"]
TAIL_SYSTEMS = {
    "sync": ["pipeline.mode=sync", "scheduler.policy=fifo", "rollout.tail_concurrency=off"],
    "async_fifo": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                   "rollout.tail_concurrency=off", "scheduler.reestimate=false"],
    "async_asp_lossless": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS],
    "async_asp_partial": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS,
                          "rollout.partial_rollout=true", "rollout.max_split=1"],
}
KEYS = ("throughput", "iteration_time_mean", "padding_bubble", "skew_bubble", "sorting_bubble",
        "lower_bound_ratio", "policy_lag_max", "queue_occupancy_cv")


def _train(out: Path, overrides: list[str]) -> Path:
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(ROOT / "configs" / "cpu_tiny_grpo.yaml", overrides + [f"output_dir={out}", "overwrite=true"])
    run_train(cfg)
    return out


def throughput(out: Path, extra: list[str]) -> None:
    rows = {}
    for name, ov in SYSTEMS.items():
        d = _train(out / name, ov + ["train.eval_every=0"] + extra)
        entry = next(v for k, v in json.loads((d / "summary.json").read_text()).items() if k != "schema_version")
        rows[name] = entry
    print(f"\n{'system':12s} " + " ".join(f"{k:>16s}" for k in KEYS))
    for name, e in rows.items():
        print(f"{name:12s} " + " ".join(f"{(e[k] if e[k] is not None else float('nan')):16.3f}" for k in KEYS))
    base = rows["sync_fifo"]["throughput"]
    for name, e in rows.items():
        print(f"throughput {name} / sync_fifo = {e['throughput'] / base:.2f}")
        print(f"  rollout breakdown {json.dumps({k: round(v, 3) for k, v in e['rollout_breakdown'].items()})}")
        print(f"  trainer breakdown {json.dumps({k: round(v, 3) for k, v in e['trainer_breakdown'].items()})}")


def _lag_bound(d: Path) -> int:
    from asp_ascend.config import lag_bound_of, load_config

    return lag_bound_of(load_config(d / "config.yaml", check_files=False))


def tail_figures(d: Path, k: int) -> dict:
    """One run's figures from its metrics.jsonl and timeline.jsonl: iteration time and tokens/s
    (all iterations, and without iteration 0, which holds the engines' warm-up), lag, the
    mechanisms' decisions, and where the time went (per iteration, mean over iterations >= 1):
    the trainer's seconds (its optimizer steps and the weight sync), the latency of the
    iteration's longest group (first admission to last sample) and the tail floor it implies,
    latency / (k + 1) (DESIGN 9: k + 1 iterations take at least the longest group's latency)."""
    from collections import defaultdict

    from asp_ascend.metrics import Timeline

    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    tl = Timeline.read_jsonl(d / "timeline.jsonl")
    times = [r["iteration_time_s"] for r in rows]
    tokens = [r["tokens"] for r in rows]
    steps = defaultdict(float)
    for e in tl.events["step"]:
        steps[e["iteration"]] += e["t_end"] - e["t_start"]
    for e in tl.events["sync"]:
        steps[e["version"] - 1] += e["t_end"] - e["t_start"]
    span = defaultdict(lambda: [float("inf"), 0.0])
    for e in tl.events["request"]:
        g = span[(e["epoch"], e["prompt_id"], e["iteration"])]
        g[0], g[1] = min(g[0], e["t_admit"]), max(g[1], e["t_finish"])
    longest = defaultdict(float)
    for (_, _, i), (a, b) in span.items():
        longest[i] = max(longest[i], b - a)
    later = [r["iteration"] for r in rows[1:]]
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    costs = tl.events.get("costs") or []
    return {"iter_time": mean(times), "iter_time_1": mean(times[1:]),
            "tokens_s": sum(tokens) / sum(times), "tokens_s_1": sum(tokens[1:]) / max(sum(times[1:]), 1e-9),
            "lag_max": max(r["policy_lag_max"] for r in rows), "reward": mean([r["reward_mean"] for r in rows]),
            "steal": len(tl.events["steal"]), "tail": sum(1 for e in tl.events["tail"] if e["room"]),
            "defer": len(tl.events["defer"]), "trainer_1": mean([steps[i] for i in later]),
            "longest_1": mean([longest[i] for i in later]), "floor_1": mean([longest[i] for i in later]) / (k + 1),
            "decode": (costs[-1]["decode_a"], costs[-1]["decode_c"]) if costs else None}


def tail(out: Path, extra: list[str], systems: list[str] | None = None, repeats: int = 1) -> None:
    """Every system ``repeats`` times, interleaved (fifo, asp, ..., fifo, asp, ...), so slow
    phases of a shared machine hit every system; then the figures side by side and, per
    repeat, each system's tokens/s over async fifo's of the same repeat."""
    names = [n for n in TAIL_SYSTEMS if not systems or n in systems]
    res: dict[tuple[str, int], dict] = {}
    for rep in range(repeats):
        for name in names:
            d = _train(out / f"{name}_r{rep}", TAIL_TASK + TAIL_SYSTEMS[name] + extra)
            res[(name, rep)] = f = tail_figures(d, _lag_bound(d))
            print(f"[{name} r{rep}] tokens/s {f['tokens_s']:.0f} ({f['tokens_s_1']:.0f} without iteration 0)", flush=True)
    print("\n(iteration 0 holds the engines' warm-up; '1+' = iterations 1 and later; trainer = optimizer steps "
          "+ weight sync per iteration; floor = longest group latency / (k + 1))")
    print(f"{'system':20s} {'rep':>3s} {'it_s':>6s} {'it_s 1+':>7s} {'tok/s':>6s} {'tok/s 1+':>8s} {'lag':>3s} "
          f"{'steal':>5s} {'caps':>4s} {'defer':>5s} {'trainer':>7s} {'longest':>7s} {'floor':>6s} {'reward':>6s}")
    for (name, rep), f in res.items():
        print(f"{name:20s} {rep:3d} {f['iter_time']:6.3f} {f['iter_time_1']:7.3f} {f['tokens_s']:6.0f} "
              f"{f['tokens_s_1']:8.0f} {f['lag_max']:3d} {f['steal']:5d} {f['tail']:4d} {f['defer']:5d} "
              f"{f['trainer_1']:7.3f} {f['longest_1']:7.3f} {f['floor_1']:6.3f} {f['reward']:6.3f}")
    if "async_fifo" in names:
        for rep in range(repeats):
            base = res[("async_fifo", rep)]
            ratios = ", ".join(f"{n} {res[(n, rep)]['tokens_s'] / base['tokens_s']:.2f}x "
                               f"({res[(n, rep)]['tokens_s_1'] / base['tokens_s_1']:.2f}x 1+)"
                               for n in names if n != "async_fifo")
            print(f"repeat {rep}: tokens/s over async_fifo: {ratios}")


def convergence(out: Path, seeds: list[int], extra: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name, ov in CONVERGENCE.items():
        for s in seeds:
            d = _train(out / f"{name}_seed{s}", ov + [f"seed={s}", "train.eval_every=0"] + extra)
            from asp_ascend.config import load_config

            cfg = load_config(d / "config.yaml", check_files=False)
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            per_iter = cfg.train.global_batch_size * cfg.train.group_size
            samples = per_iter * np.arange(1, len(rows) + 1)
            curves.setdefault(name, []).append((samples, np.asarray([r["reward_mean"] for r in rows])))
    fig, ax = plt.subplots(figsize=(7, 4))
    print(f"\n{'system':14s} final reward (mean of last 5 iterations) per seed")
    for name, runs in curves.items():
        n = min(len(r[1]) for r in runs)
        x = runs[0][0][:n]
        ys = np.stack([r[1][:n] for r in runs])
        # smooth each seed over 5 iterations before the band
        k = 5
        ys_s = np.stack([np.convolve(y, np.ones(k) / k, mode="valid") for y in ys])
        xs = x[k - 1:]
        m, sd = ys_s.mean(0), ys_s.std(0)
        ax.plot(xs, m, label=name)
        ax.fill_between(xs, m - sd, m + sd, alpha=0.2)
        finals = [float(y[-5:].mean()) for y in ys]
        print(f"{name:14s} " + " ".join(f"{f:.3f}" for f in finals) + f"   mean {np.mean(finals):.3f}")
    ax.set_xlabel("trained samples")
    ax.set_ylabel("mean reward (5-iteration moving average)")
    ax.set_title("CPU default: sync vs async-ASP (band: +- std over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)
    print(f"wrote {out / 'convergence.png'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("throughput", "tail", "convergence"))
    p.add_argument("--out", default="runs/bench_runtime")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--systems", default="", help="tail: comma-separated systems to run (default: all)")
    p.add_argument("--repeats", type=int, default=2, help="tail: runs of each system (interleaved)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.what == "throughput":
        throughput(out, a.overrides)
    elif a.what == "tail":
        tail(out, a.overrides, [x for x in a.systems.split(',') if x], a.repeats)
    else:
        convergence(out, a.seeds, a.overrides)


if __name__ == "__main__":
    main()
