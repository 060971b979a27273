"""Real CPU runs of the embedded default: sync vs async-fifo vs async-ASP, and convergence.

    python benchmarks/bench_runtime.py throughput [--out runs/bench_runtime] [key=value ...]
    python benchmarks/bench_runtime.py tail [--out runs/bench_tail] [key=value ...]
    python benchmarks/bench_runtime.py convergence [--seeds 0 1 2] [--out ...] [key=value ...]

``throughput``: one rollout instance and the trainer pinned to the two cores
(configs/cpu_tiny_grpo.yaml), three runs on one code path; prints each run's summary.json
figures (computed by asp_ascend.metrics.summarize) and the throughput ratios.
``tail`` (DESIGN 9, on a task with a heavier length tail, two instances and the trainer sharing
the cores, same seed): sync, async fifo, async asp with the lossless mechanisms (guided dispatch,
re-estimation, tail-aware concurrency) and async asp + partial rollout; prints mean iteration
time, tokens/s, lag and the mechanisms' decisions side by side.
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
             "rollout.num_cpus=0.5", "train.num_cpus=1", "train.eval_every=0", "train.max_iterations=8"]
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


def tail(out: Path, extra: list[str]) -> None:
    from asp_ascend.metrics import Timeline

    print(f"\n{'system':20s} {'iter_time_mean':>14s} {'tokens/s':>10s} {'lag_max':>8s} {'steal':>6s} {'tail':>5s} "
          f"{'defer':>6s} {'reward':>7s}")
    base = None
    for name, ov in TAIL_SYSTEMS.items():
        d = _train(out / name, TAIL_TASK + ov + extra)
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        tl = Timeline.read_jsonl(d / "timeline.jsonl")
        it = sum(r["iteration_time_s"] for r in rows) / len(rows)
        tput = sum(r["tokens"] for r in rows) / sum(r["iteration_time_s"] for r in rows)
        lag = max(r["policy_lag_max"] for r in rows)
        reward = sum(r["reward_mean"] for r in rows) / len(rows)
        n = {k: len(tl.events[k]) for k in ("steal", "tail", "defer")}
        print(f"{name:20s} {it:14.3f} {tput:10.1f} {lag:8d} {n['steal']:6d} {n['tail']:5d} {n['defer']:6d} "
              f"{reward:7.3f}", flush=True)
        if name == "async_fifo":
            base = tput
        elif base:
            print(f"  tokens/s vs async_fifo: {tput / base:.2f}x", flush=True)


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
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.what == "throughput":
        throughput(out, a.overrides)
    elif a.what == "tail":
        tail(out, a.overrides)
    else:
        convergence(out, a.seeds, a.overrides)


if __name__ == "__main__":
    main()
