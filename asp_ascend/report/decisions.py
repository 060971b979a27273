"""The tail mechanisms' decisions of a timeline as a report table (DESIGN 9): the training run's
report (report/run.py) and the simulation's (report/sim_report.py, one per system) show the same."""
from __future__ import annotations


def tail_decisions(tl, title: str = "## Tail mechanisms") -> list[str]:
    """The tail mechanisms' decisions in the timeline (DESIGN 9): a table, or nothing when none was made.
    ``tl``: a run's :class:`~asp_ascend.metrics.timeline.Timeline`, or a simulation's (read from its
    ``timeline_<policy>.jsonl``, or the simulator's ``SimTimeline``, whose steps are a frame)."""
    counts = {k: len(tl.events.get(k, [])) for k in ("steal", "tail", "defer", "swap", "regroup")}
    spec = tl.events.get("speculative", [])
    step_evs = tl.events.get("step") or tl.frame("step").to_dict("records")
    streamed = [e for e in step_evs if e.get("parts", 1) > 1]
    if not any(counts.values()) and not spec and not streamed:
        return []
    md = [title, "", "| decision | count |", "|---|---|"]
    md += [f"| {k} | {n} |" for k, n in counts.items()]
    if spec:
        tokens, steps = sum(e["tokens"] for e in spec), sum(e["steps"] for e in spec)
        md.append(f"| speculative groups ({tokens / max(steps, 1):.2f} tokens per engine step) | {len(spec)} |")
    if streamed:  # pipeline.stream_groups: steps whose groups reached the trainer in several parts
        waits = sum(e["t_start"] - e["t_first"] for e in streamed)   # span from the first part less busy time
        md.append(f"| streamed optimizer steps (of {len(step_evs)}; "
                  f"{sum(e['parts'] for e in streamed) / len(streamed):.1f} parts each, the trainer waited "
                  f"{waits / len(streamed):.2f} s between parts per step) | {len(streamed)} |")
    return md + [""]


def decisions_title(name: str) -> str:
    """The heading of system ``name``'s table in a simulation's report."""
    return f"## Tail mechanisms: `{name}`"
