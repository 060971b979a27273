"""The event engine: exact hand-computed cases and a token-by-token reference."""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import pytest

from asp_ascend.metrics import summarize
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.bounds import lower_bounds
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.trainer import micro_batch_table
from sim_common import reference_decode_step


def _jobs(resp, iteration, instance, mini_batch=None, prompt_length=None, G=None):
    resp = np.asarray(resp, dtype=np.int64)
    if resp.ndim == 1:
        resp = resp[:, None]
    J = resp.shape[0]
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.asarray(iteration, np.int64),
                   mini_batch=np.zeros(J, np.int64) if mini_batch is None else np.asarray(mini_batch, np.int64),
                   instance=np.asarray(instance, np.int64), dispatch_rank=np.arange(J, dtype=np.int64),
                   prompt_length=np.zeros(J, np.int64) if prompt_length is None else np.asarray(prompt_length, np.int64),
                   resp=resp)


UNIT = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)


def test_sim_two_instances_hand_computed():
    # instance 0: p0 (2 tokens, it 0) then p2 (1 token, it 1); instance 1: p1 (4, it 0) then p3 (1, it 1)
    # one sequence at a time, 1 s per decode step; trainer: 1 s per step, 0.5 s per sync.
    jobs = _jobs([2, 4, 1, 1], iteration=[0, 0, 1, 1], instance=[0, 1, 0, 1])
    tr = TrainerSpec(train_per_token=0.0, train_per_step=1.0, sync_s=0.5, micro_batch_size=8, micro_batching="packed")
    eng = Engine(jobs, ExecutionSettings(policy="asp", num_instances=2, max_num_seqs=1,
                                               lag_bound=1, group_size=jobs.group_size),
                 cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=False)
    tl = eng.run()
    req = tl.frame("request").set_index("prompt_id")
    assert req.loc[["p0", "p1", "p2", "p3"], "t_finish"].tolist() == [2.0, 4.0, 3.0, 5.0]
    assert req.loc[["p0", "p1", "p2", "p3"], "t_admit"].tolist() == [0.0, 0.0, 2.0, 4.0]
    assert req.loc[["p0", "p1", "p2", "p3"], "t_first_token"].tolist() == [1.0, 1.0, 3.0, 5.0]
    steps = tl.frame("step")
    assert steps[["t_start", "t_end"]].to_numpy().tolist() == [[4.0, 5.0], [5.5, 6.5]]
    assert tl.frame("sync")[["t_start", "t_end", "version"]].to_numpy().tolist() == [[5.0, 5.5, 1], [6.5, 7.0, 2]]
    mbt = micro_batch_table(jobs, 8, "packed")
    lb = lower_bounds(jobs, mbt, 0.0, 1.0, UNIT, 2, 1, 0, 1)
    # LB_0 = max(6 tokens / (2 x 1 tok/s), 1, 4 s / 2) = 3; LB_1 = max(2 / 2, 1, 1 / 2) = 1
    assert lb.tolist() == [3.0, 1.0]
    s = summarize(tl, num_instances=2, max_num_seqs=1, lag_bound=1, lower_bounds=lb)
    assert s["run_time_s"] == 7.0
    assert s["throughput"] == pytest.approx(8 / 7)
    assert s["iteration_time_mean"] == pytest.approx(3.5)      # syncs end at 5.5 and 7.0
    assert s["padding_bubble"] == 0.0
    assert s["skew_bubble"] == pytest.approx(2 / 14)           # instance 0 idle in [3, 5] while instance 1 works
    assert s["sorting_bubble"] == pytest.approx(4 / 7)         # trainer idle in [0, 4] while rollout runs
    assert s["rollout_breakdown"]["useful"] == pytest.approx(8 / 14)
    assert s["lower_bound_ratio"] == pytest.approx(7 / 4)
    assert s["policy_lag_hist"] == {"0": 2, "1": 2}


def test_sim_padding_and_sync_hand_computed():
    # one instance, k = 0 (synchronous): generate iteration 0, train it, sync, then iteration 1.
    # groups of 2 with lengths (1, 3) and (2, 2); micro-batches of 2 sequences, padded.
    jobs = _jobs([[1, 3], [2, 2]], iteration=[0, 1], instance=[0, 0], prompt_length=[1, 1])
    tr = TrainerSpec(train_per_token=0.5, train_per_step=0.0, sync_s=1.0, micro_batch_size=2, micro_batching="padded")
    tl = Engine(jobs, ExecutionSettings(policy="fifo", num_instances=1, max_num_seqs=4,
                                               lag_bound=0, group_size=jobs.group_size),
                 cost=UNIT, kv_capacity=0, trainer=tr, stream_train=False, sync_pause=False).run()
    st = tl.frame("step")
    # iteration 0: tokens (1+1)+(1+3)=6, padded to 2 x 4 = 8 slots -> 2 pad, 4 s of training
    assert st["tokens"].tolist() == [6, 6] and st["padded_tokens"].tolist() == [2, 0]
    assert st[["t_start", "t_end"]].to_numpy().tolist() == [[3.0, 7.0], [10.0, 13.0]]
    req = tl.frame("request")
    assert req["t_finish"].tolist() == [1.0, 3.0, 10.0, 10.0]   # iteration 1 admitted at the sync end, t = 8
    assert req["admission_version"].tolist() == [0, 0, 1, 1]
    s = summarize(tl, num_instances=1, max_num_seqs=4, lag_bound=0)
    assert s["padding_bubble"] == pytest.approx(2 / 14)
    assert s["run_time_s"] == 14.0 and s["iteration_time_mean"] == 7.0


# ----------------------------------------------------------- token-by-token reference

def reference_single_instance(jobs: SimJobs, cm: CostModel, max_num_seqs: int, kv: int) -> np.ndarray:
    """Finish times by simulating one instance step by step (no trainer interplay: all jobs
    admissible), with the engine's documented rules: fill while running + waiting < max,
    admit waiting while slots/KV allow, preempt the newest when the next step would overflow."""
    J, G = jobs.resp.shape
    order = sorted(range(J), key=lambda j: (jobs.iteration[j], jobs.dispatch_rank[j]))
    queue = deque(order)
    plen = {s: int(jobs.prompt_length[s // G]) for s in range(J * G)}
    L = jobs.resp.reshape(-1)
    gen = [0] * (J * G)
    running: list[int] = []
    waiting: deque = deque()
    fin = np.zeros(J * G)
    t = 0.0
    done = 0
    while done < J * G:
        while len(running) + len(waiting) < max_num_seqs and queue:
            j = queue.popleft()
            waiting.extend(range(j * G, j * G + G))
        C = sum(plen[s] + gen[s] for s in running)
        newtok = 0
        while waiting and len(running) < max_num_seqs:
            s = waiting[0]
            need = plen[s] + gen[s]
            if kv and running and C + need + len(running) + 1 > kv:
                break
            waiting.popleft()
            running.append(s)
            C += need
            newtok += need
        t += cm.prefill_per_token * newtok
        while kv and len(running) > 1 and C + len(running) > kv:
            s = running.pop()
            C -= plen[s] + gen[s]
            waiting.appendleft(s)
        t, k = reference_decode_step(cm, running, C, gen, L, fin, t)
        done += k
    return fin


@pytest.mark.parametrize("kv", [0, 400])
def test_sim_analytic_steps_match_token_by_token(kv):
    rng = np.random.default_rng(3)
    J, G = 24, 3
    jobs = _jobs(rng.integers(1, 120, (J, G)), iteration=np.arange(J) // 6, instance=np.zeros(J),
                 prompt_length=rng.integers(5, 60, J))
    cm = CostModel(decode_a=0.01, decode_b=1e-5, decode_c=2e-3, prefill_per_token=1e-4)
    tr = TrainerSpec(1e-6, 0.0, 0.0, 4, "packed")
    eng = Engine(jobs, ExecutionSettings(policy="fifo", num_instances=1, max_num_seqs=8,
                                               lag_bound=100, group_size=jobs.group_size),
                 cost=cm, kv_capacity=kv, trainer=tr, sync_pause=False)
    tl = eng.run()
    got = tl.frame("request")["t_finish"].to_numpy()
    want = reference_single_instance(jobs, cm, 8, kv)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    if kv:
        assert sum(eng.preemptions) > 0     # the KV cap actually bites in this case


def test_sim_lag_bound_blocks_admission():
    # k = 0 on two instances: nothing of iteration 1 starts before version 1 is published
    jobs = _jobs([3, 5, 2, 2], iteration=[0, 0, 1, 1], instance=[0, 1, 0, 1])
    tr = TrainerSpec(0.0, 1.0, 0.5, 8, "packed")
    tl = Engine(jobs, ExecutionSettings(policy="asp", num_instances=2, max_num_seqs=2,
                                               lag_bound=0, group_size=jobs.group_size),
                 cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=True).run()
    req = tl.frame("request")
    publish_1 = tl.frame("sync")["t_end"].iloc[0]
    assert (req.loc[req.iteration == 1, "t_admit"] >= publish_1).all()
    assert (req["iteration"] - req["admission_version"]).max() == 0


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), G=st.integers(1, 4), mns=st.integers(1, 10), kv=st.sampled_from([0, 150, 400, 2000]))
def test_sim_engine_matches_reference_property(seed, G, mns, kv):
    rng = np.random.default_rng(seed)
    J = int(rng.integers(1, 12))
    jobs = _jobs(rng.integers(1, 60, (J, G)), iteration=np.arange(J) // 3, instance=np.zeros(J),
                 prompt_length=rng.integers(1, 40, J))
    cm = CostModel(decode_a=0.01, decode_b=1e-5, decode_c=2e-3, prefill_per_token=1e-4)
    eng = Engine(jobs, ExecutionSettings(policy="fifo", num_instances=1, max_num_seqs=mns,
                                               lag_bound=100, group_size=jobs.group_size),
                 cost=cm, kv_capacity=kv, trainer=TrainerSpec(1e-6, 0.0, 0.0, 4, "packed"),
                 sync_pause=False)
    got = eng.run().frame("request")["t_finish"].to_numpy()
    np.testing.assert_allclose(got, reference_single_instance(jobs, cm, mns, kv), rtol=1e-9, atol=1e-9)
