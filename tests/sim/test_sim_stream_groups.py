"""sim.stream_groups: the trainer runs each group's forward/backward as it is generated."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.config import load_config
from sim_common import small_sim_config
from asp_ascend.errors import ConfigError
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.scheduler.microbatch import PACKED_TOKEN_COST
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.run import Mismatch, simulate_system
from asp_ascend.sim.trainer import micro_batch_table

UNIT = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)   # 1 s per decode step


def _jobs(resp, instance, mini_batch, iteration=None):
    resp = np.asarray(resp, dtype=np.int64)
    resp = resp[:, None] if resp.ndim == 1 else resp
    J = resp.shape[0]
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.zeros(J, np.int64) if iteration is None else np.asarray(iteration, np.int64),
                   mini_batch=np.asarray(mini_batch, np.int64), instance=np.asarray(instance, np.int64),
                   dispatch_rank=np.arange(J, dtype=np.int64), prompt_length=np.zeros(J, np.int64), resp=resp)


def _run(jobs, stream_groups, start="fewest_left"):
    # one sequence per instance at a time; 1 s per trained token (micro-batches of one sequence: no pad),
    # 5 s per optimizer step, 1 s per sync
    tr = TrainerSpec(train_per_token=1.0, train_per_step=5.0, sync_s=1.0, micro_batch_size=1,
                     micro_batching="padded", stream_groups=stream_groups, stream_start=start)
    R = int(jobs.instance.max()) + 1
    return Engine(jobs, ExecutionSettings(policy="asp", num_instances=R, max_num_seqs=1, lag_bound=1,
                                          group_size=jobs.group_size),
                  cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=False).run()


def test_stream_groups_two_groups_hand_computed():
    # one mini-batch: A (10 tokens) finishes at 10 s, B (30 tokens) at 30 s.
    # without streaming: the step starts at 30 and costs 10 + 30 + 5 -> ends at 75.
    # streaming: A's forward/backward 10 -> 20, B's 30 -> 60, the step 60 -> 65.
    jobs = _jobs([10, 30], instance=[0, 1], mini_batch=[0, 0])
    plain, streamed = _run(jobs, False), _run(jobs, True)
    assert plain.frame("step")[["t_start", "t_end"]].to_numpy().tolist() == [[30.0, 75.0]]
    assert plain.frame("sync")[["t_start", "t_end"]].to_numpy().tolist() == [[75.0, 76.0]]
    # one row per optimizer step, as long as the trainer was busy on it (10 + 30 + 5 s), ending with the step
    assert streamed.frame("step")[["t_start", "t_end"]].to_numpy().tolist() == [[20.0, 65.0]]
    assert streamed.frame("sync")[["t_start", "t_end"]].to_numpy().tolist() == [[65.0, 66.0]]
    # as the runtime records a streamed step: its first part began at 10, two parts (the trainer waited for B)
    assert streamed.frame("step")[["t_first", "parts"]].to_numpy().tolist() == [[10.0, 2]]
    assert "parts" not in plain.frame("step") and "t_first" not in plain.frame("step")
    q = streamed.frame("queue")
    assert q["t"].tolist() == [10.0, 10.0, 30.0, 30.0]            # each group leaves the queue as it is trained
    assert q["op"].tolist() == ["put", "get", "put", "get"] and q["size"].tolist() == [1, 0, 1, 0]


def test_stream_groups_commits_to_the_mini_batch_it_started():
    # mini-batch 0 = {A (10 s), B (30 s)}, mini-batch 1 = {C (12 s)}. Streaming, the trainer starts
    # mini-batch 0 with A at 10 (10 -> 20); C's mini-batch is complete at 12 but must wait for
    # mini-batch 0's step (its gradients need those weights): B 30 -> 60, step 60 -> 65, then
    # C 65 -> 77, step 77 -> 82. Without streaming mini-batch 1 trains 12 -> 29, mini-batch 0 30 -> 75.
    jobs = _jobs([10, 30, 12], instance=[0, 1, 2], mini_batch=[0, 0, 1])
    plain, streamed = _run(jobs, False), _run(jobs, True)
    assert plain.frame("step")[["t_start", "t_end", "mini_batch"]].to_numpy().tolist() == [[12, 29, 1], [30, 75, 0]]
    assert streamed.frame("step")[["t_start", "t_end", "mini_batch"]].to_numpy().tolist() == [[20, 65, 0],
                                                                                             [65, 82, 1]]
    # mini-batch 0 streamed in two parts from 10; mini-batch 1 taken whole at 65: one part
    assert streamed.frame("step")[["t_first", "parts"]].to_numpy().tolist() == [[10, 2], [65, 1]]


@pytest.mark.parametrize("start, end", [("fewest_left", 113.0), ("lowest_index", 113.0), ("half_generated", 106.0)])
def test_stream_groups_start_waits_for_half_a_mini_batch(start, end):
    # mini-batch 0 = {A (10 s), B (30 s), D (31 s)}, mini-batch 1 = {C (12 s)}. fewest_left and
    # lowest_index take mini-batch 0 at 10 with A (10 -> 20), B 30 -> 60, D 60 -> 91, step -> 96, then
    # C 96 -> 108, step -> 113. half_generated waits (1 of 3 generated): C 12 -> 24, step -> 29; at 30
    # two of three: A 30 -> 40, B 40 -> 70, D 70 -> 101, step -> 106.
    jobs = _jobs([10, 30, 12, 31], instance=[0, 1, 2, 3], mini_batch=[0, 0, 1, 0])
    assert _run(jobs, True, start).frame("step")["t_end"].max() == end


@pytest.mark.parametrize("start, end", [("fewest_left", 105.0), ("half_generated", 105.0), ("lowest_index", 110.0)])
def test_stream_groups_start_fewest_left_before_lowest_index(start, end):
    # mini-batch 0 = {A (20 s), B (40 s)}, mini-batch 1 = {C (10 s), D (15 s)}. At 10 fewest_left (and
    # half_generated: 1 of 2) take mini-batch 1: C 10 -> 20, D 20 -> 35, step -> 40; A 40 -> 60,
    # B 60 -> 100, step -> 105. lowest_index waits for mini-batch 0 until mini-batch 1 is complete at
    # 15: C 15 -> 25, D 25 -> 40, step -> 45; A 45 -> 65, B 65 -> 105, step -> 110.
    jobs = _jobs([20, 40, 10, 15], instance=[0, 1, 2, 3], mini_batch=[0, 0, 1, 1])
    assert _run(jobs, True, start).frame("step")["t_end"].max() == end


def test_stream_groups_prefers_a_complete_mini_batch_and_pads_per_group():
    # C's mini-batch is complete (at 12) before the trainer is free: it trains first, as without streaming
    jobs = _jobs([14, 30, 12], instance=[0, 1, 2], mini_batch=[0, 0, 1])
    st = _run(jobs, True).frame("step")
    # C 12 -> 24, step 24 -> 29; then mini-batch 0: A (done at 14) 29 -> 43, B (done at 30) 43 -> 73, step 73 -> 78
    assert st[["t_start", "t_end", "mini_batch"]].to_numpy().tolist() == [[12, 29, 1], [29, 78, 0]]
    # B is generated (30) while A trains: both run back to back, one part from 29
    assert st[["t_first", "parts"]].to_numpy().tolist() == [[12, 1], [29, 1]]
    # padded micro-batches: a streamed group is cut on its own (padded to its own longest)
    two = _jobs([[1, 3], [2, 2]], instance=[0, 0], mini_batch=[0, 0])
    assert micro_batch_table(two, 4, "padded")["padded_tokens"].tolist() == [4]            # 4 x 3 - 8
    assert micro_batch_table(two, 4, "padded", per_group=True)["padded_tokens"].tolist() == [2]   # 2 x 3 - 4, 0


def _cfg(seed, **over):
    return small_sim_config(seed, **{"workload.num_prompts": 64, "train.global_batch_size": 16,
                                     "train.mini_batch_size": 4, "sim.stream_groups": "true", **over})


@pytest.mark.parametrize("case", range(4))
def test_stream_groups_trains_every_mini_batch_once_after_its_groups(case):
    rng = np.random.default_rng(300 + case)
    over = {"pipeline.lag_bound": int(rng.integers(0, 3)), "rollout.max_split": int(rng.integers(1, 3)),
            "scheduler.dispatch": str(rng.choice(["guided", "static"])),
            "sim.micro_batching": str(rng.choice(["packed", "padded", "sorted"])),
            "cost.decode_a": float(rng.choice([0.002, 0.02])), "cost.decode_c": float(rng.choice([1e-5, 1e-3]))}
    over["sim.stream_groups_start"] = ("fewest_left", "half_generated", "lowest_index", "fewest_left")[case]
    cfg = _cfg(case, **over)
    w = workload_from_config(cfg)
    mm = Mismatch(decode_a=float(rng.choice([0.5, 1, 2])), concurrency=1.0)
    for name in ("asp", "asp_partial", "fully_async_fifo"):
        res = simulate_system(cfg, w, name, record_samples=True, mismatch=mm)
        if name == "asp_partial" and case >= 2:                                  # carry-over swaps while streaming
            assert res.summary["deferred_groups"] > 0
        req = res.timeline.frame("request")
        steps = res.timeline.frame("step").sort_values("t_end")
        syncs = res.timeline.frame("sync")
        keys = list(zip(req["epoch"], req["prompt_id"], req["sample"]))
        trained = [tuple(x) for s in steps["samples"] for x in s]
        assert sorted(trained) == sorted(keys), name                            # every sample once
        mb = list(zip(steps["iteration"], steps["mini_batch"]))
        assert len(mb) == len(set(mb)), name                                    # every mini-batch one step
        assert steps["iteration"].is_monotonic_increasing, name                 # iterations in order
        # one step at a time: a step's busy span starts after the previous step ended
        assert (steps["t_start"].to_numpy()[1:] >= steps["t_end"].to_numpy()[:-1] - 1e-9).all(), name
        # each step ends no earlier than any of its groups' generation + that group's cost + the step
        tpt, tps = res.costs.train_per_token, res.costs.train_per_step
        r = req.assign(tok=req["prompt_length"] + req["response_length"]).set_index(["epoch", "prompt_id"])
        fin, tok = r.groupby(level=[0, 1])["t_finish"].max(), r.groupby(level=[0, 1])["tok"].sum()
        per_tok = tpt * (PACKED_TOKEN_COST if cfg.sim.micro_batching == "packed" else 1.0)   # pad only adds
        for (t_end, samples) in zip(steps["t_end"], steps["samples"]):
            groups = {(e, p) for e, p, _ in samples}
            need = max(fin[g] + per_tok * tok[g] for g in groups) + tps
            assert t_end >= need - 1e-6, (name, t_end, need)
        # an iteration's steps end before its sync starts
        last = steps.groupby("iteration")["t_end"].max().to_numpy()
        assert (syncs.sort_values("version")["t_start"].to_numpy() >= last - 1e-9).all(), name
        # the queue: one get per group, never negative, empty at the end
        q = res.timeline.frame("queue")
        assert (q["op"] == "get").sum() == (q["op"] == "put").sum() == len(fin), name
        assert q["size"].min() >= 0 and q["size"].iloc[-1] == 0, name


def test_stream_groups_is_a_bool_config_key():
    with pytest.raises(ConfigError, match="sim.stream_groups"):
        load_config(None, ["sim.stream_groups=maybe"])
    with pytest.raises(ConfigError, match="sim.stream_groups_start"):
        load_config(None, ["sim.stream_groups_start=latest"])


def test_pipeline_stream_groups_is_what_asp_simulate_models_too():
    """``pipeline.stream_groups`` (asp train's key) streams the simulated trainer as
    ``sim.stream_groups`` does, with its own start rule; ``sim.stream_groups`` wins when set; the
    sync mode refuses it, naming the key and the fix."""
    from asp_ascend.sim.run import stream_settings

    w = workload_from_config(_cfg(0))
    t = {}
    for name, over in {"sim": {"sim.stream_groups_start": "lowest_index"},
                       "pipeline": {"sim.stream_groups": "false", "pipeline.stream_groups": "true",
                                    "pipeline.stream_groups_start": "lowest_index"},
                       "off": {"sim.stream_groups": "false", "pipeline.stream_groups": "off"}}.items():
        cfg = _cfg(0, **over)
        t[name] = simulate_system(cfg, w, "asp").summary["iteration_time_mean"]
    assert t["sim"] == t["pipeline"] != t["off"]
    for policy in ("asp", "fifo"):      # the sim key and its start rule win, for every streaming policy
        assert stream_settings(_cfg(0, **{"pipeline.stream_groups": "on", "pipeline.stream_groups_start": "fewest_left"}),
                               policy) == {"stream_groups": True, "stream_start": "half_generated"}
    for value in ("true", "on"):
        with pytest.raises(ConfigError, match="pipeline.stream_groups: on needs pipeline.mode=async.*set it to auto"):
            load_config(None, [f"pipeline.stream_groups={value}", "pipeline.mode=sync"])


def test_pipeline_stream_groups_auto_is_on_for_asp_off_for_the_baselines(tmp_path):
    """``pipeline.stream_groups`` is auto | on | off (YAML booleans read as on / off): ``auto`` (the
    default) resolves on for asp (where ``pipeline.regroup``'s auto does), off for the baselines and
    in the sync mode. One resolution (``config.stream_groups_of``) for the simulator's systems, asp
    train's loop (pipeline/run.py) and the calibration replay of a run (as the run resolved it)."""
    from asp_ascend.config import stream_groups_of
    from asp_ascend.pipeline.run import _stream_start
    from asp_ascend.sim.replay import run_settings
    from asp_ascend.sim.run import stream_settings

    assert load_config(None, []).pipeline.stream_groups == "auto"
    for value, want in (("auto", (True, False)), ("on", (True, True)), ("true", (True, True)),
                        ("off", (False, False)), ("false", (False, False))):
        cfg = load_config(None, [f"pipeline.stream_groups={value}"])
        assert cfg.pipeline.stream_groups == {"true": "on", "false": "off"}.get(value, value)
        assert (stream_groups_of(cfg, "asp"), stream_groups_of(cfg, "fifo")) == want, value
        assert [stream_settings(cfg, p)["stream_groups"] for p in ("asp", "fifo")] == list(want), value
        for policy, on in zip(("asp", "fifo"), want):
            over = [f"pipeline.stream_groups={value}", f"scheduler.policy={policy}"]
            if value in ("off", "false"):   # nothing streams: a start rule has no effect and is refused
                with pytest.raises(ConfigError, match="pipeline.stream_groups_start: 'lowest_index' has no effect"):
                    load_config(None, over + ["pipeline.stream_groups_start=lowest_index"])
                cfg = load_config(None, over)
            else:
                cfg = load_config(None, over + ["pipeline.stream_groups_start=lowest_index"])
            assert _stream_start(cfg) == ("lowest_index" if on else None), (value, policy)
            run = tmp_path / f"{value}_{policy}"
            run.mkdir()
            (run / "config.yaml").write_text(f"scheduler:\n  policy: {policy}\npipeline:\n  stream_groups: {value}\n"
                                             "  stream_groups_start: lowest_index\n")   # bare on/off/true: YAML bools
            assert run_settings(run)["stream_start"] == ("lowest_index" if on else None), (value, policy)
    sync = load_config(None, ["pipeline.mode=sync"])
    assert not stream_groups_of(sync, "asp") and _stream_start(sync) is None
    with pytest.raises(ConfigError, match="pipeline.stream_groups.*not one of auto, on, off"):
        load_config(None, ["pipeline.stream_groups=sometimes"])
    # the simulator: asp streams under auto, so the trainer after the iteration's last group is
    # shorter than with the key off; fifo is the same under auto and off
    got = {}
    for value in ("auto", "off", "on"):
        cfg = _cfg(0, **{"sim.stream_groups": "false", "pipeline.stream_groups": value})
        w = workload_from_config(cfg)
        got[value] = [simulate_system(cfg, w, n).summary["iteration_time_mean"] for n in ("asp", "fully_async_fifo")]
    assert got["auto"][0] == got["on"][0] != got["off"][0], got
    assert got["auto"][1] == got["off"][1] != got["on"][1], got
