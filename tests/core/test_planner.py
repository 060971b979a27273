import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.estimate import dispatch_windows, estimate
from asp_ascend.scheduler.planner import POLICIES, RELIEVE_FIRST, plan

COLUMNS = ["epoch", "prompt_id", "iteration", "mini_batch", "instance", "dispatch_rank", "predicted_length", "room"]


def heavy_tail(n, seed=0):
    rng = np.random.default_rng(seed)
    body = rng.lognormal(6.2, 0.6, n)
    tail = 1500 * (1 - rng.random(n)) ** (-1 / 1.5)
    return np.minimum(np.where(rng.random(n) < 0.1, tail, body), 8192), rng.lognormal(5.3, 0.5, n)


def ks(sample, population):
    xs = np.sort(population)
    f_pop = np.searchsorted(np.sort(population), xs, side="right") / population.size
    f_s = np.searchsorted(np.sort(sample), xs, side="right") / sample.size
    return float(np.abs(f_pop - f_s).max())


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("n", [1000, 1030])
def test_contract_invariants(policy, n):
    pred, plen = heavy_tail(n)
    ids = np.array([f"q{i}" for i in range(n)])
    B, m, R = 64, 16, 5
    df = plan(ids, pred, plen, policy=policy, global_batch_size=B, mini_batch_size=m, num_instances=R, seed=1)
    assert list(df.columns) == COLUMNS
    # every prompt exactly once
    assert sorted(df["prompt_id"]) == sorted(ids)
    # instance ids in range
    assert df["instance"].between(0, R - 1).all()
    # iterations hold exactly B prompts except the last (the remainder, never dropped)
    sizes = df.groupby("iteration").size().sort_index().to_numpy()
    assert (sizes[:-1] == B).all() and sizes[-1] == (n % B or B)
    assert df["iteration"].min() == 0 and df["iteration"].max() == len(sizes) - 1
    # mini-batches of m prompts (a partial last iteration may end in a smaller one)
    mbs = df.groupby(["iteration", "mini_batch"]).size()
    full_iters = sizes.size - (1 if n % B else 0)
    assert (mbs.loc[:full_iters - 1] == m).all()
    assert df.groupby("iteration")["mini_batch"].max().iloc[:full_iters].eq(B // m - 1).all()
    # dispatch_rank is a permutation of the epoch
    assert sorted(df["dispatch_rank"]) == list(range(n))
    assert np.allclose(df["predicted_length"], pred.astype(np.float32))


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_schedule(policy):
    pred, plen = heavy_tail(700)
    kw = dict(policy=policy, global_batch_size=64, mini_batch_size=16, num_instances=4)
    a = plan(np.arange(700).astype(str), pred, plen, seed=5, **kw)
    b = plan(np.arange(700).astype(str), pred, plen, seed=5, **kw)
    pd.testing.assert_frame_equal(a, b)
    if policy in ("asp", "random"):
        c = plan(np.arange(700).astype(str), pred, plen, seed=6, **kw)
        assert not a["iteration"].equals(c["iteration"])


def test_baselines_follow_their_definitions():
    n, B, m = 256, 64, 16
    pred, plen = heavy_tail(n)
    ids = np.arange(n).astype(str)
    fifo = plan(ids, pred, plen, policy="fifo", global_batch_size=B, mini_batch_size=m, num_instances=4)
    assert (fifo["iteration"].to_numpy() == np.arange(n) // B).all()
    assert (fifo["mini_batch"].to_numpy() == (np.arange(n) % B) // m).all()
    assert (fifo["dispatch_rank"].to_numpy() == np.arange(n)).all()
    srt = plan(ids, pred, plen, policy="sorted", global_batch_size=B, mini_batch_size=m, num_instances=4)
    order = srt.sort_values("dispatch_rank")
    assert (np.diff(order["predicted_length"].to_numpy()) >= 0).all()  # ascending over the epoch
    assert (np.diff(order["iteration"].to_numpy()) >= 0).all()
    rnd = plan(ids, pred, plen, policy="random", global_batch_size=B, mini_batch_size=m, num_instances=4)
    assert sorted(rnd.groupby("iteration").size()) == [B] * (n // B)
    assert not (rnd["iteration"].to_numpy() == np.arange(n) // B).all()
    bal = plan(ids, pred, plen, policy="balanced", global_batch_size=B, mini_batch_size=m, num_instances=4)
    assert (bal["iteration"] == fifo["iteration"]).all() and (bal["mini_batch"] == fifo["mini_batch"]).all()
    # dispatched in dataset order per instance
    for _, g in bal.groupby("instance"):
        assert (np.diff(g.sort_values("dispatch_rank")["prompt_id"].astype(int).to_numpy()) > 0).all()
    # LPT balances better than a plain least-loaded pull in dataset order
    w = CostModel().work(plen, pred, 64)
    spread = lambda df: df.assign(w=w).groupby(["iteration", "instance"])["w"].sum().groupby("iteration").agg(
        lambda s: s.max() / s.mean()).mean()
    assert spread(bal) < spread(fifo)


def test_asp_keeps_the_epoch_length_mix_in_every_iteration():
    n, B = 8192, 256
    pred, plen = heavy_tail(n, seed=2)
    asp = plan(np.arange(n).astype(str), pred, plen, policy="asp", global_batch_size=B, mini_batch_size=64,
               num_instances=8)
    srt = plan(np.arange(n).astype(str), pred, plen, policy="sorted", global_batch_size=B, mini_batch_size=64,
               num_instances=8)
    strat = plan(np.arange(n).astype(str), pred, plen, policy="asp", global_batch_size=B, mini_batch_size=64,
                 num_instances=8, relieve_first=0.0)
    asp_ks = np.array([ks(g["predicted_length"].to_numpy(), pred) for _, g in asp.groupby("iteration")])
    sorted_ks = [ks(g["predicted_length"].to_numpy(), pred) for _, g in srt.groupby("iteration")]
    # one prompt from each of B length strata: the CDFs differ by at most one stratum
    assert max(ks(g["predicted_length"].to_numpy(), pred) for _, g in strat.groupby("iteration")) <= 1.5 / B
    # scheduler.relieve_first (asp's default 0.02: m <= 5 of 256 strata): iteration 0 gives its m
    # predicted-longest groups to iterations 1..m for groups of the next strata: it moves by at most
    # m / B more, each of them by at most one more stratum, the others not at all
    m = int(RELIEVE_FIRST * B)
    assert asp_ks[0] <= (1.5 + m) / B and asp_ks[1:m + 1].max() <= 2.5 / B and asp_ks[m + 1:].max() <= 1.5 / B
    assert min(sorted_ks) > 0.45 and np.mean(sorted_ks) > 0.7  # sorted iterations: a length curriculum
    # and no drift of lengths across the epoch (no curriculum by iteration order)
    means = asp.groupby("iteration")["predicted_length"].mean().to_numpy()
    assert abs(np.corrcoef(np.arange(means.size), means)[0, 1]) < 0.3


def test_asp_minibatches_homogeneous_and_instances_balanced():
    n, B, m, R = 4096, 512, 64, 8
    pred, plen = heavy_tail(n, seed=3)
    asp = plan(np.arange(n).astype(str), pred, plen, policy="asp", global_batch_size=B, mini_batch_size=m,
               num_instances=R)
    fifo = plan(np.arange(n).astype(str), pred, plen, policy="fifo", global_batch_size=B, mini_batch_size=m,
                num_instances=R)
    tot = pred + plen
    rng_of = lambda df: df.assign(t=tot).groupby(["iteration", "mini_batch"])["t"].agg(lambda s: s.max() - s.min()).mean()
    assert rng_of(asp) < 0.3 * rng_of(fifo)
    # mini-batch 0 is the shortest of its iteration
    mb_mean = asp.groupby(["iteration", "mini_batch"])["predicted_length"].mean()
    for it in range(n // B):
        assert (np.diff(mb_mean.loc[it].to_numpy()) >= 0).all()
    w = CostModel().work(plen, pred, 64) * 8
    per = asp.assign(w=w).groupby(["iteration", "instance"])["w"].sum().unstack()
    assert (per.max(axis=1) / per.mean(axis=1)).max() < 1.05
    # the R longest groups of an iteration land on R different instances
    for _, g in asp.groupby("iteration"):
        assert g.nlargest(R, "predicted_length")["instance"].nunique() == R


def test_asp_starts_long_groups_early_within_the_lag_bound():
    n, B = 4096, 256
    pred, plen = heavy_tail(n, seed=4)
    # 4 instances: no group's latency exceeds k + 1 periods of an instance's work, so `needed` pulls
    # nothing forward there; `rounded` (every group of half a period or more) does. With 32 instances
    # the period is 8x shorter and the longest groups exceed k + 1 of them
    for R, rule, pulls in ((4, "rounded", True), (4, "needed", False), (32, "needed", True)):
        for k in (0, 1, 2):
            df = plan(np.arange(n).astype(str), pred, plen, policy="asp", global_batch_size=B, mini_batch_size=64,
                      num_instances=R, lag_bound=k, pull_forward=rule)
            win = dispatch_windows(df["iteration"].to_numpy(), df["instance"].to_numpy(), df["dispatch_rank"].to_numpy(),
                                   R)
            shift = df["iteration"].to_numpy() - win
            assert shift.min() >= 0 and shift.max() <= k
            if k == 0 or not pulls:
                assert shift.max() == 0, (R, rule, k)
            else:
                assert shift.max() >= 1, (R, rule, k)
                # pulled-forward groups are the long ones
                assert pred[shift > 0].mean() > 3 * pred[shift == 0].mean()
                if rule == "needed":   # and every one of them is longer than any group left in its window
                    assert pred[shift > 0].min() >= np.quantile(pred[shift == 0], 0.99)


def test_needed_pulls_forward_a_subset_of_rounded_by_no_more_windows():
    """`needed` ranks a group ahead only where its latency exceeds k + 1 periods; `rounded` every
    group of half a period or more: the first never pulls a group further than the second."""
    from asp_ascend.scheduler.planner import pull_forward_windows

    lat = np.linspace(0.0, 6.0, 601)
    for k in (0, 1, 2, 3):
        need, rnd = pull_forward_windows(lat, 1.0, k, "needed"), pull_forward_windows(lat, 1.0, k, "rounded")
        assert (need <= rnd).all() and need.max() <= k and need.min() >= 0
        # by hand at k = 1: up to 2 periods nothing; (2, 3] one window; beyond, still k = 1
        if k == 1:
            assert need[lat <= 2.0].max() == 0 and (need[lat > 2.0] == 1).all()
            assert rnd[lat < 0.5].max() == 0 and (rnd[lat >= 0.5] == 1).all()
    with pytest.raises(ValueError, match="scheduler.pull_forward"):
        plan(["a", "b"], np.array([1.0, 2.0]), policy="asp", global_batch_size=1, mini_batch_size=1,
             pull_forward="eager")


def test_asp_fills_the_pipeline_with_the_lightest_floor():
    """Hand-computed: 4 prompts, B = 2, so two iterations, each with one prompt of the long stratum
    {1000, 900} and one of the short stratum {10, 10}. The first iteration has no earlier one to
    overlap with, so its longest group is paid in full: it must be the one holding 900, for every
    seed (before: a seeded draw put the 1000 first about half of the time)."""
    pred = np.array([1000.0, 900.0, 10.0, 10.0])
    for seed in range(6):
        df = plan(np.arange(4).astype(str), pred, policy="asp", global_batch_size=2, mini_batch_size=1,
                  num_instances=2, seed=seed)
        assert df.loc[df["prompt_id"] == "1", "iteration"].item() == 0, seed
        assert sorted(df["iteration"]) == [0, 0, 1, 1]


def test_asp_first_iteration_has_the_shortest_longest_group():
    n, B = 4096, 256
    pred, plen = heavy_tail(n, seed=7)
    for seed in range(4):
        df = plan(np.arange(n).astype(str), pred, plen, policy="asp", global_batch_size=B, mini_batch_size=64,
                  num_instances=8, seed=seed)
        lat = CostModel().group_latency(plen, pred, 8)
        floor = pd.Series(lat).groupby(df["iteration"].to_numpy()).max()
        assert floor.idxmin() == 0, (seed, floor.head())


def _estimate(df, lengths, plen, R, k, **kw):
    return estimate(df["iteration"], df["instance"], df["mini_batch"], df["dispatch_rank"], lengths, plen,
                    group_size=8, num_instances=R, max_num_seqs=256, lag_bound=k, micro_batch_size=16,
                    cost=CostModel(), **kw)


# the margin the estimate gives ASP: on the conversation trace at R = 32 the event simulator has ASP
# 4-5 % behind fifo and random, and the estimate (within 10 % of it, docs/scheduler.md) no longer
# overstates the gain: there it only has to stay within 5 % of them
@pytest.mark.parametrize("kind, R, margin", [("synthetic", 8, 0.95), ("trace", 32, 1.05)])
def test_asp_beats_mix_preserving_baselines_on_heavy_tails(kind, R, margin, empty_yaml, shared_data):
    ov = ["lengths.max_response_length=8192", "workload.num_prompts=16384", f"workload.type={kind}"]
    if kind == "trace":     # a synthetic workload reads neither (config/explicit.py refuses them there)
        ov += ["workload.length_scale=6", f"workload.trace_path={shared_data / 'azure_llm_trace_2023_conv.csv'}"]
    w = workload_from_config(load_config(empty_yaml, ov))
    truth = w.mean_length[-1]
    res = {}
    for pol in POLICIES:
        df = plan(w.prompt_ids, truth, w.prompt_length, policy=pol, global_batch_size=512, mini_batch_size=64,
                  num_instances=R, max_num_seqs=256, lag_bound=1)
        res[pol] = _estimate(df, truth, w.prompt_length, R, 1)
    for pol in ("fifo", "random", "balanced"):
        assert res["asp"]["iteration_time_mean"] < margin * res[pol]["iteration_time_mean"], (pol, res)
    assert res["asp"]["padding_bubble"] < res["fifo"]["padding_bubble"]
    # (the estimate prices each group's latency beside its instance's other sequences, so no
    # schedule sits on the bound; the ratio is >= 1 by definition)
    assert res["asp"]["lower_bound_ratio"] >= 1.0 - 1e-9, res["asp"]
    # (the lower bound depends on each iteration's mix, so compare with the mix-preserving ones)
    assert res["asp"]["lower_bound_ratio"] < max(1.0, margin) * min(res[p]["lower_bound_ratio"]
                                                                   for p in ("fifo", "random", "balanced"))


def test_estimate_sync_is_serial_and_lag_helps():
    pred, plen = heavy_tail(2048, seed=5)
    df0 = plan(np.arange(2048).astype(str), pred, plen, policy="fifo", global_batch_size=256, mini_batch_size=64,
               num_instances=4, lag_bound=0)
    e0 = _estimate(df0, pred, plen, 4, 0)
    e1 = _estimate(df0, pred, plen, 4, 1)
    e3 = _estimate(df0, pred, plen, 4, 3)
    assert e0["iteration_time_mean"] > e1["iteration_time_mean"] >= e3["iteration_time_mean"]
    for e in (e0, e1, e3):
        assert e["lower_bound_ratio"] >= 1.0 - 1e-9
        assert 0 <= e["skew_bubble"] <= 1 and 0 <= e["padding_bubble"] <= 1 and 0 <= e["sorting_bubble"] <= 1


def test_tail_rooms_isolate_the_long_groups_and_start_them_early():
    """A few very long groups among short ones (about 700 tokens: the instances are busy), many
    instances, a light trainer: the long ones would set their iterations' floor uncapped, so they
    get a small room, start as early as the lag bound allows, and their hosts get less other work.
    tail=off: no room."""
    rng = np.random.default_rng(3)
    n, B, R = 2048, 128, 16
    pred = rng.lognormal(6.5, 0.4, n)
    long = rng.choice(n, 16, replace=False)
    pred[long] = 8000.0
    plen = np.full(n, 100.0)
    cost = CostModel(train_per_token=1e-7, logprob_per_token=0.0, train_per_step=0.01, sync_s=0.1)
    # relieve_first=0: one long group per iteration. asp's default moves iteration 0's to iteration 1
    # (scheduler/first_iteration.py): iteration 0's top is then a crowd of short groups, and those that
    # miss the target its longest allows are capped too, as intended (the next test; docs/scheduler.md,
    # "Tail rooms for an iteration whose top is a crowd")
    kw = dict(policy="asp", global_batch_size=B, mini_batch_size=32, num_instances=R, max_num_seqs=256,
              lag_bound=1, cost=cost, seed=0, relieve_first=0.0)
    off = plan(np.arange(n).astype(str), pred, plen, tail="off", **kw)
    auto = plan(np.arange(n).astype(str), pred, plen, tail="auto", **kw)
    assert (off["room"] == 0).all()
    capped = auto["room"] > 0
    assert set(np.flatnonzero(capped)) == set(long)
    assert (auto.loc[capped, "room"] < 256).all() and (auto.loc[capped, "room"] % 8 == 0).all()
    # each long group is admitted before every other group of its iteration
    first_other = auto[~capped].groupby("iteration")["dispatch_rank"].min()
    for _, row in auto[capped].iterrows():
        assert row["dispatch_rank"] < first_other[row["iteration"]]
    # its host carries less work of that iteration than the others
    w = CostModel().work(plen, pred, 256)
    per = auto.assign(w=w).groupby(["iteration", "instance"])["w"].sum()
    for _, row in auto[capped].iterrows():
        it = per.loc[row["iteration"]]
        assert it.loc[row["instance"]] - w[int(row["prompt_id"])] <= it.median()
    # iteration membership and mini-batches are the same: only placement and order change
    pd.testing.assert_series_equal(off["iteration"], auto["iteration"])
    pd.testing.assert_series_equal(off["mini_batch"], auto["mini_batch"])
    fixed = plan(np.arange(n).astype(str), pred, plen, tail=48, **kw)
    assert set(fixed.loc[fixed["room"] > 0, "room"]) == {48}


def test_tail_rooms_with_the_first_iteration_relieved():
    """asp's default relieve_first (one group moved at B = 64) with tail=auto: each iteration holds
    one 8000-token and one 4000-token group among short ones (about 900 tokens: the instances are
    busy, so a long group is slowed by the others); iteration 0 gives its 8000 to iteration 1 for
    iteration 1's 4000. Every 8000 is capped and iteration 0's two 4000s (they set its floor now),
    no other 4000 and no short one: where an iteration's longest group stands far above the rest, its
    short groups meet the target it allows on a full instance. (In the previous test's plan with
    the relief, iteration 0 keeps no long group at all: its top is a crowd of 300-600-token groups,
    and auto caps those of them that miss the target, which pays for every group it caps:
    scheduler/tail.py, paid_tails.)"""
    rng = np.random.default_rng(3)
    n, B, R = 2048, 64, 16
    pred = rng.lognormal(6.8, 0.4, n)
    pick = rng.choice(n, 64, replace=False)
    pred[pick[:32]], pred[pick[32:]] = 8000.0, 4000.0
    plen = np.full(n, 100.0)
    cost = CostModel(train_per_token=1e-7, logprob_per_token=0.0, train_per_step=0.01, sync_s=0.1)
    auto = plan(np.arange(n).astype(str), pred, plen, tail="auto", policy="asp", global_batch_size=B,
                mini_batch_size=32, num_instances=R, max_num_seqs=256, lag_bound=1, cost=cost, seed=0)
    it = auto["iteration"].to_numpy()
    assert sorted(pred[(it == 0) & (pred >= 4000)]) == [4000.0, 4000.0]    # relieved
    assert sorted(pred[(it == 1) & (pred >= 4000)]) == [8000.0, 8000.0]
    capped = auto["room"].to_numpy() > 0
    # every 8000 and iteration 0's two 4000s (its floor now); a 4000 beside an 8000 meets the target
    # the 8000 allows at the sequences the instances run (TailModel.batch), so no cap
    assert set(np.flatnonzero(capped)) == set(pick[:32]) | set(np.flatnonzero((it == 0) & (pred >= 4000)))
    assert (auto.loc[capped, "room"] < 256).all()


def test_desc_order_breaks_ties_by_the_seeded_shuffle_alone():
    """Equal values keep the order of the seeded permutation; an unstable sort would reorder
    them by numpy's kernel, so two machines with one seed would plan different epochs."""
    from asp_ascend.scheduler.planner import _desc_order

    # four distinct values, each repeated 64 times: every tie group is large enough that
    # numpy's default (unstable) kinds reorder it
    values = np.repeat(np.array([5.0, 3.0, 9.0, 1.0]), 64)
    rng_seed = 7
    order = _desc_order(values, np.random.default_rng(rng_seed))
    perm = np.random.default_rng(rng_seed).permutation(values.size)
    # by hand: descending value; within a value, the positions in `perm` order
    expected = np.concatenate([perm[values[perm] == v] for v in (9.0, 5.0, 3.0, 1.0)])
    np.testing.assert_array_equal(order, expected)


def test_concentrate_tail_gathers_the_longest_groups_and_keeps_counts():
    """scheduler.concentrate_tail (opt-in): the predicted-longest groups move into a subset of the
    iterations (never the first), every iteration keeps B groups, each iteration's predicted-length
    CDF moves by at most the margin, the predicted publish chain is lower, and the plan is the same
    for the same seed; 0 is today's plan exactly."""
    from asp_ascend.scheduler.concentrate import publish_chain

    n, B, margin = 4096, 256, 0.02
    rng = np.random.default_rng(3)   # heavy_tail's lengths without its cap: no ties among the longest
    pred = np.where(rng.random(n) < 0.1, 1500 * (1 - rng.random(n)) ** (-1 / 1.5), rng.lognormal(6.2, 0.6, n))
    plen = rng.lognormal(5.3, 0.5, n)
    ids = np.arange(n).astype(str)
    # relieve_first=0: the stratified membership, which concentrate_tail starts from alone
    kw = dict(global_batch_size=B, mini_batch_size=64, num_instances=8, lag_bound=1, relieve_first=0.0)
    cost = CostModel()
    lat = cost.group_latency(plen, pred, 8)
    for seed in range(3):
        base = plan(ids, pred, plen, policy="asp", seed=seed, **kw)
        off = plan(ids, pred, plen, policy="asp", seed=seed, concentrate_tail=0.0, **kw)
        pd.testing.assert_frame_equal(base, off)
        conc = plan(ids, pred, plen, policy="asp", seed=seed, concentrate_tail=margin, **kw)
        pd.testing.assert_frame_equal(conc, plan(ids, pred, plen, policy="asp", seed=seed, concentrate_tail=margin,
                                                 **kw))
        it0, it1 = base["iteration"].to_numpy(), conc["iteration"].to_numpy()
        assert (np.bincount(it1) == B).all()
        assert (it0 != it1).any(), seed
        # the 16 predicted-longest groups: one per iteration before, gathered into fewer after, none first
        top = np.argsort(-pred, kind="stable")[:n // B]
        assert np.unique(it0[top]).size == n // B
        assert np.unique(it1[top]).size < n // B / 2 and 0 not in set(it1[top]), (seed, sorted(it1[top]))
        assert max(ks(g["predicted_length"].to_numpy(), pred) for _, g in conc.groupby("iteration")) <= 1.5 / B + margin
        busy_tokens = 8 * (plen + pred)
        n_mb = np.full(n // B, B // 64)
        assert (publish_chain(it1, lat, busy_tokens, n_mb, cost, 1, n // B)
                < publish_chain(it0, lat, busy_tokens, n_mb, cost, 1, n // B))

def test_membership_auto_takes_the_dataset_order_where_its_predicted_chain_is_lower():
    """scheduler.membership (opt-in auto): the stratified membership gives each of 8 iterations one of the 8 long
    groups; where a decode step costs far more than the trainer's work (the longest groups bound the
    publish chain) the dataset order, which holds all 8 in one iteration, publishes much earlier on
    predicted figures, and auto takes it when the history says the predictions are good (quality 0.95);
    with poor (0.2) or unknown quality (one epoch of history) the lengths drawn around the predictions are
    near random, the dataset order's gain is not there, and the plan stays stratified; where the trainer
    binds, the chains are level and auto keeps the stratified plan (stratified: always)."""
    from asp_ascend.scheduler.concentrate import publish_chain

    n, B = 64, 8
    pred = np.full(n, 100.0)
    pred[8:16] = 4000.0                       # the dataset order's iteration 1: every long group
    plen = np.full(n, 50.0)
    ids = np.arange(n).astype(str)
    kw = dict(global_batch_size=B, mini_batch_size=4, num_instances=2, max_num_seqs=64, lag_bound=1,
              relieve_first=0.0)
    step_bound = CostModel(decode_a=0.2)
    auto = plan(ids, pred, plen, policy="asp", cost=step_bound, membership="auto", prediction_quality=0.95, **kw)
    strat = plan(ids, pred, plen, policy="asp", cost=step_bound, **kw)       # the default: stratified
    for poor in (0.2, 0.0, None):
        pd.testing.assert_frame_equal(plan(ids, pred, plen, policy="asp", cost=step_bound, membership="auto",
                                           prediction_quality=poor, **kw), strat)
    long_auto = auto["iteration"].to_numpy()[8:16]
    assert np.unique(strat["iteration"].to_numpy()[8:16]).size == 8
    assert np.unique(long_auto).size == 1 and long_auto[0] != 0
    # the same iterations as fifo's (consecutive prompts), the lightest-floor one first
    assert sorted(auto.groupby("iteration")["prompt_id"].apply(lambda s: min(map(int, s)) // B)) == list(range(8))
    lat = step_bound.group_latency(plen, pred, 8)
    n_mb = np.full(8, 2)
    chain = [publish_chain(p["iteration"].to_numpy(), lat, 8 * (plen + pred), n_mb, step_bound, 1, 8) for p in (auto, strat)]
    assert chain[0] < 0.5 * chain[1]
    # trainer-bound: the chains are level within 1 %, the plan stays stratified
    trainer_bound = CostModel(decode_a=0.2, train_per_token=0.1)
    pd.testing.assert_frame_equal(plan(ids, pred, plen, policy="asp", cost=trainer_bound, membership="auto",
                                       prediction_quality=1.0, **kw),
                                  plan(ids, pred, plen, policy="asp", cost=trainer_bound, **kw))
    with pytest.raises(ValueError, match="scheduler.membership"):
        plan(ids, pred, plen, policy="asp", membership="random", **kw)
