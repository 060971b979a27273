"""Values derived from several config keys, computed here once for every user."""
from __future__ import annotations

from .schema import Config


def lag_bound_of(cfg: Config) -> int:
    """k as every executor applies it: ``pipeline.lag_bound``, or 0 in ``pipeline.mode: sync``."""
    return 0 if cfg.pipeline.mode == "sync" else int(cfg.pipeline.lag_bound)


def prefix_block_of(cfg: Config) -> int:
    """The cost model's ``prefix_block``: ``rollout.kv_block_size`` with ``rollout.prefix_caching``
    on, else 0 (every sample prefills its own prompt)."""
    return int(cfg.rollout.kv_block_size) if cfg.rollout.prefix_caching else 0


def membership_options(cfg: Config) -> dict:
    """The ``scheduler.*`` keys that shape an asp plan's iteration membership, first window and
    pulled-forward groups, as ``scheduler.planner.plan``'s keyword arguments (one place for every
    caller that plans)."""
    s = cfg.scheduler
    return {"membership": s.membership, "concentrate_tail": s.concentrate_tail, "relieve_first": s.relieve_first, "fill_first": s.fill_first,
            "gather_top": s.gather_top,
            "pull_forward": s.pull_forward}


def reads_forecasts(cfg: Config) -> bool:
    """Does an asp plan of ``cfg`` read the history's record of how its forecasts came true
    (``lengths.predictors.forecast_record``)? ``scheduler.membership: auto`` and ``scheduler.gather_top``
    draw lengths from it; other plans never do, so their callers need not measure it."""
    return cfg.scheduler.membership == "auto" or cfg.scheduler.gather_top > 0


def _on_for(mode: str, policy: str) -> bool:
    """An ``auto | on | off`` key of asp's trainer-side rules: ``auto`` is on for asp's schedules,
    off for the baselines."""
    return mode == "on" or (mode == "auto" and policy == "asp")


def regroup_of(cfg: Config, policy: str) -> bool:
    """``pipeline.regroup`` for a run (or simulated system) dispatching with ``policy``: ``auto`` is
    on for asp's schedules, off for the baselines."""
    return _on_for(cfg.pipeline.regroup, policy)


def regroup_heavy_of(cfg: Config, policy: str) -> bool:
    """``pipeline.regroup_heavy`` for a run (or simulated system) dispatching with ``policy``: it
    re-composes only the mini-batches regroup manages, so ``auto`` (and ``on``) is on wherever
    :func:`regroup_of` is, ``off`` nowhere (``on`` with ``pipeline.regroup: off`` is refused)."""
    return cfg.pipeline.regroup_heavy != "off" and regroup_of(cfg, policy)


def stream_groups_of(cfg: Config, policy: str) -> bool:
    """``pipeline.stream_groups`` for a run (or simulated system) dispatching with ``policy``:
    ``auto`` is on wherever ``pipeline.regroup``'s ``auto`` is (asp's schedules), off for the
    baselines and in ``pipeline.mode: sync`` (which trains once the iteration is generated; ``on``
    is refused there); ``on`` | ``off`` for every policy."""
    mode = cfg.pipeline.stream_groups
    return mode == "on" or (cfg.pipeline.mode == "async" and _on_for(mode, policy))


# A run's pipeline.mode / scheduler.policy / scheduler.adaptive as the simulator names the same
# system (sim/policies.py): run summaries are keyed by it, so a run and its simulation line up.
# A sync run (decoupled instances, k = 0, whole-iteration training) has no simulated counterpart.
ASYNC_SYSTEM_POLICIES = {"fifo": "fully_async_fifo", "sorted": "async_sorted", "random": "async_random",
                         "balanced": "async_balanced", "asp": "asp"}


def system_policy_name(mode: str, policy: str, adaptive: bool = False) -> str | None:
    """The simulator's system policy of a run, or None when the simulator has none."""
    if mode != "async":
        return None
    if policy == "asp" and adaptive:
        return "asp_adaptive"
    return ASYNC_SYSTEM_POLICIES[policy]


def summary_key(cfg: Config) -> str:
    """A run's entry in summary.json: its simulator name, else ``<mode>_<policy>``."""
    p = cfg.pipeline.mode, cfg.scheduler.policy
    return system_policy_name(*p, cfg.scheduler.adaptive) or "_".join(p)
