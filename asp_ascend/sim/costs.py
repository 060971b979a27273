"""Hardware cost models of the simulator: model classes, tensor parallelism, KV capacity.

The per-instance decode model is the scheduler's :class:`~asp_ascend.scheduler.cost.CostModel`
(``t_step = a + b * sum(context) + c * n``, the DistServe form); this module builds one for
an instance of ``tp`` devices and adds what only the simulator needs: KV-cache capacity in
tokens, trainer seconds per token for a given number of training devices, weight-sync time
from parameter bytes and link bandwidth.

Tensor parallelism: the device-side work of an instance over ``tp`` devices runs
``speedup(tp) = tp * e ** (intra-node doublings) * e_x ** (inter-node doublings)`` times faster
than on one device (``e`` = ``sim.tp_efficiency``, ``e_x`` = ``sim.tp_efficiency_internode``,
nodes of ``sim.devices_per_node``). The host side does not shrink: every step pays a fixed host
overhead and a per-sequence host cost (scheduling, sampling, output processing: Vidur models
these CPU overheads as functions of batch size; BestServe finds decode "dispatch-bound"), and
each TP doubling adds an all-reduce latency (x4 across nodes)::

    a(tp) = a_dev / speedup(tp) + a_host + allreduce_s * (doublings, inter-node ones x4)
    b(tp) = b / speedup(tp)
    c(tp) = c_dev / speedup(tp) + c_host

So one instance over all devices saturates early (its host cost grows with its batch, its
device work gains little from the last doublings) while several smaller instances on the same
devices keep scaling: the single-instance plateau ("Mind the Memory Gap", arXiv 2503.08311).

Default model classes (per device of an Ascend 910B-class accelerator: 64 GB HBM at about
1.6 TB/s, 354 bf16 TFLOPS; see docs/simulator.md for the derivation and sources):

============  =========  =========  =========  ==========  ===========  ============
class         decode a   decode b   decode c   KV bytes/   train s/tok  weights
              (s/step)   (s/tok/    (s/seq/    token       /device      (bytes)
                         step)      step)
============  =========  =========  =========  ==========  ===========  ============
7b            0.020      3.5e-8     1.0e-4     56 KiB      3.4e-4       15.2e9
32b           0.060      1.6e-7     4.5e-4     256 KiB     1.55e-3      65.5e9
============  =========  =========  =========  ==========  ===========  ============

``a`` = weight bytes / HBM bandwidth (``a_dev``) + 8 ms host overhead per step (``a_host``);
``b`` ~ KV bytes per token / bandwidth; ``c`` ~ 2 * params FLOPs per token at ~40 % utilisation
(``c_dev``) + 30 us host cost per sequence (``c_host``); training ~ 6 * params FLOPs per token at
~35 % MFU, a log-prob pass 2 * params. (The a + b*sum(ctx) + c*bs decode form is DistServe's
simulator's; KV footprints from the Qwen2.5-7B/32B configs.) ``custom`` takes ``cost.*`` as given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..scheduler.cost import CostModel
from ..scheduler.microbatch import PACKED_TOKEN_COST  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class ModelClass:
    """Per-device costs of one model size on one accelerator type."""
    name: str
    decode_a: float            # s per decode step, one device
    decode_b: float            # s per context token per step, one device
    decode_c: float            # s per running sequence per step, one device
    prefill_per_token: float   # s per prompt token, one device
    train_per_token: float     # s per (padded) token fwd+bwd, one device
    logprob_per_token: float   # s per token for one forward log-prob pass, one device
    train_per_step: float      # fixed s per optimizer step
    param_bytes: float         # weights in bf16
    kv_bytes_per_token: float
    device_memory: float = 64e9
    memory_utilization: float = 0.9
    min_tp: int = 1            # smallest TP whose shard of the weights fits a device
    a_host: float = 0.008      # part of decode_a spent on the host (does not shrink with TP)
    c_host: float = 3.0e-5     # part of decode_c spent on the host, per sequence
    allreduce_s: float = 1.0e-3  # added step latency per TP doubling (all-reduces of every layer)


MODEL_CLASSES = {
    "7b": ModelClass("7b", decode_a=0.020, decode_b=3.5e-8, decode_c=1.0e-4, prefill_per_token=8.0e-5,
                     train_per_token=3.4e-4, logprob_per_token=1.13e-4, train_per_step=0.5,
                     param_bytes=15.2e9, kv_bytes_per_token=56 * 1024, min_tp=1, allreduce_s=1.0e-3),
    "32b": ModelClass("32b", decode_a=0.060, decode_b=1.6e-7, decode_c=4.5e-4, prefill_per_token=3.6e-4,
                      train_per_token=1.55e-3, logprob_per_token=5.2e-4, train_per_step=1.5,
                      param_bytes=65.5e9, kv_bytes_per_token=256 * 1024, min_tp=2, allreduce_s=2.5e-3),
}


def tp_doublings(tp: int, devices_per_node: int = 8) -> tuple[float, float]:
    """(intra-node, inter-node) doublings of a ``tp``-way instance."""
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    total = math.log2(tp)
    intra = min(total, math.log2(max(1, devices_per_node)))
    return intra, total - intra


def tp_speedup(tp: int, efficiency: float, efficiency_internode: float | None = None,
               devices_per_node: int = 8) -> float:
    """Device-side throughput of one instance over ``tp`` devices relative to one device."""
    intra, inter = tp_doublings(tp, devices_per_node)
    ex = efficiency if efficiency_internode is None else efficiency_internode
    return tp * efficiency ** intra * ex ** inter


# PACKED_TOKEN_COST: what one packed token costs the trainer in padded slots (scheduler/microbatch.py,
# measured by benchmarks/bench_packing.py); shared with the analytic estimate.


def trainer_slots(tokens, padded_tokens, micro_batching: str) -> np.ndarray:
    """The slots the trainer pays for (micro-batch table columns), in padded-slot units."""
    if micro_batching == "packed":
        return PACKED_TOKEN_COST * np.asarray(tokens, dtype=float)
    return np.asarray(tokens, dtype=float) + np.asarray(padded_tokens, dtype=float)


def trainer_slots_one(tokens: int, padded_tokens: int, micro_batching: str) -> float:
    """:func:`trainer_slots` of one step, on Python floats (the same float64 product or sum)."""
    if micro_batching == "packed":
        return PACKED_TOKEN_COST * float(tokens)
    return float(tokens) + float(padded_tokens)


@dataclass(frozen=True)
class SimCosts:
    """Everything the engine needs to time one system configuration."""
    instance: CostModel          # decode/prefill of one rollout instance (already TP-scaled)
    kv_capacity: int             # tokens per instance (0 = unlimited)
    train_per_token: float       # trainer s per padded token incl. log-prob passes, all trainer devices
    train_per_step: float        # fixed s per optimizer step
    sync_s: float                # weight sync trainer -> rollout, s
    switch_s: float = 0.0        # colocated only: offload/onload + resharding per iteration, s
    publish_s: float | None = None   # runtime overheads (TrainerSpec); calibrated from a real run
    step_latency_s: float = 0.0
    admit_latency_s: float = 0.0
    sync_busy_s: float = 0.0     # added to a sync that starts while an instance decodes; calibrated
    admit_each_s: float = 0.0    # each admission reaches its instance's engine this long later, one at a time; calibrated
    admit_engine_s: float = 0.0  # engine time an admission costs a busy instance; calibrated


def instance_costs(cost_cfg, sim_cfg, tp: int, kv_cache_tokens: int = 0) -> tuple[CostModel, int]:
    """(decode CostModel, KV capacity in tokens) of one instance over ``tp`` devices.

    ``model_class=custom``: ``cost.decode_*``/``prefill_per_token`` are one instance's own
    coefficients (e.g. calibrated from a real run), taken as given whatever ``tp``; the KV
    capacity is ``rollout.kv_cache_tokens``.
    """
    if sim_cfg.model_class == "custom":
        cm = CostModel.from_config(cost_cfg)
        return cm, int(kv_cache_tokens)
    mc = MODEL_CLASSES[sim_cfg.model_class]
    s = tp_speedup(tp, sim_cfg.tp_efficiency, sim_cfg.tp_efficiency_internode, sim_cfg.devices_per_node)
    intra, inter = tp_doublings(tp, sim_cfg.devices_per_node)
    cm = CostModel(decode_a=(mc.decode_a - mc.a_host) / s + mc.a_host + mc.allreduce_s * (intra + 4 * inter),
                   decode_b=mc.decode_b / s, decode_c=(mc.decode_c - mc.c_host) / s + mc.c_host,
                   prefill_per_token=mc.prefill_per_token / s)
    free = tp * mc.device_memory * mc.memory_utilization - mc.param_bytes
    if free <= 0:
        raise ValueError(f"{mc.name}: weights ({mc.param_bytes / 1e9:.0f} GB) do not fit {tp} device(s); "
                         f"use sim.infer_tp >= {mc.min_tp}")
    kv = int(free / mc.kv_bytes_per_token)
    if kv_cache_tokens:
        kv = min(kv, int(kv_cache_tokens))
    return cm, kv


def system_costs(cost_cfg, sim_cfg, *, tp: int, train_devices: int, kv_cache_tokens: int = 0,
                 colocated: bool = False, logprob_passes: int = 2) -> SimCosts:
    """Costs of one system configuration: rollout instances of ``tp`` devices, a trainer on
    ``train_devices`` devices (data parallel, linear scaling), weight sync over the link."""
    cm, kv = instance_costs(cost_cfg, sim_cfg, tp, kv_cache_tokens)
    if sim_cfg.model_class == "custom":
        per_tok = cost_cfg.train_per_token + logprob_passes * cost_cfg.logprob_per_token
        # cost.train_per_token is "all trainer devices" for the configured train device count
        scale = max(1, sim_cfg.total_devices - sim_cfg.rollout_devices) / max(1, train_devices)
        return SimCosts(cm, kv, per_tok * scale, cost_cfg.train_per_step, cost_cfg.sync_s,
                        sim_cfg.colocated_switch_s if colocated else 0.0, _opt(cost_cfg, "publish_s", None),
                        _opt(cost_cfg, "step_latency_s", 0.0), _opt(cost_cfg, "admit_latency_s", 0.0),
                        _opt(cost_cfg, "sync_busy_s", 0.0), _opt(cost_cfg, "admit_each_s", 0.0),
                        _opt(cost_cfg, "admit_engine_s", 0.0))
    mc = MODEL_CLASSES[sim_cfg.model_class]
    per_tok = (mc.train_per_token + logprob_passes * mc.logprob_per_token) / max(1, train_devices)
    sync = mc.param_bytes / (sim_cfg.sync_bandwidth_gbps * 1e9) + sim_cfg.sync_latency_s
    switch = 0.0
    if colocated:
        # offload/onload of weights, grads and optimizer state to host + resharding, per iteration
        # (16 bytes of weights+grads+Adam state per parameter = 8x the bf16 weights, out and back in)
        switch = sim_cfg.colocated_switch_s if sim_cfg.colocated_switch_s > 0 else \
            2 * 8 * mc.param_bytes / max(1, train_devices) / (sim_cfg.host_bandwidth_gbps * 1e9)
    return SimCosts(cm, kv, per_tok, mc.train_per_step, sync, switch)


def _opt(cfg, key, default):
    v = getattr(cfg, key, default)
    return default if v is None else float(v)


def check_kv_capacity(cfg, kv_capacity: int, prompt_lengths) -> None:
    """Raise ConfigError when an instance's KV capacity (0 = unlimited) cannot hold one sequence of
    the longest prompt + ``lengths.max_response_length`` tokens: what vLLM checks against its
    max_model_len as it starts (the config check knows no prompt lengths: it asks for one token)."""
    from ..config.validate import kv_capacity_problem
    from ..errors import ConfigError

    if not kv_capacity or len(prompt_lengths) == 0:
        return
    longest = int(np.max(prompt_lengths))
    need = longest + int(cfg.lengths.max_response_length)
    if kv_capacity >= need:
        return
    what = f"the workload's longest prompt, {longest}, + lengths.max_response_length={cfg.lengths.max_response_length}"
    if cfg.rollout.kv_cache_tokens and int(cfg.rollout.kv_cache_tokens) == int(kv_capacity):
        raise ConfigError([kv_capacity_problem(int(kv_capacity), need, what)])
    raise ConfigError([f"sim.model_class: {cfg.sim.model_class} at sim.infer_tp={cfg.sim.infer_tp} leaves "
                       f"{kv_capacity} KV tokens an instance, below one sequence's worst case, {need} tokens "
                       f"({what}): vLLM would refuse to start; raise sim.infer_tp or lower "
                       f"lengths.max_response_length"])
