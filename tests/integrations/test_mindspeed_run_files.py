"""The async MindSpeed-RL loop writes the runtime's run files: a partial-rollout run on the CPU stand-ins
(TransferDock whose writes land late, DP-sharded actor group, schedule-fed instances that record the
version behind every token) leaves timeline.jsonl with the carry-over's ``defer`` / ``swap`` events,
per-token ``segments``, metrics.jsonl and summary.json with the deferred samples' lag histograms, and
``asp report`` and ``asp simulate --calibrate`` read the directory."""
from __future__ import annotations

import json

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from asp_ascend.integrations.mindspeed_rl.async_loop import AsyncGRPOLoop, LoopPorts, LoopSettings  # noqa: E402
from asp_ascend.integrations.mindspeed_rl.run_files import RunFiles  # noqa: E402
from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource  # noqa: E402
from asp_ascend.integrations.mindspeed_rl.trainer import ROLLOUT_LOG_PROB, TransferDockStore  # noqa: E402
from asp_ascend.metrics.timeline import Timeline  # noqa: E402
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings  # noqa: E402
from asp_ascend.scheduler.tail_control import TailOptions  # noqa: E402
from cpu_groups import CpuActorGroup, group_norm_advantage, rule_reward  # noqa: E402
from td_standin import DataStrategy, TransferDock, resolve, unpad  # noqa: E402

VOCAB, N, GBS, K, S = 6, 2, 4, 1, 1
LENGTHS = {str(p): (40 if p == 1 else 2 + p % 2) for p in range(12)}   # prompt 1 is the iteration-0 tail


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class TokenInstance:
    """The runtime rollout actor's submit/poll on a shared clock: one decode step per poll for every running
    group; every token is labelled with the instance's version when it is drawn (``segments``)."""

    def __init__(self, idx: int, clock: Clock):
        self.idx, self.clock, self.version, self.running = idx, clock, 0, []

    def submit(self, group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta=None):
        self.running.append({"meta": meta, "len": LENGTHS[meta["prompt_id"]], "n": n, "version": self.version,
                             "t_admit": self.clock(), "tokens": 0, "segments": [], "t_first": None})
        return self.version

    def poll(self):
        self.clock.t += 0.01 * (1 + len(self.running) / 8)       # one decode step
        done = []
        for g in list(self.running):
            if not g["segments"] or g["segments"][-1][1] != self.version:
                g["segments"].append([g["tokens"], self.version])
            g["tokens"] += 1
            g["t_first"] = g["t_first"] or self.clock()
            if g["tokens"] == g["len"]:
                self.running.remove(g)
                done.append({"meta": g["meta"], "admission_version": g["version"], "t_admit": g["t_admit"],
                             "samples": [{"token_ids": [s] * g["len"], "logprobs": [-0.5] * g["len"],
                                          "t_first_token": g["t_first"], "t_finish": self.clock(),
                                          "segments": [list(x) for x in g["segments"]],
                                          "finish_reason": "stop"} for s in range(g["n"])]})
        return {"groups": done}


def run_partial(out):
    """Three iterations of gbs 4, G = 2, k = 1, S = 1 through the loop; returns the loop's metrics rows."""
    rows = [dict(epoch=0, prompt_id=str(p), iteration=p // GBS, mini_batch=(p % GBS) // 2, instance=p % 2,
                 dispatch_rank=p, predicted_length=float(LENGTHS[str(p)])) for p in range(12)]
    plan = ExecutionPlan.from_schedule(pd.DataFrame(rows), ExecutionSettings(
        policy="asp", lag_bound=K, group_size=N, max_num_seqs=4 * N, num_instances=2))
    clock = Clock()
    insts = [TokenInstance(0, clock), TokenInstance(1, clock)]
    src = DispatcherSource(plan, insts, lambda pid: ([int(pid) % VOCAB, 1], {"labels": [int(pid) % VOCAB]}),
                           sampling={"max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0,
                                     "stop_token_ids": []}, poll_interval_s=0.0, clock=clock,
                           tail=TailOptions(reestimate=True, partial_rollout=True, max_split=S), max_tokens=64)

    def step_clock():
        clock.t += 0.005
        return clock.t

    def publish(v):
        clock.t += 0.02
        for inst in insts:
            inst.version = v
        src.on_published(v)

    dock = TransferDock(GBS, N, addition_columns=["labels", ROLLOUT_LOG_PROB])
    actor = CpuActorGroup(dock, VOCAB, N, 2, lr=1.0, dp=2, with_ref=False, clock=step_clock)
    files = RunFiles(out)
    ports = LoopPorts(actor=actor, store=TransferDockStore(DataStrategy(dock), unpad, get=resolve), samples=src,
                      compute_rewards=lambda: rule_reward(dock), compute_advantage=lambda: group_norm_advantage(dock, N),
                      publish_weights=publish, on_iteration=files.on_iteration, timeline=files)
    loop = AsyncGRPOLoop(ports, LoopSettings(global_batch_size=GBS, group_size=N, lag_bound=K, iterations=3,
                                             dataset_additional_keys=("labels",), mini_batch_size=2, trainer_dp=2,
                                             max_split=S), clock=clock)
    loop.run()
    return files


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from asp_ascend.config import load_config, save_resolved

    out = tmp_path_factory.mktemp("msrl_run")
    cfg = load_config(None, [f"output_dir={out}", "pipeline.mode=async", f"pipeline.lag_bound={K}",
                             "scheduler.policy=asp", "rollout.num_instances=2", f"rollout.max_num_seqs={4 * N}",
                             "rollout.partial_rollout=true", f"rollout.max_split={S}", f"train.group_size={N}",
                             f"train.global_batch_size={GBS}", "train.mini_batch_size=2"], check_files=False)
    save_resolved(cfg)
    files = run_partial(out)
    summary = files.close(cfg)
    return out, summary


def test_carry_over_decisions_are_timeline_events_with_the_runtimes_fields(run_dir):
    out, _ = run_dir
    tl = Timeline.read_jsonl(out / "timeline.jsonl")
    end = max(e["t_end"] for e in tl.events["sync"])
    (defer,), (swap,) = tl.events["defer"], tl.events["swap"]
    # the fields TailControl.maybe_defer writes in `asp train` (metrics/timeline.py), times from the run's start
    assert set(defer) == {"t", "epoch", "prompt_id", "iteration", "to_iteration", "remaining", "budget"}
    assert set(swap) == {"t", "epoch", "prompt_id", "iteration", "to_iteration", "mini_batch", "replaces"}
    assert (defer["prompt_id"], defer["iteration"], defer["to_iteration"]) == ("1", 0, 1)
    assert swap["replaces"] == [0, "1"] and (swap["iteration"], swap["to_iteration"]) == (1, 0)
    assert 0.0 < defer["t"] < end and defer["remaining"] > defer["budget"]
    # the sample queue: every finished group put, and taken by the trainer
    ops = [e["op"] for e in tl.events["queue"]]
    assert ops.count("put") == ops.count("get") == 12
    # request events: trained iteration, planned iteration and the version behind every token
    req = tl.frame("request")
    carried = req[req.prompt_id == "1"]
    assert set(carried.iteration) == {1} and set(carried.planned_iteration) == {0}
    assert all(seg == [[0, 0], [seg[1][0], 1]] and 0 < seg[1][0] < 40 for seg in carried.segments)
    assert (req[req.prompt_id != "1"].iteration == req[req.prompt_id != "1"].planned_iteration).sum() == 20
    assert set(req.finish_reason) == {"stop"}
    # every step, request and sync lies inside the run window
    assert req.t_admit.min() >= 0 and req.t_finish.max() <= end
    assert all(0 <= st["t_start"] <= st["t_end"] <= end for st in tl.events["step"])


def test_metrics_and_summary_carry_the_deferred_lag_histograms(run_dir):
    out, summary = run_dir
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["deferred_groups"] for r in rows] == [0, 1, 0]
    assert rows[1]["policy_lag_max"] == 1 and 0 <= rows[1]["token_lag_max"] <= 1
    on_disk = json.loads((out / "summary.json").read_text())
    s = on_disk["asp"]
    assert s["deferred_token_lag_hist"] == summary["deferred_token_lag_hist"]
    # the simulator's definitions (metrics.deferred_lags): a sample trained after its planned iteration, here
    # the deferred group (admitted at v0, trained in 1, its last tokens drawn by v1); the group of iteration 1
    # that took its slot (admitted at v0, trained in 0) moved earlier and is not deferred
    assert s["deferred_groups"] == 1 and s["deferred_samples"] == N
    assert s["deferred_lag_hist"] == {"1": N}              # by admission version
    assert s["deferred_token_lag_hist"] == {"0": N}        # by the version of the last token
    assert s["policy_lag_max_lossless"] <= K
    assert s["policy_lag_max"] <= K + S and s["iterations"] == 3 and s["throughput"] > 0
    # the bound the samples are held to, as `asp simulate` reports it under partial rollout: k + S
    assert s["lag_bound"] == K + S


def test_summary_has_the_per_instance_split_after_iteration_0(run_dir):
    # run_summary (asp train's too) writes metrics.instance_split_entry: response tokens each instance drew for
    # the samples finishing between the first weight sync's end and the last, their shares, the busy share
    out, _ = run_dir
    split = json.loads((out / "summary.json").read_text())["asp"]["instance_split"]
    tl = Timeline.read_jsonl(out / "timeline.jsonl")
    t_end = sorted(e["t_end"] for e in tl.events["sync"])
    assert len(t_end) == 3 and split["window_s"] == pytest.approx(t_end[-1] - t_end[0])
    req = tl.frame("request")
    inside = req[(req.t_finish >= t_end[0]) & (req.t_finish <= t_end[-1])]
    tokens = inside.groupby("instance")["response_length"].sum().reindex([0, 1], fill_value=0).tolist()
    assert [r["instance"] for r in split["instances"]] == [0, 1]
    assert [r["tokens"] for r in split["instances"]] == tokens and sum(tokens) > 0
    assert sum(r["token_share"] for r in split["instances"]) == pytest.approx(1.0)
    assert all(0 < r["busy"] <= 1 for r in split["instances"])


def test_asp_report_and_calibrate_read_the_run(run_dir):
    out, _ = run_dir
    from asp_ascend.report.run import run_report
    from asp_ascend.sim.calibrate import calibrate_run

    assert run_report(out) == 0
    md = (out / "report.md").read_text()
    assert "## Tail mechanisms" in md and "| defer | 1 |" in md and "| swap | 1 |" in md
    assert "## Per-instance split" in md and "| instance | tokens | token share | busy |" in md
    fit = calibrate_run(out)
    assert fit["decode_a"] is not None and fit["decode_a"] >= 0


def test_a_resumed_run_keeps_the_earlier_attempts_files(tmp_path):
    (tmp_path / "timeline.jsonl").write_text('{"kind": "sync", "t_start": 0, "t_end": 1, "version": 1}\n')
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    files = RunFiles(tmp_path)
    files.add("sync", t_start=0.0, t_end=0.5, version=2)
    files.close()
    assert (tmp_path / "previous" / "attempt_1" / "metrics.jsonl").read_text() == '{"iteration": 0}\n'
    assert [e["version"] for e in Timeline.read_jsonl(tmp_path / "timeline.jsonl").events["sync"]] == [2]
    assert not (tmp_path / "metrics.jsonl").read_text()
    RunFiles(tmp_path).close()
    assert (tmp_path / "previous" / "attempt_2" / "timeline.jsonl").is_file()
