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
from .decisions import tail_decisions


def run_report(run_dir, sim_dir=None) -> int:
    """``sim_dir`` (a training run only): its simulation's output_dir, put beside the run."""
    out = Path(run_dir)
    if not out.is_dir():
        raise DataError(f"{out} is not a directory: pass the output_dir of `asp simulate` or `asp train`")
    if (out / "summary.json").is_file():
        read_json(out / "summary.json", "it is recomputed from timeline.jsonl for a training run; rerun "
                  "`asp simulate` for a simulation")
    if (out / "simulation.json").is_file() or ((out / "summary.json").is_file() and not (out / "timeline.jsonl").is_file()):
        from .sim_report import write_sim_report

        if sim_dir is not None:
            raise DataError(f"{out} is a simulation: --sim puts a simulation beside a training run; pass the "
                            "run's output_dir first")
        if not (out / "summary.json").is_file():
            raise DataError(f"{out}/summary.json is missing: the simulation did not finish; rerun `asp simulate`")
        path = write_sim_report(out)
    elif (out / "timeline.jsonl").is_file():
        path = write_train_report(out, sim_dir)
    else:
        raise DataError(f"{out} holds neither simulation.json nor timeline.jsonl: pass the output_dir of "
                        "`asp simulate` or `asp train`")
    print(f"asp report: wrote {path}")
    return 0


def read_json(path: Path, fix: str) -> dict:
    """A JSON file of a run, or a DataError naming it, the problem and ``fix`` (after "delete it:")."""
    try:
        with open(path) as fh:
            obj = json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}), e.g. cut off by a crash or a full "
                        f"disk; delete it: {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc}); delete it: {fix}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(obj).__name__}; delete it: {fix}")
    return obj


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
    from ..config import lag_bound_of, run_config, summary_key
    from ..io import write_json_atomic
    from ..metrics import summarize
    from ..metrics.timeline import Timeline

    p = out / "summary.json"
    if p.is_file():
        s = read_json(p, "it is recomputed from timeline.jsonl")
        s.pop("schema_version", None)
        return s
    tl = tl or Timeline.read_jsonl(out / "timeline.jsonl")
    cfg = run_config(out)  # through the schema: a missing key has the value the run used
    R = _num_instances(out, tl, cfg)
    s = {summary_key(cfg): summarize(tl, num_instances=R, max_num_seqs=cfg.rollout.max_num_seqs,
                                     lag_bound=lag_bound_of(cfg))}
    write_json_atomic(p, s)
    return s


def _num_instances(out: Path, tl, cfg=None) -> int:
    """The run's rollout instance count: config.yaml's (``cfg``, when the caller has read it already),
    else one past the highest instance in the timeline."""
    from ..config import run_config

    if (out / "config.yaml").is_file():
        return (cfg or run_config(out)).rollout.num_instances
    req = tl.frame("request")
    return int(req["instance"].max()) + 1 if not req.empty else 1


def instance_section(entry: dict, tl, out: Path) -> tuple[list[str], dict | None]:
    """The per-instance split of the run (summary.json's ``instance_split``; computed from the timeline for
    a summary written before the key existed) as a markdown table, and the split (None: no window)."""
    from ..metrics import instance_split_entry

    split = entry["instance_split"] if "instance_split" in entry else instance_split_entry(
        tl, num_instances=_num_instances(out, tl))
    md = ["## Per-instance split", ""]
    if split is None:
        return md + ["Fewer than two weight syncs: no window after iteration 0, so no per-instance split.", ""], None
    n = len(split["instances"])
    md += [f"Each rollout instance from the first weight sync's end to the last ({split['window_s']:.1f} s, "
           f"iteration 0 left out): the response tokens it drew, their share (even: {100 / max(n, 1):.1f} %) "
           "and the share of the time it ran at least one sequence (docs/metrics.md).", "",
           "| instance | tokens | token share | busy |", "|---|---|---|---|"]
    md += [f"| {r['instance']} | {r['tokens']} | {100 * r['token_share']:.1f} % | {r['busy']:.2f} |"
           for r in split["instances"]]
    return md + [""], split


def beside_simulation(summary: dict, sim_dir) -> list[str]:
    """The run's summary row and its simulation's under the same system-policy key."""
    sim = Path(sim_dir) / "summary.json"
    if not sim.is_file():
        raise DataError(f"{sim} is missing: --sim needs the output_dir of a finished `asp simulate`")
    with open(sim) as fh:
        simulated = json.load(fh)
    simulated.pop("schema_version", None)
    (key, entry), = summary.items()
    if key not in simulated:
        raise DataError(f"{sim}: no entry {key!r} (simulated: {', '.join(simulated)}); simulate the run's system "
                        f"with sim.policies including {key}")
    from .sim_report import summary_table

    return ["## Beside its simulation", "", f"Simulation `{Path(sim_dir).name}`, system policy `{key}`.", "",
            *summary_table({f"{key} (run)": entry, f"{key} (simulated)": simulated[key]}), ""]


def attempts(out: Path) -> list[tuple[str, pd.DataFrame]]:
    """(folder, metrics rows) of every attempt of a run, oldest first: the interrupted ones that
    `resume=true` moved to ``previous/attempt_<n>/``, then the run directory itself."""
    prev = sorted((p for p in (out / "previous").glob("attempt_*") if p.is_dir() and p.name[8:].isdigit()),
                  key=lambda p: int(p.name[8:])) if (out / "previous").is_dir() else []
    return [(f"previous/{p.name}", _read_metrics(p)) for p in prev] + [(".", _read_metrics(out))]


def _attempts_section(runs: list[tuple[str, pd.DataFrame]]) -> list[str]:
    rows = ["## Attempts", "", f"This run was resumed {len(runs) - 1} time(s). Each attempt's files are kept apart "
            "(the earlier ones under `previous/`); the per-iteration metrics below cover every attempt, the "
            "summary and the timeline plots the last one.", "",
            "| attempt | folder | iterations | rows | reward (first -> last) |", "|---|---|---|---|---|"]
    for n, (folder, m) in enumerate(runs, 1):
        if m.empty or "iteration" not in m:
            rows.append(f"| {n} | `{folder}` | none | 0 | |")
            continue
        its = f"{int(m['iteration'].min())}-{int(m['iteration'].max())}"
        rew = (f"{m['reward_mean'].iloc[0]:.3f} -> {m['reward_mean'].iloc[-1]:.3f}" if "reward_mean" in m else "")
        rows.append(f"| {n} | `{folder}` | {its} | {len(m)} | {rew} |")
    return rows + [""]


def write_train_report(out: Path, sim_dir=None) -> Path:
    from ..metrics.timeline import Timeline
    from . import plots
    from .sim_report import summary_table

    tl = Timeline.read_jsonl(out / "timeline.jsonl")
    summary = train_summary(out, tl)
    runs = attempts(out)
    metrics = pd.concat([m.assign(attempt=n) for n, (_, m) in enumerate(runs, 1) if not m.empty], ignore_index=True) \
        if any(not m.empty for _, m in runs) else pd.DataFrame()
    md = ["# Training run report", "", f"Run directory `{out.name}`.", "", "## Summary", "", *summary_table(summary), ""]
    if len(runs) > 1:
        md += _attempts_section(runs)
    if sim_dir is not None:
        md += beside_simulation(summary, sim_dir)
    md += tail_decisions(tl)
    split_md, split = instance_section(next(iter(summary.values()), {}), tl, out)
    md += split_md
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
    if split is not None:
        figs.append(("Per-instance split", plots.instance_split(split, out / "instances.png")))
    if not metrics.empty:
        figs.append(("Per-iteration metrics", plots.iteration_series(metrics, out / "iterations.png")))
        md += [f"{len(metrics)} iterations in metrics.jsonl" + (f" ({len(runs)} attempts)." if len(runs) > 1 else "."),
               ""]
    from .sim_report import write_markdown

    return write_markdown(out, md, figs, "Metric definitions: docs/metrics.md.")
