"""Default cost models: TP scaling, the single-instance plateau, KV capacity, exact group latency."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.bounds import group_latencies
from asp_ascend.sim.costs import instance_costs, system_costs, tp_speedup


def _sim(**over):
    return load_config(None, [f"{k}={v}" for k, v in over.items()])


def test_sim_tp_speedup_sublinear_and_worse_across_nodes():
    assert tp_speedup(1, 0.85) == 1.0
    assert tp_speedup(2, 0.85) == pytest.approx(1.7)
    assert tp_speedup(16, 0.85, 0.6, devices_per_node=8) == pytest.approx(16 * 0.85 ** 3 * 0.6)
    assert tp_speedup(16, 0.85, 0.6, 8) < tp_speedup(16, 0.85, 0.85, 8) < 16


@pytest.mark.parametrize("model,tp", [("7b", 2), ("32b", 4)])
def test_sim_single_instance_plateaus_below_replicas(model, tp):
    cfg = _sim(**{"sim.model_class": model})
    D, S, ctx = 64, 256, 2000.0
    one, _ = instance_costs(cfg.cost, cfg.sim, D)
    rep, _ = instance_costs(cfg.cost, cfg.sim, tp)
    replicas = D // tp
    single = one.peak_throughput(S * replicas, ctx)           # same total concurrency
    multi = replicas * rep.peak_throughput(S, ctx)
    assert multi > 2 * single
    # and the single instance barely gains from its last doubling
    half, _ = instance_costs(cfg.cost, cfg.sim, D // 2)
    assert one.peak_throughput(S * replicas, ctx) < 1.3 * half.peak_throughput(S * replicas, ctx)


def test_sim_kv_capacity_and_fit():
    cfg = _sim(**{"sim.model_class": "7b"})
    _, kv = instance_costs(cfg.cost, cfg.sim, 2)
    assert kv == int((2 * 64e9 * 0.9 - 15.2e9) / (56 * 1024))
    _, capped = instance_costs(cfg.cost, cfg.sim, 2, kv_cache_tokens=1000)
    assert capped == 1000
    big = _sim(**{"sim.model_class": "32b"})
    with pytest.raises(ValueError, match="infer_tp >= 2"):
        instance_costs(big.cost, big.sim, 1)


def test_sim_trainer_scales_with_devices_and_colocated_pays_switch():
    cfg = _sim(**{"sim.model_class": "7b"})
    a = system_costs(cfg.cost, cfg.sim, tp=2, train_devices=8)
    b = system_costs(cfg.cost, cfg.sim, tp=2, train_devices=16)
    assert a.train_per_token == pytest.approx(2 * b.train_per_token)
    assert a.switch_s == 0.0
    c = system_costs(cfg.cost, cfg.sim, tp=2, train_devices=16, colocated=True)
    assert c.switch_s > 0
    assert a.sync_s == pytest.approx(15.2e9 / 25e9 + 0.1)


def _by_steps(cm, prompt, lengths):
    """A group alone on an instance, one decode step at a time, from the one step formula."""
    t = cm.prefill_per_token * prompt * len(lengths)
    gen = 0
    while any(gen < L for L in lengths):
        run = [L for L in lengths if gen < L]
        gen += 1
        t += cm.step(len(run), len(run) * (prompt + gen))   # the token being generated counted
    return t


def test_cost_one_step_formula_behind_every_latency():
    cm = CostModel(decode_a=0.01, decode_b=1e-6, decode_c=1e-3, prefill_per_token=1e-4)
    rng = np.random.default_rng(0)
    resp = rng.integers(1, 120, (12, 5))
    p = rng.integers(1, 100, 12)
    want = [_by_steps(cm, int(pi), r.tolist()) for pi, r in zip(p, resp)]
    np.testing.assert_allclose(group_latencies(p, resp, cm), want, rtol=1e-12)
    np.testing.assert_allclose(cm.group_latency_exact(p, resp), want, rtol=1e-12)
    # G = 1 is the scheduler's solo latency; G equal lengths its group latency
    assert float(cm.solo_latency(50, 200)) == pytest.approx(_by_steps(cm, 50, [200]), rel=1e-12)
    assert float(cm.group_latency(50, 200, 4)) == pytest.approx(_by_steps(cm, 50, [200] * 4), rel=1e-12)
    # m steps in closed form = the sum of single steps; steps_to_reach inverts it
    assert cm.steps(7, 3, 90) == pytest.approx(sum(cm.step(3, 90 + 3 * j) for j in range(1, 8)), rel=1e-12)
    for delta in (0.0, 1e-9, 0.05, 0.3, 2.0):
        m = cm.steps_to_reach(delta, 3, 90)
        assert cm.steps(m, 3, 90) >= delta and (m == 0 or m == 1 or cm.steps(m - 1, 3, 90) < delta)
    # one sequence's share of a full instance: the fixed part split S ways
    assert float(cm.work(10, 100, 4)) == pytest.approx(
        float(cm.solo_latency(10, 100)) - 100 * cm.decode_a * 3 / 4, rel=1e-12)
    # peak throughput: S tokens per step of S sequences
    assert float(cm.peak_throughput(8, 50.0)) == pytest.approx(8 / cm.step(8, 8 * 50.0), rel=1e-12)
