"""PNG plots of a simulation or a training run (matplotlib, Agg backend, imported lazily).

Every function takes plain data (timeline frames, summary dicts) and a path, and returns the path.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

MAX_GANTT_BARS = 4000


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    from ..io import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def gantt(req: pd.DataFrame, syncs: pd.DataFrame, path, title: str = "") -> Path:
    """One row per rollout instance: a bar per prompt group (admission to last sample),
    coloured by iteration; weight syncs as vertical lines. Long runs show their start."""
    plt = _plt()
    g = req.groupby(["instance", "epoch", "prompt_id"], sort=False).agg(
        t0=("t_admit", "min"), t1=("t_finish", "max"), it=("iteration", "first")).reset_index()
    g = g.sort_values("t0")
    clipped = len(g) > MAX_GANTT_BARS
    if clipped:
        g = g.iloc[:MAX_GANTT_BARS]
    R = int(req["instance"].max()) + 1
    fig, ax = plt.subplots(figsize=(11, max(2.5, min(12, 0.35 * R + 1.5))))
    cmap = plt.get_cmap("tab10")
    # groups overlapping in time on one instance go to separate lanes inside its row
    from matplotlib.collections import PolyCollection

    verts, colors = [], []
    for r, gr in g.groupby("instance"):
        lanes_end: list[float] = []
        lane_of = []
        for t0, t1 in zip(gr["t0"], gr["t1"]):
            lane = next((i for i, e in enumerate(lanes_end) if e <= t0), len(lanes_end))
            if lane == len(lanes_end):
                lanes_end.append(t1)
            else:
                lanes_end[lane] = t1
            lane_of.append(lane)
        h = 0.8 / max(1, len(lanes_end))
        for t0, t1, it, lane in zip(gr["t0"], gr["t1"], gr["it"], lane_of):
            y0 = r - 0.4 + lane * h
            verts.append([(t0, y0), (t1, y0), (t1, y0 + h), (t0, y0 + h)])
            colors.append(cmap(int(it) % 10))
    ax.add_collection(PolyCollection(verts, facecolors=colors, linewidths=0))
    ax.set_xlim(float(g["t0"].min()), float(g["t1"].max()))
    ax.set_ylim(-0.6, R - 0.4)
    tmax = g["t1"].max()
    if not syncs.empty:
        for t in syncs["t_end"]:
            if t <= tmax:
                ax.axvline(t, color="k", lw=0.5, alpha=0.4)
    ax.set_yticks(range(R) if R <= 32 else range(0, R, max(1, R // 16)))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rollout instance")
    ax.set_title((title + " " if title else "") + "per-instance timeline (bars: prompt groups, colour: iteration; "
                 "lines: weight syncs)" + (f"; first {MAX_GANTT_BARS} groups" if clipped else ""), fontsize=9)
    return _save(fig, path)


def queue_occupancy(series: dict[str, pd.DataFrame], path) -> Path:
    """Trainer sample-queue length (groups) over time, one line per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, q in series.items():
        if q is None or q.empty:
            continue
        q = q.sort_values("t", kind="stable")
        t, v = q["t"].to_numpy(float), q["size"].to_numpy(float)
        if t.size > 20000:  # thin for drawing; keep the envelope
            idx = np.linspace(0, t.size - 1, 20000).astype(int)
            t, v = t[idx], v[idx]
        ax.step(t, v, where="post", lw=0.8, label=name)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("groups in trainer queue")
    ax.set_title("trainer queue occupancy", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def lag_histograms(hists: dict[str, dict], path) -> Path:
    """Share of trained samples per policy lag, one bar group per run."""
    plt = _plt()
    names = [n for n, h in hists.items() if h]
    lags = sorted({int(k) for h in hists.values() for k in (h or {})}) or [0]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(names) + 2), 3.5))
    width = 0.8 / max(1, len(lags))
    for j, lag in enumerate(lags):
        vals = []
        for n in names:
            h = hists[n]
            tot = sum(h.values())
            vals.append(h.get(str(lag), 0) / tot if tot else 0)
        ax.bar(np.arange(len(names)) + j * width, vals, width, label=f"lag {lag}")
    ax.set_xticks(np.arange(len(names)) + width * (len(lags) - 1) / 2)
    ax.set_xticklabels(names, rotation=20, fontsize=8, ha="right")
    ax.set_ylabel("share of trained samples")
    ax.set_title("policy lag (iteration - admission version)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def bubble_breakdown(summary: dict[str, dict], path) -> Path:
    """Stacked shares of rollout instance-time and trainer time per policy."""
    plt = _plt()
    names = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(names) + 3), 4), sharey=True)
    parts = {"rollout_breakdown": ("useful", "skew_bubble", "lag_blocked", "other"),
             "trainer_breakdown": ("useful", "padding", "sorting_bubble", "other")}
    colors = {"useful": "#4c9a2a", "skew_bubble": "#d95f02", "lag_blocked": "#7570b3", "other": "#bbbbbb",
              "padding": "#e7298a", "sorting_bubble": "#e6ab02"}
    for ax, (key, cats) in zip(axes, parts.items()):
        bottom = np.zeros(len(names))
        for c in cats:
            vals = np.array([float((summary[n].get(key) or {}).get(c, 0.0)) for n in names])
            ax.bar(range(len(names)), vals, bottom=bottom, color=colors[c], label=c)
            bottom += vals
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=25, fontsize=8, ha="right")
        ax.set_title("rollout instance-time" if key.startswith("rollout") else "trainer time", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("share of run time")
    return _save(fig, path)


def instance_split(split: dict, path) -> Path:
    """Per rollout instance (summary.json's ``instance_split``): its share of the response tokens, with the
    even share 1 / R as a line, and the share of the window it was busy."""
    plt = _plt()
    rows = split["instances"]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(min(14, max(6, 0.3 * len(rows) + 4)), 3), sharex=True)
    axes[0].bar(x, [r["token_share"] for r in rows], color="#1b9e77")
    axes[0].axhline(1 / max(1, len(rows)), color="k", lw=1, ls="--")
    axes[0].set_title("share of response tokens (dashed: even)", fontsize=9)
    axes[1].bar(x, [r["busy"] for r in rows], color="#7570b3")
    axes[1].set_ylim(0, 1)
    axes[1].set_title("busy (>= 1 sequence running)", fontsize=9)
    for ax in axes:
        if len(rows) <= 32:
            ax.set_xticks(x)
            ax.set_xticklabels([str(r["instance"]) for r in rows], fontsize=7)
        ax.set_xlabel("rollout instance")
    return _save(fig, path)


def scaling_curve(points: pd.DataFrame, path, metric: str = "throughput", x: str = "devices",
                  xlabel: str = "devices (rollout + training)",
                  title: str = "scaling: throughput against device count", log_x: bool = True) -> Path:
    """``points``: columns <x>, policy, <metric>. One line per policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, g in points.groupby("policy", sort=False):
        g = g.sort_values(x)
        ax.plot(g[x], g[metric], marker="o", label=name, lw=2 if name in ("asp", "single_instance") else 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("trained tokens/s" if metric == "throughput" else metric)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def iteration_series(metrics: pd.DataFrame, path) -> Path:
    """Training run: iteration time and (when logged) reward and response length per iteration."""
    plt = _plt()
    cols = [c for c in ("iteration_time_s", "throughput", "reward_mean", "response_length_mean", "policy_lag_max")
            if c in metrics.columns]
    fig, axes = plt.subplots(len(cols), 1, figsize=(8, 2.0 * max(1, len(cols))), sharex=True, squeeze=False)
    x = metrics["iteration"] if "iteration" in metrics.columns else np.arange(len(metrics))
    for ax, c in zip(axes[:, 0], cols):
        ax.plot(x, metrics[c], lw=1)
        ax.set_ylabel(c, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("iteration")
    return _save(fig, path)
