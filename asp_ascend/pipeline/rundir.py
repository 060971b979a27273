"""What `asp train` may do with its ``output_dir``, checked before any work (no torch, no Ray).

- A directory that already holds a run is never written into by a new run: ``resume=true``
  continues it, ``overwrite=true`` deletes its outputs first, anything else is an error. Two
  runs' files are never mixed.
- ``resume=true`` compares the command with the run's saved ``config.yaml``: a key the command
  leaves out keeps the run's value; a key it sets that changes what is trained or how it is
  scheduled is refused (named); the keys in :data:`RESUME_SAFE` (logging, timeouts, where the
  processes run, how long to train) may change. Each attempt's resolved config is written
  (``config.yaml``; the earlier attempts' under ``previous/attempt_<n>/``).
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ..errors import ConfigError

# Files and folders one `asp train` run writes into its output_dir (all of them: overwrite
# deletes exactly these, so a user's own files beside them are left alone).
TRAIN_OUTPUTS = ("config.yaml", "schedule.parquet", "schedule_report.json", "metrics.jsonl", "eval.jsonl",
                 "timeline.jsonl", "warm_start.jsonl", "summary.json", "lengths.parquet", "instances.jsonl",
                 "train.log", "report.md", "checkpoints", "previous", "tensorboard", "model_init", "wandb")
# The files of one attempt: they start empty (a resumed run's earlier attempt keeps its own under previous/).
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "timeline.jsonl", "warm_start.jsonl", "summary.json", "lengths.parquet",
             "instances.jsonl")
# Outputs that only a started training run leaves (a schedule alone, from `asp schedule`, is not a run).
RUN_MARKERS = ("metrics.jsonl", "timeline.jsonl", "summary.json", "instances.jsonl", "checkpoints", "previous")

# Keys a resumed attempt may change: they do not change what an iteration trains, nor the
# schedule, nor the sampling (prefixes end in a dot).
RESUME_SAFE = ("logging.", "sim.", "mindspeed.", "verl.", "resume", "overwrite", "output_dir",
               "train.max_iterations", "train.checkpoint_every", "train.eval_every", "train.num_cpus",
               "train.cpu_cores", "rollout.num_cpus", "rollout.cpu_cores", "rollout.kv_cache_space_gib",
               "rollout.request_timeout_s", "rollout.max_restarts", "train.step_timeout_s", "train.step_timeout_factor",
               "weight_sync.timeout_s", "weight_sync.stall_timeout_s", "weight_sync.send_slack_s",
               "weight_sync.master_port", "weight_sync.transport", "weight_sync.bucket_mb")


def is_safe(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in RESUME_SAFE)


def describe_run(out: Path) -> str | None:
    """What run ``out`` holds, in words ("a finished run (summary.json)"), or None when it holds none."""
    out = Path(out)
    if not out.is_dir():
        return None
    present = [m for m in RUN_MARKERS if (out / m).exists() and not ((out / m).is_dir() and not any((out / m).iterdir()))]
    if not present:
        return None
    if (out / "summary.json").is_file():
        return "a finished run (summary.json)"
    from .checkpoint import find_latest

    ck = find_latest(out / "checkpoints")
    if ck is not None:
        return f"an interrupted run (its newest checkpoint is checkpoints/{ck.name})"
    return f"an interrupted run without a checkpoint ({', '.join(present)})"


def check_run_dir(cfg) -> None:
    """``output_dir`` may be written by this `asp train` (see the module docstring)."""
    out = Path(cfg.output_dir)
    if cfg.resume and cfg.overwrite:
        raise ConfigError(["resume / overwrite: both are true; resume=true continues the run in output_dir, "
                           "overwrite=true deletes it and starts again: choose one"])
    if cfg.resume or cfg.overwrite:
        return
    held = describe_run(out)
    if held is not None:
        raise ConfigError([f"output_dir: {out} already holds {held}; a new run would mix its files with that "
                           "one's. Pass resume=true to continue it, overwrite=true to delete it and start again, or "
                           "choose another output_dir"])
    check_saved_schedule(cfg)


def check_saved_schedule(cfg) -> None:
    """``output_dir`` may hold a schedule without a run: ``asp schedule``'s output, or a run stopped
    before its first iteration. A new run plans its own and writes it there; that is the same
    schedule when the saved config.yaml plans like this one (the planner is deterministic), so
    it goes ahead. A schedule planned with other keys would be replaced: refused, naming them."""
    out = Path(cfg.output_dir)
    sched = out / "schedule.parquet"
    if not sched.is_file():
        return
    path = out / "config.yaml"
    if not path.is_file():
        raise ConfigError([f"output_dir: {sched} is there without the config.yaml it was planned with, so this run "
                           "cannot tell whether it plans the same schedule and would replace it. Pass overwrite=true "
                           "to replace it, or choose another output_dir"])
    from ..config import to_dict

    old, new = _flat(to_dict(_saved_config(path, "output_dir"))), _flat(to_dict(cfg))
    differ = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k) and not is_safe(k)]
    if differ:
        shown = "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in differ[:8])
        more = f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""
        raise ConfigError([f"output_dir: {out} holds a schedule (schedule.parquet, from `asp schedule` or a run "
                           f"stopped before its first iteration) planned with another config: {shown}{more}. This "
                           "run would plan its own and replace it. Pass overwrite=true to replace it, run with the "
                           "schedule's config, or choose another output_dir"])


def _saved_config(path: Path, what: str):
    """The config a run (or `asp schedule`) saved at ``path``; ConfigError prefixed by ``what`` if it does not load."""
    from ..config import load_config

    try:
        return load_config(path, check_files=False, saved=True)
    except ConfigError as exc:
        raise ConfigError([f"{what}: the saved config {path} does not load: {p}" for p in exc.problems]) from None


def clear_run(out: Path) -> list[str]:
    """``overwrite=true``: delete every output a training run writes (and nothing else). Returns the names."""
    out = Path(out)
    gone = []
    for name in TRAIN_OUTPUTS:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        gone.append(name)
    for p in out.glob("*.png"):  # `asp report`'s plots of the old run
        p.unlink()
        gone.append(p.name)
    return gone


def prepare_outputs(cfg, out: Path, resume) -> list[str]:
    """Make ``out`` ready for this attempt: the run's own files start empty; a resumed attempt's
    earlier files move under previous/attempt_<n>/ (with the config it ran with; the new
    attempt's resolved config becomes config.yaml). ``overwrite=true``: the old run's outputs
    are deleted first; their names are returned."""
    from ..config import save_resolved

    out = Path(out)
    cleared = clear_run(out) if cfg.overwrite and out.is_dir() else []
    out.mkdir(parents=True, exist_ok=True)
    if resume is not None:
        from .checkpoint import archive_run_files

        archive_run_files(out, RUN_FILES + ("config.yaml",), resume.attempt)
        save_resolved(cfg, out)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    return cleared


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def given_keys(overrides) -> set[str] | None:
    """The dotted keys a command line sets (``a.b=1`` -> ``a.b``); None = every key (an API caller)."""
    if overrides is None:
        return None
    return {o.partition("=")[0].strip().lstrip("+~") for o in overrides if "=" in o}


def _given(key: str, given: set[str] | None) -> bool:
    return given is None or any(key == g or key.startswith(g + ".") for g in given)


@dataclasses.dataclass
class ResumeConfig:
    cfg: object                       # the attempt's resolved config
    changed: dict                     # safe keys the command changed: key -> (saved, new)
    kept: dict                        # keys the command left out whose saved value differs from its config file


def resolve_resume(cfg, overrides=None) -> ResumeConfig:
    """The config of a resumed attempt: the run's saved ``config.yaml`` with the changes the
    command asks for, where allowed (ConfigError naming every refused key otherwise).

    ``overrides``: the command's ``key=value`` list; keys it does not name are "left out" and
    keep the saved value. None (an API caller passing a whole config): every key counts as given."""
    from ..config import build_config, to_dict, validate

    out = Path(cfg.output_dir)
    path = out / "config.yaml"
    if not path.is_file():
        raise ConfigError([f"resume: {path} does not exist, so the run's own config is unknown; start without "
                           "resume=true (overwrite=true to replace what is there)"])
    saved = _saved_config(path, "resume")
    old, new = _flat(to_dict(saved)), _flat(to_dict(cfg))
    given = given_keys(overrides)
    refused, changed, kept = [], {}, {}
    merged = dict(old)
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b or key in ("resume", "overwrite", "output_dir"):
            continue
        if not _given(key, given):
            kept[key] = (a, b)
        elif is_safe(key):
            changed[key] = (a, b)
            merged[key] = b
        else:
            refused.append(f"{key}: the run was made with {a!r}, this command asks for {b!r}; {key} changes what "
                           "is trained or how it is scheduled, so a resumed run keeps the run's value. Drop the "
                           "override to resume, or start a new run (another output_dir, or overwrite=true)")
    if refused:
        raise ConfigError(refused, f"(resume of {out})")
    merged.update({"resume": True, "overwrite": False, "output_dir": cfg.output_dir})
    nested: dict = {}
    for key, v in merged.items():
        *parents, leaf = key.split(".")
        d = nested
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = v
    problems: list[str] = []
    resolved = build_config(nested, problems)
    problems += validate(resolved, check_files=False)
    if problems:  # cannot happen for values that came from two valid configs; say so if it does
        raise ConfigError(problems, f"(resume of {out})")
    return ResumeConfig(resolved, changed, kept)


def interrupted_message(config: str, overrides: list[str], output_dir) -> str:
    """What `asp train` says on Ctrl-C: the checkpoint that exists and the command that resumes
    from it (or that none exists and how to start again)."""
    import shlex

    from .checkpoint import find_latest

    out = Path(output_dir)
    rest = [o for o in overrides if o.partition("=")[0].strip() not in ("resume", "overwrite")]
    ck = find_latest(out / "checkpoints")
    if ck is None:
        again = shlex.join(["asp", "train", config, *rest, "overwrite=true"])
        return (f"interrupted; no checkpoint was written in {out / 'checkpoints'} (train.checkpoint_every=N saves "
                f"one every N iterations), so the run cannot be resumed. Start it again with:\n  {again}")
    cmd = shlex.join(["asp", "train", config, *rest, "resume=true"])
    return f"interrupted; the newest checkpoint is {ck}. Resume from it with:\n  {cmd}"
