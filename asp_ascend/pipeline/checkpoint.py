"""Trainer checkpoints and `asp train ... resume=true`.

Layout (``output_dir/checkpoints``)::

    iter_000004/            one checkpoint per saved policy version
      config.json, model.safetensors, tokenizer files     (the trainer: save_pretrained)
      optimizer.pt, rng.pt                                (the trainer: AdamW state, RNG states)
      trainer_state.json                                  (the trainer: policy version)
      reference.safetensors                               (the trainer: KL reference, train.kl_coef > 0)
      run_state.json                                      (the driver: schedule cursor, length history)
    latest                  the name of the newest complete checkpoint, written last

Writing is crash-safe: everything goes into ``iter_N.tmp-<pid>`` first, the folder is renamed
to ``iter_N`` only when complete, and ``latest`` (an atomic file write) is updated after the
rename. A crash at any point leaves either the previous checkpoint as ``latest`` or a complete
new one; a left-over ``*.tmp-*`` folder or a folder missing a file is never taken as valid
(:func:`find_latest` checks every file it needs). The next attempt removes the left-over ``*.tmp-*``
folders before it saves (:func:`clean_stale_saves`). A re-save of a version (the final save) moves
the old ``iter_N`` aside as ``iter_N.old-<pid>`` before renaming the new one in; a crash between
the two renames is settled by the next look-up (:func:`settle_resaves`: the old copy is put back).

What a resume restores: the weights, the optimizer, the policy version (= the number of
trained iterations: the schedule cursor), the trainer's RNG states and the length history
observed so far; the schedule is the run's own ``schedule.parquet``. With partial rollout
(``rollout.partial_rollout``) the schedule is not the whole story: carry-over may have deferred
groups of trained iterations into later ones and swapped finished groups of later iterations
into trained ones. ``run_state.json`` then also holds ``carry_over`` (:func:`carry_state`): the
membership of every iteration from the checkpoint's version on, the deferred groups with their
planned iterations, the groups already trained ahead of their plan, and every swap so far; a
resume trains that membership (:func:`resume_plan`), not the schedule's. The MindSpeed-RL path, whose
trainer writes its own checkpoints, keeps the same state in ``output_dir/carry_over/iter_<v>.json``
(:func:`save_carry`) and restores it with the same :func:`carried_plan`. The driver draws no
random numbers (each prompt's sampling seed is derived from (seed, epoch, prompt_id)), so a
resumed run generates each remaining prompt with the same seeds as the uninterrupted one.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..engines import checkpoint_io  # torch-free at import (torch only inside its functions)
from ..errors import ConfigError
from ..scheduler.planner import SHARED_QUEUE

_log = logging.getLogger(__name__)

STATE_FILE = "run_state.json"
REQUIRED = ("config.json", "model.safetensors", checkpoint_io.OPTIMIZER_FILE, checkpoint_io.RNG_FILE,
            checkpoint_io.STATE_FILE, STATE_FILE)
SCHEMA_VERSION = 1


@dataclass
class Resume:
    """What ``resume=true`` continues from."""
    path: Path                  # the checkpoint folder (also a loadable HF model directory)
    version: int                # policy version = iterations already trained
    history: list[dict] = field(default_factory=list)  # observed lengths (the run's length history)
    attempt: int = 1            # how many times this run directory has been resumed
    carry: dict | None = None   # partial rollout: the carry-over state at the checkpoint (carry_state)


# ---------------------------------------------------------------------- writing
def save(root: Path, version: int, write_trainer, run_state: dict) -> Path:
    """Write checkpoint ``iter_<version>`` under ``root`` crash-safely and point ``latest`` at it.

    ``write_trainer(tmp_dir)`` writes the trainer's files into ``tmp_dir`` (it may run in another
    process on a shared file system). ``run_state`` is the driver's part (JSON).
    """
    from ..io import write_json_atomic, write_text_atomic

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{version:06d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_trainer(tmp)
    write_json_atomic(tmp / STATE_FILE, {"version": int(version), **run_state})
    missing = [f for f in REQUIRED if not (tmp / f).is_file()]
    if missing:
        raise RuntimeError(f"checkpoint {tmp} is missing {missing} after writing")
    _fsync_dir(tmp)
    if final.exists():  # a re-save of the same version (e.g. the final one)
        old = root / f"{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    write_text_atomic(root / "latest", final.name + "\n")
    return final


def clean_stale_saves(root: Path, say=print) -> list[Path]:
    """At the start of an attempt, before its first save: remove the ``*.tmp-*`` folders under ``root``
    that earlier saves left (a save stopped by its bound, ``CheckpointSaveHung``; a crash; a kill).
    None is ever a checkpoint (:func:`is_valid` refuses them), so only their disk space goes. A
    folder whose name carries the pid of a live process on this host other than this one (the
    driver's ``.tmp-<pid>``, the trainer's inner ``.tmp-<pid>``) is kept: that process may be a save
    still writing it (a previous attempt's trainer stuck in a file system). Each folder removed or
    kept is said (``say``); an interrupted re-save is settled first (:func:`settle_resaves`). Returns
    the removed folders."""
    root = Path(root)
    settle_resaves(root, say)
    removed: list[Path] = []
    for path in sorted(root.glob("*.tmp-*")) if root.is_dir() else []:
        if not path.is_dir():
            continue
        live = [pid for pid in _pids(path.name) if pid != os.getpid() and _alive(pid)]
        if live:
            say(f"checkpoints: kept {path.name}, left by a save that did not finish: process {live[0]} is alive on "
                "this host and may still be writing it (never used for a resume; remove it once that process is gone)")
            continue
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            say(f"checkpoints: could not remove {path}, left by a save that did not finish (never used for a resume)")
            continue
        removed.append(path)
        say(f"checkpoints: removed {path.name}, left by a save that did not finish (never used for a resume)")
    return removed


def settle_resaves(root: Path, say=None) -> list[Path]:
    """Finish what a re-save of a version (:func:`save`: ``iter_N`` moved aside as ``iter_N.old-<pid>``,
    the new one renamed into place, the old one removed) left when its process died midway. Died
    between the two renames: no ``iter_N``, only the old copy, a complete checkpoint of that version,
    so it is put back (else a resume would fall back to an earlier version). Died after them: the old
    copy beside the new ``iter_N`` is removed. A folder whose pid is this process or a live one here is
    left alone (that save may still be running). Returns the folders put back."""
    root = Path(root)
    say = say or _log.warning
    restored: list[Path] = []
    for old in sorted(root.glob("iter_*.old-*")) if root.is_dir() else []:
        base, _, pid = old.name.partition(".old-")
        if not old.is_dir() or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        if (root / base).exists():
            shutil.rmtree(old, ignore_errors=True)
            say(f"checkpoints: removed {old.name}, the previous copy of {base} left by a re-save that was interrupted")
        else:
            os.replace(old, root / base)
            restored.append(root / base)
            say(f"checkpoints: put {old.name} back as {base}: a re-save of that version was interrupted between "
                "its two renames, and this is the version's complete checkpoint")
    return restored


def _pids(name: str) -> list[int]:
    """The process ids a save folder's name carries (``iter_N.tmp-<driver>[.tmp-<trainer>]``)."""
    return [int(p.split(".")[0]) for p in name.split(".tmp-")[1:] if p.split(".")[0].isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process: alive
        return True
    except OSError:
        return False
    return True


def run_state(history: list[dict], version: int, total_iterations: int, carry: dict | None = None) -> dict:
    """The driver's part of a checkpoint: schedule cursor, the length history so far and, with
    partial rollout, the carry-over state (:func:`carry_state`)."""
    state = {"trained_iterations": int(version), "next_iteration": int(version),
             "total_iterations": int(total_iterations), "history": history}
    if carry is not None:
        state["carry_over"] = carry
    return state


def driver_state(history: list[dict], iterations: dict, version: int, total_iterations: int, carry=None) -> dict:
    """What the orchestrator saves at version ``version``: :func:`run_state` with the history of
    the groups trained so far. ``carry`` (a :class:`~asp_ascend.scheduler.carryover.CarryOver`,
    partial rollout): "trained" follows its membership, not the plan's ``iterations``, and its
    state is saved (:func:`carry_state`)."""
    trained = iterations if carry is None else carry.iterations()
    return run_state(trained_history(history, trained, version), version, total_iterations,
                     None if carry is None else carry_state(carry, version))


def carry_state(carry, version: int) -> dict:
    """The carry-over state of a :class:`~asp_ascend.scheduler.carryover.CarryOver` at a checkpoint
    of ``version`` (iterations < ``version`` trained), as JSON:

    - ``members``: ``[iteration, mini_batch, [[epoch, prompt_id], ...]]`` for every iteration from
      ``version`` up to ``end`` (one past the last the carry-over covers), in the trainer's order
      (what the resumed run trains, instead of the schedule's);
    - ``deferred``: ``[epoch, prompt_id, planned iteration, iteration]`` of the groups among them
      that carry-over moved later than planned (their lag bound counts from the planned one);
    - ``trained_ahead``: the same for groups planned at >= ``version`` already trained in an earlier
      iteration (swapped in): the resumed run does not train them again;
    - ``swaps``: every swap so far, ``[[deferred key], [swapped-in key], iteration, mini_batch,
      to_iteration, to_mini_batch]`` (the record; the resume needs only the three above).
    """
    its = carry.iterations()
    members = [[i, m, [list(k) for k in keys]] for i in sorted(its) if i >= version for m, keys in sorted(its[i].items())]
    deferred = [[*k, carry.planned[k], i] for i, _m, keys in members for k in map(tuple, keys) if carry.planned[k] < i]
    ahead = [[*k, carry.planned[k], carry.where[k][0]] for k in carry.trained
             if carry.planned[k] >= version and carry.where[k][0] < version]
    swaps = [[list(s.deferred), list(s.swapped_in), s.iteration, s.mini_batch, s.to_iteration, s.to_mini_batch]
             for s in carry.swaps]
    end = 1 + max(carry.planned.values(), default=version - 1)  # one past the last iteration it covers
    return {"version": int(version), "end": int(end), "members": members, "deferred": deferred,
            "trained_ahead": sorted(ahead), "swaps": swaps}


CARRY_DIR = "carry_over"   # the MindSpeed-RL path: its carry-over states, beside its own checkpoints


def carry_file(folder: Path, version: int) -> Path:
    """Where :func:`save_carry` writes the state of the checkpoint of ``version``."""
    return Path(folder) / f"iter_{int(version):06d}.json"


def drop_carry_after(folder: Path, version: int) -> None:
    """Remove the :func:`carry_file` states of versions after ``version`` (an interrupted attempt's,
    beyond the checkpoint a run resumes from)."""
    folder = Path(folder)
    for f in folder.glob("iter_*.json") if folder.is_dir() else ():
        v = f.stem[len("iter_"):]
        if v.isdigit() and int(v) > version:
            f.unlink()


def save_carry(folder: Path, version: int, carry) -> Path:
    """:func:`carry_state` of ``carry`` at version ``version``, written atomically to
    :func:`carry_file` for a trainer that saves its own checkpoints (MindSpeed-RL's): call it before the
    trainer's checkpoint of ``version``, so every checkpoint has its state (a crash in between leaves a
    state without its checkpoint, which the next save of that version rewrites)."""
    from ..io import write_json_atomic

    path = carry_file(folder, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, carry_state(carry, version))
    return path


def trained_history(history: list[dict], iterations: dict, version: int) -> list[dict]:
    """The length-history rows of prompts already trained (iterations < ``version``).

    ``iterations``: iteration -> mini-batch -> keys, as trained: an
    :class:`~asp_ascend.scheduler.execution.ExecutionPlan`'s, or with partial rollout the
    carry-over's current membership (``CarryOver.iterations()``: a deferred group is not trained
    yet, a group swapped into a trained iteration is). Groups of later iterations that finished
    before the checkpoint are generated again after a resume; leaving them out keeps the history
    free of duplicates."""
    later = {key for i, mbs in iterations.items() if i >= version for mb in mbs.values() for key in mb}
    return [h for h in history if (int(h["epoch"]), str(h["prompt_id"])) not in later]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- reading
def is_valid(path: Path) -> bool:
    """A complete checkpoint folder: every required file present, both state files parse."""
    path = Path(path)
    if not path.is_dir() or ".tmp-" in path.name or ".old-" in path.name:
        return False
    if not all((path / f).is_file() and (path / f).stat().st_size > 0 for f in REQUIRED):
        return False
    try:
        st = json.loads((path / STATE_FILE).read_text())
        return int(st["version"]) == checkpoint_io.read_version(path) and isinstance(st.get("history"), list)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def find_latest(root: Path) -> Path | None:
    """The checkpoint ``latest`` names if it is valid, else the newest valid ``iter_*`` folder."""
    root = Path(root)
    if not root.is_dir():
        return None
    settle_resaves(root)
    pointer = root / "latest"
    if pointer.is_file():
        name = pointer.read_text().strip()
        if name and "/" not in name and is_valid(root / name):
            return root / name
    valid = sorted(p for p in root.glob("iter_*") if is_valid(p))
    return valid[-1] if valid else None


def load(path: Path) -> Resume:
    st = json.loads((Path(path) / STATE_FILE).read_text())
    return Resume(path=Path(path), version=int(st["version"]), history=list(st["history"]),
                  carry=st.get("carry_over"))


def find_resume(out: Path) -> Resume:
    """``resume=true``: the newest valid checkpoint of ``out`` and its schedule, or a ConfigError."""
    out = Path(out)
    if not (out / "schedule.parquet").is_file():
        raise ConfigError([f"resume: {out / 'schedule.parquet'} does not exist, so there is no run to resume in "
                           f"output_dir={out}; start without resume=true"])
    path = find_latest(out / "checkpoints")
    if path is None:
        raise ConfigError([f"resume: no complete checkpoint in {out / 'checkpoints'} (set train.checkpoint_every=N "
                           "to save every N iterations); start without resume=true or point output_dir at the run"])
    res = load(path)
    prev = out / "previous"
    res.attempt = 1 + (len(list(prev.glob("attempt_*"))) if prev.is_dir() else 0)
    return res


def archive_run_files(out: Path, names, attempt: int) -> Path:
    """Move the interrupted attempt's outputs to ``out/previous/attempt_<n>/`` (kept, not merged)."""
    dest = Path(out) / "previous" / f"attempt_{attempt}"
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = Path(out) / name
        if src.exists():
            os.replace(src, dest / name)
    return dest


def resume_plan(cfg, settings, out: Path, start: int, carry: dict | None = None):
    """The run's own schedule as an :class:`~asp_ascend.scheduler.execution.ExecutionPlan` from
    iteration ``start`` on (every instance taken to hold version ``start``); the dispatch policy
    is the one the schedule was planned with. ``carry`` (a checkpoint's ``carry_over``, partial
    rollout): the iterations from ``start`` on train the saved membership instead of the
    schedule's (:func:`carried_schedule`); ``plan.carried`` holds each deferred group's planned
    iteration."""
    import dataclasses

    import pandas as pd

    out = Path(out)
    sched = pd.read_parquet(out / "schedule.parquet")
    report = json.loads((out / "schedule_report.json").read_text()) if (out / "schedule_report.json").is_file() else {}
    R = cfg.rollout.num_instances
    if int(sched["instance"].max()) >= R:
        raise ConfigError([f"resume: rollout.num_instances={R}, but the saved schedule places prompts on "
                           f"{int(sched['instance'].max()) + 1} instances; resume with the run's own instance count"])
    if report.get("policy") in SHARED_QUEUE:
        settings = dataclasses.replace(settings, policy=report["policy"])
    plan = carried_plan(sched, settings, start, carry, cfg.rollout.partial_rollout, out / "schedule.parquet",
                        max_iterations=cfg.train.max_iterations)
    if plan.total_iterations <= 0:
        raise ConfigError([f"resume: the checkpoint at version {start} has already trained every iteration of "
                           f"{out / 'schedule.parquet'} (up to iteration {plan.end - 1}); nothing to resume"])
    return plan


def carried_plan(sched, settings, start: int, carry: dict | None, partial_rollout: bool, where="schedule.parquet",
                 max_iterations: int = 0):
    """``sched`` as an :class:`~asp_ascend.scheduler.execution.ExecutionPlan` from iteration ``start`` on,
    with a checkpoint's carry-over state restored (``carry``: its :func:`carry_state`, or None): the
    iterations from ``start`` on train the saved membership instead of the schedule's
    (:func:`carried_schedule`: the groups deferred into them are in, the ones trained ahead of their plan
    out), in the trainer's order at the checkpoint, and ``plan.carried`` holds each deferred group's
    planned iteration (the carry-over's lag bound k + S counts from it). ``asp train``'s resume
    (:func:`resume_plan`) and the MindSpeed-RL source's both build their plan here."""
    from ..scheduler.execution import ExecutionPlan

    if carry is not None:
        if not partial_rollout:
            raise ConfigError([f"resume: the checkpoint at version {start} holds carry-over state (groups deferred "
                               "by partial rollout); resume with rollout.partial_rollout=true"])
        planned_pred = sched.groupby("iteration")["predicted_length"].sum()
        sched, order, carried = carried_schedule(sched, carry, start, where)
    plan = ExecutionPlan.from_schedule(sched, settings, start=start, max_iterations=max_iterations)
    if carry is not None:
        for (i, m), keys in order.items():
            if i in plan.iterations:
                plan.iterations[i][m] = list(keys)  # the trainer's order at the checkpoint
        # a step's loss normaliser uses the plan's predicted tokens of its iteration, as planned
        plan.predicted.update({int(i): float(x) for i, x in planned_pred.items() if int(i) in plan.predicted})
        plan.carried = carried
    return plan


def carried_schedule(sched, carry: dict, start: int, where="schedule.parquet"):
    """The schedule rewritten to a checkpoint's carry-over state: each group of the saved
    ``members`` moved to its saved (iteration, mini-batch), the groups trained ahead of their plan
    dropped. Returns (schedule, (iteration, mini_batch) -> keys in order, key -> planned iteration
    of the deferred groups). A state that does not fit the schedule is a ConfigError."""
    sched = sched.copy()
    keys = list(zip(sched["epoch"].astype(int), sched["prompt_id"].astype(str)))
    planned = dict(zip(keys, sched["iteration"].astype(int)))
    order = {(int(i), int(m)): [(int(e), str(p)) for e, p in ks] for i, m, ks in carry["members"]}
    slot = {k: im for im, ks in order.items() for k in ks}
    ahead = {(int(e), str(p)) for e, p, *_ in carry.get("trained_ahead", [])}
    bad = [k for k in [*slot, *ahead] if k not in planned]
    end = int(carry.get("end", max(planned.values(), default=start) + 1))  # iterations the state covers
    missing = [k for k, it in planned.items() if start <= it < end and k not in slot and k not in ahead]
    if bad or missing or int(carry.get("version", start)) != int(start):
        raise ConfigError([f"resume: the checkpoint's carry-over state (version {carry.get('version')}) does not match "
                           f"{where} at version {start}: groups {(bad or missing)[:3]} "
                           f"{'are not in the schedule' if bad else 'are neither in a later iteration nor trained'}; "
                           "resume from a checkpoint of this run"])
    sched["iteration"] = [slot[k][0] if k in slot else it for k, it in zip(keys, sched["iteration"].astype(int))]
    sched["mini_batch"] = [slot[k][1] if k in slot else m for k, m in zip(keys, sched["mini_batch"].astype(int))]
    sched = sched[[k not in ahead for k in keys]]
    carried = {k: planned[k] for k, (i, _m) in slot.items() if planned[k] < i}
    return sched.reset_index(drop=True), order, carried
