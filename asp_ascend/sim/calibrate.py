"""Fit the cost model's coefficients from a run's ``timeline.jsonl`` (``asp simulate --calibrate``).

**Decode and prefill** (:mod:`.decode_fit`): engine steps reconstructed from the timeline
(each request of L tokens spans L - 1 steps between its first token and its finish), one
row per interval between observed step boundaries, fitted by non-negative least squares;
per-request mean step times when too few intervals can be reconstructed.

**Trainer and sync.** Optimizer-step duration on (token slots, 1), non-negative least squares;
sync: mean duration.

**Runtime overheads.** A real runtime loses time between the events the cost model times; the
simulator models three of them (:class:`~asp_ascend.sim.engine.TrainerSpec`), each measured from
the timeline as the mean of its own gaps (the mean, since they add up into the mean iteration
time; their distributions are long-tailed on a loaded machine):

- ``step_latency_s``: an optimizer step starts this long after both its mini-batch is generated
  and the trainer is free (result collection, rewards, the call to the trainer), measured on the
  steps whose data arrived while the trainer was idle;
- ``publish_s``: the trainer's own time per iteration boundary (publishing the weights plus the
  driver's per-iteration bookkeeping; the instances may still be loading the weights when the
  trainer goes on): the gap between an iteration's last step and the next step when the data was
  already there, minus ``step_latency_s``;
- ``admit_latency_s``: from the end of an instance's sync to its first admission of an iteration
  that this version made admissible (lag-bound admissions), pooled with the gaps from a group's
  finish to the next admission on its instance while the instance held its most groups
  (slot-bound admissions);
- ``admit_each_s``: how long one admission takes to reach its instance's engine. An instance
  handles its admissions one after another (the runtime's ``submit`` calls, each adding a
  group's requests to vLLM under the engine lock, stamping ``t_admit`` as it starts), so the
  admissions of a burst (several groups admissible at once, e.g. an iteration's groups after a
  weight sync) are stamped one hand-over apart: the mean gap between consecutive admissions on an
  instance where the later group was already admissible at the earlier stamp (nothing it could
  have waited for happened in between: no group of the instance finished, no weight sync ended,
  no optimizer step started, no tail cap changed, and its iteration was within the lag bound of the version the instance
  held; with the runtime's ``admit_latency_s``, nothing of that in the latency before the earlier
  stamp either) (:func:`_burst_gaps`).

:mod:`.replay` simulates the run's own jobs with a fit and sets the measured and simulated
per-iteration phases side by side.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..metrics.timeline import Timeline
from .decode_fit import PREFIX_BLOCK, fit_decode_requests, fit_decode_steps, fit_total

MIN_ADMISSIONS = 8   # admissions stamped in the step fit's rows below which admit_engine_s is not fitted


# --------------------------------------------------------------------------- overheads
def _group_ready(req: pd.DataFrame) -> pd.Series:
    return req.groupby(["epoch", "prompt_id"])["t_finish"].max()


def fit_overheads(tl: Timeline) -> dict:
    """``step_latency_s``, ``publish_s``, ``admit_latency_s``, ``admit_each_s`` (module doc); None
    where unmeasurable."""
    req, steps, syncs = tl.frame("request"), tl.frame("step"), tl.frame("sync")
    out = {"step_latency_s": None, "publish_s": None, "admit_latency_s": None, "admit_each_s": None}
    if not steps.empty and "samples" in steps and len(steps) >= 2:
        fin = _group_ready(req)
        ready = []
        for smp in steps["samples"]:
            keys = {(int(e), str(p)) for e, p, _ in smp} if isinstance(smp, (list, tuple)) else set()
            vals = [fin.get(k, np.nan) for k in keys]
            ready.append(max(vals) if vals and not np.isnan(vals).all() else np.nan)
        st = steps.assign(ready=np.asarray(ready, float)).sort_values("t_start").reset_index(drop=True)
        prev_end = st["t_end"].shift(1).to_numpy(float)
        start, rdy = st["t_start"].to_numpy(float), st["ready"].to_numpy(float)
        first_of_it = (st["iteration"] != st["iteration"].shift(1)).to_numpy()
        # a streamed step (pipeline.stream_groups, ``parts`` > 1) began before its last group was
        # ready and its t_start is its busy span's: neither latency is measured on it
        whole = (st["parts"].fillna(1).to_numpy(float) <= 1) if "parts" in st else np.ones(len(st), bool)
        rdy = np.where(whole, rdy, np.nan)
        data_bound = np.isfinite(rdy) & (rdy > prev_end) & (start >= rdy)
        # first step of the run: prev_end is NaN, count it as data-bound
        data_bound |= np.isfinite(rdy) & np.isnan(prev_end) & (start >= rdy)
        if data_bound.sum() >= 1:
            out["step_latency_s"] = float(np.mean(start[data_bound] - rdy[data_bound]))
        trainer_bound = np.isfinite(rdy) & np.isfinite(prev_end) & (rdy <= prev_end) & first_of_it & (start >= prev_end)
        if trainer_bound.sum() >= 1:
            gap = float(np.mean(start[trainer_bound] - prev_end[trainer_bound]))
            out["publish_s"] = float(max(0.0, gap - (out["step_latency_s"] or 0.0)))
    gaps = _admit_gaps(req, syncs)
    if gaps:
        out["admit_latency_s"] = float(np.mean(gaps))
    burst = _burst_gaps(req, syncs, tl.frame("tail"), steps, out["admit_latency_s"] or 0.0)
    if burst:
        out["admit_each_s"] = float(np.mean(burst))
    return out


def _groups_and_versions(req: pd.DataFrame, syncs: pd.DataFrame):
    """What both admission-gap fits read of a run: the lag bound seen (k), the first version, one
    row per group (its instance, first admission, last finish, iteration), and the sync ends with
    the newest version published by each (``np.maximum.accumulate``: a late sync of an older
    version does not lower it)."""
    lag = int((req["iteration"] - req["admission_version"]).max())
    v0 = int(req["admission_version"].min())
    g = req.groupby(["epoch", "prompt_id"]).agg(inst=("instance", "first"), ta=("t_admit", "min"),
                                                tf=("t_finish", "max"), it=("iteration", "first"))
    if syncs.empty:
        ends, vers = np.zeros(0), np.zeros(0, dtype=np.int64)
    else:
        sy = syncs.sort_values("t_end")
        ends, vers = sy["t_end"].to_numpy(float), np.maximum.accumulate(sy["version"].to_numpy(np.int64))
    return lag, v0, g, ends, vers


def _burst_gaps(req: pd.DataFrame, syncs: pd.DataFrame, tail: pd.DataFrame, steps: pd.DataFrame,
                late: float = 0.0) -> list:
    """Gaps between consecutive admissions on an instance within a burst (module doc,
    ``admit_each_s``): the later group was admissible at the earlier stamp (its iteration within
    the lag bound of the version the instance held then) and between the two stamps no group of
    the instance finished, no weight sync ended, no optimizer step started (the trainer's take
    frees the sample queue's room, the runtime's backpressure) and no ``tail`` event (a cap given
    or lifted) was recorded on the instance. The runtime learns of a finish or a new version
    ``admit_latency_s`` (``late``) after it, so a finish or sync end up to ``late`` before the
    earlier stamp also leaves the gap out (the later admission may have waited for it)."""
    if req.empty:
        return []
    lag, v0, g, ends, vers = _groups_and_versions(req, syncs)
    st = np.sort(steps["t_start"].to_numpy(float)) if not steps.empty else np.zeros(0)
    gaps = []
    for inst, x in g.groupby("inst"):
        x = x.sort_values("ta", kind="stable")
        ta, it = x["ta"].to_numpy(float), x["it"].to_numpy(np.int64)
        tf = np.sort(x["tf"].to_numpy(float))
        tt = np.sort(tail.loc[tail["instance"] == inst, "t"].to_numpy(float)) if not tail.empty else np.zeros(0)
        a, b = ta[:-1], ta[1:]

        def none_in(t, lo=a):       # no stamp of ``t`` in (lo, b]
            return np.searchsorted(t, b, side="right") == np.searchsorted(t, lo, side="right")

        k = np.searchsorted(ends, a, side="right") - 1
        held = np.where(k >= 0, vers[np.maximum(k, 0)] if vers.size else v0, v0)
        ok = (none_in(tf, a - late) & none_in(ends, a - late) & none_in(tt) & none_in(st)
              & (it[1:] <= held + lag))
        gaps.extend((b - a)[ok].tolist())
    return gaps


def _admit_gaps(req: pd.DataFrame, syncs: pd.DataFrame) -> list:
    """Admission latencies, per instance: (1) group finish -> next admission, when the instance
    held its most groups ever (the finish freed the slot the admission waited for) and the
    admitted group was admissible with the version the instance held at the finish; (2) sync
    end -> first admission of the iteration that version made admissible, when the instance
    had a free slot at the sync end."""
    if req.empty:
        return []
    lag, v0, g, ends, vers = _groups_and_versions(req, syncs)
    gaps = []
    for _, x in g.groupby("inst"):
        x = x.sort_values("ta")
        ta, it = x["ta"].to_numpy(float), x["it"].to_numpy(np.int64)
        tf = np.sort(x["tf"].to_numpy(float))

        def inflight(t):   # groups admitted before t and not finished before t
            return np.searchsorted(ta, t, side="left") - np.searchsorted(tf, t, side="left")

        most = int(inflight(tf).max())
        # (1) slot-bound admissions
        nxt = np.searchsorted(ta, tf, side="right")
        k_ver = np.searchsorted(ends, tf, side="right") - 1
        held = np.where(k_ver >= 0, vers[np.maximum(k_ver, 0)] if vers.size else v0, v0)
        for c, k, full, v in zip(tf, nxt, inflight(tf) == most, held):
            if full and k < ta.size and it[k] <= v + lag:
                gaps.append(float(ta[k] - c))
        # (2) version-bound admissions
        free = inflight(ends) < most
        for te, v, ok in zip(ends, vers, free):
            k = np.flatnonzero(it == v + lag)
            if ok and k.size and ta[k[0]] >= te:
                gaps.append(float(ta[k[0]] - te))
    return gaps


# --------------------------------------------------------------------------- the fit
def fit_sync(req: pd.DataFrame, syncs: pd.DataFrame) -> dict:
    """``sync_s``: the mean weight sync that starts while no instance decodes; ``sync_busy_s``: how
    much longer one takes that starts while some instance decodes (the weights land between two
    engine steps, and the instance's own work competes with loading them). On the CPU default a
    busy sync took 0.18 s against 0.07 s idle, and the share of busy syncs differs between
    systems (sync mode: none; async fifo: 3 in 4), so one mean fitted on one system mispredicts
    another. With only one kind of sync in the timeline, ``sync_s`` is their mean and
    ``sync_busy_s`` 0."""
    if syncs.empty:
        return {"sync_s": None, "sync_busy_s": None}
    dur = (syncs["t_end"] - syncs["t_start"]).to_numpy(float)
    t0 = syncs["t_start"].to_numpy(float)
    ta, tf = np.sort(req["t_admit"].to_numpy(float)), np.sort(req["t_finish"].to_numpy(float))
    busy = (np.searchsorted(ta, t0, side="right") - np.searchsorted(tf, t0, side="right")) > 0
    if busy.all() or not busy.any():
        return {"sync_s": float(dur.mean()), "sync_busy_s": 0.0}
    idle = float(dur[~busy].mean())
    return {"sync_s": idle, "sync_busy_s": float(max(0.0, dur[busy].mean() - idle))}


def run_micro_batching(steps: pd.DataFrame, configured: str = "auto") -> str:
    """The micro-batching a run's trainer used: ``train.micro_batching`` when set, else (``auto``)
    ``packed`` when no optimizer step computed a pad slot and ``sorted`` otherwise (the runtime's
    ``auto`` packs where the model's attention allows it and sorts elsewhere)."""
    if configured in ("packed", "padded", "sorted"):
        return configured
    if steps.empty or "padded_tokens" not in steps:
        return "packed"
    return "packed" if float(steps["padded_tokens"].sum()) == 0 else "sorted"


def fit_timeline(tl: Timeline, micro_batching: str = "auto", prefix_block: int = PREFIX_BLOCK) -> dict:
    """Fitted coefficients (floats; None where the timeline has no data) and fit quality.

    ``train_per_token`` is in the simulator's slot units (:func:`~asp_ascend.sim.costs.trainer_slots`
    of the run's micro-batching, :func:`run_micro_batching`): a packed step's slots are its tokens x
    ``PACKED_TOKEN_COST``, a padded or sorted one's its tokens + pad slots, so a fit on a packed run
    predicts a padded one (and back) with the measured ratio between the two. ``prefix_block``: the
    run's prefix caching (its KV block, 0 = off; ``config.prefix_block_of`` of the run's config):
    the prefill column counts the prompt tokens the engine computed (:mod:`.decode_fit`); the fit's
    ``prefix_block`` says what it assumed, and a replay charges prefill the same way."""
    from .costs import trainer_slots

    req = tl.frame("request")
    if req.empty:
        raise DataError("the timeline has no request events: nothing to calibrate from")
    syncs = tl.frame("sync")
    fit = fit_decode_steps(req, syncs, prefix_block) or fit_decode_requests(req)
    fit["prefix_block"] = int(prefix_block)
    steps = tl.frame("step")
    if not steps.empty and len(steps) >= 2:
        dur = (steps["t_end"] - steps["t_start"]).to_numpy(float)
        mode = run_micro_batching(steps, micro_batching)
        slots = trainer_slots(steps["tokens"].to_numpy(float), steps["padded_tokens"].to_numpy(float), mode)
        fit["micro_batching"] = mode
        coef = fit_total(np.column_stack([slots, np.ones_like(slots)]), dur)
        fit["train_per_token"], fit["train_per_step"] = float(coef[0]), float(coef[1])
    else:
        fit["train_per_token"] = fit["train_per_step"] = None
    fit.update(fit_sync(req, syncs))
    fit.update(fit_overheads(tl))
    _engine_cost_from_handover(fit)
    return fit


def _engine_cost_from_handover(fit: dict) -> None:
    """``admit_engine_s`` where the step fit cannot see it: a run none of whose admissions (fewer
    than MIN_ADMISSIONS) are stamped in a fitted interval (all of them land where nothing runs
    through yet: a sync run whose whole burst is handed over before the instance's first step)
    leaves the fit's admission column empty, and its 0 would price every admission beside running
    sequences as free when the fit predicts an async run. The runtime's hand-over holds the
    instance's engine lock (the step loop waits for it), so the stall an admission causes is its
    hand-over: ``admit_each_s`` stands in, marked ``admit_engine_from: handover`` (else ``steps``).
    On the CPU default the async runs' fitted admission cost is 0.8-1.0x their fitted hand-over."""
    if fit.get("decode_method") != "steps":
        return
    fit["admit_engine_from"] = "steps"
    if fit.get("decode_admissions", 0) < MIN_ADMISSIONS and (fit.get("admit_each_s") or 0.0) > 0.0:
        fit["admit_engine_s"] = float(fit["admit_each_s"])
        fit["admit_engine_from"] = "handover"


def calibrate_run(run_dir: str | Path) -> dict:
    """Read ``RUN_DIR/timeline.jsonl`` and fit the cost model."""
    path = Path(run_dir) / "timeline.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: --calibrate needs the run directory of a finished `asp train` "
                        "run (it writes timeline.jsonl)")
    from ..config import prefix_block_of, run_config

    fit = fit_timeline(Timeline.read_jsonl(path), prefix_block=prefix_block_of(run_config(run_dir)))
    fit["source"] = str(path)
    return fit
