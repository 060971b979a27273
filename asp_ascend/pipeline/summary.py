"""The tail keys of a real run's ``summary.json`` (DESIGN 9): what the mechanisms did, from the
run's own timeline, under the simulator's names.

``asp train`` (``pipeline/run.py: write_summary``) and MindSpeed-RL's async loop
(``integrations/mindspeed_rl/run_files.py``) write :func:`run_summary`: ``metrics.summarize``'s
entry plus :func:`carry_over_summary`, so a run's summary has the keys ``asp simulate`` writes
(``sim.mechanisms.tail_summary``): ``stolen_groups``, ``tail_capped_groups``, ``deferred_groups`` (distinct
groups deferred: a group deferred twice is one), ``regrouped_groups``
(``regrouped_heavy_first``: those of them by ``pipeline.regroup_heavy``),
and by ``metrics.deferred_lags`` ``deferred_samples``, ``policy_lag_max_lossless``,
``deferred_lag_hist`` and ``deferred_token_lag_hist``; the per-iteration length mix. ``summarize``'s
``instance_split`` (per rollout instance after iteration 0) comes from the same function in both.

No torch: numpy/pandas only (the summary is written after training, in the driver).
"""
from __future__ import annotations

TAIL_KINDS = ("steal", "tail", "defer", "swap", "regroup")


def carry_over_summary(tl, lag_bound: int) -> dict:
    """The simulator's tail keys (``sim.mechanisms.tail_summary``) from a real timeline: a sample is deferred
    when the iteration that trained it (``request.iteration``) is after its ``planned_iteration``; its token
    lag is that iteration minus the version of its last token (the last of its ``segments``)."""
    import numpy as np

    from ..sim.mechanisms import MechanismLog, tail_summary

    req = tl.frame("request")
    planned = (req["planned_iteration"] if "planned_iteration" in req else req["iteration"]).to_numpy()
    if "segments" in req:
        last = np.asarray([int(seg[-1][1]) if seg else int(v)
                           for seg, v in zip(req["segments"], req["admission_version"])])
    else:
        last = req["admission_version"].to_numpy()
    log = MechanismLog()    # counted as the simulator counts them (an event's rule, distinct deferred groups)
    for kind in TAIL_KINDS:
        for ev in tl.events[kind]:
            log(kind, **ev)
    out = tail_summary(req, planned, last, lag_bound, log)
    out["stolen_groups"] = len(tl.events["steal"])
    return out


def run_summary(tl, cfg, say=None) -> dict:
    """summary.json's entry of a real run, as the simulator writes it for the same system:
    ``metrics.summarize`` (``lower_bound_ratio`` from the cost model fitted to the run; a run too
    small to fit has none, said through ``say``) plus :func:`carry_over_summary`. ``lag_bound`` is
    the bound the run's samples are held to: k, plus ``rollout.max_split`` S with partial rollout
    (a deferred sample may be trained up to S iterations late), as ``asp simulate`` reports it;
    ``policy_lag_max_lossless`` is checked against k."""
    from ..config import lag_bound_of
    from ..errors import DataError
    from ..metrics import summarize
    from .bounds import run_lower_bounds

    k = lag_bound_of(cfg)
    try:
        lb = run_lower_bounds(tl, cfg, k)
    except DataError as exc:
        if say is not None:
            say(f"lower_bound_ratio left out: {exc}")
        lb = None
    bound = k + (int(cfg.rollout.max_split) if cfg.rollout.partial_rollout else 0)
    s = summarize(tl, num_instances=cfg.rollout.num_instances, max_num_seqs=cfg.rollout.max_num_seqs,
                  lag_bound=bound, lower_bounds=lb)
    s.update(carry_over_summary(tl, k))
    return s
