"""The tail mechanisms' decisions in a simulated timeline (DESIGN 5/9): ``asp simulate`` writes the
steal/tail/defer/swap/regroup events a real run writes, at the simulated time, matching the
summary's counts; ``deferred_groups`` counts distinct groups, not defer events."""
from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.metrics.timeline import Timeline
from asp_ascend.pipeline.summary import carry_over_summary
from asp_ascend.report.sim_report import write_sim_report
from asp_ascend.sim.mechanisms import MechanismLog, tail_summary
from asp_ascend.sim.run import run_points, simulate_system
from sim_common import small_sim_config

# the fields of each event as the runtime writes them (scheduler/tail_control.py; metrics/timeline.py)
FIELDS = {"steal": {"t", "epoch", "prompt_id", "iteration", "from_instance", "to_instance", "predicted_length",
                    "victim_work"},
          "tail": {"t", "instance", "epoch", "prompt_id", "iteration", "room", "cap", "reason"},
          "defer": {"t", "epoch", "prompt_id", "iteration", "to_iteration", "remaining", "budget"},
          "swap": {"t", "epoch", "prompt_id", "iteration", "to_iteration", "mini_batch", "replaces"},
          "regroup": {"t", "epoch", "prompt_id", "iteration", "mini_batch", "from_mini_batch", "replaces"}}
KEYS = ("stolen_groups", "tail_capped_groups", "deferred_groups", "regrouped_groups", "regrouped_heavy_first")


def _cfg(seed, **over):
    # 128 prompts x G = 4, 4 iterations of 4 mini-batches; guided dispatch, regroup, S = 2
    return small_sim_config(seed, **{"workload.num_prompts": 128, "train.global_batch_size": 32,
                                     "train.mini_batch_size": 8, "scheduler.dispatch": "guided",
                                     "pipeline.regroup": "on", "rollout.max_split": 2, **over})


@pytest.mark.parametrize("seed, tail", [(1, "off"), (3, "auto")])
def test_simulated_timeline_holds_the_tail_decisions(tmp_path, seed, tail):
    cfg = _cfg(seed, **{"rollout.tail_concurrency": tail})
    run_points(cfg, workload_from_config(cfg), ["asp", "asp_partial"], tmp_path, echo=lambda *a: None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name in ("asp", "asp_partial"):
        tl = Timeline.read_jsonl(tmp_path / f"timeline_{name}.jsonl")
        s = summary[name]
        end = max(ev["t_end"] for ev in tl.events["sync"])
        assert tl.events["regroup"], f"{name}: no regroup event"
        for kind, fields in FIELDS.items():
            for ev in tl.events[kind]:
                assert set(ev) - {"rule"} == fields, (name, kind, ev)
                assert 0.0 <= ev["t"] <= end, (name, kind, ev)
        # a group is regrouped only once some group of its iteration is generated: never at 0 s
        assert min(ev["t"] for ev in tl.events["regroup"]) > 0.0
        assert s["regrouped_groups"] == len(tl.events["regroup"])
        assert s["regrouped_heavy_first"] == sum(ev.get("rule") == "heavy_first" for ev in tl.events["regroup"])
        assert s["stolen_groups"] == len(tl.events["steal"]) > 0
        assert s["tail_capped_groups"] == len(tl.events["tail"])
        assert (len(tl.events["tail"]) > 0) == (tail == "auto")
        deferred = Counter((ev["epoch"], ev["prompt_id"]) for ev in tl.events["defer"])
        assert s["deferred_groups"] == len(deferred)
        assert len(tl.events["swap"]) == len(tl.events["defer"])
        if name == "asp_partial":
            assert deferred, "no group was deferred: the run does not test carry-over"
            # the time of a decision is the engine's: a deferral's swap at the same moment
            assert [ev["t"] for ev in tl.events["defer"]] == [ev["t"] for ev in tl.events["swap"]]
            assert sorted(ev["t"] for ev in tl.events["defer"]) == [ev["t"] for ev in tl.events["defer"]]
        else:
            assert not deferred and not tl.events["swap"]
        # a real run's summary of the same timeline counts the same (pipeline/summary.py)
        real = carry_over_summary(tl, int(cfg.pipeline.lag_bound))
        assert {x: real[x] for x in KEYS} == {x: s[x] for x in KEYS}
    # seed 1 defers one group twice (S = 2): two defer events, one deferred group
    if seed == 1:
        tl = Timeline.read_jsonl(tmp_path / "timeline_asp_partial.jsonl")
        assert len(tl.events["defer"]) > summary["asp_partial"]["deferred_groups"]
    # `asp report` on the simulation shows them as it shows a real run's
    md = write_sim_report(tmp_path).read_text()
    for name in ("asp", "asp_partial"):
        tl = Timeline.read_jsonl(tmp_path / f"timeline_{name}.jsonl")
        assert f"## Tail mechanisms: `{name}`" in md
        assert f"| regroup | {len(tl.events['regroup'])} |" in md
    assert f"| defer | {len(tl.events['defer'])} |" in md
    # as `asp simulate` writes it (the decisions from memory, not from the files)
    views = run_points(cfg, workload_from_config(cfg), ["asp", "asp_partial"], tmp_path / "again",
                       echo=lambda *a: None)
    assert write_sim_report(tmp_path / "again", views).read_text() == md


def test_unrecorded_timeline_keeps_counts_only_and_the_same_summary():
    """A run whose timeline is not written (``record_samples`` off, as the benchmarks and large runs)
    keeps no event, and recording them changes nothing the run decides."""
    cfg = _cfg(3, **{"rollout.tail_concurrency": "auto"})
    w = workload_from_config(cfg)
    for name in ("asp", "asp_partial"):
        on = simulate_system(cfg, w, name, record_samples=True)
        off = simulate_system(cfg, w, name, record_samples=False)
        assert all(not off.timeline.events[k] for k in FIELDS)
        assert all(off.timeline.frame(k).empty for k in FIELDS)
        assert on.timeline.events["regroup"] and len(on.timeline.frame("regroup")) == len(on.timeline.events["regroup"])
        assert {k: v for k, v in on.summary.items()} == {k: v for k, v in off.summary.items()}
        assert on.summary["deferred_groups"] == len({(e["epoch"], e["prompt_id"]) for e in on.timeline.events["defer"]})


def _ev(epoch, pid, it, to):
    return {"t": float(it), "epoch": epoch, "prompt_id": pid, "iteration": it, "to_iteration": to}


def test_deferred_groups_counts_groups_not_defer_events():
    # A is deferred from iteration 0 to 1 and again from 1 to 2 (S = 2), B from 0 to 1: three defer
    # events, two deferred groups. One sample per group; C and D swapped in (trained early).
    defers = [_ev(0, "A", 0, 1), _ev(0, "B", 0, 1), _ev(0, "A", 1, 2)]
    log = MechanismLog()
    for ev in defers:
        log("defer", **ev)
        log("swap", **{**ev, "prompt_id": ev["prompt_id"] + "'"})
    assert log.counts == {"defer": 3, "swap": 3}
    req = pd.DataFrame({"iteration": [2, 1, 0, 0], "admission_version": [0, 0, 0, 0], "response_length": [9, 8, 1, 1],
                        "prompt_id": ["A", "B", "C", "D"]})
    planned = [0, 0, 1, 2]
    s = tail_summary(req, planned, [0, 0, 0, 0], 1, log)
    assert s["deferred_groups"] == 2 and s["deferred_samples"] == 2
    # a real run's summary from its timeline: the same count
    tl = Timeline()
    for pid, it, p in zip(req["prompt_id"], req["iteration"], planned):
        tl.add("request", epoch=0, iteration=int(it), planned_iteration=p, instance=0, prompt_id=pid, sample=0,
               admission_version=0, t_admit=0.0, t_first_token=0.0, t_finish=1.0, prompt_length=1,
               response_length=1)
    for ev in defers:
        tl.add("defer", **ev, remaining=5.0, budget=1.0)
    assert carry_over_summary(tl, 1)["deferred_groups"] == 2
    # the same group in another epoch is another group
    tl.add("defer", **_ev(1, "A", 4, 5), remaining=5.0, budget=1.0)
    assert carry_over_summary(tl, 1)["deferred_groups"] == 3
