"""The event timeline: one format for simulated and real runs (DESIGN 5).

``timeline.jsonl`` holds one JSON object per line with a ``kind``:

- ``request``: epoch, iteration, instance, prompt_id, sample, admission_version,
  t_admit, t_first_token, t_finish, prompt_length, response_length; real runs add
  finish_reason (vLLM's: ``stop`` = an end token, ``length`` = cut at the response cap)
- ``step`` (optimizer step): t_start, t_end, iteration, mini_batch, version,
  samples ([[epoch, prompt_id, sample], ...]), tokens (real prompt+response tokens),
  padded_tokens (pad slots of its padded micro-batches)
- ``queue``: t, op (put|get), size (groups in the sample queue after the op)
- ``sync``: t_start, t_end, version (the version published)
- ``instance``: t, instance, state (up|down|restart): fault-tolerance events; a ``down`` event
  of the runtime also has ``reason`` (the exception's type and message: a crash, a hang, a hung receive)
- ``trainer``: t, state (``hung``), call (the trainer call waited for: ``train_step``,
  ``accumulate``, ..., ``save_checkpoint``, ``publish``, ``node_ip``, ``open_group``,
  ``load_checkpoint``), iteration (None before the loop), mini_batch (None but for a step), version,
  waited_s, bound_s: the run stopped because a trainer call outlived its bound
  (``train.step_timeout_s``, pipeline/train_watch.py, pipeline/trainer_waits.py, pipeline/start_waits.py)
- the tail mechanisms' decisions (DESIGN 9):
  ``steal``: t, epoch, prompt_id, iteration, from_instance, to_instance, predicted_length,
  victim_work (guided dispatch moved a job not yet started);
  ``tail``: t, instance, epoch, prompt_id, iteration, room, cap (a floor-setting group was
  admitted: its instance holds at most ``cap`` sequences while it runs), ``reason`` (``plan``:
  the planner's room at admission; ``measured``: a room sized from the instance's measured
  costs at admission; ``reestimate``: a running group's room changed, room 0 = lifted;
  ``reactive``: ``rollout.tail_concurrency: reactive`` capped the instance of a critical
  group), ``remaining`` (re-estimated tokens left, with ``reestimate``);
  ``costs``: t, decode_a, decode_b, decode_c, steps, seq_steps, busy_s, train_s (real runs,
  every system: the decode-step coefficients fitted to the instances' own steps so far, the
  steps, sequence-steps and seconds inside the steps measured so far, all instances together,
  and the mean trainer seconds per iteration, scheduler/cost_meter.py; one per refit);
  ``defer``: t, epoch, prompt_id, iteration, to_iteration, remaining, budget and
  ``swap``: t, epoch, prompt_id, iteration, to_iteration, mini_batch, replaces (carry-over);
  ``regroup``: t, epoch, prompt_id, iteration, mini_batch, from_mini_batch, replaces, and ``rule``
  ``heavy_first`` for ``pipeline.regroup_heavy``'s (a generated group moved between mini-batches of
  its iteration); the simulator writes steal/tail/defer/swap/regroup too, at its simulated time;
  ``speculative``: t, instance, epoch, prompt_id, tokens, steps, tokens_per_step, draft_tokens,
  accepted_per_step (a group drawn with speculative decoding).
  ``request`` events of real runs carry ``planned_iteration`` (the schedule's; ``iteration`` is
  the iteration that trained the sample: they differ for groups partial rollout deferred or
  swapped in) and may carry ``segments`` ([[first token, version], ...]: the weights
  behind each token of the sample) and ``resumed_at`` (partial rollout: tokens kept from a
  failed instance, the sample continued from there).
- the path from a finish to the next admission (real runs; :mod:`asp_ascend.metrics.admission`):
  ``poll``: instance, groups (the finished group ids it brought), t_call (the poll began on the
  instance), t_wake (its wait for a finish ended), t_locked (it held the instance's lock), t_return,
  t_got (the orchestrator had the result); ``submit``: instance, groups (the group ids of one submit
  call), t_sent (the orchestrator sent it), t_call (it reached the instance), t_locked (it held the
  instance's engine lock), t_done (its groups were added).

Times are seconds from the run's start. :class:`Timeline` keeps events columnar
(lists of dicts per kind) and converts to pandas frames for the metric functions.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..io import json_default

KINDS = ("request", "step", "queue", "sync", "instance", "steal", "tail", "defer", "swap", "regroup", "speculative",
         "costs", "poll", "submit", "trainer")

REQUEST_FIELDS = ("epoch", "iteration", "instance", "prompt_id", "sample", "admission_version",
                  "t_admit", "t_first_token", "t_finish", "prompt_length", "response_length")
STEP_FIELDS = ("t_start", "t_end", "iteration", "mini_batch", "version", "samples", "tokens", "padded_tokens")


@dataclass
class Timeline:
    events: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def add(self, kind: str, **ev: Any) -> None:
        if kind not in self.events:
            raise ValueError(f"unknown timeline event kind {kind!r}; valid: {', '.join(KINDS)}")
        self.events[kind].append(ev)

    def extend(self, kind: str, evs: Iterable[dict[str, Any]]) -> None:
        self.events[kind].extend(evs)

    def frame(self, kind: str):
        import pandas as pd

        return pd.DataFrame(self.events[kind])

    # ---------------------------------------------------------------- jsonl
    def write_jsonl(self, path: str | Path) -> None:
        from ..io import atomic_path

        with atomic_path(path) as tmp, open(tmp, "w") as fh:
            for kind in KINDS:
                for ev in self.events[kind]:
                    fh.write(json.dumps({"kind": kind, **ev}, default=json_default) + "\n")

    @classmethod
    def read_jsonl(cls, path: str | Path) -> "Timeline":
        from ..errors import DataError

        tl = cls()
        with open(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}); "
                                    "the timeline may be truncated by a crash: delete the line") from None
                kind = ev.pop("kind", None)
                if kind not in tl.events:
                    raise DataError(f"{path}:{lineno}: unknown event kind {kind!r}; valid: {', '.join(KINDS)}")
                tl.events[kind].append(ev)
        return tl


class TimelineWriter:
    """Appends events to ``timeline.jsonl`` as they happen (real runs), flushing each line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a")

    def add(self, kind: str, **ev: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown timeline event kind {kind!r}")
        self._fh.write(json.dumps({"kind": kind, **ev}, default=json_default) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
