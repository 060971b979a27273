"""pipeline.regroup in the simulator: a mini-batch filled at run time within its iteration."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.config import load_config
from sim_common import small_sim_config
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.mechanisms import SimMechanisms
from asp_ascend.sim.run import simulate_system

UNIT = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)   # 1 s per decode step


def _jobs(resp, mini_batch, iteration=None):
    resp = np.asarray(resp, dtype=np.int64)[:, None]
    J = resp.shape[0]
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.zeros(J, np.int64) if iteration is None else np.asarray(iteration, np.int64),
                   mini_batch=np.asarray(mini_batch, np.int64), instance=np.arange(J, dtype=np.int64),
                   dispatch_rank=np.arange(J, dtype=np.int64), prompt_length=np.zeros(J, np.int64), resp=resp)


def _engine(jobs, regroup, stream_groups=False):
    # every group alone on its own instance (1 s per token: a group of n tokens is generated at n s);
    # the trainer 0.5 s per token (micro-batches of one sequence: no pad), 1 s per optimizer step, 1 s per sync
    tr = TrainerSpec(train_per_token=0.5, train_per_step=1.0, sync_s=1.0, micro_batch_size=1,
                     micro_batching="padded", stream_groups=stream_groups, stream_start="fewest_left")
    return Engine(jobs, ExecutionSettings(policy="asp", num_instances=jobs.resp.shape[0], max_num_seqs=1,
                                          lag_bound=1, group_size=1),
                  cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=False, mechanisms=SimMechanisms(regroup=regroup))


def _steps(tl):
    st = tl.frame("step").sort_values("t_start")
    return (st[["t_start", "t_end", "mini_batch"]].to_numpy().tolist(),
            [sorted(p for _, p, _ in s) for s in st["samples"]])


def test_regroup_trains_the_others_first_and_one_mini_batch_after_the_long_group():
    # mini-batch 0 = {L (100 tokens, mispredicted long), A (10)}, mini-batch 1 = {B (20), C (110)}.
    # Without regroup: mini-batch 0 is generated at 100 and trains 100 -> 156 (110 x 0.5 + 1), mini-batch 1
    # at 110 waits for the trainer: 156 -> 222 (130 x 0.5 + 1): two mini-batches after L.
    # With regroup: at 20 (A, B generated, none complete) mini-batch 0 (1 generated, ties with 1: lowest
    # index) takes B in L's slot: {A, B} trains 20 -> 36 (30 x 0.5 + 1); {L, C} at 110 -> 216 (210 x 0.5 + 1).
    jobs = _jobs([100, 10, 20, 110], mini_batch=[0, 0, 1, 1])
    old = _engine(jobs, False)
    tl_old = old.run()
    assert _steps(tl_old) == ([[100, 156, 0], [156, 222, 1]], [["p0", "p1"], ["p2", "p3"]])
    new = _engine(jobs, True)
    tl = new.run()
    assert _steps(tl) == ([[20, 36, 0], [110, 216, 1]], [["p1", "p2"], ["p0", "p3"]])
    assert tl.frame("sync")[["t_start", "t_end"]].to_numpy().tolist() == [[216, 217]]
    assert new.log.counts == {"regroup": 1} and not old.log.counts
    # the timeline's event at 20 s (A, B generated), as the runtime writes it: B takes L's slot of mini-batch 0
    assert tl.events["regroup"] == [{"t": 20.0, "epoch": 0, "prompt_id": "p2", "iteration": 0, "mini_batch": 0,
                                     "from_mini_batch": 1, "replaces": [0, "p0"]}]
    assert not tl_old.events["regroup"]
    # exactly once, in the planned iteration; the same tokens trained
    req = tl.frame("request")
    assert sorted(p for s in tl.frame("step")["samples"] for _, p, _ in s) == sorted(req["prompt_id"])
    assert tl.frame("step")["tokens"].sum() == tl_old.frame("step")["tokens"].sum() == 240


def test_regroup_waits_while_no_mini_batch_can_be_completed():
    # mini-batch 0 = {A (10), L (100)}, mini-batch 1 = {B (50), C (60)}, mini-batch 2 = {D (70), E (80)}.
    # From 10 to 50 only A is generated: one generated group cannot complete a mini-batch of two, nothing moves.
    # At 50 A and B are generated, one each in 0 and 1: mini-batch 0 (lowest index on the tie) takes B
    # in L's slot; {A, B} trains 50 -> 81 (60 x 0.5 + 1). While the trainer is busy nothing moves: at 81
    # mini-batch 2 = {D, E} is complete (at 80) and trains as planned, 81 -> 157; {L, C} at 157 -> 238.
    jobs = _jobs([10, 100, 50, 60, 70, 80], mini_batch=[0, 0, 1, 1, 2, 2])
    eng = _engine(jobs, True)
    steps, members = _steps(eng.run())
    assert steps == [[50, 81, 0], [81, 157, 2], [157, 238, 1]]
    assert members == [["p0", "p2"], ["p4", "p5"], ["p1", "p3"]]
    assert eng.log.counts == {"regroup": 1}


def test_regroup_fills_the_streamed_mini_batch():
    # streaming (fewest_left): at 10 the trainer streams mini-batch 0 = {A (10), L (100)}: A 10 -> 15.
    # It then waits for L; B (20) is generated in mini-batch 1 = {B, C (30)}: regroup moves B into L's
    # slot of the streamed mini-batch: B 20 -> 30, step 30 -> 31. {L, C}: C 31 -> 46, waits for L (100):
    # 100 -> 150, step -> 151. Without regroup: L 100 -> 150, step 151; B 151 -> 161, C -> 176, step 177.
    jobs = _jobs([10, 100, 20, 30], mini_batch=[0, 0, 1, 1])
    assert _engine(jobs, False, True).run().frame("step")["t_end"].tolist() == [151, 177]
    eng = _engine(jobs, True, True)
    tl = eng.run()
    assert tl.frame("step")["t_end"].tolist() == [31, 151]
    assert _steps(tl)[1] == [["p0", "p2"], ["p1", "p3"]]


def _cfg(seed, **over):
    return small_sim_config(seed, **{"workload.num_prompts": 128, "train.global_batch_size": 32,
                                     "train.mini_batch_size": 8, "pipeline.regroup": "on", **over})


@pytest.mark.parametrize("case", range(5))
def test_regroup_exactly_once_membership_and_lag(case):
    # cases 3 and 4: with pipeline.regroup_heavy (whole steps, streamed steps)
    rng = np.random.default_rng(700 + case)
    over = {"pipeline.lag_bound": int(rng.integers(0, 3)), "scheduler.dispatch": str(rng.choice(["guided", "static"])),
            "sim.micro_batching": str(rng.choice(["packed", "padded"])),
            "sim.stream_groups": ("false", "true", "false", "false", "true")[case],
            "pipeline.regroup_heavy": "true" if case >= 3 else "false",
            "cost.decode_c": float(rng.choice([1e-5, 1e-3]))}
    cfg = _cfg(case, **over)
    w = workload_from_config(cfg)
    for name in ("asp", "fully_async_fifo", "asp_partial"):
        res = simulate_system(cfg, w, name, record_samples=True)
        req = res.timeline.frame("request")
        steps = res.timeline.frame("step")
        keys = list(zip(req["epoch"], req["prompt_id"], req["sample"]))
        trained = [tuple(x) for s in steps["samples"] for x in s]
        assert sorted(trained) == sorted(keys), name                          # every sample once
        assert steps.groupby("iteration")["samples"].apply(lambda s: sum(map(len, s))).eq(32 * 4).all()
        assert all(len(s) == 8 * 4 for s in steps["samples"]), name            # mini_batch_size prompts per step
        k = int(cfg.pipeline.lag_bound)
        if name != "asp_partial":
            # membership per iteration as planned: nothing deferred, every lag within k
            assert res.summary["deferred_groups"] == 0
            assert res.summary["policy_lag_max"] <= k
        if name == "asp" and case in (0, 3):
            assert res.summary["regrouped_groups"] > 0
        again = simulate_system(cfg, w, name, record_samples=True).summary
        assert {x: v for x, v in again.items() if x != "wall_s"} == \
            {x: v for x, v in res.summary.items() if x != "wall_s"}           # the same seed, the same summary


def test_regroup_auto_is_on_for_asp_only_and_the_key_takes_booleans():
    from asp_ascend.config import regroup_of

    for value, want in (("auto", (True, False)), ("on", (True, True)), ("off", (False, False)),
                        ("true", (True, True)), ("false", (False, False))):
        cfg = load_config(None, [f"pipeline.regroup={value}"])
        assert (regroup_of(cfg, "asp"), regroup_of(cfg, "fifo")) == want, value
    assert load_config(None, []).pipeline.regroup == "auto"
    with pytest.raises(Exception, match="pipeline.regroup.*not one of auto, on, off"):
        load_config(None, ["pipeline.regroup=sometimes"])
    # the simulator resolves it per system: asp's streaming systems regroup, the baselines do not
    cfg = _cfg(0, **{"pipeline.regroup": "auto"})
    w = workload_from_config(cfg)
    got = {n: simulate_system(cfg, w, n).summary["regrouped_groups"] > 0 for n in ("asp", "fully_async_fifo")}
    assert got == {"asp": True, "fully_async_fifo": False}


def test_regroup_heavy_trains_the_lightest_groups_after_the_late_one():
    # mini-batch 0 = {A, B} (10 and 12 tokens, prompts of 100: trained 12 -> 124), 1 = {C (45), L (300)},
    # 2 = {D (20), E (50)}. At 124, 2 is complete and L not generated. Regroup alone trains {D, E}
    # 124 -> 160 (70 x 0.5 + 1) and {C, L} after L: 300 -> 473.5 (345 x 0.5 + 1). With regroup_heavy the
    # step at 124 takes the two heaviest generated groups, E and C (D goes to 1): {E, C} 124 -> 172.5,
    # {D, L} 300 -> 461 (320 x 0.5 + 1): the same work, the light group after the late one.
    resp = np.array([10, 12, 45, 300, 20, 50], dtype=np.int64)
    jobs = _jobs(resp, mini_batch=[0, 0, 1, 1, 2, 2])
    jobs.prompt_length[:2] = 100
    tr = TrainerSpec(train_per_token=0.5, train_per_step=1.0, sync_s=1.0, micro_batch_size=1, micro_batching="padded")

    def run(heavy):
        eng = Engine(jobs, ExecutionSettings(policy="asp", num_instances=6, max_num_seqs=1, lag_bound=1, group_size=1),
                     cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=False,
                     mechanisms=SimMechanisms(regroup=True, regroup_heavy=heavy))
        return eng, eng.run()

    old, tl_old = run(False)
    assert _steps(tl_old) == ([[12, 124, 0], [124, 160, 2], [300, 473.5, 1]],
                              [["p0", "p1"], ["p4", "p5"], ["p2", "p3"]])
    new, tl = run(True)
    assert _steps(tl) == ([[12, 124, 0], [124, 172.5, 2], [300, 461, 1]], [["p0", "p1"], ["p2", "p5"], ["p3", "p4"]])
    assert tl.frame("sync")["t_end"].tolist() == [462]
    assert new.log.counts == {"regroup": 1, "regroup_heavy_first": 1} and not old.log.counts
    assert tl.frame("step")["tokens"].sum() == tl_old.frame("step")["tokens"].sum()


def test_summaries_count_heavy_first_moves():
    """``regrouped_heavy_first``: the simulator's summary and a real run's (pipeline/summary.py, from its
    ``regroup`` events' ``rule``) count the moves ``pipeline.regroup_heavy`` made, among ``regrouped_groups``."""
    from asp_ascend.metrics.timeline import Timeline
    from asp_ascend.pipeline.summary import carry_over_summary

    cfg = _cfg(3, **{"pipeline.regroup_heavy": "true"})
    s = simulate_system(cfg, workload_from_config(cfg), "asp").summary
    assert 0 < s["regrouped_heavy_first"] < s["regrouped_groups"]
    tl = Timeline()
    for i in range(2):
        tl.add("request", epoch=0, iteration=i, instance=0, prompt_id=f"p{i}", sample=0, admission_version=i,
               t_admit=0.0, t_first_token=1.0, t_finish=2.0, prompt_length=1, response_length=3)
    tl.add("regroup", t=1.0, epoch=0, prompt_id="p0", iteration=0, rule="heavy_first")
    tl.add("regroup", t=1.0, epoch=0, prompt_id="p1", iteration=1)
    got = carry_over_summary(tl, lag_bound=1)
    assert (got["regrouped_groups"], got["regrouped_heavy_first"]) == (2, 1)


def test_regroup_heavy_auto_follows_regroup_and_on_needs_it(tmp_path):
    """``pipeline.regroup_heavy`` (``auto`` by default) re-composes only the mini-batches regroup
    manages: ``auto`` and ``on`` resolve on wherever ``pipeline.regroup`` does (auto: asp), off
    elsewhere (the baselines do nothing with it); ``on`` with ``pipeline.regroup: off`` is refused,
    naming the fix; YAML booleans read as on / off. One resolution (``config.regroup_heavy_of``)
    for the simulator and the runtime's tail options (pipeline/planning.py)."""
    from asp_ascend.config import regroup_heavy_of
    from asp_ascend.errors import ConfigError
    from asp_ascend.pipeline.planning import tail_options

    assert load_config(None, []).pipeline.regroup_heavy == "auto"
    for regroup, heavy, want in (("auto", "auto", (True, False)), ("auto", "on", (True, False)),
                                 ("auto", "true", (True, False)), ("auto", "off", (False, False)),
                                 ("auto", "false", (False, False)), ("on", "auto", (True, True)),
                                 ("on", "on", (True, True)), ("off", "auto", (False, False)),
                                 ("off", "off", (False, False))):
        cfg = load_config(None, [f"pipeline.regroup={regroup}", f"pipeline.regroup_heavy={heavy}"])
        assert (regroup_heavy_of(cfg, "asp"), regroup_heavy_of(cfg, "fifo")) == want, (regroup, heavy)
        for policy, on in zip(("asp", "fifo"), want):
            cfg = load_config(None, [f"pipeline.regroup={regroup}", f"pipeline.regroup_heavy={heavy}",
                                     f"scheduler.policy={policy}"])
            assert tail_options(cfg, tmp_path / "none.parquet").regroup_heavy is on, (regroup, heavy, policy)
    for heavy in ("on", "true"):
        with pytest.raises(ConfigError, match="pipeline.regroup_heavy: on needs pipeline.regroup.*"
                                              "set pipeline.regroup: auto.*or pipeline.regroup_heavy: auto"):
            load_config(None, [f"pipeline.regroup_heavy={heavy}", "pipeline.regroup=off"])
    with pytest.raises(ConfigError, match="pipeline.regroup_heavy.*not one of auto, on, off"):
        load_config(None, ["pipeline.regroup_heavy=sometimes"])
    # the simulator: asp's default makes heaviest-first moves (as on does), off none; fifo (regroup
    # auto = off there) moves nothing with it on
    got = {}
    for heavy in ("auto", "off", "on"):
        cfg = _cfg(0, **{"pipeline.regroup": "auto", "pipeline.regroup_heavy": heavy})
        w = workload_from_config(cfg)
        got[heavy] = [(s["regrouped_groups"], s["regrouped_heavy_first"]) for s in
                      (simulate_system(cfg, w, n).summary for n in ("asp", "fully_async_fifo"))]
    assert got["auto"] == got["on"] and got["auto"][0][1] > 0 and got["off"][0][1] == 0 < got["off"][0][0], got
    assert got["on"][1] == (0, 0), got
