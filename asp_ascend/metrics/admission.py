"""From a group's finish to the next admission on its instance (real runs' timelines).

Under ``rollout.admission: groups`` a full instance admits its next group only after one of its
groups finishes: the finish reaches the orchestrator through the instance's poll, the orchestrator
dispatches, and the submit enters the engine between two engine steps. :func:`admission_latency`
measures that path in ``timeline.jsonl``; with the ``poll`` and ``submit`` events (real runs record
them) it also says where the time went.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

# the parts of the path, in order; they add up to the latency (seconds)
PARTS = ("no_poll",      # finish .. the poll that brought it began (no poll was waiting at the finish)
         "wake",         # .. that poll's wait ended
         "poll_lock",    # .. it held the instance's lock
         "poll_out",     # .. it returned (draining, progress)
         "ray_back",     # .. the orchestrator had its result
         "driver",       # .. the orchestrator sent the submit call (its loop: rewards, queue, dispatch)
         "ray_call",     # .. the call reached the instance
         "submit_lock",  # .. it held the instance's lock
         "add")          # .. the group was added (groups added before it in the same call)


def _groups(requests: list[dict]) -> dict:
    """(instance, epoch, prompt_id, t_admit) -> [t_admit, latest t_finish]."""
    g: dict[tuple, list[float]] = {}
    for e in requests:
        k = (int(e["instance"]), e["epoch"], e["prompt_id"], e["t_admit"])
        cur = g.setdefault(k, [float(e["t_admit"]), float(e["t_finish"])])
        cur[1] = max(cur[1], float(e["t_finish"]))
    return g


def _held_before(admits: np.ndarray, finishes: np.ndarray, t: float) -> int:
    """Groups an instance held just before ``t`` (admitted before it, not finished before it)."""
    return int(((admits < t) & (finishes >= t)).sum())


def admission_latency(timeline, *, slots: int | None = None) -> dict[str, Any]:
    """Every finish that freed a slot of a full instance, paired with the instance's next admission.

    Per instance: its groups from the ``request`` events (admission, last sample's finish). A
    group's finish at f *freed a slot* when the instance held ``slots`` groups just before f
    (default: the most it ever held at once). It is paired with the instance's first admission
    after f, unless a weight sync ended in between (the admission may have waited for the version,
    not for the slot). Several groups finishing in one engine step share their f: one pair.

    With ``poll`` and ``submit`` events, each pair is split into :data:`PARTS` (the poll that
    brought the finished group, the submit call that carried the admitted one); a pair whose
    submit was sent before that poll's result arrived (another finish's admission) has no split.

    Returns ``{"pairs": [{"instance", "t_finish", "t_admit", "latency", and each part when
    split}], "latency": stats, "parts": {part: stats}}`` (stats: ``n``, ``median``, ``p90``,
    ``mean``, in seconds; the parts' over the split pairs only)."""
    events = timeline.events
    req = events.get("request") or []
    if not req:
        raise ValueError("admission_latency: the timeline has no request events (nothing was generated)")
    if slots is not None and slots < 1:
        raise ValueError(f"admission_latency: slots={slots}; pass the instance's group slots (>= 1) or None")
    syncs = np.sort(np.asarray([e["t_end"] for e in events.get("sync") or []], dtype=float))
    by_inst: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    for (r, epoch, pid, _), (a, f) in _groups(req).items():
        by_inst[r].append((f"{epoch}:{pid}", a, f))
    polls: dict[tuple[int, str], dict] = {}
    for p in events.get("poll") or []:
        for gid in p["groups"]:
            polls.setdefault((int(p["instance"]), gid), p)
    submits: dict[tuple[int, str], dict] = {}
    for s in events.get("submit") or []:
        for gid in s["groups"]:
            submits[(int(s["instance"]), gid)] = s
    pairs = []
    for r, gs in sorted(by_inst.items()):
        gs.sort(key=lambda x: x[1])
        ids = [x[0] for x in gs]
        admits = np.asarray([x[1] for x in gs])
        finishes = np.asarray([x[2] for x in gs])
        cap = slots if slots is not None else max(_held_before(admits, finishes, f) for f in finishes)
        for f in np.unique(finishes):
            if _held_before(admits, finishes, f) < cap:
                continue
            j = int(np.searchsorted(admits, f, side="right"))
            if j >= len(admits):
                continue
            a = float(admits[j])
            if np.any((syncs > f) & (syncs <= a)):
                continue
            pair = {"instance": r, "t_finish": float(f), "t_admit": a, "latency": a - float(f)}
            done = [ids[i] for i in np.flatnonzero(finishes == f)]
            p = next((polls[(r, g)] for g in done if (r, g) in polls), None)
            s = submits.get((r, ids[j]))
            if p is not None and s is not None and s.get("t_sent") is not None and s["t_sent"] >= p["t_got"]:
                start = max(p["t_call"], f)
                pair.update(no_poll=start - f, wake=p["t_wake"] - start, poll_lock=p["t_locked"] - p["t_wake"],
                            poll_out=p["t_return"] - p["t_locked"], ray_back=p["t_got"] - p["t_return"],
                            driver=s["t_sent"] - p["t_got"], ray_call=s["t_call"] - s["t_sent"],
                            submit_lock=s["t_locked"] - s["t_call"], add=a - s["t_locked"])
            pairs.append(pair)
    split = [p for p in pairs if "add" in p]
    return {"pairs": pairs, "latency": _stats([p["latency"] for p in pairs]),
            "parts": {k: _stats([p[k] for p in split]) for k in PARTS}}


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "median": float("nan"), "p90": float("nan"), "mean": float("nan")}
    v = np.asarray(xs, dtype=float)
    return {"n": int(v.size), "median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
            "mean": float(v.mean())}
