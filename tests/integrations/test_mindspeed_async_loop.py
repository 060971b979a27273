"""The async GRPO loop driven against CPU worker groups that really compute (torch CPU)."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from asp_ascend.integrations.mindspeed_rl.async_loop import (  # noqa: E402
    ActorGroup, AsyncGRPOLoop, ExperienceStore, LoopPorts, LoopSettings, RefGroup, SampleSource,
    behaviour_weights, build_rows)
from asp_ascend.metrics.timeline import Timeline  # noqa: E402
from asp_ascend.scheduler.admission import LagViolation  # noqa: E402

from asp_ascend.integrations.mindspeed_rl.trainer import ROLLOUT_LOG_PROB, TransferDockStore  # noqa: E402
from cpu_groups import CpuActorGroup, CpuRefGroup, CpuRolloutPool, group_norm_advantage, rule_reward  # noqa: E402
from td_standin import DataStrategy, TransferDock, resolve, unpad  # noqa: E402

VOCAB, N, GBS, MB, R = 6, 4, 8, 4, 2


def make_schedule(num_prompts=32, epochs=3, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    per_epoch = num_prompts // GBS
    for ep in range(epochs):
        order = rng.permutation(num_prompts)
        for pos, pid in enumerate(order):
            it = ep * per_epoch + pos // GBS
            rows.append(dict(epoch=ep, prompt_id=str(pid), iteration=it, mini_batch=(pos % GBS) // MB,
                             instance=pos % R, dispatch_rank=pos, predicted_length=float(rng.integers(2, 9))))
    return pd.DataFrame(rows)


def build(lag_bound=1, off_policy="decoupled_ppo", lr=2.0, with_ref=True, timeline=None, dp=1):
    """The loop over the CPU stand-ins: a TransferDock whose worker writes land late, read through the
    adapter's own TransferDockStore; an actor group that shards rows by data-parallel rank."""
    sched = make_schedule()
    iterations = int(sched.iteration.max()) + 1
    dock = TransferDock(GBS, N, addition_columns=["labels", ROLLOUT_LOG_PROB])
    store = TransferDockStore(DataStrategy(dock), unpad, get=resolve)
    actor = CpuActorGroup(dock, VOCAB, N, MB, lr=lr, dp=dp, with_ref=with_ref)
    ref = CpuRefGroup(dock, VOCAB) if with_ref else None
    pool = CpuRolloutPool(sched, R, N, lag_bound, VOCAB, capacity_groups=GBS * (lag_bound + 1))
    history = []
    ports = LoopPorts(actor=actor, store=store, samples=pool, ref=ref,
                      compute_rewards=lambda: rule_reward(dock),
                      compute_advantage=lambda: group_norm_advantage(dock, N),
                      publish_weights=lambda v: pool.publish(v, actor.named_weights()),
                      on_iteration=history.append, timeline=timeline)
    settings = LoopSettings(global_batch_size=GBS, group_size=N, lag_bound=lag_bound, iterations=iterations,
                            off_policy=off_policy, dataset_additional_keys=("labels",), mini_batch_size=MB,
                            trainer_dp=dp)
    # the stand-ins time on time.monotonic; the loop must share their clock (its default is the instances' time.time)
    return AsyncGRPOLoop(ports, settings, clock=time.monotonic), actor, ref, pool, dock, sched, history


def test_cpu_groups_satisfy_the_protocols():
    loop, actor, ref, pool, dock, _, _ = build()
    assert isinstance(actor, ActorGroup) and isinstance(ref, RefGroup)
    assert isinstance(loop.p.store, ExperienceStore) and isinstance(pool, SampleSource)


def test_worker_writes_land_late_and_the_store_reads_wait_for_them():
    """MindSpeed-RL's workers write old_log_prob/advantages without waiting: a snapshot taken after the
    worker call returned still has None rows; the adapter's store reads through the dock's wait."""
    loop, actor, ref, pool, dock, sched, _ = build()
    groups = pool.get_groups(0, GBS)
    rows, idx = build_rows(groups, N, ("labels",))
    loop.p.store.put_experience(rows, idx)
    actor.compute_log_prob(blocking=True)
    assert all(v is None for v in dock.get_experience_data()["old_log_prob"])
    got = loop.p.store.read_columns(["old_log_prob", ROLLOUT_LOG_PROB], idx)
    assert all(isinstance(t, torch.Tensor) and len(t) == len(r) for t, r in zip(got["old_log_prob"], rows["responses"]))
    assert all(torch.equal(a, b) for a, b in zip(got[ROLLOUT_LOG_PROB], rows[ROLLOUT_LOG_PROB]))
    assert not dock.pending


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_async_loop_trains_every_prompt_once_within_the_lag_bound_and_learns(dp):
    tl = Timeline()
    loop, actor, ref, pool, store, sched, history = build(lag_bound=1, timeline=tl, dp=dp)
    loop.run()
    iterations = int(sched.iteration.max()) + 1
    assert [h["iteration"] for h in history] == list(range(iterations))
    assert [h["policy_version"] for h in history] == list(range(1, iterations + 1))
    # every instance holds the last version; old log-probs recomputed every iteration, never skipped
    assert pool.adm.instance_version == [iterations] * R
    assert actor.log_prob_calls == iterations and actor.updates == iterations and ref.calls == iterations
    assert store.clears == iterations and not store.pending
    # each scheduled (epoch, prompt) trained exactly once, in its own iteration, all G samples
    steps = tl.events["step"]
    trained = [(s["iteration"], e, p, k) for s in steps for e, p, k in s["samples"]]
    assert len(trained) == len(set(trained)) == len(sched) * N
    expected = {(int(r.iteration), int(r.epoch), r.prompt_id) for r in sched.itertuples()}
    assert {(i, e, p) for i, e, p, _ in trained} == expected
    assert len(steps) == iterations * (GBS // MB)        # one optimizer step per mini-batch
    # ... and with the rows sharded over dp ranks, step m trains exactly the schedule's mini-batch m
    planned = {(int(r.iteration), int(r.mini_batch)): set() for r in sched.itertuples()}
    for r in sched.itertuples():
        planned[(int(r.iteration), int(r.mini_batch))].add((int(r.epoch), r.prompt_id))
    for s in steps:
        assert {(e, p) for e, p, _ in s["samples"]} == planned[(s["iteration"], s["mini_batch"])]
    # the lag bound holds and async really ran ahead (k = 1 -> some samples one version old)
    lags = [r["iteration"] - r["admission_version"] for r in tl.events["request"]]
    assert max(lags) == 1 and min(lags) == 0
    assert all(h["policy_lag_max"] <= 1 for h in history)
    assert len(tl.events["sync"]) == iterations
    # the timeline is the shared format: the shared metric functions summarise it
    from asp_ascend.metrics.bubbles import summarize

    summary = summarize(tl, num_instances=R, max_num_seqs=8, lag_bound=1)
    assert summary["policy_lag_max"] == 1 and summary["throughput"] > 0
    # it learns: reward = fraction of tokens equal to the label (1/6 by chance)
    with torch.no_grad():
        hit = torch.stack([torch.softmax(actor.policy.table[c], -1)[c] for c in range(VOCAB)]).mean()
    assert hit > 2.0 / VOCAB, f"mean probability of the rewarded token {float(hit):.3f}"


def test_lag_zero_is_synchronous_and_weights_are_one():
    loop, actor, ref, pool, store, sched, history = build(lag_bound=0)
    loop.run()
    assert all(h["policy_lag_max"] == 0 for h in history)
    # on-policy rows: pi_old == pi_behaviour, so the decoupled weight is 1 up to float error
    assert all(abs(h["is_weight_mean"] - 1.0) < 1e-5 and abs(h["is_weight_max"] - 1.0) < 1e-5 for h in history)


def test_stale_rows_get_real_importance_weights():
    loop, actor, ref, pool, store, sched, history = build(lag_bound=1)
    loop.run()
    # after the first update the trainer's weights differ from the instances' older ones
    assert any(abs(h["is_weight_max"] - 1.0) > 1e-3 or abs(h["is_weight_min"] - 1.0) > 1e-3 for h in history[1:])


def test_off_policy_modes():
    old = torch.tensor([-1.0, -2.0, -0.5])
    beh = torch.tensor([-2.0, -1.0, -0.5])
    assert torch.allclose(behaviour_weights(old, beh, "decoupled_ppo", 2.0), torch.exp(old - beh))
    assert torch.allclose(behaviour_weights(old, beh, "tis", 2.0), torch.exp(old - beh).clamp(max=2.0))
    assert torch.equal(behaviour_weights(old, beh, "none", 2.0), torch.ones(3))
    with pytest.raises(ValueError, match="choose one of"):
        behaviour_weights(old, beh, "magic", 2.0)


def test_weighted_advantage_equals_decoupled_ppo_objective():
    """Folding w into A gives w * clipped-PPO, the decoupled objective, token by token."""
    g = torch.Generator().manual_seed(0)
    lp, old, beh, adv = (torch.randn(64, generator=g) for _ in range(4))
    r, w, eps = torch.exp(lp - old), torch.exp(old - beh), 0.2

    def ppo(a):
        return torch.max(-a * r, -a * r.clamp(1 - eps, 1 + eps))

    assert torch.allclose(ppo(adv * w), w * ppo(adv), atol=1e-6)


def test_rows_are_group_contiguous():
    from asp_ascend.integrations.mindspeed_rl.async_loop import SampleGroup

    groups = [SampleGroup(0, f"p{j}", 0, 0, 0, 0, [1, 2], [[j] * (s + 1) for s in range(2)],
                          [[-0.1] * (s + 1) for s in range(2)], {"labels": j}) for j in range(3)]
    rows, idx = build_rows(groups, 2, ("labels",))
    assert idx == list(range(6))
    assert [int(t[0]) for t in rows["responses"]] == [0, 0, 1, 1, 2, 2]
    assert [int(x) for x in rows["response_length"]] == [1, 2] * 3
    assert all(torch.equal(i, torch.cat([p, r])) for i, p, r in zip(rows["input_ids"], rows["prompts"], rows["responses"]))
    bad = SampleGroup(0, "x", 0, 0, 0, 0, [1], [[1, 2]], [[-0.1]], {"labels": 0})
    with pytest.raises(ValueError, match="expected group size 2"):
        build_rows([bad], 2, ("labels",))


def test_a_lag_violation_is_refused():
    loop, actor, ref, pool, store, sched, history = build(lag_bound=1)
    real = pool.get_groups

    def stale(i, count):
        out = real(i, count)
        out[0].admission_version = i - 2
        return out

    pool.get_groups = stale
    with pytest.raises(LagViolation, match="exceeds the bound 1"):
        loop.run_iteration(0)


def _mindspeed_optimizer_steps(num_rows: int, n: int, mb_prompts: int, dp: int) -> list[set[int]]:
    """Which rows each optimizer step trains in MindSpeed-RL's update with guarantee_order and no shuffle:
    rank d takes rows [d*E, (d+1)*E) (get_current_dp_range_indexes with assign_batch_size=E) and cuts
    them into consecutive mini-batches of mb*n/dp rows; step m is the union of every rank's m-th piece."""
    e, per = num_rows // dp, mb_prompts * n // dp
    steps = [set() for _ in range(e // per)]
    for d in range(dp):
        for m in range(e // per):
            steps[m].update(range(d * e + m * per, d * e + (m + 1) * per))
    return steps


@pytest.mark.parametrize("dp, mb", [(1, 4), (2, 4), (4, 4), (2, 8), (4, 8)])
def test_dp_layout_realises_the_schedule_mini_batches(dp, mb):
    from asp_ascend.integrations.mindspeed_rl.async_loop import dp_group_order

    gbs, n = 8, 3
    order = dp_group_order(gbs, mb, dp)
    assert sorted(order) == list(range(gbs))
    group_of_row = [order[r // n] for r in range(gbs * n)]   # row -> index of the group in mini-batch order
    for m, rows in enumerate(_mindspeed_optimizer_steps(gbs * n, n, mb, dp)):
        assert {group_of_row[r] // mb for r in rows} == {m}   # step m trains exactly mini-batch m
        assert len({group_of_row[r] for r in rows}) == mb     # all of it, whole groups


def test_dp_layout_rejects_an_unsplittable_mini_batch():
    from asp_ascend.integrations.mindspeed_rl.async_loop import dp_group_order

    with pytest.raises(ValueError, match="divisible by the trainer's DP size"):
        dp_group_order(8, 4, 3)
