"""vLLM V1's chunked prefill in the simulated instances (``rollout.max_num_batched_tokens``,
``sim/chunked.py``) against the stall model (``sim/instances.py``). Hand-computed cases: one
decode step = a = 1 s (b = c = 0), one prompt token = 0.1 s, one sequence per group."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.chunked import ChunkedInstances
from asp_ascend.sim.engine import SimJobs
from asp_ascend.sim.instances import Instances
from asp_ascend.sim.run import simulate_system
from sim_common import reference_decode_step, small_sim_config

CM = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.1)


def _jobs(plen, resp, G=1):
    J = len(plen)
    z = np.zeros(J, dtype=np.int64)
    return SimJobs(epoch=z, prompt_id=np.array([f"p{j}" for j in range(J)]), iteration=z, mini_batch=z,
                   instance=z, dispatch_rank=np.arange(J), prompt_length=np.asarray(plen, dtype=np.int64),
                   resp=np.repeat(np.asarray(resp, dtype=np.int64)[:, None], G, axis=1))


def _inst(plen, resp, budget=0, mns=4, kv=0, cm=CM, G=1):
    events = []
    kw = dict(push=lambda t, kind, r, tok: events.append((t, tok)), on_group_done=lambda j, t: None)
    jobs = _jobs(plen, resp, G)
    inst = (ChunkedInstances(jobs, 1, cm, mns, kv, batched_tokens=budget, **kw) if budget
            else Instances(jobs, 1, cm, mns, kv, **kw))
    return inst, events


def _step(inst, events):
    """Run instance 0 to its next event (as the engine does: at_event, start_waiting, schedule)."""
    t, tok = events[-1]
    assert tok == inst.ev_tok[0]
    inst.at_event(0)
    assert inst.T[0] == t
    inst.start_waiting(0)
    inst.schedule(0)


def _running_then_long_prompt(budget):
    """Job 0 (2-token prompt, 100 tokens) runs alone for 5 steps; job 1 (20-token prompt, 5
    tokens) is admitted at the boundary after them (5.2 s)."""
    inst, ev = _inst([2, 20], [100, 5], budget)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)                   # 2 prompt tokens: 0.2 s
    inst.schedule(0)
    assert inst.T[0] == pytest.approx(0.2) and inst.t_first[0] == pytest.approx(1.2)
    inst.advance(0, 5.2)                    # 5 decode steps
    assert inst.S[0] == 5 and inst.T[0] == pytest.approx(5.2)
    inst.enqueue(0, 1, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    return inst, ev


def test_stall_model_the_running_sequence_waits_for_the_whole_prompt():
    inst, ev = _running_then_long_prompt(0)
    assert inst.T[0] == pytest.approx(5.2 + 2.0)          # 20 tokens x 0.1 s, nothing decodes
    assert inst.t_first[1] == pytest.approx(8.2)          # then one step
    assert ev[-1][0] == pytest.approx(7.2 + 5)            # job 1's 5 tokens: steps 6-10


def test_a_long_prompt_is_prefilled_beside_the_running_sequence():
    # budget 8: the running sequence's token first, 7 prompt tokens a step: 7 + 7 + 6
    inst, ev = _running_then_long_prompt(8)
    assert inst.pf_left[0] == 13 and inst.n[0] == 1
    assert inst.T[0] == pytest.approx(5.9)                # the chunk's 0.7 s, then the decode step
    assert ev[-1][0] == pytest.approx(6.9)                # the next boundary is an event
    _step(inst, ev)                                       # step 6 ended (the running sequence's token 6)
    assert inst.S[0] == 6 and inst.pf_left[0] == 6 and inst.T[0] == pytest.approx(7.6)
    assert ev[-1][0] == pytest.approx(8.6)
    _step(inst, ev)                                       # step 7 ended at 8.6; the last 6 prompt tokens
    assert inst.S[0] == 7 and inst.pf_left[0] == 0 and inst.n[0] == 2
    assert inst.T[0] == pytest.approx(9.2) and inst.bud[0] == 1
    assert inst.t_first[1] == pytest.approx(10.2)         # its first token ends step 8
    # job 1's 5 tokens: steps 8-12, no boundary before it finishes
    assert ev[-1][0] == pytest.approx(9.2 + 5) and inst.ev_step[0] == 12
    # against the stall model: the running sequence's tokens 6 and 7 come 1.3 and 0.6 s earlier,
    # token 8 at the same 10.2 s (the same work), the new sequence's first token 2 s later
    assert inst.chunk_steps[0] == 4


def test_a_prompt_within_the_budget_is_the_stall_model():
    # a step with room for the whole prompt: its tokens and then the step, as the stall model
    for budget in (0, 23, 10 ** 9):
        inst, ev = _running_then_long_prompt(budget)
        assert inst.T[0] == pytest.approx(7.2) and inst.t_first[1] == pytest.approx(8.2)
        assert ev[-1][0] == pytest.approx(12.2)


def test_an_idle_instance_prefills_a_burst_in_chunks_and_runs_the_done_ones():
    # three 6-token prompts, budget 8 (mns 4): step 1 computes prompt 0 and 2 of prompt 1, step 2
    # (prompt 0 decodes: 7 left) 4 of prompt 1 and 3 of prompt 2, step 3 (two decode) the last 3
    inst, ev = _inst([6, 6, 6], [10, 10, 10], budget=8)
    for j in range(3):
        inst.enqueue(0, j, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    assert inst.n[0] == 1 and inst.pf_left[0] == 4
    assert inst.T[0] == pytest.approx(0.8) and inst.t_first[0] == pytest.approx(1.8)
    _step(inst, ev)
    assert inst.n[0] == 2 and inst.pf_left[0] == 3 and inst.T[0] == pytest.approx(1.8 + 0.7)
    assert inst.t_first[1] == pytest.approx(3.5)
    _step(inst, ev)
    assert inst.n[0] == 3 and inst.pf_left[0] == 0 and inst.T[0] == pytest.approx(3.5 + 0.3)
    assert inst.t_first[2] == pytest.approx(4.8)
    # the stall model: all 18 tokens first (1.8 s), every first token at 2.8 s
    stall, _ = _inst([6, 6, 6], [10, 10, 10])
    for j in range(3):
        stall.enqueue(0, j, 0)
    stall.start_waiting(0)
    assert stall.T[0] == pytest.approx(1.8) and stall.t_first[:3] == pytest.approx([2.8] * 3)


def test_an_idle_instance_computes_prompt_tokens_alone():
    # a 20-token prompt alone, budget 8: two steps of prompt tokens only (0.8 s each, no decode
    # step), the third computes 4 and samples the first token
    inst, ev = _inst([20], [3], budget=8)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    assert inst.n[0] == 0 and ev[-1][0] == pytest.approx(0.8)
    _step(inst, ev)
    assert inst.n[0] == 0 and ev[-1][0] == pytest.approx(1.6)
    _step(inst, ev)
    assert inst.n[0] == 1 and inst.T[0] == pytest.approx(2.0) and inst.t_first[0] == pytest.approx(3.0)
    assert ev[-1][0] == pytest.approx(5.0)                # 3 tokens: 3 steps; the stall model's too
    stall, sev = _inst([20], [3])
    stall.enqueue(0, 0, 0)
    stall.start_waiting(0)
    stall.schedule(0)
    assert sev[-1][0] == pytest.approx(5.0)


def test_decode_tokens_filling_the_budget_leave_no_prompt_tokens():
    # two running sequences take the whole budget of 2 (a simulated engine may run more sequences
    # than vLLM's budget allows): the waiting prompt gets nothing and no step is an event until a
    # running sequence finishes; then one prompt token a step
    inst, ev = _inst([1, 1, 3], [4, 10, 2], budget=2, mns=3)
    inst.enqueue(0, 0, 0)
    inst.enqueue(0, 1, 0)
    inst.start_waiting(0)                 # both prompts (1 + 1 token) in the first step's budget
    inst.schedule(0)
    assert inst.n[0] == 2 and inst.T[0] == pytest.approx(0.2)
    inst.enqueue(0, 2, 0)
    inst.start_waiting(0)                 # the same step: its budget is spent
    inst.schedule(0)
    assert inst.pf_left[0] == 0 and len(inst.waiting[0]) == 1
    assert inst.ev_step[0] == 4 and ev[-1][0] == pytest.approx(4.2)    # job 0's finish, not step 1
    _step(inst, ev)                       # step 4: job 0 done; budget 2 - 1 running = 1 token
    assert inst.n[0] == 1 and inst.pf_left[0] == 2 and inst.T[0] == pytest.approx(4.3)
    assert inst.ev_step[0] == 5
    _step(inst, ev)
    _step(inst, ev)
    assert inst.n[0] == 2 and inst.pf_left[0] == 0 and inst.T[0] == pytest.approx(6.5)
    assert inst.t_first[2] == pytest.approx(7.5)


def test_the_partly_prefilled_sequence_is_preempted_first():
    # KV 39: a running 2-token prompt (100 tokens to go) and a 30-token prompt, budget 8: it holds
    # its 30 tokens from its first 7-token chunk; the running one grows until the next step would
    # overflow, and the partly prefilled one leaves (admitted last), its chunks lost
    inst, ev = _inst([2, 30], [100, 5], budget=8, kv=39)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    inst.advance(0, 5.2)                  # context 2 + 5 = 7: 7 + 30 + 1 + 1 <= 39 admits it
    inst.enqueue(0, 1, 0)
    inst.start_waiting(0)
    assert inst.pf_left[0] == 23 and inst.pf_kv[0] == 30
    inst.schedule(0)                      # 7 + 30 + 1 <= 39: step 6 runs
    _step(inst, ev)                       # context 8: 8 + 30 + 1 <= 39, the second chunk
    assert inst.pf_left[0] == 16 and inst.preemptions[0] == 0
    _step(inst, ev)                       # the third chunk (0.7 s), then 9 + 30 + 1 > 39: it leaves
    assert inst.preemptions[0] == 1 and inst.pf_left[0] == 0 and inst.pf_kv[0] == 0
    assert inst.n[0] == 1 and list(inst.waiting[0]) == [1] and inst.T[0] == pytest.approx(9.3)
    # no step-by-step events: the next is where job 0 alone would fill the cache (30 steps)
    assert inst.ev_step[0] == 7 + 30 and ev[-1][0] == pytest.approx(9.3 + 30)


def test_prefix_caching_a_group_in_chunks():
    # G = 2, a 300-token prompt, blocks of 128, budget 256: the first sample prefills 256 + 44,
    # the second finds 256 cached and computes 44 beside it
    cm = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.01, prefix_block=128)
    inst, ev = _inst([300], [50], budget=256, cm=cm, G=2)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    assert inst.n[0] == 0 and inst.pf_left[0] == 44 and inst.T[0] == pytest.approx(2.56)
    _step(inst, ev)                       # 44 + 44 tokens: both done in the second step
    assert inst.n[0] == 2 and inst.saved[0] == 256 and inst.hold[0] == 2
    assert inst.T[0] == pytest.approx(2.56 + 0.88)


@pytest.mark.parametrize("budget, ok", [(None, True), (0, True), (16, True), (8192, True), (15, False), (-1, False)])
def test_the_key_is_checked_against_max_num_seqs(empty_yaml, budget, ok):
    over = ["rollout.max_num_seqs=16"] + ([] if budget is None else [f"rollout.max_num_batched_tokens={budget}"])
    if ok:
        assert load_config(empty_yaml, over).rollout.max_num_batched_tokens == budget
        return
    with pytest.raises(ConfigError, match=r"rollout.max_num_batched_tokens: -?\d+ must be >= "
                                          r"rollout.max_num_seqs=16.*rollout.max_num_batched_tokens=8192"):
        load_config(empty_yaml, over)


def test_the_runtime_passes_the_budget_to_vllm(empty_yaml):
    from asp_ascend.pipeline.actors import engine_args

    assert engine_args(load_config(empty_yaml, [])) == {"enable_prefix_caching": True}
    assert engine_args(load_config(empty_yaml, ["rollout.max_num_batched_tokens=4096"])) == {
        "enable_prefix_caching": True, "max_num_batched_tokens": 4096}


def _summary(cfg, name):
    from asp_ascend.lengths.workloads import workload_from_config

    return simulate_system(cfg, workload_from_config(cfg), name, record_samples=False).summary


@pytest.mark.parametrize("name", ["fully_async_fifo", "asp"])
def test_a_budget_no_burst_reaches_is_the_stall_model(name):
    base = _summary(small_sim_config(3), name)
    big = _summary(small_sim_config(3, **{"rollout.max_num_batched_tokens": 10 ** 9}), name)
    for key in ("iteration_time_mean", "throughput", "preemptions"):
        assert big[key] == base[key]


@pytest.mark.parametrize("name", ["fully_async_fifo", "asp"])
def test_a_small_budget_runs_every_sample_once(name):
    # budget = max_num_seqs (16), a KV cache that preempts: every sample generated exactly once
    cfg = small_sim_config(5, **{"rollout.max_num_batched_tokens": 16, "rollout.kv_cache_tokens": 6000})
    s = _summary(cfg, name)
    base = _summary(small_sim_config(5, **{"rollout.kv_cache_tokens": 6000}), name)
    assert s["iterations"] == base["iterations"] and s["samples"] == base["samples"]
    assert s["iteration_time_mean"] != base["iteration_time_mean"]


# ----------------------------------------------------------- step-by-step reference

def reference_chunked(jobs: SimJobs, cm: CostModel, mns: int, kv: int, budget: int) -> np.ndarray:
    """Finish times of one instance stepped one engine step at a time with vLLM V1's rules (all
    jobs admissible, no prefix caching): fill while running + waiting < mns; each step the running
    sequences' decode tokens first, then the partly prefilled sequence (the queue's head) and the
    waiting ones in order, each taking what is left of the budget (a slot and KV space needed to
    start); prompt tokens paid at the step's start; preempt the partial, then the newest running
    sequence, while the next step would overflow the KV cache; then the decode step."""
    J, G = jobs.resp.shape
    queue = deque(sorted(range(J), key=lambda j: (jobs.iteration[j], jobs.dispatch_rank[j])))
    plen = {s: int(jobs.prompt_length[s // G]) for s in range(J * G)}
    L = jobs.resp.reshape(-1)
    gen = [0] * (J * G)
    running: list[int] = []
    waiting: deque = deque()
    left = pkv = 0                  # the partly prefilled sequence (waiting[0] when left > 0)
    fin = np.zeros(J * G)
    t, done = 0.0, 0
    while done < J * G:
        while len(running) + len(waiting) < mns and queue:
            j = queue.popleft()
            waiting.extend(range(j * G, j * G + G))
        C = sum(plen[s] + gen[s] for s in running)
        bud, chunk = budget - len(running), 0
        while waiting and bud > 0:
            s = waiting[0]
            if not left:
                need = plen[s] + gen[s]
                if len(running) >= mns or (kv and running and C + need + len(running) + 1 > kv):
                    break
                left = pkv = need
            c = min(left, bud)
            chunk, bud, left = chunk + c, bud - c, left - c
            if left:
                break
            waiting.popleft()
            running.append(s)
            C += pkv
            pkv = 0
        t += cm.prefill_per_token * chunk
        while kv and C + pkv + len(running) > kv:
            if left and running:
                left = pkv = 0
            elif len(running) > 1:
                s = running.pop()
                C -= plen[s] + gen[s]
                waiting.appendleft(s)
            else:
                break
        t, k = reference_decode_step(cm, running, C, gen, L, fin, t)
        done += k
    return fin


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), G=st.integers(1, 4), mns=st.integers(1, 10),
       kv=st.sampled_from([0, 150, 400, 2000]), extra=st.integers(0, 40))
def test_the_event_engine_matches_a_step_by_step_reference(seed, G, mns, kv, extra):
    from asp_ascend.scheduler.execution import ExecutionSettings
    from asp_ascend.sim.engine import Engine, TrainerSpec

    rng = np.random.default_rng(seed)
    J = int(rng.integers(1, 12))
    z = np.zeros(J, dtype=np.int64)
    jobs = SimJobs(epoch=z, prompt_id=np.array([f"p{j}" for j in range(J)], dtype=object),
                   iteration=np.arange(J) // 3, mini_batch=z, instance=z, dispatch_rank=np.arange(J),
                   prompt_length=rng.integers(1, 40, J), resp=rng.integers(1, 60, (J, G)))
    cm = CostModel(decode_a=0.01, decode_b=1e-5, decode_c=2e-3, prefill_per_token=1e-3)
    budget = mns + extra            # vLLM's floor: max_num_batched_tokens >= max_num_seqs
    eng = Engine(jobs, ExecutionSettings(policy="fifo", num_instances=1, max_num_seqs=mns, lag_bound=100,
                                         group_size=G),
                 cost=cm, kv_capacity=kv, trainer=TrainerSpec(1e-6, 0.0, 0.0, 4, "packed"), sync_pause=False,
                 batched_tokens=budget)
    got = eng.run().frame("request")["t_finish"].to_numpy()
    np.testing.assert_allclose(got, reference_chunked(jobs, cm, mns, kv, budget), rtol=1e-9, atol=1e-9)
