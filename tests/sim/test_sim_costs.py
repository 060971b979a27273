"""Default cost models: TP scaling, the single-instance plateau, KV capacity, exact group latency."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.bounds import group_latencies
from asp_ascend.sim.costs import group_latency_exact, instance_costs, system_costs, tp_speedup


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


def test_sim_group_latency_exact_matches_vectorised_and_solo():
    cm = CostModel(decode_a=0.01, decode_b=1e-6, decode_c=1e-3, prefill_per_token=1e-4)
    rng = np.random.default_rng(0)
    resp = rng.integers(1, 300, (20, 5))
    p = rng.integers(1, 100, 20)
    want = [group_latency_exact(pi, r, cm) for pi, r in zip(p, resp)]
    np.testing.assert_allclose(group_latencies(p, resp, cm), want, rtol=1e-12)
    # G = 1 is the scheduler's solo latency
    assert group_latency_exact(50, [200], cm) == pytest.approx(float(cm.solo_latency(50, 200)))
    # G equal lengths is the scheduler's group latency
    assert group_latency_exact(50, [200] * 4, cm) == pytest.approx(float(cm.group_latency(50, 200, 4)))
