"""``report.md`` + PNG plots of a simulation directory (written by ``asp simulate``)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from . import plots

BASELINES = ("sync_colocated", "one_step_off", "fully_async_fifo")


def _load(path: Path) -> dict:
    with open(path) as fh:
        d = json.load(fh)
    d.pop("schema_version", None)
    return d


def headline(summary: dict) -> list[str]:
    """Sentences comparing asp/asp_adaptive with the baselines present in ``summary``."""
    lines = []
    for best in ("asp_adaptive", "asp"):
        if best in summary:
            break
    else:
        return lines
    a = summary[best]
    for base in BASELINES + ("async_sorted", "single_instance"):
        if base not in summary:
            continue
        b = summary[base]
        tp = a["throughput"] / b["throughput"] if b["throughput"] else float("nan")
        it = 1 - a["iteration_time_mean"] / b["iteration_time_mean"] if b["iteration_time_mean"] else float("nan")
        note = " (scheduling alone: same pipeline, fifo dispatch)" if base == "fully_async_fifo" else ""
        lines.append(f"- `{best}` vs `{base}`{note}: throughput x{tp:.2f}, mean iteration time "
                     f"{-100 * it:+.1f}%")
    return lines


def scaling_points(out: Path, sub: str = "sweep", prefix: str = "devices") -> pd.DataFrame:
    """Throughput per (point, policy) from ``out/<sub>/<prefix>_<N>/summary.json``."""
    rows = []
    for p in sorted((out / sub).glob(f"{prefix}_*/summary.json"), key=lambda q: int(q.parent.name.split("_")[1])):
        D = int(p.parent.name.split("_")[1])
        for name, s in _load(p).items():
            rows.append({"devices": D, "policy": name, "throughput": s["throughput"],
                         "iteration_time_mean": s["iteration_time_mean"]})
    return pd.DataFrame(rows)


def summary_table(summary: dict) -> list[str]:
    base = summary.get("sync_colocated")
    lines = ["| policy | devices | throughput (tok/s) | x sync_colocated | iteration time mean / p50 / p99 (s) "
             "| padding | skew | sorting | LB ratio | lag max | queue CV |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        rel = f"{s['throughput'] / base['throughput']:.2f}" if base and base["throughput"] else "-"
        lbr = s.get("lower_bound_ratio")
        lines.append(f"| {name} | {s.get('devices', '-')} | {s['throughput']:.0f} | {rel} | "
                     f"{s['iteration_time_mean']:.1f} / {s['iteration_time_p50']:.1f} / {s['iteration_time_p99']:.1f} | "
                     f"{s['padding_bubble']:.3f} | {s['skew_bubble']:.3f} | {s['sorting_bubble']:.3f} | "
                     f"{'-' if lbr is None else f'{lbr:.2f}'} | {s['policy_lag_max']} | {s['queue_occupancy_cv']:.2f} |")
    return lines


def instance_spread(summary: dict) -> list[str]:
    """Per system, how evenly its rollout instances shared the work (summary.json's ``instance_split``,
    after iteration 0): the lowest and highest token share and busy share; nothing when no entry has one."""
    rows = [(n, s["instance_split"]["instances"]) for n, s in summary.items()
            if (s.get("instance_split") or {}).get("instances")]
    if not rows:
        return []
    md = ["## Per-instance split", "", "Each system's rollout instances after iteration 0 (first to last weight "
          "sync): the lowest and highest share of the response tokens (even = 1 / instances) and of the time "
          "with at least one sequence running (busy); docs/metrics.md.", "",
          "| policy | instances | token share min / max (even) | busy min / max |", "|---|---|---|---|"]
    for name, inst in rows:
        sh, busy = [r["token_share"] for r in inst], [r["busy"] for r in inst]
        md.append(f"| {name} | {len(inst)} | {100 * min(sh):.1f} / {100 * max(sh):.1f} % ({100 / len(inst):.1f} %) "
                  f"| {min(busy):.2f} / {max(busy):.2f} |")
    return md + [""]


def write_sim_report(out, views: dict | None = None) -> Path:
    """Write ``report.md`` and the PNGs into simulation directory ``out``; returns the report path.

    ``views``: per policy, in-memory timeline frames (``request``, ``queue``, ``sync``) for the
    Gantt and queue plots, and ``decisions`` (the tail mechanisms' table, ``report.decisions.tail_decisions``);
    without them the ``timeline_<policy>.jsonl`` files are read.
    """
    out = Path(out)
    summary = _load(out / "summary.json")
    sim = _load(out / "simulation.json") if (out / "simulation.json").is_file() else {}
    md = ["# Simulation report", "", *_workload_lines(sim.get("workload")), *_systems_lines(sim.get("systems"))]
    md += ["## Results", "", *summary_table(summary), ""]
    hl = headline(summary)
    if hl:
        md += ["## Comparisons", "", *hl, ""]
    md += instance_spread(summary)
    if (out / "calibration.json").is_file():
        md += _calibration_lines(_load(out / "calibration.json"))
    figs = [("Bubble breakdown per policy", plots.bubble_breakdown(summary, out / "bubbles.png")),
            ("Policy lag", plots.lag_histograms({n: s.get("policy_lag_hist") for n, s in summary.items()},
                                                out / "policy_lag.png"))]
    for section in (_timeline_plots(out, summary, views), _scaling_section(out), _split_section(out)):
        md += section[0]
        figs += section[1]
    return write_markdown(out, md, figs, "Metric definitions: docs/metrics.md. Simulator model and its limits: "
                          "docs/simulator.md.")


def _workload_lines(w: dict | None) -> list[str]:
    if not w:
        return []
    r = w["response_length"]
    return [f"Workload `{w['name']}`: {w['prompts']} prompts x G={w['group_size']}, simulated epochs "
            f"{w['simulated_epochs']} (history epochs {w['history_epochs']}); response length mean {r['mean']:.0f}, "
            f"p50 {r['p50']:.0f}, p90 {r['p90']:.0f}, p99 {r['p99']:.0f}, max {r['max']}; prompt length mean "
            f"{w['prompt_length_mean']:.0f} tokens.", ""]


def _systems_lines(systems: dict | None) -> list[str]:
    if not systems:
        return []
    md = ["| system | devices | rollout instances x TP | trainer devices | KV tokens/instance | "
          "decode a / b / c (s) | sync (s) | preemptions |", "|---|---|---|---|---|---|---|---|"]
    for name, s in systems.items():
        sp, c = s["spec"], s["instance_cost"]
        md.append(f"| {name} | {s['devices']} | {sp['num_instances']} x {sp['tp']} | {sp['train_devices']}"
                  f"{' (shared)' if sp['colocated'] else ''} | {s['kv_capacity_tokens'] or 'unlimited'} | "
                  f"{c['decode_a']:.3g} / {c['decode_b']:.3g} / {c['decode_c']:.3g} | {s['sync_s']:.2f} | "
                  f"{s['preemptions']} |")
    return md + [""]


def _calibration_lines(cal: dict) -> list[str]:
    md = ["## Calibration", "", f"Coefficients fitted from `{cal.get('source')}` (decode R^2 "
          f"{cal.get('decode_r2', float('nan')):.3f} over {cal.get('decode_rows')} requests):", "",
          "| coefficient | value |", "|---|---|"]
    md += [f"| {k} | {v:.4g} |" for k, v in cal.items() if isinstance(v, float)]
    return md + [""]


def _timeline_plots(out: Path, summary: dict, views: dict | None) -> tuple[list[str], list]:
    """Per-policy tail mechanisms' decisions (as a training run's report shows them), Gantt charts
    and the queue plot, from ``views`` or the written timelines."""
    from ..metrics.timeline import Timeline
    from .decisions import decisions_title, tail_decisions

    figs, queues, md = [], {}, []
    for name in summary:
        v = (views or {}).get(name)
        if v is None:
            p = out / f"timeline_{name}.jsonl"
            if not p.is_file():
                continue
            tl = Timeline.read_jsonl(p)
            v = {**{k: tl.frame(k) for k in ("request", "queue", "sync")},
                 "decisions": tail_decisions(tl, decisions_title(name))}
        md += v.get("decisions", [])
        queues[name] = v["queue"]
        if not v["request"].empty:
            figs.append((f"Per-instance timeline: {name}",
                         plots.gantt(v["request"], v["sync"], out / f"gantt_{name}.png", name)))
    if not queues:
        return ["Timelines were not written (large run), so there are no Gantt or queue plots; "
                "rerun with `sim.write_timeline=always` to get them.", ""], figs
    return md, figs + [("Trainer queue occupancy", plots.queue_occupancy(queues, out / "queue_occupancy.png"))]



def _throughput_table(pts: pd.DataFrame, first_column: str) -> list[str]:
    tab = pts.pivot_table(index="devices", columns="policy", values="throughput", sort=False)
    md = [f"| {first_column} | " + " | ".join(tab.columns) + " |", "|---" * (len(tab.columns) + 1) + "|"]
    for D, row in tab.iterrows():
        md.append(f"| {D} | " + " | ".join(f"{v:.0f}" for v in row.to_numpy()) + " |")
    return md


def _scaling_section(out: Path) -> tuple[list[str], list]:
    pts = scaling_points(out)
    if pts.empty:
        return [], []
    md = ["## Scaling", "", "Trained tokens/s by device count (`sweep/devices_<D>/summary.json`):", "",
          *_throughput_table(pts, "devices"), ""]
    return md, [("Scaling curve", plots.scaling_curve(pts, out / "scaling.png"))]


def _split_section(out: Path) -> tuple[list[str], list]:
    split = scaling_points(out, "split", "rollout")
    if split.empty:
        return [], []
    best = split.loc[split.groupby("policy")["throughput"].idxmax()]
    md = ["## Rollout/trainer split", "",
          "Trained tokens/s by the number of rollout devices at the same total "
          "(`split/rollout_<Dr>/summary.json`):", "", *_throughput_table(split, "rollout devices"),
          "", "Best split per policy: " + ", ".join(f"`{r.policy}` {r.devices}" for r in best.itertuples()), ""]
    return md, [("Rollout/trainer split", plots.scaling_curve(
        split, out / "split.png", xlabel="rollout devices (the rest train)",
        title="throughput against the rollout/trainer split", log_x=False))]


def write_markdown(out: Path, md: list[str], figs: list[tuple[str, str]], footer: str) -> Path:
    """Append the plots section and ``footer`` to ``md``; write ``out/report.md`` atomically."""
    from ..io import write_text_atomic

    md = md + ["## Plots", ""]
    for title, path in figs:
        md += [f"### {title}", "", f"![{title}]({Path(path).name})", ""]
    md += [footer, ""]
    path = out / "report.md"
    write_text_atomic(path, "\n".join(md))
    return path
