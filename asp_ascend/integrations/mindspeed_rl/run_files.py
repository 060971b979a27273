"""The async MindSpeed-RL run's own files, in the format ``asp train`` writes (DESIGN 6).

``output_dir`` gets ``timeline.jsonl`` (every event as it happens: the loop's ``request`` /
``step`` / ``sync``, the sample source's ``queue`` and the tail mechanisms' ``steal`` / ``tail`` /
``defer`` / ``swap``), ``metrics.jsonl`` (one row per iteration) and, when the run ends,
``summary.json``: the shared metric functions over the timeline (``metrics.summarize``), keyed
by the simulator's name of the run's system, plus what the tail mechanisms did
(``pipeline.summary.carry_over_summary``, as ``asp train`` writes them: ``deferred_groups``, and by
``metrics.deferred_lags`` ``deferred_lag_hist`` by admission version and ``deferred_token_lag_hist`` by the version of each
deferred sample's last token, a deferred sample being one trained after its planned iteration;
the per-iteration length mix). So ``asp report OUTPUT_DIR`` and ``asp simulate CONFIG --calibrate OUTPUT_DIR`` read a
MindSpeed-RL run as they read one of ``asp train``.

No torch: numpy/pandas only (the summary runs in the driver after training).
"""
from __future__ import annotations

import json
from pathlib import Path

from ...io import json_default
from ...metrics.timeline import Timeline, TimelineWriter

ATTEMPT_FILES = ("timeline.jsonl", "metrics.jsonl", "summary.json")


class RunFiles:
    """The loop's timeline port (``add``) and metrics sink (``on_iteration``) over ``output_dir``;
    :meth:`close` writes ``summary.json``. Each attempt's files start empty: a resumed run's earlier ones
    move to ``previous/attempt_<n>/``, as ``asp train`` keeps them (``asp report`` lists the attempts)."""

    def __init__(self, output_dir: str | Path):
        self.out = Path(output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        if any((self.out / name).exists() for name in ATTEMPT_FILES):
            from ...pipeline.checkpoint import archive_run_files

            prev = self.out / "previous"
            n = 1 + sum(1 for d in prev.glob("attempt_*") if d.is_dir()) if prev.is_dir() else 1
            archive_run_files(self.out, ATTEMPT_FILES, n)
        self.timeline = Timeline()                       # this attempt's events, for the summary
        self._writer = TimelineWriter(self.out / "timeline.jsonl")
        self._metrics = open(self.out / "metrics.jsonl", "a")

    def add(self, kind: str, **ev) -> None:
        self.timeline.add(kind, **ev)
        self._writer.add(kind, **ev)

    def on_iteration(self, row: dict) -> None:
        self._metrics.write(json.dumps(row, default=json_default) + "\n")
        self._metrics.flush()

    def close(self, cfg=None) -> dict | None:
        """Close the files; with ``cfg`` (the run's translated config) write ``summary.json`` and return it."""
        self._writer.close()
        self._metrics.close()
        if cfg is None or not self.timeline.events["request"]:
            return None
        from ...config import summary_key
        from ...io import write_json_atomic
        from ...pipeline.summary import run_summary

        s = run_summary(self.timeline, cfg)
        write_json_atomic(self.out / "summary.json", {summary_key(cfg): s})
        return s

