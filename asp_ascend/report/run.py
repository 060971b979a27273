"""`asp report RUN_DIR`: plots and tables from a finished simulation or training run.

A simulation directory has ``simulation.json``; a training run has ``timeline.jsonl``
(and usually ``metrics.jsonl``, ``summary.json`` and ``config.yaml``, DESIGN 6). For a
training run without ``summary.json`` the summary is computed from the timeline with
:func:`asp_ascend.metrics.summarize` (instance count, ``max_num_seqs`` and lag bound read
from ``config.yaml``) and written.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import DataError


def run_report(run_dir) -> int:
    out = Path(run_dir)
    if not out.is_dir():
        raise DataError(f"{out} is not a directory: pass the output_dir of `asp simulate` or `asp train`")
    if (out / "simulation.json").is_file() or ((out / "summary.json").is_file() and not (out / "timeline.jsonl").is_file()):
        from .sim_report import write_sim_report

        if not (out / "summary.json").is_file():
            raise DataError(f"{out}/summary.json is missing: the simulation did not finish; rerun `asp simulate`")
        path = write_sim_report(out)
    elif (out / "timeline.jsonl").is_file():
        path = write_train_report(out)
    else:
        raise DataError(f"{out} holds neither simulation.json nor timeline.jsonl: pass the output_dir of "
                        "`asp simulate` or `asp train`")
    print(f"asp report: wrote {path}")
    return 0


def _read_config(out: Path) -> dict:
    p = out / "config.yaml"
    if not p.is_file():
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(p), resolve=True) or {}


def _read_metrics(out: Path) -> pd.DataFrame:
    p = out / "metrics.jsonl"
    if not p.is_file():
        return pd.DataFrame()
    rows = []
    with open(p) as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{p}:{lineno}: not valid JSON ({exc.msg}); delete the truncated line") from None
    return pd.DataFrame(rows)


def train_summary(out: Path, tl=None) -> dict:
    """The run's summary.json (computed from the timeline and written when absent)."""
    from ..io import write_json_atomic
    from ..metrics import summarize
    from ..metrics.timeline import Timeline

    p = out / "summary.json"
    if p.is_file():
        with open(p) as fh:
            s = json.load(fh)
        s.pop("schema_version", None)
        return s
    tl = tl or Timeline.read_jsonl(out / "timeline.jsonl")
    cfg = _read_config(out)
    req = tl.frame("request")
    R = int(cfg.get("rollout", {}).get("num_instances") or (int(req["instance"].max()) + 1 if not req.empty else 1))
    mns = int(cfg.get("rollout", {}).get("max_num_seqs", 64))
    pipe = cfg.get("pipeline", {})
    k = 0 if pipe.get("mode") == "sync" else int(pipe.get("lag_bound", 1))
    name = f"{pipe.get('mode', 'async')}_{cfg.get('scheduler', {}).get('policy', 'asp')}"
    s = {name: summarize(tl, num_instances=R, max_num_seqs=mns, lag_bound=k)}
    write_json_atomic(p, s)
    return s


def write_train_report(out: Path) -> Path:
    from ..metrics.timeline import Timeline
    from . import plots
    from .sim_report import summary_table

    tl = Timeline.read_jsonl(out / "timeline.jsonl")
    summary = train_summary(out, tl)
    metrics = _read_metrics(out)
    md = ["# Training run report", "", f"Run directory `{out.name}`.", "", "## Summary", "", *summary_table(summary), ""]
    figs = []
    req = tl.frame("request")
    if not req.empty:
        figs.append(("Per-instance timeline", plots.gantt(req, tl.frame("sync"), out / "gantt.png")))
    q = tl.frame("queue")
    if not q.empty:
        figs.append(("Trainer queue occupancy", plots.queue_occupancy({"run": q}, out / "queue_occupancy.png")))
    figs.append(("Policy lag", plots.lag_histograms({n: s.get("policy_lag_hist") for n, s in summary.items()},
                                                    out / "policy_lag.png")))
    figs.append(("Bubble breakdown", plots.bubble_breakdown(summary, out / "bubbles.png")))
    if not metrics.empty:
        figs.append(("Per-iteration metrics", plots.iteration_series(metrics, out / "iterations.png")))
        md += [f"{len(metrics)} iterations in metrics.jsonl.", ""]
    from .sim_report import write_markdown

    return write_markdown(out, md, figs, "Metric definitions: docs/metrics.md.")
