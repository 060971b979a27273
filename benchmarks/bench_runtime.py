"""Real CPU runs of the embedded default: sync vs async-fifo vs async-ASP, and convergence.

    python benchmarks/bench_runtime.py throughput [--out runs/bench_runtime] [key=value ...]
    python benchmarks/bench_runtime.py tail [--out runs/bench_tail] [--systems a,b] [--repeats 2] [key=value ...]
    python benchmarks/bench_runtime.py paired [--out runs/paired] [--systems a,b] [--blocks 1] [--order abba]
        [--history LENGTHS_TABLE [--history-quantile Q]] [key=value ...]
    python benchmarks/bench_runtime.py paired --report-only [--out runs/paired]
    python benchmarks/bench_runtime.py stepcost [--out runs/stepcost] [--batches 1,2,...]
    python benchmarks/bench_runtime.py bound --stepcost runs/stepcost/stepcost.json RUN_DIR...
    python benchmarks/bench_runtime.py latency RUN_DIR...
    python benchmarks/bench_runtime.py convergence [--seeds 0 1 2] [--out ...] [--systems a,b]
        [--launcher "CMD"] [--report-only] [key=value ...]

``throughput``: one rollout instance and the trainer pinned to the two cores
(configs/cpu_tiny_grpo.yaml), three runs on one code path; prints each run's summary.json
figures (computed by asp_ascend.metrics.summarize) and the throughput ratios.
``tail`` (DESIGN 9, on a task with a heavier length tail, two instances and the trainer sharing
the cores, same seed): sync, async fifo, async asp with the lossless mechanisms (guided dispatch,
re-estimation, tail-aware concurrency) and async asp + partial rollout, one full epoch each,
``--repeats`` times interleaved; prints per run the mean iteration time and tokens/s (also
without iteration 0, the pipeline fill), lag, the mechanisms' decisions, the trainer's
seconds and the longest group's latency per iteration (the tail floor), then per repeat each
system's tokens/s over async fifo's, and the CPU each run's processes used (``CpuSampler``).
``paired`` (the protocol for the tail comparison on a machine whose speed drifts): two systems
(default async fifo = A, async asp with the lossless mechanisms = B), same seed and config, in
ABBA blocks (``--order ab``: AB pairs); every invocation appends ``--blocks`` more blocks to
``--out`` (``paired.jsonl``, one row per run directory; the figures are read from the run
directories each time the series is summarised), so a series can be split into several CPU holds.
Per run: tokens/s and mean iteration time without iteration 0, the CPU its processes used and
what the machine used besides (other load), decode steps per iteration and sequences per step
(the ``costs`` events), the instance-time idle and with fewer than 8 running sequences, the
trainer's seconds per iteration, the steal and defer events; then per run and summed per system
the policy-lag histogram of the trained samples (summary.json; with partial rollout also the
deferred samples' lags by admission version and by newest-token version) and the per-instance
split (response tokens each instance drew and its busy share, ``asp_ascend.metrics.instance_split``;
``tail`` prints these too); then per pair (A, B adjacent in time: AB and BA of each block) the
ratio B / A (also of the mean engine step time, and tokens/s at equal step time: each run's
tokens/s times its ms per step, :func:`pair_ratios`), and over all pairs the median with its
min-max spread. Per run also the slot floor (the fewest engine steps per iteration any order of
the run's groups could take under group slots, :func:`plan_figures`; per system, the run's steps
over it) and how the plan's predicted lengths correlate with the groups' drawn longest and mean
sample. ``--history PATH`` (``tail`` too): the systems of ``HISTORY_SYSTEMS`` (``async_asp_history``)
plan from that length table (``lengths.path``; a prompt's mean, or ``--history-quantile Q``'s
quantile of its samples), the other system of the pair as it is; with a frozen policy and the same
seed a run draws exactly the lengths of the frozen run whose lengths.parquet is given, so that is an
oracle plan (docs/runtime.md, "The oracle ceiling").
``train.lr=1e-12`` as an override freezes the policy: every system then draws the same tokens per
iteration, so tokens/s compares the schedules and not the policies' trajectories (docs/runtime.md,
"Streaming groups into the trainer").
``stepcost``: CPU and wall time per engine step of one vLLM-CPU instance against batch size.
``bound``: the CPU-time bound of tail runs (what any dispatch order could gain; docs/runtime.md).
``latency``: per run directory, from a group's finish that freed a slot of its full instance to
the instance's next admission (``asp_ascend.metrics.admission_latency``): median, p90 and mean,
and where the time went (poll, Ray, the orchestrator's loop, submit); ``paired`` prints the
median and p90 per run too.
``convergence``: sync and async-ASP with lag bound 1 and 2, several seeds (``--systems``: any of
``CONVERGENCE``, e.g. also ``async_asp_k2_tis``); prints the final mean rewards and the mean
reward per block of 16 iterations (averaged over seeds) and writes ``convergence.png`` (mean
reward against trained samples, one band per system: mean +- std over seeds). Without
``--launcher`` the runs train inside this process; with it each run is its own ``asp train``
process with that command prefix (e.g. a CPU lock held for that run only), and a run directory
that already holds a finished run is not run again. ``--report-only`` runs nothing and
summarises the run directories in ``--out``. Figures are printed, not asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
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
    # not in the default list: lag bound 2 with truncated importance weights instead of decoupled PPO
    "async_asp_k2_tis": ["pipeline.mode=async", "pipeline.lag_bound=2", "scheduler.policy=asp",
                         "train.off_policy=tis"],
}
CONVERGENCE_DEFAULT = ["sync", "async_asp_k1", "async_asp_k2"]
CONVERGENCE_BLOCK = 16  # iterations per block of the per-block reward table
# the lossless mechanisms of DESIGN 9 (a-c), then bounded off-policy carry-over (e); regroup
# (asp's default since 2026-12-03, pipeline.regroup: auto) pinned off so that the systems measured
# before it stay what they were; the *_regroup systems turn it on, without its heaviest-first take
# (pipeline.regroup_heavy, asp's default since, pinned off: they were measured before it); streaming
# (pipeline.stream_groups, asp's default since 2026-12-03) pinned off likewise but for *_stream
LOSSLESS = ["scheduler.dispatch=guided", "scheduler.reestimate=true", "rollout.tail_concurrency=auto",
            "pipeline.stream_groups=off", "pipeline.regroup=off"]
TAIL_TASK = ["data.synthetic.tail_alpha=0.8", "rollout.num_instances=2", "rollout.cpu_cores=[]", "train.cpu_cores=[]",
             "rollout.num_cpus=0.5", "train.num_cpus=1", "train.eval_every=0", "train.max_iterations=16"]
TAIL_SYSTEMS = {
    "sync": ["pipeline.mode=sync", "scheduler.policy=fifo", "rollout.tail_concurrency=off"],
    "async_fifo": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                   "rollout.tail_concurrency=off", "scheduler.reestimate=false"],
    "async_asp_lossless": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS],
    # diagnosis: the lossless mechanisms without guided dispatch's steals (each group on its planned instance)
    "async_asp_static": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp",
                         "scheduler.dispatch=static", "scheduler.reestimate=true", "rollout.tail_concurrency=auto"],
    "async_asp_partial": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS,
                          "rollout.partial_rollout=true", "rollout.max_split=1"],
    # pipeline.stream_groups: the trainer takes each generated group of the mini-batch it trains as it arrives
    "async_fifo_stream": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                          "rollout.tail_concurrency=off", "scheduler.reestimate=false", "pipeline.stream_groups=true"],
    "async_asp_stream": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS,
                         "pipeline.stream_groups=true"],
    # pipeline.regroup: a mini-batch completed at run time from generated groups of its iteration
    "async_asp_regroup": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS[:-1],
                          "pipeline.regroup=on", "pipeline.regroup_heavy=off"],
    "async_fifo_regroup": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                           "rollout.tail_concurrency=off", "scheduler.reestimate=false", "pipeline.regroup=on",
                           "pipeline.regroup_heavy=off"],
    # rollout.admission=sequences: an instance admits while its unfinished samples < max_num_seqs
    "async_fifo_seq": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                       "rollout.tail_concurrency=off", "scheduler.reestimate=false", "rollout.admission=sequences"],
    "async_fifo_groups": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=fifo",
                          "rollout.tail_concurrency=off", "scheduler.reestimate=false", "rollout.admission=groups"],
    "async_asp_seq": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS,
                      "rollout.admission=sequences"],
    # asp's lossless mechanisms planned from the length history of ``--history PATH`` (e.g. a run's
    # lengths.parquet; ``history_overrides``): with a frozen policy and the same seed a run draws the
    # lengths of the run the table came from, so the plan's predictions are an oracle
    "async_asp_history": ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", *LOSSLESS],
}
HISTORY_SYSTEMS = ("async_asp_history",)   # the systems ``--history`` applies to (and that need it)
TAIL_DEFAULT = ("sync", "async_fifo", "async_asp_lossless", "async_asp_partial")   # ``tail`` without --systems
KEYS = ("throughput", "iteration_time_mean", "padding_bubble", "skew_bubble", "sorting_bubble",
        "lower_bound_ratio", "policy_lag_max", "queue_occupancy_cv")


def history_overrides(path: Path, quantile: float | None = None) -> list[str]:
    """The keys a history system adds: ``lengths.path`` and the predictor, the mean of a prompt's
    samples in the table, or with ``quantile`` their ``quantile`` quantile (1.0: the longest, what a
    group's latency is)."""
    pred = (["lengths.predictor=mean"] if quantile is None
            else ["lengths.predictor=quantile", f"lengths.quantile={quantile}"])
    return [f"lengths.path={path}", *pred]


def system_overrides(name: str, history: list[str]) -> list[str]:
    """``name``'s keys; ``history`` (:func:`history_overrides`) only for the systems of ``HISTORY_SYSTEMS``."""
    return TAIL_SYSTEMS[name] + (list(history) if name in HISTORY_SYSTEMS else [])


def _train(out: Path, overrides: list[str], cpu: bool = False) -> Path:
    """One ``asp train`` run; ``cpu``: sample the CPU time of the run's processes meanwhile
    (:class:`CpuSampler`, written to ``cpu_samples.jsonl`` in the run directory)."""
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(ROOT / "configs" / "cpu_tiny_grpo.yaml", overrides + [f"output_dir={out}", "overwrite=true"])
    sampler = CpuSampler(out / "metrics.jsonl") if cpu else None
    try:
        run_train(cfg)
    finally:
        if sampler is not None:
            sampler.stop(out / "cpu_samples.jsonl")
    return out


ROLES = (("asp-rollou", "instance"), ("RolloutEng", "instance"), ("TrainerEng", "trainer"))


class CpuSampler:
    """Every ``every_s``: the machine's busy and total CPU time (/proc/stat), the CPU seconds
    (user + system) of every process descended from this one (the run: the driver, Ray, the
    actors and the vLLM engine-core processes they start) and how many rows metrics.jsonl has,
    so the CPU spent between two iterations' sync ends can be read back. Roles: a process is
    ``instance`` or ``trainer`` when it or an ancestor is that Ray actor (a vLLM engine core
    is its instance's child: ``engine`` then), the bench process is ``driver``, the rest
    (raylet, GCS, agents) ``ray``."""

    def __init__(self, metrics: Path, every_s: float = 0.2):
        import threading

        self.metrics, self.every_s, self.rows = metrics, every_s, []
        self.tick = os.sysconf("SC_CLK_TCK")
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _procs(self) -> dict[int, tuple[int, str, float]]:
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            f = raw[raw.rindex(")") + 2:].split()
            out[int(d)] = (int(f[1]), comm, (int(f[11]) + int(f[12])) / self.tick)
        return out

    def _roles(self, procs: dict) -> dict[str, float]:
        me = os.getpid()
        roles: dict[str, float] = {}
        for pid, (_, comm, cpu) in procs.items():
            chain, p = [], pid
            while p in procs and p != me and len(chain) < 32:
                chain.append(procs[p][1])
                p = procs[p][0]
            if p != me:
                continue  # not the run's
            role = "driver" if pid == me else "ray"
            for i, c in enumerate(chain):
                hit = next((r for key, r in ROLES if key in c), None)
                if hit:
                    role = "engine" if hit == "instance" and i > 0 else hit
                    break
            roles[role] = roles.get(role, 0.0) + cpu
        return roles

    def _run(self) -> None:
        while not self._halt.is_set():
            t = time.time()
            stat = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
            vals = [int(x) for x in stat[:8]]
            total, idle = sum(vals), vals[3] + vals[4]
            try:
                rows = self.metrics.read_text().count("\n") if self.metrics.exists() else 0
            except OSError:
                rows = 0
            self.rows.append({"t": t, "busy": (total - idle) / self.tick, "total": total / self.tick,
                              "rows": rows, "roles": self._roles(self._procs())})
            self._halt.wait(self.every_s)

    def stop(self, path: Path) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))


def cpu_window(path: Path) -> dict | None:
    """CPU figures between the sync end of iteration 0 and of the last iteration (the samples
    where metrics.jsonl first has 1 row and its final count): wall seconds, the machine's busy
    cores (0..number of cores: every process, also others' jobs) and, per role, the run's own
    cores in use. None without samples."""
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if not rows or rows[-1]["rows"] < 2:
        return None
    a = next(r for r in rows if r["rows"] >= 1)
    b = next(r for r in rows if r["rows"] >= rows[-1]["rows"])
    wall = b["t"] - a["t"]
    roles = {k: (b["roles"].get(k, 0.0) - a["roles"].get(k, 0.0)) / wall for k in b["roles"]}
    return {"wall": wall, "iterations": b["rows"] - a["rows"], "machine_cores": (b["busy"] - a["busy"]) / wall,
            "cores": (b["total"] - a["total"]) / wall, "run_cores": sum(roles.values()), "roles": roles}


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
    from asp_ascend.config import lag_bound_of, run_config

    return lag_bound_of(run_config(d))


def tail_figures(d: Path, k: int) -> dict:
    """One run's figures from its metrics.jsonl and timeline.jsonl: iteration time and tokens/s
    (all iterations, and without iteration 0, the pipeline fill: with k = 1 it generates two iterations), lag, the
    mechanisms' decisions, and where the time went (per iteration, mean over iterations >= 1):
    the trainer's seconds (its optimizer steps and the weight sync), the latency of the
    iteration's longest group (first admission to last sample) and the tail floor it implies,
    latency / (k + 1) (DESIGN 9: k + 1 iterations take at least the longest group's latency).
    Also the run's lag histograms (summary.json: every trained sample, and partial rollout's
    deferred samples by admission and by newest-token version) and the per-instance split from
    iteration 0's sync end to the last (``split``: :func:`asp_ascend.metrics.instance_split`; None
    with fewer than two iterations)."""
    from collections import defaultdict

    from asp_ascend.metrics import Timeline, instance_split
    from asp_ascend.report.run import train_summary

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
    entry = next(iter(train_summary(d).values()))
    t_end = [r["t"] for r in rows]
    split = instance_split(tl, num_instances=_config(d)["rollout"]["num_instances"], t0=t_end[0], t1=t_end[-1],
                           few=FEW) if len(t_end) > 1 else None
    return {"iter_time": mean(times), "iter_time_1": mean(times[1:]),
            "tokens_s": sum(tokens) / sum(times), "tokens_s_1": sum(tokens[1:]) / max(sum(times[1:]), 1e-9),
            "lag_max": max(r["policy_lag_max"] for r in rows), "reward": mean([r["reward_mean"] for r in rows]),
            "steal": len(tl.events["steal"]), "tail": sum(1 for e in tl.events["tail"] if e["room"]),
            "defer": len(tl.events["defer"]), "trainer_1": mean([steps[i] for i in later]),
            "longest_1": mean([longest[i] for i in later]), "floor_1": mean([longest[i] for i in later]) / (k + 1),
            "decode": (costs[-1]["decode_a"], costs[-1]["decode_c"]) if costs else None,
            "lag_hist": entry.get("policy_lag_hist") or {}, "deferred_lag_hist": entry.get("deferred_lag_hist") or {},
            "deferred_token_lag_hist": entry.get("deferred_token_lag_hist") or {},
            "deferred_groups": entry.get("deferred_groups", 0), "deferred_samples": entry.get("deferred_samples", 0),
            "split": split}


FEW = 8   # fewer running sequences than this on an instance: a tail step (the ``few`` share)


def _hist(h: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in h.items()) or "-"


def _lag_line(f: dict) -> str:
    line = f"lag {_hist(f['lag_hist'])}"
    if f["deferred_samples"]:
        line += (f" | deferred {f['deferred_groups']} groups, {f['deferred_samples']} samples: by admission "
                 f"{_hist(f['deferred_lag_hist'])}, by newest token {_hist(f['deferred_token_lag_hist'])}")
    return line + f" | defer {f['defer']}, steal {f['steal']}"


def _split_line(split: dict | None) -> str:
    if split is None:
        return "instances: fewer than two iterations"
    return "instances: " + " | ".join(f"{r['instance']}: {r['tokens']} tokens ({100 * r['token_share']:.0f} %), "
                                      f"busy {r['busy']:.2f}" for r in split["instances"])


def lags_and_instances(runs: list[tuple[str, str, dict]]) -> None:
    """Per run (``(system, label, figures of tail_figures)``) and summed per system: the policy lag of
    the trained samples, partial rollout's deferred samples, the mechanisms' decisions, and each
    instance's share of the response tokens and of the time busy, so a reader sees what partial
    rollout adds at what lag and whether the instances were balanced."""
    from asp_ascend.metrics import combine_instance_splits, sum_histograms

    print("\npolicy lag of the trained samples (every iteration; lag:samples); partial rollout's deferred "
          "samples by admission version and by their newest token's version; defer and steal events; per "
          "instance from iteration 0's sync end to the last: response tokens it drew (share) and the share "
          "of the time it ran >= 1 sequence (busy)")
    for _, label, f in runs:
        print(f"  {label:30s} {_lag_line(f)}")
        print(f"  {'':30s} {_split_line(f['split'])}")
    print("summed per system:")
    for name in dict.fromkeys(n for n, _, _ in runs):
        fs = [f for n, _, f in runs if n == name]
        tot = {k: sum_histograms([f[k] for f in fs]) for k in ("lag_hist", "deferred_lag_hist", "deferred_token_lag_hist")}
        tot.update({k: sum(f[k] for f in fs) for k in ("deferred_groups", "deferred_samples", "defer", "steal")})
        splits = [f["split"] for f in fs if f["split"] is not None]
        label = f"{name} ({len(fs)} runs)"
        print(f"  {label:30s} {_lag_line(tot)}")
        print(f"  {'':30s} {_split_line(combine_instance_splits(splits) if splits else None)}")


def tail(out: Path, extra: list[str], systems: list[str] | None = None, repeats: int = 1,
         history: list[str] = ()) -> None:
    """Every system ``repeats`` times, interleaved (fifo, asp, ..., fifo, asp, ...), so slow
    phases of a shared machine hit every system; then the figures side by side and, per
    repeat, each system's tokens/s over async fifo's of the same repeat."""
    names = [n for n in TAIL_SYSTEMS if (n in systems if systems else n in TAIL_DEFAULT)]
    res: dict[tuple[str, int], dict] = {}
    for rep in range(repeats):
        for name in names:
            d = _train(out / f"{name}_r{rep}", TAIL_TASK + system_overrides(name, history) + extra, cpu=True)
            res[(name, rep)] = f = tail_figures(d, _lag_bound(d))
            f["cpu"] = cpu_window(d / "cpu_samples.jsonl")
            print(f"[{name} r{rep}] tokens/s {f['tokens_s']:.0f} ({f['tokens_s_1']:.0f} without iteration 0)", flush=True)
    print("\n(iteration 0 is the pipeline fill; '1+' = iterations 1 and later; trainer = optimizer steps "
          "+ weight sync per iteration; floor = longest group latency / (k + 1))")
    print(f"{'system':20s} {'rep':>3s} {'it_s':>6s} {'it_s 1+':>7s} {'tok/s':>6s} {'tok/s 1+':>8s} {'lag':>3s} "
          f"{'steal':>5s} {'caps':>4s} {'defer':>5s} {'trainer':>7s} {'longest':>7s} {'floor':>6s} {'reward':>6s}")
    for (name, rep), f in res.items():
        print(f"{name:20s} {rep:3d} {f['iter_time']:6.3f} {f['iter_time_1']:7.3f} {f['tokens_s']:6.0f} "
              f"{f['tokens_s_1']:8.0f} {f['lag_max']:3d} {f['steal']:5d} {f['tail']:4d} {f['defer']:5d} "
              f"{f['trainer_1']:7.3f} {f['longest_1']:7.3f} {f['floor_1']:6.3f} {f['reward']:6.3f}")
    print("\nCPU from the sync end of iteration 0 to the last one (cores in use, of "
          f"{os.cpu_count()}): the machine's (every process) and the run's, per role; "
          "bound = 2 cores / the run's cores: how much faster the same CPU work could go at best")
    print(f"{'system':20s} {'rep':>3s} {'wall':>6s} {'machine':>7s} {'run':>5s} {'trainer':>7s} {'inst':>5s} "
          f"{'engine':>6s} {'driver':>6s} {'ray':>5s} {'bound':>5s}")
    for (name, rep), f in res.items():
        c = f.get("cpu")
        if not c:
            continue
        r = c["roles"]
        print(f"{name:20s} {rep:3d} {c['wall']:6.2f} {c['machine_cores']:7.2f} {c['run_cores']:5.2f} "
              f"{r.get('trainer', 0):7.2f} {r.get('instance', 0):5.2f} {r.get('engine', 0):6.2f} "
              f"{r.get('driver', 0):6.2f} {r.get('ray', 0):5.2f} {c['cores'] / max(c['run_cores'], 1e-9):5.2f}")
    lags_and_instances([(name, f"{name} r{rep}", f) for (name, rep), f in res.items()])
    if "async_fifo" in names:
        for rep in range(repeats):
            base = res[("async_fifo", rep)]
            ratios = ", ".join(f"{n} {res[(n, rep)]['tokens_s'] / base['tokens_s']:.2f}x "
                               f"({res[(n, rep)]['tokens_s_1'] / base['tokens_s_1']:.2f}x 1+)"
                               for n in names if n != "async_fifo")
            print(f"repeat {rep}: tokens/s over async_fifo: {ratios}")


def decode_steps(d: Path, t0: float, t1: float) -> dict | None:
    """Engine steps and sequence-steps per second between ``t0`` and ``t1`` (run seconds), every
    instance together, from the ``costs`` events' running totals (the first and last events inside
    the interval); None when fewer than two events fall inside."""
    from asp_ascend.metrics import Timeline

    ev = [e for e in Timeline.read_jsonl(d / "timeline.jsonl").events.get("costs", []) if t0 <= e["t"] <= t1]
    if len(ev) < 2 or "seq_steps" not in ev[0]:
        return None
    a, b = ev[0], ev[-1]
    dt = b["t"] - a["t"]
    steps, seqs, busy = b["steps"] - a["steps"], b["seq_steps"] - a["seq_steps"], b["busy_s"] - a["busy_s"]
    return {"steps_s": steps / dt, "batch": seqs / max(steps, 1e-9), "step_ms": 1e3 * busy / max(steps, 1e-9)}


def occupancy(split: dict) -> dict:
    """Share of the instance-time of ``split``'s window (all instances together) with no running
    sequence (``idle``: the engine does not step) and with 1 .. ``FEW`` - 1 (``few``: tail steps that
    pay an engine step's fixed cost for a handful of tokens), from
    :func:`asp_ascend.metrics.instance_split` (a sample occupies its instance from admission to its
    finish)."""
    span = max(split["window_s"], 1e-9) * max(1, len(split["instances"]))
    return {"idle": 1.0 - sum(r["busy_s"] for r in split["instances"]) / span,
            "few": sum(r["few_s"] for r in split["instances"]) / span}


def plan_figures(d: Path) -> dict:
    """Two figures of a run from its ``request`` events and schedule.parquet, every group drawn:

    ``slot_floor``: the fewest engine steps per iteration (iterations 1 on) in which any order of the
    run's groups could draw them under group slots (``rollout.admission: groups``, no partial
    rollout): a group holds one of its instance's ``max_num_seqs // G`` slots from admission until
    its longest sample's last token, a sample gains one token per engine step, so the groups of an
    iteration need at least sum(their longest sample) / (slots x instances) steps. It counts no
    admission gap and no lag bound, so it is below what any schedule of that admission rule can
    run; a run's steps per iteration over it is the most an order could cut them (at equal step
    time, the most it could gain in tokens/s). None under ``rollout.admission: sequences`` or with
    partial rollout (a group then frees its slot early).

    ``pred_r_longest`` / ``pred_r_mean``: the Pearson correlation of the plan's ``predicted_length``
    with each group's drawn longest / mean sample (NaN without schedule.parquet or variance)."""
    from collections import defaultdict

    import numpy as np
    import pandas as pd

    from asp_ascend.metrics import Timeline

    cfg = _config(d)
    ro, nan = cfg.get("rollout", {}), float("nan")
    longest, total, count, iteration = defaultdict(int), defaultdict(int), defaultdict(int), {}
    for e in Timeline.read_jsonl(d / "timeline.jsonl").events.get("request", []):
        g = (int(e["epoch"]), str(e["prompt_id"]))
        longest[g] = max(longest[g], int(e["response_length"]))
        total[g] += int(e["response_length"])
        count[g] += 1
        iteration[g] = int(e["iteration"])
    res = {"slot_floor": None, "pred_r_longest": nan, "pred_r_mean": nan}
    later = [g for g in longest if iteration[g] >= 1]
    if later and ro.get("admission", "groups") == "groups" and not ro.get("partial_rollout", False):
        slots = max(1, int(ro["max_num_seqs"]) // int(cfg["train"]["group_size"])) * int(ro.get("num_instances", 1))
        res["slot_floor"] = sum(longest[g] for g in later) / slots / len({iteration[g] for g in later})
    sched = d / "schedule.parquet"
    if longest and sched.is_file():
        plan = pd.read_parquet(sched, columns=["epoch", "prompt_id", "predicted_length"])
        pred = {(int(e), str(p)): float(x) for e, p, x in zip(plan["epoch"], plan["prompt_id"], plan["predicted_length"])}
        keys = [g for g in longest if g in pred]
        x = np.array([pred[g] for g in keys])
        for key, y in (("pred_r_longest", [longest[g] for g in keys]),
                       ("pred_r_mean", [total[g] / count[g] for g in keys])):
            y = np.asarray(y, dtype=float)
            if len(keys) > 1 and x.std() > 0 and y.std() > 0:
                res[key] = float(np.corrcoef(x, y)[0, 1])
    return res


def run_row(d: Path, name: str, **extra) -> dict:
    """One run's row of the paired series: tokens/s and mean iteration time (iteration 1 on), the
    CPU figures of the window iteration 0's sync end .. the last sync end (``cpu_window``: the
    run's own CPU seconds, the machine's, and the difference = other load), and the decode
    steps per iteration with their mean batch, the idle and few-running instance-time shares;
    ``figures``: everything :func:`tail_figures` read (lag histograms, per-instance split)."""
    k = _lag_bound(d)
    f = tail_figures(d, k)
    cw = cpu_window(d / "cpu_samples.jsonl")
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    row = {"system": name, "dir": str(d), **extra, "tokens_s_1": f["tokens_s_1"], "iter_time_1": f["iter_time_1"],
           "tokens_1": sum(r["tokens"] for r in rows[1:]) / max(1, len(rows) - 1), "lag_max": f["lag_max"],
           "steal": f["steal"], "defer": f["defer"], "trainer_1": f["trainer_1"], "longest_1": f["longest_1"]}
    if cw is not None:
        row.update(wall=cw["wall"], run_cpu_s=cw["run_cores"] * cw["wall"],
                   machine_cpu_s=cw["machine_cores"] * cw["wall"],
                   other_cores=cw["machine_cores"] - cw["run_cores"], run_cores=cw["run_cores"])
    t_end = [r["t"] for r in rows]
    st = decode_steps(d, t_end[0], t_end[-1]) if len(t_end) > 1 else None
    if st is not None:
        row.update(steps_iter=st["steps_s"] * f["iter_time_1"], batch=st["batch"], step_ms=st["step_ms"])
    if f["split"] is not None:
        row.update(occupancy(f["split"]))
    row.update(plan_figures(d))
    lat = admission_figures(d)
    if lat is not None and lat["latency"]["n"]:
        row.update(adm_ms=1e3 * lat["latency"]["median"], adm_p90_ms=1e3 * lat["latency"]["p90"])
    row["figures"] = f
    return row


def admission_figures(d: Path) -> dict | None:
    """:func:`asp_ascend.metrics.admission_latency` of one run directory (its group slots from its
    config); None under ``rollout.admission: sequences`` (no slots to free)."""
    from asp_ascend.metrics import Timeline, admission_latency

    cfg = _config(d)
    ro = cfg.get("rollout", {})
    if ro.get("admission", "groups") != "groups":
        return None
    slots = max(1, int(ro["max_num_seqs"]) // int(cfg["train"]["group_size"]))
    return admission_latency(Timeline.read_jsonl(d / "timeline.jsonl"), slots=slots)


def latency(runs: list[Path]) -> None:
    """``latency``: see the module docstring."""
    from asp_ascend.metrics.admission import PARTS

    for d in runs:
        res = admission_figures(d)
        if res is None:
            print(f"{d}: rollout.admission is not groups: no slot to free")
            continue
        lat = res["latency"]
        print(f"{d}: {lat['n']} finishes that freed a slot; to the next admission median {1e3 * lat['median']:.1f} ms, "
              f"p90 {1e3 * lat['p90']:.1f} ms, mean {1e3 * lat['mean']:.1f} ms")
        parts = res["parts"]
        if not parts["add"]["n"]:
            print("  (no poll/submit events: a run of older code; no split)")
            continue
        print(f"  split over {parts['add']['n']} of them (ms, median / mean): " + ", ".join(
            f"{k} {1e3 * parts[k]['median']:.1f}/{1e3 * parts[k]['mean']:.1f}" for k in PARTS))


OTHER_LOAD_MAX = 0.1   # cores other processes used during a run above which its pair is marked (and left out of the clean median)


def paired(out: Path, extra: list[str], systems: list[str], blocks: int, order: str,
           history: list[str] = ()) -> None:
    """``blocks`` more blocks of the paired series in ``out`` (see the module docstring); ``history``:
    the keys of ``--history`` (:func:`history_overrides`), for the systems of ``HISTORY_SYSTEMS``."""
    a, b = systems
    seq = {"abba": [a, b, b, a], "ab": [a, b]}[order]
    log = out / "paired.jsonl"
    done = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    first = 1 + max((r["block"] for r in done), default=-1)
    for blk in range(first, first + blocks):
        for pos, name in enumerate(seq):
            own = system_overrides(name, history)[len(TAIL_SYSTEMS[name]):] + extra
            d = _train(out / f"b{blk:02d}_{pos}_{name}", TAIL_TASK + TAIL_SYSTEMS[name] + own, cpu=True)
            done.append({"system": name, "dir": str(d), "block": blk, "pos": pos, "t": time.time(), "overrides": own})
            tmp = log.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in done))
            tmp.replace(log)
            try:
                row = run_row(d, name)
                print(f"[block {blk} run {pos} {name}] tokens/s {row['tokens_s_1']:.0f}, iteration "
                      f"{row['iter_time_1']:.3f} s, other load {row.get('other_cores', float('nan')):.2f} cores",
                      flush=True)
            except Exception as exc:  # the run is kept; --report-only reads it again
                print(f"[block {blk} run {pos} {name}] figures failed: {exc!r}", flush=True)
    paired_report(out, systems)


def pair_ratios(ra: dict, rb: dict) -> dict:
    """One pair's ratios, B (``rb``) over A (``ra``), from two :func:`run_row` rows: tokens/s;
    iteration time A / B (> 1: B faster); tokens and engine steps per iteration; the mean engine
    step time (``step_ms``, B / A); and ``tok_norm``, tokens/s at equal step time: each run's
    tokens/s times its own mean ms per engine step (tokens per engine-step-second: what a run
    would draw if its engine stepped at 1 s per step), B / A. It takes out of the pair the
    machine's speed drift between the two runs, which moves every step of a run alike; it also
    takes out what a system changes in its own step time, so where the step cost grows with the
    batch (the fitted ``decode_c`` of the ``costs`` events), a system that steps smaller batches
    is charged for its cheaper steps. NaN where either run has no decode-step figures.
    ``load``: the larger other load of the two runs; ``clean``: at most ``OTHER_LOAD_MAX``."""
    nan = float("nan")
    load = max(ra.get("other_cores", 0.0), rb.get("other_cores", 0.0))
    ms_a, ms_b = ra.get("step_ms", nan), rb.get("step_ms", nan)
    return {"tok": rb["tokens_s_1"] / ra["tokens_s_1"], "it": ra["iter_time_1"] / rb["iter_time_1"],
            "tokens": rb["tokens_1"] / ra["tokens_1"], "steps": rb.get("steps_iter", nan) / ra.get("steps_iter", nan),
            "step_ms": ms_b / ms_a, "tok_norm": rb["tokens_s_1"] * ms_b / (ra["tokens_s_1"] * ms_a),
            "clean": load <= OTHER_LOAD_MAX, "load": load}


def paired_report(out: Path, systems: list[str] | None = None) -> dict:
    """The series in ``out/paired.jsonl``: every run, then per pair B / A (tokens/s; iteration
    time A / B, so > 1 = B faster), the median and min-max over the pairs, and each block's mean."""
    import numpy as np

    nan = float("nan")
    rows = [{**r, **run_row(Path(r["dir"]), r["system"])}      # figures read again from each run directory
            for r in map(json.loads, (out / "paired.jsonl").read_text().splitlines())]
    a, b = systems or (rows[0]["system"], next(r["system"] for r in rows if r["system"] != rows[0]["system"]))
    print(f"\n{'block':>5s} {'run':>3s} {'system':20s} {'tok/s 1+':>8s} {'it_s 1+':>7s} {'tokens/it':>9s} "
          f"{'run CPU s':>9s} {'other cores':>11s} {'steps/it':>8s} {'batch':>5s} {'step ms':>7s} {'idle':>5s} "
          f"{'few':>5s} {'trainer':>7s} {'steal':>5s} {'defer':>5s} {'lag':>3s} {'adm ms':>6s} {'p90':>5s} "
          f"{'floor':>5s} {'r long':>6s} {'r mean':>6s}")
    for r in rows:
        print(f"{r['block']:5d} {r['pos']:3d} {r['system']:20s} {r['tokens_s_1']:8.0f} {r['iter_time_1']:7.3f} "
              f"{r['tokens_1']:9.0f} {r.get('run_cpu_s', nan):9.1f} {r.get('other_cores', nan):11.2f} "
              f"{r.get('steps_iter', nan):8.1f} {r.get('batch', nan):5.1f} {r.get('step_ms', nan):7.1f} "
              f"{r.get('idle', nan):5.2f} {r.get('few', nan):5.2f} {r['trainer_1']:7.3f} {r['steal']:5d} {r['defer']:5d} "
              f"{r['lag_max']:3d} {r.get('adm_ms', nan):6.1f} {r.get('adm_p90_ms', nan):5.1f} "
              f"{r['slot_floor'] if r.get('slot_floor') is not None else nan:5.1f} "
              f"{r.get('pred_r_longest', nan):6.2f} {r.get('pred_r_mean', nan):6.2f}")
    print("(floor: the fewest engine steps per iteration any order of the run's groups could take under group "
          "slots, plan_figures; r long / r mean: correlation of the plan's predicted lengths with the drawn "
          "group longest / mean sample)")
    lags_and_instances([(r["system"], f"block {r['block']} run {r['pos']} {r['system']}", r["figures"]) for r in rows])
    pairs = []
    for blk in sorted({r["block"] for r in rows}):
        runs = sorted((r for r in rows if r["block"] == blk), key=lambda r: r["pos"])
        for x, y in zip(runs[::2], runs[1::2]):   # (0, 1), (2, 3): AB, then BA
            ra, rb = (x, y) if x["system"] == a else (y, x)
            if ra["system"] == a and rb["system"] == b:
                pairs.append({"block": blk, **pair_ratios(ra, rb)})
    if not pairs:
        print("no complete pair yet")
        return {}
    print(f"\npairs ({b} over {a}; iteration time {a} / {b}: > 1 = {b} faster; tokens/it and steps/it {b} / {a};"
          f" '*': other load above {OTHER_LOAD_MAX} cores in one of the two runs):")
    for p in pairs:
        print(f"  block {p['block']}: tokens/s {p['tok']:.3f}x   iteration time {p['it']:.3f}x   tokens/it "
              f"{p['tokens']:.3f}x   steps/it {p['steps']:.3f}x   step ms {p['step_ms']:.3f}x   tokens/s at equal "
              f"step time {p['tok_norm']:.3f}x{'' if p['clean'] else '   * other load %.2f' % p['load']}")
    res = {}
    for subset, label0 in ((pairs, "all pairs"), ([p for p in pairs if p["clean"]], "pairs without other load")):
        if not subset or (label0 != "all pairs" and len(subset) == len(pairs)):
            continue
        print(f"{label0}:")
        for key, label in (("tok", "tokens/s"), ("it", "iteration time"), ("tokens", "tokens per iteration"),
                           ("steps", "engine steps per it."), ("step_ms", "ms per engine step"),
                           ("tok_norm", "tok/s at equal step ms")):
            v = np.array([p[key] for p in subset])
            res[(label0, key)] = (float(np.median(v)), float(v.min()), float(v.max()))
            print(f"  {label:22s} median {np.median(v):.3f}x  (min {v.min():.3f}x, max {v.max():.3f}x, {len(v)} pairs)")
    fa = [r["tokens_s_1"] for r in rows if r["system"] == a]
    print(f"{a} alone: tokens/s {min(fa):.0f} .. {max(fa):.0f} over {len(fa)} runs (the drift the pairs cancel)")
    for name in (a, b):
        cut = np.array([r["steps_iter"] / r["slot_floor"] for r in rows
                        if r["system"] == name and r.get("slot_floor") and "steps_iter" in r])
        if len(cut):
            res[("slot floor", name)] = (float(np.median(cut)), float(cut.min()), float(cut.max()))
            print(f"{name}: engine steps per iteration over the slot floor median {np.median(cut):.3f}x (min "
                  f"{cut.min():.3f}x, max {cut.max():.3f}x, {len(cut)} runs): the most any order of the same "
                  "groups could cut them under group slots")
    return res


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of process ``root`` and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            f = raw[raw.rindex(")") + 2:].split()
            procs[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    total = 0.0
    for pid, (_, cpu) in procs.items():
        p, hops = pid, 0
        while p in procs and p != root and hops < 32:
            p, hops = procs[p][0], hops + 1
        if p == root:
            total += cpu
    return total


def stepcost(out: Path, extra: list[str], batches: list[int], tokens: int = 64, repeats: int = 2) -> None:
    """What one decode step of one vLLM-CPU instance costs against its batch size, on the tiny
    model of the tail benchmark: for each batch size b, b sequences of ``tokens`` tokens
    (``ignore_eos``) decode together; wall seconds and CPU seconds (this process + the engine
    core) per engine step (``tokens`` steps per batch) and per token. One engine, in this
    process, on whatever cores this process may use (run it under ``taskset -c 0`` for one)."""
    from asp_ascend.config import load_config
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.engines.rollout import RolloutEngine
    from asp_ascend.pipeline.run import prepare_model

    cfg = load_config(ROOT / "configs" / "cpu_tiny_grpo.yaml", TAIL_TASK + extra + [f"output_dir={out}"])
    train, ev = prompts_from_config(cfg)
    model = prepare_model(cfg, train, ev, out)
    eng = RolloutEngine(str(model), max_num_seqs=max(batches), max_model_len=256, seed=0,
                        kv_cache_gib=cfg.rollout.kv_cache_space_gib, dtype=cfg.model.dtype)
    try:
        prompt = [5, 6, 7, 8, 9]
        eng.warm_up([prompt], max(batches), tokens)
        print(f"cores: {sorted(os.sched_getaffinity(0))}; {tokens} decode steps per batch")
        print(f"{'batch':>5s} {'wall ms/step':>12s} {'cpu ms/step':>11s} {'cpu ms/token':>12s} {'tokens/s':>8s}")
        rows = []
        for b in batches:
            best = None
            for _ in range(repeats):
                c0, t0 = _tree_cpu(os.getpid()), time.time()
                _decode(eng, prompt, b, tokens)
                wall, cpu = time.time() - t0, _tree_cpu(os.getpid()) - c0
                if best is None or wall < best[0]:
                    best = (wall, cpu)
            wall, cpu = best
            print(f"{b:5d} {1e3 * wall / tokens:12.2f} {1e3 * cpu / tokens:11.2f} {1e3 * cpu / (b * tokens):12.3f} "
                  f"{b * tokens / wall:8.0f}", flush=True)
            rows.append({"batch": b, "wall_step_s": wall / tokens, "cpu_step_s": cpu / tokens})
    finally:
        eng.shutdown()
    import numpy as np

    n = np.array([r["batch"] for r in rows], dtype=float)
    y = np.array([r["cpu_step_s"] for r in rows])
    c, a = np.polyfit(n, y, 1)   # CPU seconds per step = a + c * batch
    fit = {"cpu_step_a": float(a), "cpu_step_c": float(c), "rows": rows, "tokens": tokens,
           "cores": sorted(os.sched_getaffinity(0))}
    (out / "stepcost.json").write_text(json.dumps(fit, indent=1))
    print(f"CPU per engine step = {1e3 * a:.2f} ms + {1e3 * c:.3f} ms x batch; wrote {out / 'stepcost.json'}")


def bound(runs: list[Path], stepcost_json: Path, target: float = 1.15) -> None:
    """The CPU-time bound of tail runs (docs/runtime.md): the fastest any dispatch order could run
    the same iterations on this machine, from iteration 1 on. Per iteration the work that stays
    whatever the order: the trainer's CPU seconds and the Ray/driver overhead (measured,
    ``cpu_samples.jsonl``); decode priced at its cheapest: one engine step serves every running
    sequence of an instance, a step costs ``a + c x batch`` CPU seconds (``stepcost.json``), and
    at most k + 1 iterations are in flight, so the run needs at least
    sum(longest sample of each iteration) / (k + 1) steps and pays ``c`` for every token. Then
    T >= max(the trainer's CPU, all that CPU / the cores); "gain max" is the run's measured time
    per iteration over that T. Also per run: its engine steps per iteration and their mean batch
    (``costs`` events; runs made before they carried ``seq_steps`` show none) and the decode CPU
    per engine step they imply.

    Against async fifo (each fifo run given, with every other run listed after it up to the next
    fifo run): "any vs fifo" = fifo's measured time over the bound of fifo's own iterations (what
    any schedule could gain over fifo on the same work); "steps for Nx" = the engine steps per
    iteration a run may take, at its own tokens, trainer and overhead CPU and at the measured step
    price, to reach ``target`` x fifo's tokens/s (its decode CPU per step as measured in the run)."""
    from asp_ascend.metrics import Timeline

    sc = json.loads(stepcost_json.read_text())
    a, c = sc["cpu_step_a"], sc["cpu_step_c"]
    print(f"step CPU = {1e3 * a:.2f} ms + {1e3 * c:.3f} ms x batch ({stepcost_json})")
    print(f"{'run':28s} {'T meas':>6s} {'tok/it':>6s} {'trainer':>7s} {'decode':>6s} {'other':>5s} {'steps/it':>8s} "
          f"{'batch':>5s} {'ms/step':>7s} {'min steps':>9s} {'decode min':>10s} {'T bound':>7s} {'gain max':>8s} "
          f"{'any vs fifo':>11s} {'steps for ' + format(target, '.2f') + 'x':>14s}")
    fifo = None
    for d in runs:
        cw = cpu_window(d / "cpu_samples.jsonl")
        if cw is None:
            print(f"{d}: no cpu_samples.jsonl (run it with bench_runtime.py tail or paired)")
            continue
        tl = Timeline.read_jsonl(d / "timeline.jsonl")
        longest, tokens = {}, {}
        for e in tl.events["request"]:
            i = e["iteration"]
            longest[i] = max(longest.get(i, 0), e["response_length"])
            tokens[i] = tokens.get(i, 0) + e["response_length"]
        its = [i for i in sorted(longest) if i >= 1]
        n = len(its)
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        tok_it = sum(r["tokens"] for r in rows[1:]) / max(1, len(rows) - 1)   # trained tokens (prompt + response)
        per = cw["wall"] / max(cw["iterations"], 1)          # measured seconds per iteration (1+)
        r = {k: v * per for k, v in cw["roles"].items()}    # CPU seconds per iteration, per role
        trainer = r.get("trainer", 0.0)
        decode = r.get("instance", 0.0) + r.get("engine", 0.0)
        other = r.get("driver", 0.0) + r.get("ray", 0.0)
        k1 = _lag_bound(d) + 1.0
        steps = sum(longest[i] for i in its) / k1 / n
        resp = sum(tokens[i] for i in its) / n
        dmin = a * steps + c * resp
        t_bound = max(trainer, (trainer + dmin + other) / cw["cores"])
        st = decode_steps(d, rows[0]["t"], rows[-1]["t"]) if len(rows) > 1 else None
        steps_it = st["steps_s"] * per if st else float("nan")
        ms_step = 1e3 * decode / steps_it if st else float("nan")
        cfg = _config(d)
        is_fifo = cfg["scheduler"]["policy"] == "fifo" and cfg["pipeline"]["mode"] == "async"
        vs, budget = "", ""
        if is_fifo:
            fifo = {"tok_s": tok_it / per, "per": per}
            vs = f"{per / t_bound:.2f}x"
        elif fifo is not None and st:
            need = tok_it / (target * fifo["tok_s"])          # seconds per iteration for the target
            # decode CPU it may spend: the cores x need, less the trainer and overhead; each step at
            # this run's measured CPU per step (which includes its per-token part at its batch)
            budget = f"{(cw['cores'] * need - trainer - other) / (ms_step / 1e3):.1f}"
        print(f"{d.name:28s} {per:6.3f} {tok_it:6.0f} {trainer:7.3f} {decode:6.3f} {other:5.3f} {steps_it:8.1f} "
              f"{(st['batch'] if st else float('nan')):5.1f} {ms_step:7.1f} {steps:9.1f} {dmin:10.3f} "
              f"{t_bound:7.3f} {per / t_bound:7.2f}x {vs:>11s} {budget:>14s}")


def _config(d: Path) -> dict:
    import yaml

    return yaml.safe_load((d / "config.yaml").read_text())


def _decode(eng, prompt: list[int], b: int, tokens: int) -> None:
    from vllm import SamplingParams

    sp = SamplingParams(n=1, temperature=1.0, max_tokens=tokens, ignore_eos=True, detokenize=False, logprobs=0)
    with eng._lock:  # the instance's step loop must not step the engine meanwhile
        eng.llm.generate([{"prompt_token_ids": prompt, "cache_salt": f"s{b}"} for _ in range(b)], sp,
                         use_tqdm=False)


def convergence(out: Path, seeds: list[int], extra: list[str], systems: list[str], launcher: list[str] | None,
                report_only: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from asp_ascend.config import run_config

    if not report_only:
        if launcher is not None:
            from bench_convergence import _finished, run_one
        for s in seeds:  # seed-major: every system has a run early
            for name in systems:
                d = out / f"{name}_seed{s}"
                ov = CONVERGENCE[name] + [f"seed={s}", "train.eval_every=0"] + extra
                if launcher is None:
                    _train(d, ov)
                elif not _finished(d):
                    run_one(d, ov, launcher, sys.stdout)
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name in systems:
        for s in seeds:
            d = out / f"{name}_seed{s}"
            if not (d / "metrics.jsonl").exists():
                print(f"{d.name}: no metrics.jsonl, left out")
                continue
            cfg = run_config(d)
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
    print(f"\n{'system':16s} mean reward per block of {CONVERGENCE_BLOCK} iterations (mean over seeds), mean over the run")
    for name, runs in curves.items():
        n = min(len(r[1]) for r in runs)
        y = np.stack([r[1][:n] for r in runs]).mean(0)
        blocks = [float(y[i:i + CONVERGENCE_BLOCK].mean()) for i in range(0, n - CONVERGENCE_BLOCK + 1, CONVERGENCE_BLOCK)]
        print(f"{name:16s} " + " ".join(f"{b:.3f}" for b in blocks) + f"   {float(y.mean()):.3f}  ({len(runs)} seeds)")
    ax.set_xlabel("trained samples")
    ax.set_ylabel("mean reward (5-iteration moving average)")
    ax.set_title("CPU default: sync vs async-ASP (band: +- std over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)
    print(f"wrote {out / 'convergence.png'}")


def _history_arg(p, a) -> list[str]:
    """The keys of ``--history`` / ``--history-quantile`` (:func:`history_overrides`), after checking
    them against the systems asked for: a history system needs the table, the table needs one, and
    the table is read once here (a bad one fails before any run, naming the file)."""
    if a.history_quantile is not None and a.history is None:
        p.error("--history-quantile needs --history PATH (the length table it reads)")
    if a.what not in ("tail", "paired") or a.report_only:
        if a.history is not None and a.what not in ("tail", "paired"):
            p.error(f"{a.what}: --history applies to tail and paired only")
        return []
    systems = [x for x in a.systems.split(",") if x]
    wants = [x for x in systems if x in HISTORY_SYSTEMS]
    if wants and a.history is None:
        p.error(f"{wants[0]} plans from a length history: add --history PATH (e.g. a frozen run's lengths.parquet)")
    if a.history is None:
        return []
    if not wants:
        p.error(f"--history is read by {', '.join(HISTORY_SYSTEMS)} only: add one to --systems "
                f"(got {a.systems or 'the default systems'!r})")
    if not 0.0 <= (a.history_quantile if a.history_quantile is not None else 0.0) <= 1.0:
        p.error(f"--history-quantile {a.history_quantile}: must be in [0, 1] (1.0: a prompt's longest sample)")
    from asp_ascend.errors import DataError
    from asp_ascend.lengths.history import load_history

    path = Path(a.history).resolve()
    try:
        load_history(path)
    except DataError as exc:
        p.error(f"--history: {exc}")
    return history_overrides(path, a.history_quantile)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("throughput", "tail", "paired", "stepcost", "bound", "latency", "convergence"))
    p.add_argument("--out", default="runs/bench_runtime")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--systems", default="", help="tail, paired, convergence: comma-separated systems to run")
    p.add_argument("--launcher", default=None, help="convergence: run each run as its own process with this "
                   "command prefix (shell-split)")
    p.add_argument("--repeats", type=int, default=2, help="tail: runs of each system (interleaved)")
    p.add_argument("--blocks", type=int, default=1, help="paired: blocks to add to --out")
    p.add_argument("--order", default="abba", choices=("abba", "ab"), help="paired: the order inside a block")
    p.add_argument("--report-only", action="store_true", help="paired, convergence: summarise --out, run nothing")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128", help="stepcost: batch sizes")
    p.add_argument("--target", type=float, default=1.15, help="bound: the throughput ratio over fifo to budget for")
    p.add_argument("--stepcost", default="runs/stepcost/stepcost.json", help="bound: stepcost's output")
    p.add_argument("--history", default=None, help="tail, paired: the length history (a run's lengths.parquet, "
                   "or a .csv/.jsonl table) the systems of HISTORY_SYSTEMS plan from (lengths.path)")
    p.add_argument("--history-quantile", type=float, default=None, help="tail, paired: predict a prompt's "
                   "length as this quantile of its history samples (1.0: the longest); without it, their mean")
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    history = _history_arg(p, a)
    out = Path(a.out)
    if a.what not in ("latency", "bound"):   # those two only read run directories: no --out
        out.mkdir(parents=True, exist_ok=True)
    if a.what == "throughput":
        throughput(out, a.overrides)
    elif a.what == "tail":
        tail(out, a.overrides, [x for x in a.systems.split(',') if x], a.repeats, history)
    elif a.what == "paired":
        pair = [x for x in a.systems.split(",") if x] or ["async_fifo", "async_asp_lossless"]
        if len(pair) != 2 or any(x not in TAIL_SYSTEMS for x in pair):
            p.error(f"paired: --systems takes two of {', '.join(TAIL_SYSTEMS)} (got {a.systems!r})")
        if a.report_only:
            paired_report(out, pair)
        else:
            paired(out, a.overrides, pair, a.blocks, a.order, history)
    elif a.what == "stepcost":
        stepcost(out, a.overrides, [int(x) for x in a.batches.split(",")])
    elif a.what == "bound":
        bound([Path(x) for x in a.overrides], Path(a.stepcost), a.target)
    elif a.what == "latency":
        if not a.overrides:
            p.error("latency: pass one or more run directories (each with timeline.jsonl and config.yaml)")
        latency([Path(x) for x in a.overrides])
    else:
        systems = [x for x in a.systems.split(",") if x] or CONVERGENCE_DEFAULT
        if any(x not in CONVERGENCE for x in systems):
            p.error(f"convergence: --systems takes any of {', '.join(CONVERGENCE)} (got {a.systems!r})")
        convergence(out.resolve(), a.seeds, a.overrides, systems,
                    None if a.launcher is None else shlex.split(a.launcher), a.report_only)


if __name__ == "__main__":
    main()
