"""Keys only ``asp train`` runs: a framework bridge refuses them by name, with the fix."""
from __future__ import annotations


def train_only_problems(cfg, framework: str) -> list[str]:
    """The ``asp.*`` keys of ``cfg`` set to something only ``asp train`` can do under ``framework``."""
    from ..config import trained_workload_problem

    problems = []
    wl = trained_workload_problem(cfg, f"a {framework} run", f"{framework}'s own training dataset", "asp.")
    if wl:
        problems.append(wl)
    if cfg.pipeline.stream_groups == "on":   # auto: off here (the bridges stream nothing)
        problems.append(f"asp.pipeline.stream_groups: true is not supported with {framework} (its actor update "
                        "takes a whole mini-batch; only asp train streams groups into its trainer); set "
                        "asp.pipeline.stream_groups: false (or auto)")
    if cfg.pipeline.regroup == "on":   # auto: off here (the bridges run no regroup)
        problems.append(f"asp.pipeline.regroup: true is not supported with {framework} (its trainer takes an "
                        "iteration once it is generated, in the schedule's mini-batches; only asp train starts a "
                        "step before then, where re-composing mini-batches can help); set asp.pipeline.regroup: false")
    if cfg.pipeline.regroup_heavy == "on":   # auto: off here, as regroup is
        problems.append(f"asp.pipeline.regroup_heavy: true is not supported with {framework} (it re-composes "
                        "mini-batches before an iteration is generated, which only asp train's trainer does); set "
                        "asp.pipeline.regroup_heavy: false (or auto)")
    if cfg.rollout.admission != "groups":
        problems.append(f"asp.rollout.admission: {cfg.rollout.admission} is not supported with {framework} "
                        "(only asp train's rollout instances report the unfinished samples the sequence rule "
                        "counts); set asp.rollout.admission: groups")
    train, ws = type(cfg.train)(), type(cfg.weight_sync)()   # the defaults: a value off them was set
    for key, val, default in (("train.step_timeout_s", cfg.train.step_timeout_s, train.step_timeout_s),
                              ("train.step_timeout_factor", cfg.train.step_timeout_factor, train.step_timeout_factor),
                              ("weight_sync.send_slack_s", cfg.weight_sync.send_slack_s, ws.send_slack_s)):
        if val != default:
            problems.append(f"asp.{key}: {val:g} is not supported with {framework} (only asp train's loop bounds a "
                            f"hung trainer call; {framework}'s trainer runs in its own loop, which has no such "
                            f"bound); remove asp.{key}")
    return problems
