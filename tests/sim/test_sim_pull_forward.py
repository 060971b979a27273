"""scheduler.pull_forward: where rollout is throughput-bound, pulling a later iteration's long groups
ahead of an earlier iteration's groups delays the publish that admits the next window, and the slots
idle under the lag bound; `needed` (asp's default) keeps them in their own window. Hand-computed plan
and admissions on one instance, then the simulator."""
import numpy as np

from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.scheduler.planner import plan
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec

PER_STEP = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)  # a step: 1 s, any batch
# one optimizer step per iteration (mini-batch = global batch), 3 s; the weight sync is free
TRAINER = TrainerSpec(train_per_token=0.0, train_per_step=3.0, sync_s=0.0, micro_batch_size=8,
                      micro_batching="packed")
# four iterations (B = 3, G = 1), each one prompt of every stratum: two of 4 tokens, one of 1
LENGTHS = np.array([4.0, 4.0, 1.0] * 4)


def _plan(rule: str, seed: int = 0):
    return plan(np.arange(12).astype(str), LENGTHS, policy="asp", group_size=1, global_batch_size=3,
                mini_batch_size=3, num_instances=1, max_num_seqs=2, lag_bound=1, cost=PER_STEP, seed=seed,
                relieve_first=0.0, pull_forward=rule)


def _simulate(df):
    n = len(df)
    jobs = SimJobs(epoch=np.zeros(n, np.int64), prompt_id=df["prompt_id"].to_numpy(dtype=object),
                   iteration=df["iteration"].to_numpy(), mini_batch=df["mini_batch"].to_numpy(),
                   instance=df["instance"].to_numpy(), dispatch_rank=df["dispatch_rank"].to_numpy(),
                   prompt_length=np.zeros(n, np.int64), resp=LENGTHS.astype(np.int64).reshape(n, 1),
                   predicted_length=LENGTHS, room=None)
    st = ExecutionSettings(policy="asp", num_instances=1, max_num_seqs=2, lag_bound=1, group_size=1, dispatch="static")
    tl = Engine(jobs, st, cost=PER_STEP, kv_capacity=0, trainer=TRAINER, sync_pause=False).run()
    return tl.frame("request"), tl.frame("sync")


def _order(df):
    d = df.sort_values("dispatch_rank")
    return list(zip(d["iteration"].tolist(), d["predicted_length"].astype(int).tolist()))


def test_needed_keeps_every_group_in_its_window_where_rounded_pulls_the_long_ones():
    # the period: 9 tokens per iteration / 2 slots = 4.5 s. A 4-token group takes 4 s alone: half a
    # period or more, so `rounded` ranks iterations 2's and 3's a window early (fill_first keeps
    # iteration 1's out of window 0); under k + 1 = 2 periods, so `needed` pulls nothing
    for seed in range(4):
        need, rnd = _plan("needed", seed), _plan("rounded", seed)
        assert need.set_index("prompt_id")["iteration"].to_dict() == rnd.set_index("prompt_id")["iteration"].to_dict()
        assert _order(need) == [(i, x) for i in range(4) for x in (4, 4, 1)]
        o = _order(rnd)
        assert o[:3] == [(0, 4), (0, 4), (0, 1)]
        assert sorted(o[3:7]) == [(1, 4), (1, 4), (2, 4), (2, 4)] and o[7] == (1, 1)
        assert o[8:] == [(3, 4), (3, 4), (2, 1), (3, 1)]


def test_needed_is_work_conserving_where_rounded_idles_under_the_lag_bound():
    """By hand, one instance of 2 slots, k = 1 (iteration i admissible once version i - 1 is out), a
    trainer step of 3 s after each iteration's last group.
    rounded: iteration 0's 4s at 0-4, its 1 and iteration 1's first 4 at 4, iteration 1's other 4 at
    5-9; V1 (iteration 0 done at 5, trained 5-8) admits iteration 2, whose 4s are ranked ahead of
    iteration 1's 1: they take the slots at 8 and 9, so iteration 1's 1 runs 12-13, V2 at 16;
    iteration 2's 1 runs 13-14 and both slots idle 14-16 (iteration 3 not admissible); iteration 3
    then runs 16-20 and 20-21: 21 s.
    needed: iteration 1's 1 at 8-9, V2 at 12; iteration 2 at 9-13 and 13-14, iteration 3's 4s at
    13-17 and 14-18, its 1 at 17-18: 18 s = 36 slot-seconds / 2 slots, no slot ever idle."""
    need, _ = _simulate(_plan("needed"))
    rnd, sync_r = _simulate(_plan("rounded"))
    assert need["t_finish"].max() == 18.0 and rnd["t_finish"].max() == 21.0
    assert need["t_finish"].max() == LENGTHS.sum() / 2          # the decode-work bound: work-conserving
    it1_short = lambda r: float(r[(r.iteration == 1) & (r.response_length == 1)]["t_admit"].iloc[0])
    assert it1_short(need) == 8.0 and it1_short(rnd) == 12.0
    assert sync_r.set_index("version")["t_end"].to_dict()[2] == 16.0
    assert (rnd[rnd.iteration == 3]["t_admit"] >= 16.0).all()
    # between 14 and 16 no sequence runs under rounded
    assert not ((rnd["t_admit"] < 16.0) & (rnd["t_finish"] > 14.0)).any()
    for r in (need, rnd):   # the lag bound holds either way
        assert (r["iteration"] - r["admission_version"] <= 1).all()
