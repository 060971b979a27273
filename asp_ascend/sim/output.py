"""The simulator's output: a DESIGN 5 event timeline held as pandas frames."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..metrics.timeline import KINDS, Timeline


class SimTimeline(Timeline):
    """A :class:`Timeline` whose events are held as pandas frames (fast for 10^6 requests), except
    the few of ``events`` (kind -> [fields]: the tail mechanisms' decisions), held as a real run's
    :class:`Timeline` holds them (their fields differ from event to event)."""

    def __init__(self, frames: dict[str, pd.DataFrame], events: dict[str, list] | None = None):
        super().__init__()
        self.frames = {k: frames.get(k, pd.DataFrame()) for k in KINDS}
        for kind, evs in (events or {}).items():
            if kind not in self.events:
                raise ValueError(f"unknown timeline event kind {kind!r}; valid: {', '.join(KINDS)}")
            self.events[kind] = evs

    def frame(self, kind: str) -> pd.DataFrame:
        if kind not in self.frames:
            raise ValueError(f"unknown timeline event kind {kind!r}; valid: {', '.join(KINDS)}")
        if self.events[kind] and self.frames[kind].empty:
            return pd.DataFrame(self.events[kind])
        return self.frames[kind]

    def write_jsonl(self, path) -> None:
        from ..io import atomic_path
        from .timeline_io import write_frames_jsonl

        with atomic_path(path) as tmp:
            write_frames_jsonl(self.frames, tmp, self.events)


def build_timeline(jobs, mbt: pd.DataFrame, seqs, queue: tuple, step_rows: list, sync_rows: list,
                   record_samples: bool, members: dict | None = None, trained_iteration=None,
                   streamed: bool = False, events: dict | None = None) -> SimTimeline:
    """The run's events as a :class:`SimTimeline`: one request row per sequence (``seqs``: the
    instances' per-sequence record), one step row per optimizer step (``step_rows``: (t_start,
    t_end, mini-batch index into ``mbt``, t_first, parts); ``streamed`` (the trainer streamed groups,
    ``sim.stream_groups``) adds ``t_first`` and ``parts`` to the step rows, as the runtime writes
    them), one sync row per weight sync, the trainer queue's
    puts and gets. With ``record_samples`` each step lists its (epoch, prompt_id, sample)
    triples; ``members`` ((iteration, mini_batch) -> job indices) and ``trained_iteration`` (per
    job) override the schedule's where carry-over moved groups. ``events``: the tail mechanisms'
    decisions (kind -> [fields], ``MechanismLog.events``), as the runtime writes them."""
    it = jobs.iteration if trained_iteration is None else np.asarray(trained_iteration)
    G, J = jobs.group_size, len(jobs)
    req = pd.DataFrame({
        "epoch": np.repeat(jobs.epoch, G).astype(np.int64),
        "iteration": np.repeat(it, G).astype(np.int64),
        "instance": np.asarray(seqs.seq_inst, dtype=np.int64),
        "prompt_id": np.repeat(jobs.prompt_id, G),
        "sample": np.tile(np.arange(G), J),
        "admission_version": np.asarray(seqs.adm_ver, dtype=np.int64),
        "t_admit": np.asarray(seqs.t_admit),
        "t_first_token": np.asarray(seqs.t_first),
        "t_finish": np.asarray(seqs.t_fin),
        "prompt_length": np.repeat(jobs.prompt_length, G).astype(np.int64),
        "response_length": np.asarray(seqs.resp, dtype=np.int64),
    })
    st = np.asarray(step_rows, dtype=float).reshape(-1, 5)
    x = st[:, 2].astype(np.int64)
    steps = pd.DataFrame({
        "t_start": st[:, 0], "t_end": st[:, 1],
        "iteration": mbt["iteration"].to_numpy()[x], "mini_batch": mbt["mini_batch"].to_numpy()[x],
        "version": mbt["iteration"].to_numpy()[x],
        "tokens": mbt["tokens"].to_numpy()[x], "padded_tokens": mbt["padded_tokens"].to_numpy()[x]})
    if streamed:   # as the runtime's streamed steps: when the first part began, and how many parts
        steps["t_first"] = st[:, 3]
        steps["parts"] = st[:, 4].astype(np.int64)
    if record_samples:
        steps["samples"] = _step_samples(jobs, steps, members)
    sy = np.asarray(sync_rows, dtype=float).reshape(-1, 3)
    syncs = pd.DataFrame({"t_start": sy[:, 0], "t_end": sy[:, 1], "version": sy[:, 2].astype(np.int64)})
    q = pd.DataFrame({"t": np.asarray(queue[0], dtype=float), "op": queue[1],
                      "size": np.asarray(queue[2], dtype=np.int64)})
    return SimTimeline({"request": req, "step": steps, "sync": syncs, "queue": q,
                        "instance": pd.DataFrame(columns=["t", "instance", "state"])}, events)


def _step_samples(jobs, steps: pd.DataFrame, members: dict | None) -> list:
    G = jobs.group_size
    if members is None:
        key = list(zip(jobs.iteration.tolist(), jobs.mini_batch.tolist()))
        members = {}
        for j in np.lexsort((jobs.dispatch_rank, jobs.mini_batch, jobs.iteration)).tolist():
            members.setdefault(key[j], []).append(j)
    out = {}
    for k, js in members.items():
        out[k] = [[int(jobs.epoch[j]), str(jobs.prompt_id[j]), smp] for j in js for smp in range(G)]
    return [out[(i, m)] for i, m in zip(steps["iteration"], steps["mini_batch"])]
