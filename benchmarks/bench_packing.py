"""Trainer time per iteration and padding bubble: padded vs sorted vs packed micro-batches.

    python benchmarks/bench_packing.py [--iterations 6] [--out runs/bench_packing] [--threads 1]
                                       [--configs configs/cpu_tiny_grpo.yaml configs/cpu_tiny_heavytail.yaml]

One run, one seed (the configs' own). For each config: the task's prompts, the tiny model the
config builds, and the iterations the config's ASP schedule plans, in schedule order (the
order in which an iteration's groups reach the trainer); each prompt's G samples answer it with
its reference answer, each sample's length scaled by a lognormal factor (sigma 0.3: the spread
within a group of a policy that has learnt the task roughly), with per-token behaviour
log-probs and advantages drawn from the seed. The real ``TrainerEngine`` then takes the
iterations' optimizer steps once per ``train.micro_batching`` mode, every mode from the same
initial weights, modes interleaved step by step (the order rotating per iteration) so that the
load of a shared machine falls on all of them alike. The trainer runs with ``--threads`` torch
threads (the configs pin it to one core). Rollout is not run: only the trainer's side differs
between the modes (the rollout, queue and sync are the same whatever the micro-batching).

Reported per config, mode and token budget (``--budgets``: the config's default 0 = micro_batch_size
x the step's longest sequence, and a fixed budget): trainer seconds per iteration (mean and median
over the timed iterations, the first iteration of each being a warm-up that is not timed),
padding bubble (pad slots / all slots, metrics.bubbles.padding_bubble over every step),
micro-batches per step, real tokens per trainer second, and the speed-up over ``padded`` at the
default budget. Seconds per packed token over seconds per padded/sorted slot, per workload and
budget, give what a packed token costs in padded slots: the simulator's packed trainer cost
(sim/costs.py ``PACKED_TOKEN_COST``). Written to
``OUT/bench_packing.json``; the table is printed as markdown (docs/runtime.md holds a copy).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("padded", "sorted", "packed")
CONFIGS = ("configs/cpu_tiny_grpo.yaml", "configs/cpu_tiny_heavytail.yaml")


def workload(cfg, out: Path, iterations: int):
    """(model_dir, [[mini-batch samples, ...] per iteration]) for ``cfg``."""
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.engines.tiny_model import load_tokenizer
    from asp_ascend.pipeline.run import prepare_model
    from asp_ascend.scheduler.run import build_schedule

    train, ev = prompts_from_config(cfg)
    model_dir = prepare_model(cfg, train, ev, out)
    sched, _ = build_schedule(cfg, train, compare=False)
    tok = load_tokenizer(model_dir)
    eos = tok.eos_token_id
    row = {pid: i for i, pid in enumerate(train.ids)}
    rng = np.random.default_rng(cfg.seed)
    G, cap = cfg.train.group_size, cfg.lengths.max_response_length
    its = []
    for it in sorted(sched["iteration"].unique())[:iterations]:
        rows = sched[sched["iteration"] == it]
        steps = []
        for _, mb in rows.groupby("mini_batch", sort=True):
            samples = []
            for pid in mb["prompt_id"]:
                i = row[pid]
                prompt = tok(train.prompts[i], add_special_tokens=False).input_ids
                answer = tok(train.answers[i], add_special_tokens=False).input_ids + [eos]
                for n in np.clip(np.rint(len(answer) * rng.lognormal(0.0, 0.3, G)), 1, cap).astype(int):
                    resp = [answer[j % len(answer)] for j in range(n)]
                    samples.append({"prompt_ids": prompt, "response_ids": resp,
                                    "behav_logprobs": rng.uniform(-2.5, -0.5, n).tolist(),
                                    "advantage": float(rng.standard_normal()),
                                    "version_first": int(it), "version_last": int(it)})
            steps.append(samples)
        its.append(steps)
    return model_dir, its


def bench_config(path: str, out: Path, iterations: int, threads: int, budgets: list[int]) -> dict:
    import torch

    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.config import load_config
    from asp_ascend.engines.trainer import TrainerEngine
    from asp_ascend.metrics.bubbles import padding_bubble

    cfg = load_config(ROOT / path, [f"output_dir={out}"])
    model_dir, its = workload(cfg, out / Path(path).stem, iterations + 1)
    t = cfg.train
    cases = [(mode, b) for b in budgets for mode in MODES]
    trainers = {}
    for mode, b in cases:
        trainers[mode, b] = TrainerEngine(
            str(model_dir), lr=t.lr, weight_decay=t.weight_decay, micro_batch_size=t.micro_batch_size,
            loss=LossConfig(clip_eps=t.clip_eps, off_policy=t.off_policy, cap=t.tis_cap, kl_coef=t.kl_coef),
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, seed=cfg.seed, dtype=cfg.model.dtype,
            micro_batching=mode, max_tokens_per_micro_batch=b)
    torch.set_num_threads(threads)
    rec = {c: {"iteration_s": [], "tokens": 0, "padded_tokens": 0, "micro_batches": 0, "steps": 0} for c in cases}
    steps_log = []
    for k, steps in enumerate(its):
        for c in cases[k % len(cases):] + cases[:k % len(cases)]:
            tr = trainers[c]
            tr.begin_iteration(k, len(steps))
            spent = 0.0
            for samples in steps:
                n_mb = len(tr.micro_batches(samples))
                st = tr.train_step(samples)
                spent += st["t_end"] - st["t_start"]
                if k:  # iteration 0 is the warm-up
                    r = rec[c]
                    r["tokens"] += st["tokens"]
                    r["padded_tokens"] += st["padded_tokens"]
                    r["micro_batches"] += n_mb
                    r["steps"] += 1
                    steps_log.append({"mode": c[0], "budget": c[1], "tokens": st["tokens"],
                                      "padded_tokens": st["padded_tokens"], "micro_batches": n_mb,
                                      "seconds": st["t_end"] - st["t_start"]})
            if k:
                rec[c]["iteration_s"].append(spent)
    rows = []
    for mode, b in cases:
        r = rec[mode, b]
        s = np.asarray(r["iteration_s"])
        rows.append({"mode": mode, "budget": b, "trainer_s_per_iteration": float(s.mean()),
                     "trainer_s_per_iteration_p50": float(np.median(s)),
                     "padding_bubble": padding_bubble(r["tokens"], r["padded_tokens"]),
                     "micro_batches_per_step": r["micro_batches"] / max(r["steps"], 1),
                     "tokens_per_s": r["tokens"] / float(s.sum()), "iterations": len(s),
                     "tokens_per_iteration": r["tokens"] / len(s)})
    base = {row["budget"]: row["trainer_s_per_iteration"] for row in rows if row["mode"] == "padded"}
    default = base[budgets[0]]
    for row in rows:
        row["speedup_vs_padded"] = default / row["trainer_s_per_iteration"]
    return {"config": path, "rows": rows, "steps": steps_log,
            "packed_attention": trainers["packed", budgets[0]].model.config._attn_implementation,
            "micro_batch_size": t.micro_batch_size}


def packed_token_cost(results: list[dict]) -> dict:
    """What a packed token costs in padded slots: per workload and budget, trainer seconds per
    packed token (packed steps) over seconds per slot (padded and sorted steps); mean and
    standard deviation over the pairs (the simulator's ``PACKED_TOKEN_COST``)."""
    pairs = {}
    for res in results:
        by = {}
        for st in res["steps"]:
            k = (st["budget"], st["mode"] == "packed")
            sec, units = by.get(k, (0.0, 0))
            by[k] = (sec + st["seconds"], units + st["tokens"] + (0 if k[1] else st["padded_tokens"]))
        for b in {k[0] for k in by}:
            (sp, up), (ss, us) = by[b, True], by[b, False]
            pairs[f"{Path(res['config']).stem}@{b}"] = (sp / up) / (ss / us)
    v = np.array(list(pairs.values()))
    return {"pairs": pairs, "mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def table(results: list[dict]) -> str:
    lines = ["| workload | micro_batching | max_tokens_per_micro_batch | trainer s / iteration (mean, p50) | "
             "padding_bubble | micro-batches / step | tokens / s | speed-up vs padded (default budget) |",
             "|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            b = r["budget"] or f"0 ({res['micro_batch_size']} x longest)"
            lines.append(f"| {Path(res['config']).stem} | {r['mode']} | {b} | {r['trainer_s_per_iteration']:.3f}, "
                         f"{r['trainer_s_per_iteration_p50']:.3f} | {r['padding_bubble']:.3f} | "
                         f"{r['micro_batches_per_step']:.1f} | {r['tokens_per_s']:.0f} | {r['speedup_vs_padded']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=6, help="timed iterations per config (after one warm-up)")
    ap.add_argument("--out", default="runs/bench_packing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--budgets", nargs="+", type=int, default=[0, 1024],
                    help="train.max_tokens_per_micro_batch values (0 = micro_batch_size x the step's longest)")
    a = ap.parse_args(argv)
    from asp_ascend.io import write_json_atomic

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = [bench_config(c, out, a.iterations, a.threads, a.budgets) for c in a.configs]
    cost = packed_token_cost(results)
    meta = {"schema_version": 1, "iterations": a.iterations, "threads": a.threads, "elapsed_s": time.time() - t0,
            "load_average_end": os.getloadavg(), "packed_token_cost": cost, "results": results}
    write_json_atomic(out / "bench_packing.json", meta)
    print(table(results))
    print(f"\na packed token costs {cost['mean']:.3f} +- {cost['std']:.3f} padded slots "
          f"({', '.join(f'{k} {v:.3f}' for k, v in cost['pairs'].items())})")
    print(f"\n{json.dumps({'elapsed_s': round(meta['elapsed_s'], 1), 'load_average_end': meta['load_average_end']})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
