"""The run's plan: the schedule written before the actors start, the adaptive re-planner, and
the tail keys the loop reads from the schedule (used by ``pipeline/run.py: run_train``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

__all__ = ["plan_run", "replanner", "resume_replanner", "tail_options"]


def plan_run(cfg, settings, train, out: Path):
    """(the execution plan, the adaptive re-planner or None): the schedule of all epochs, or of
    epoch 0 when adaptive (the later ones are planned during the run)."""
    from ..config import save_resolved
    from ..io import write_json_atomic, write_parquet_atomic
    from ..scheduler.execution import ExecutionPlan
    from ..scheduler.run import build_schedule

    plan_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1)) if settings.adaptive else cfg
    sched, report = build_schedule(plan_cfg, train, None, compare=False)
    # schedule.parquet keeps the whole plan: a run stopped by train.max_iterations can be resumed
    write_parquet_atomic(out / "schedule.parquet", sched, {"policy": cfg.scheduler.policy})
    if "admission_concurrency" in report:   # asp: the planner's per-instance admission (scheduler.concurrency)
        settings = dataclasses.replace(settings, max_num_seqs=min(settings.max_num_seqs, report["admission_concurrency"]))
    plan = ExecutionPlan.from_schedule(sched, settings, max_iterations=cfg.train.max_iterations)
    write_json_atomic(out / "schedule_report.json", report)
    save_resolved(cfg, out)
    return plan, (replanner(cfg, train, settings.lag_bound, out, sched) if settings.adaptive else None)


def replanner(cfg, train, k: int, out: Path, first, count=None):
    """``scheduler.adaptive``: plan epoch e from the response lengths observed so far. ``train``: the
    prompts (their lengths in the run's tokens), or None to read ``data.path`` counted by ``count``
    (data/prompt_tokens.py; a framework bridge's driver)."""
    import pandas as pd

    from ..io import write_parquet_atomic
    from ..scheduler.admission import Job
    from ..scheduler.execution import jobs_from_schedule
    from ..scheduler.run import inputs_from_config, plan_epoch_frame

    frames = [first]

    def replan(epoch: int, history: list[dict], offset: int) -> list[Job]:
        inp = inputs_from_config(cfg, train, pd.DataFrame(history) if history else None, count)
        df = plan_epoch_frame(cfg, inp, epoch, offset, lag_bound=k)
        frames.append(df)
        write_parquet_atomic(out / "schedule.parquet", pd.concat(frames, ignore_index=True),
                             {"policy": cfg.scheduler.policy, "adaptive": "true"})
        return jobs_from_schedule(df)

    return replan


def resume_replanner(cfg, settings, train, out: Path):
    """``scheduler.adaptive`` on a resume: the re-planner over the run's own ``schedule.parquet`` while
    epochs are still to plan, else None. The resumed loop plans epoch ``plan.next_epoch`` once the
    planned ones are dispatched, from the checkpoint's length history (``run_state.json``: the rows of
    the iterations trained before it, none of a group finished but untrained) and what it observes
    after, as the MindSpeed-RL source does from its ``lengths/`` parts."""
    import pandas as pd

    if not settings.adaptive:
        return None
    sched = pd.read_parquet(out / "schedule.parquet")
    if int(sched["epoch"].max()) + 1 >= cfg.train.epochs:
        return None
    return replanner(cfg, train, settings.lag_bound, out, sched)


def tail_options(cfg, schedule_path: Path, bridge: bool = False):
    """The tail keys for the loop (DESIGN 9); the planned rooms come from the schedule's
    ``room`` column (0: no cap). The runtime sizes rooms from its own measured costs
    (``measure_costs``: scheduler/tail_control.py); the planned rooms are then not used.
    ``bridge``: for a framework bridge's source (MindSpeed-RL), whose trainer takes an iteration
    once it is generated: ``pipeline.regroup`` and ``pipeline.regroup_heavy`` resolve off there
    (an explicit ``on`` is refused by integrations/train_only.py)."""
    import pandas as pd

    from ..scheduler.tail_control import TailOptions

    rooms = {}
    if schedule_path.is_file():
        sched = pd.read_parquet(schedule_path)
        if "room" in sched:
            capped = sched[sched["room"] > 0]
            rooms = {(int(e), str(p)): int(n) for e, p, n in zip(capped["epoch"], capped["prompt_id"], capped["room"])}
    from ..config import regroup_heavy_of, regroup_of
    from ..platforms import get_platform

    r = cfg.rollout
    # unpinned instances on the CPU share its cores with each other and the trainer: no run-time rooms
    shared = get_platform(cfg.platform, check=False).name == "cpu" and not r.cpu_cores
    return TailOptions(reestimate=cfg.scheduler.reestimate, tail_concurrency=str(r.tail_concurrency),
                       partial_rollout=r.partial_rollout, max_split=r.max_split, rooms=rooms, measure_costs=True,
                       dedicated=not shared, regroup=not bridge and regroup_of(cfg, cfg.scheduler.policy),
                       regroup_heavy=not bridge and regroup_heavy_of(cfg, cfg.scheduler.policy))
