"""vLLM's automatic prefix caching in the simulated instances (``rollout.prefix_caching``,
``sim/instances.py``): the G samples of one prompt on one instance prefill the prompt's full
KV blocks (those before its last token) once and hold them once while any of them runs there;
the step fit counts prompt tokens the same way (``sim/decode_fit.py``). Hand-computed cases:
one prefill unit = 1 s per token, one decode step = 1 s."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.config import load_config, prefix_block_of
from asp_ascend.errors import ConfigError
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.decode_fit import prefilled_tokens
from asp_ascend.sim.engine import SimJobs
from asp_ascend.sim.instances import Instances

B = 128


def _jobs(plen, G, resp=100):
    J = len(plen)
    z = np.zeros(J, dtype=np.int64)
    return SimJobs(epoch=z, prompt_id=np.array([f"p{j}" for j in range(J)]), iteration=z, mini_batch=z,
                   instance=z, dispatch_rank=np.arange(J), prompt_length=np.asarray(plen, dtype=np.int64),
                   resp=np.full((J, G), resp, dtype=np.int64))


def _inst(plen, G, block, R=1, kv=0, mns=64, resp=100):
    cm = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=1.0, prefix_block=block)
    return Instances(_jobs(plen, G, resp), R, cm, mns, kv, push=lambda *a: None, on_group_done=lambda j, t: None)


def test_a_group_on_one_instance_prefills_its_prompt_once():
    # 300-token prompt, blocks of 128: a sibling finds 2 blocks (256 tokens) cached, computes 44
    on = _inst([300], 4, B)
    on.enqueue(0, 0, 0)
    on.start_waiting(0)
    assert on.T[0] == 300 + 3 * 44
    assert on.saved[0] == 3 * 256          # the prompt's shared blocks held once
    off = _inst([300], 4, 0)
    off.enqueue(0, 0, 0)
    off.start_waiting(0)
    assert off.T[0] == 4 * 300 and off.saved[0] == 0


def test_a_prompt_within_one_block_shares_nothing():
    # 128 tokens: the one full block holds the last token, which vLLM always computes
    inst = _inst([128], 4, B)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    assert inst.T[0] == 4 * 128


def test_each_instance_and_each_group_pays_its_own_prompt():
    # groups 0 and 1 on instance 0, group 2 on instance 1: one full prompt per group and instance
    inst = _inst([300, 300, 300], 2, B, R=2)
    inst.enqueue(0, 0, 0)
    inst.enqueue(0, 1, 0)
    inst.enqueue(1, 2, 0)
    inst.start_waiting(0)
    inst.start_waiting(1)
    assert inst.T[0] == 2 * (300 + 44)
    assert inst.T[1] == 300 + 44


def test_a_preempted_sequence_pays_its_generated_tokens_while_a_sibling_runs():
    inst = _inst([300], 2, B)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    t0 = inst.T[0]                         # 300 + 44
    inst.schedule(0)
    inst.advance(0, t0 + 5)                # 5 decode steps of 1 s
    assert inst.S[0] == 5
    inst._preempt_one(0)                   # the later admitted sibling leaves, 5 tokens generated
    assert inst.g0[1] == 5 and inst.saved[0] == 0
    t1 = inst.T[0]
    inst.start_waiting(0)                  # back beside its running sibling: 300 + 5 - 256
    assert inst.T[0] - t1 == 49
    assert inst.saved[0] == 256


def test_the_last_holder_leaving_drops_the_share():
    inst = _inst([300], 2, B, resp=3)
    inst.enqueue(0, 0, 0)
    inst.start_waiting(0)
    inst.schedule(0)
    inst.at_event(0)                       # both finish after 3 steps
    assert inst.n[0] == 0 and inst.saved[0] == 0 and inst.hold[0] == 0


def test_the_kv_cache_holds_a_shared_prompt_once():
    # 256-token prompt: a sibling shares 128 tokens; KV 256 + 128 + 2 fits both only when shared
    for block, running in ((B, 2), (0, 1)):
        inst = _inst([256], 2, block, kv=256 + 128 + 2)
        inst.enqueue(0, 0, 0)
        inst.start_waiting(0)
        assert inst.n[0] == running


def test_the_step_fit_counts_what_the_engine_prefilled():
    p = np.full(5, 300.0)
    # group 0: two start at boundary 1 (the second is cached), one at 3 while the first runs
    # (to 4), one at 6 after all finished (recomputes); group 1: one sequence alone
    i1 = np.array([1, 1, 3, 6, 1])
    i2 = np.array([4, 2, 5, 8, 3])
    grp = np.array([0, 0, 0, 0, 1])
    assert prefilled_tokens(p, i1, i2, grp, B).tolist() == [300, 44, 44, 300, 300]
    assert prefilled_tokens(p, i1, i2, grp, 0).tolist() == [300] * 5


def test_the_key_and_its_block(empty_yaml):
    assert prefix_block_of(load_config(empty_yaml)) == 128          # on by default, as vLLM V1
    assert prefix_block_of(load_config(empty_yaml, ["rollout.prefix_caching=false"])) == 0
    assert prefix_block_of(load_config(empty_yaml, ["rollout.kv_block_size=16"])) == 16
    with pytest.raises(ConfigError, match="rollout.kv_block_size: 0 must be >= 1"):
        load_config(empty_yaml, ["rollout.kv_block_size=0"])
    with pytest.raises(ConfigError, match="rollout.prefix_caching"):
        load_config(empty_yaml, ["rollout.prefix_caching=maybe"])


def test_cost_model_group_prefill():
    cm = CostModel(prefill_per_token=1.0, prefix_block=B)
    assert cm.group_prefill_tokens(300, 8) == 300 + 7 * 44
    assert CostModel(prefill_per_token=1.0).group_prefill(300, 8) == 8 * 300
    # a group alone on an instance: the simulator's charge
    assert cm.group_latency_exact([300], [[1] * 8])[0] == pytest.approx(300 + 7 * 44 + cm.steps(1, 8, 8 * 300))
