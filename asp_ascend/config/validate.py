"""Cross-field checks of a :class:`~.schema.Config`, in one place.

Every check appends a message naming the dotted key, the bad value and the fix; the caller
reports them all at once. Also the parsers of keys that take a word or a number.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

from .schema import Config

# Range of every float key not checked by a cross-field rule in ``validate``: (low, low
# inclusive, high, high inclusive); None = unbounded. Non-finite values (.nan, .inf) are
# refused for every float key before these ranges are looked at.
_FLOAT_RANGES: dict[str, tuple] = {
    "data.synthetic.tail_alpha": (0.0, False, None, False),
    "workload.body_median": (0.0, False, None, False),
    "workload.body_sigma": (0.0, True, None, False),
    "workload.tail_scale": (0.0, False, None, False),
    "workload.group_spread": (0.0, True, None, False),
    "workload.drift": (-1.0, False, None, False),
    "workload.prompt_median": (0.0, False, None, False),
    "workload.prompt_sigma": (0.0, True, None, False),
    "workload.prompt_response_correlation": (-1.0, True, 1.0, True),
    "cost.prefill_per_token": (0.0, True, None, False),
    "cost.train_per_step": (0.0, True, None, False),
    "cost.logprob_per_token": (0.0, True, None, False),
    "cost.sync_s": (0.0, True, None, False),
    "cost.sync_busy_s": (0.0, True, None, False),
    "cost.publish_s": (0.0, True, None, False),
    "cost.step_latency_s": (0.0, True, None, False),
    "cost.admit_latency_s": (0.0, True, None, False),
    "cost.admit_each_s": (0.0, True, None, False),
    "cost.admit_engine_s": (0.0, True, None, False),
    "rollout.kv_cache_space_gib": (0.0, False, None, False),
    "rollout.request_timeout_s": (0.0, True, None, False),
    "train.step_timeout_factor": (1.0, True, None, False),
    "weight_sync.send_slack_s": (0.0, True, None, False),
    "rollout.num_cpus": (0.0, True, None, False),
    "train.lr": (0.0, False, None, False),
    "train.weight_decay": (0.0, True, None, False),
    "train.clip_eps": (0.0, False, None, False),
    "train.kl_coef": (0.0, True, None, False),
    "train.tis_cap": (0.0, False, None, False),
    "train.num_cpus": (0.0, True, None, False),
    "train.warmup_sft_lr": (0.0, False, None, False),
    "sim.tp_efficiency": (0.0, False, 1.0, True),
    "sim.tp_efficiency_internode": (0.0, False, 1.0, True),
    "sim.sync_bandwidth_gbps": (0.0, False, None, False),
    "sim.sync_latency_s": (0.0, True, None, False),
    "sim.host_bandwidth_gbps": (0.0, False, None, False),
    "sim.colocated_switch_s": (0.0, True, None, False),
}


def _float_fields(obj, prefix: str = ""):
    """(dotted key, value, default) of every float (or optional float) key of the config."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        val, tp = getattr(obj, f.name), hints[f.name]
        if dataclasses.is_dataclass(val):
            yield from _float_fields(val, f"{prefix}{f.name}.")
        elif tp is float or tp == typing.Optional[float]:
            default = f.default if f.default is not dataclasses.MISSING else None
            yield f"{prefix}{f.name}", val, default


def _range_text(lo, lo_in, hi, hi_in) -> str:
    if hi is None:
        return f"{'>=' if lo_in else '>'} {lo:g}"
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def _validate_floats(cfg: Config, p: list[str]) -> set[str]:
    """Every float key is a finite number in its range (NaN compares false with everything, so
    a range check alone lets ``.nan`` through). Returns the keys found non-finite."""
    bad: set[str] = set()
    for key, val, default in _float_fields(cfg):
        if val is None:
            continue
        fix = f"use e.g. {key}={default!r} (the default)" if default is not None else f"remove {key}"
        if not math.isfinite(val):
            bad.add(key)
            p.append(f"{key}: {val!r} must be a finite number; {fix}")
            continue
        rng = _FLOAT_RANGES.get(key)
        if rng is None:
            continue
        lo, lo_in, hi, hi_in = rng
        ok = (val >= lo if lo_in else val > lo) and (hi is None or (val <= hi if hi_in else val < hi))
        if not ok:
            p.append(f"{key}: {val!r} must be {_range_text(*rng)}; {fix}")
    return bad


def _validate_workload(cfg: Config, p: list[str]) -> None:
    """The simulator's synthetic workload (``workload.*``) and where its lengths come from."""
    w = cfg.workload
    if not -1.0 <= w.epoch_correlation <= 1.0:
        p.append(f"workload.epoch_correlation: {w.epoch_correlation} must be in [-1, 1]")
    if not 0.0 <= w.tail_fraction <= 1.0:
        p.append(f"workload.tail_fraction: {w.tail_fraction} must be in [0, 1]")
    if w.tail_alpha <= 0:
        p.append(f"workload.tail_alpha: {w.tail_alpha} must be > 0")
    if w.length_scale <= 0:
        p.append(f"workload.length_scale: {w.length_scale} must be > 0")
    if w.type == "trace" and not w.trace_path:
        p.append("workload.trace_path: required when workload.type=trace; point it at a CSV/parquet/JSONL length table")
    if w.type == "history" and not cfg.lengths.path:
        p.append("lengths.path: required when workload.type=history")


def validate(cfg: Config, *, check_files: bool = True) -> list[str]:
    """Cross-field checks in one place. Returns every problem found."""
    p: list[str] = []
    nonfinite = _validate_floats(cfg, p)
    t, r, pl = cfg.train, cfg.rollout, cfg.pipeline

    def pos(key, val, minimum=1):
        if val < minimum:
            p.append(f"{key}: {val!r} must be >= {minimum}")

    pos("rollout.num_instances", r.num_instances)
    pos("rollout.max_num_seqs", r.max_num_seqs)
    pos("rollout.devices_per_instance", r.devices_per_instance)
    pos("rollout.kv_cache_tokens", r.kv_cache_tokens, 0)
    seq = cfg.lengths.max_response_length + 1   # the longest response after a prompt of one token
    if 0 < r.kv_cache_tokens < seq:
        p.append(kv_capacity_problem(r.kv_cache_tokens, seq, "at least 1 prompt token + lengths.max_response_length="
                                     f"{cfg.lengths.max_response_length}"))
    mbt = r.max_num_batched_tokens
    if mbt is not None and mbt != 0 and not mbt >= max(1, r.max_num_seqs):
        p.append(f"rollout.max_num_batched_tokens: {mbt!r} must be >= rollout.max_num_seqs={r.max_num_seqs} (vLLM "
                 "refuses a step budget below max_num_seqs: every running sequence takes one token a step), or 0 / "
                 "null for vLLM's default and the simulator's stall model; use e.g. "
                 f"rollout.max_num_batched_tokens={max(8192, r.max_num_seqs)}")
    if r.kv_block_size < 1:
        p.append(f"rollout.kv_block_size: {r.kv_block_size!r} must be >= 1 (tokens per KV block, as vLLM's "
                 "block_size: 128 on vLLM-CPU and vllm-ascend, 16 on CUDA); use e.g. rollout.kv_block_size=128")
    if t.group_size < 2:
        p.append(f"train.group_size: {t.group_size!r} must be >= 2 (GRPO normalises rewards within a group: with one "
                 "sample every advantage is zero and nothing is learned); use e.g. train.group_size=8")
    if not r.temperature > 0:
        p.append(f"rollout.temperature: {r.temperature!r} must be > 0 (vLLM samples greedily at 0 while the trainer "
                 "divides logits by it); use e.g. rollout.temperature=1.0")
    if not 0.0 < r.top_p <= 1.0:
        p.append(f"rollout.top_p: {r.top_p!r} must be in (0, 1] (1.0 = no nucleus); use e.g. rollout.top_p=1.0")
    if cfg.model.dtype == "float16":
        p.append("model.dtype: 'float16' is not supported for training: float16 gradients need a loss scaler "
                 "(GradScaler) to avoid underflow/overflow and the trainers have none; use model.dtype=bfloat16 "
                 "(same memory, float32's exponent range) or float32")
    pos("train.global_batch_size", t.global_batch_size)
    pos("train.mini_batch_size", t.mini_batch_size)
    pos("train.micro_batch_size", t.micro_batch_size)
    pos("train.max_tokens_per_micro_batch", t.max_tokens_per_micro_batch, 0)
    pos("train.devices", t.devices)
    pos("train.epochs", t.epochs)
    pos("pipeline.lag_bound", pl.lag_bound, 0)
    pos("weight_sync.bucket_mb", cfg.weight_sync.bucket_mb)
    if not 0 <= cfg.weight_sync.master_port <= 65535:
        p.append(f"weight_sync.master_port: {cfg.weight_sync.master_port} must be a TCP port (1-65535), or 0 to pick "
                 "a free one")
    if cfg.weight_sync.timeout_s <= 0:
        p.append(f"weight_sync.timeout_s: {cfg.weight_sync.timeout_s} must be > 0 (seconds)")
    if cfg.weight_sync.stall_timeout_s < 1.0:
        p.append(f"weight_sync.stall_timeout_s: {cfg.weight_sync.stall_timeout_s} must be >= 1 (seconds without "
                 "progress before a receiver or the sender gives up; below a second a healthy sync of any real model would be "
                 "cut); use e.g. weight_sync.stall_timeout_s=300 (the default)")
    if 0 < t.step_timeout_s < 1.0 or t.step_timeout_s < 0:
        p.append(f"train.step_timeout_s: {t.step_timeout_s} must be 0 (no bound) or >= 1 (seconds a trainer call of "
                 "an optimizer step may stay out before the run stops; below a second a healthy step of any real "
                 "model would be cut); use e.g. train.step_timeout_s=1800 (the default)")
    pos("lengths.max_response_length", cfg.lengths.max_response_length)
    pos("workload.num_prompts", cfg.workload.num_prompts)
    pos("workload.epochs", cfg.workload.epochs)
    if t.mini_batch_size >= 1 and t.global_batch_size >= 1 and t.global_batch_size % t.mini_batch_size:
        near = _nearest_divisor(t.global_batch_size, t.mini_batch_size)
        p.append(f"train.mini_batch_size: {t.mini_batch_size} does not divide train.global_batch_size="
                 f"{t.global_batch_size}; use a divisor such as {near}")
    if not 0.0 < cfg.lengths.ema_alpha <= 1.0:
        p.append(f"lengths.ema_alpha: {cfg.lengths.ema_alpha} must be in (0, 1]")
    if not 0.0 <= cfg.lengths.quantile <= 1.0:
        p.append(f"lengths.quantile: {cfg.lengths.quantile} must be in [0, 1]")
    _validate_workload(cfg, p)
    for key, val in (("cost.decode_a", cfg.cost.decode_a), ("cost.decode_b", cfg.cost.decode_b),
                     ("cost.decode_c", cfg.cost.decode_c), ("cost.train_per_token", cfg.cost.train_per_token)):
        if val < 0:
            p.append(f"{key}: {val} must be >= 0")
    _validate_tail_keys(cfg, p)
    s = cfg.sim
    pos("sim.total_devices", s.total_devices)
    pos("sim.infer_tp", s.infer_tp)
    if not 0 < s.rollout_devices < s.total_devices:
        p.append(f"sim.rollout_devices: {s.rollout_devices} must be between 1 and sim.total_devices-1={s.total_devices - 1}")
    if check_files:
        for key, val in (("data.path", cfg.data.path), ("data.eval_path", cfg.data.eval_path),
                         ("lengths.path", cfg.lengths.path), ("model.path", cfg.model.path),
                         ("workload.trace_path", cfg.workload.trace_path if cfg.workload.type == "trace" else None)):
            if val and not Path(val).exists():
                p.append(f"{key}: {val} does not exist; fix the path or remove the key")
    # A non-finite value is reported once (the range checks below it would repeat it).
    return [m for m in p if m.split(":", 1)[0] not in nonfinite or "must be a finite number" in m]


def kv_capacity_problem(kv: int, minimum: int, what: str) -> str:
    """The problem line of a KV capacity (``rollout.kv_cache_tokens``) below one sequence's worst
    case ``minimum`` (``what`` says of what): vLLM refuses to start an engine whose KV cache cannot
    hold one sequence of max_model_len tokens, where the simulator would run it alone past capacity."""
    return (f"rollout.kv_cache_tokens: {kv} is below one sequence's worst case, {minimum} tokens ({what}): vLLM "
            f"refuses to start an engine whose KV cache cannot hold one sequence of max_model_len tokens; use "
            f"rollout.kv_cache_tokens >= {minimum}, lower lengths.max_response_length, or 0 to leave the capacity "
            f"to the engine (the model class's memory, unlimited with sim.model_class custom)")


def _nearest_divisor(n: int, target: int) -> int:
    """The divisor of ``n`` closest to ``target`` (O(sqrt n): a fuzzed batch size may be huge)."""
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            best = min((best, d, n // d), key=lambda x: (abs(x - target), x))
        d += 1
        if d > 10 ** 5:    # absurd sizes: a divisor below 100000 is a fine hint
            break
    return best


def _count_or(value, words: tuple[str, ...], what: str) -> int | str:
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower()
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = None
    if n is None or n < 1 or str(n) != str(value).strip():
        raise ValueError(f"must be {' or '.join(words)} or a positive number of {what}, got {value!r}")
    return n


def parse_tail_concurrency(value) -> int | str:
    """``rollout.tail_concurrency``: ``"auto"``, ``"off"``, ``"reactive"`` or a positive int (raises ValueError)."""
    return _count_or(value, ("auto", "off", "reactive"), "sequences")


def parse_speculative_max_batch(value) -> int | str:
    """``rollout.speculative_max_batch``: ``"auto"``, ``"always"`` or a positive int (raises ValueError)."""
    return _count_or(value, ("auto", "always"), "sequences")


def _validate_tail_keys(cfg: Config, p: list[str]) -> None:
    """The tail mechanisms' keys (DESIGN 9)."""
    r, c = cfg.rollout, cfg.cost
    for key, val, parse in (("rollout.tail_concurrency", r.tail_concurrency, parse_tail_concurrency),
                            ("rollout.speculative_max_batch", r.speculative_max_batch, parse_speculative_max_batch)):
        try:
            parse(val)
        except ValueError as exc:
            p.append(f"{key}: {exc}")
    if r.speculative != "none" and r.num_speculative_tokens < 1:
        p.append(f"rollout.num_speculative_tokens: {r.num_speculative_tokens} must be >= 1 with "
                 f"rollout.speculative={r.speculative}")
    if not 0.0 <= c.spec_acceptance < 1.0:
        p.append(f"cost.spec_acceptance: {c.spec_acceptance} must be in [0, 1)")
    for key, val in (("cost.spec_draft_s", c.spec_draft_s), ("cost.spec_draft_per_seq", c.spec_draft_per_seq)):
        if val < 0:
            p.append(f"{key}: {val} must be >= 0")
    if not 0.0 <= cfg.scheduler.concentrate_tail < 0.5:
        p.append(f"scheduler.concentrate_tail: {cfg.scheduler.concentrate_tail} must be in [0, 0.5) (the KS an "
                 f"iteration's predicted lengths may move; 0 = off); use e.g. scheduler.concentrate_tail=0.02")
    if not 0.0 <= cfg.scheduler.gather_top < 0.5:
        p.append(f"scheduler.gather_top: {cfg.scheduler.gather_top} must be in [0, 0.5) (the KS an iteration's "
                 f"predicted lengths may move; 0 = off); use e.g. scheduler.gather_top=0.02")
    if not 0.0 <= cfg.scheduler.relieve_first < 0.5:
        p.append(f"scheduler.relieve_first: {cfg.scheduler.relieve_first} must be in [0, 0.5) (the KS iteration 0's "
                 f"predicted lengths may move; 0 = off); use e.g. scheduler.relieve_first=0.02")
    if r.max_split < 1:
        p.append(f"rollout.max_split: {r.max_split} must be >= 1 (iterations a deferred group may move)")
    if cfg.pipeline.stream_groups == "on" and cfg.pipeline.mode == "sync":
        p.append("pipeline.stream_groups: on needs pipeline.mode=async (the sync mode trains once the whole iteration "
                 "is generated); set it to auto (off in the sync mode) or off, or use async")
    if cfg.pipeline.regroup_heavy == "on" and cfg.pipeline.regroup == "off":
        p.append("pipeline.regroup_heavy: on needs pipeline.regroup (it re-composes the mini-batches regroup "
                 "manages), which is off; set pipeline.regroup: auto (on for asp) or on, or pipeline.regroup_heavy: "
                 "auto (off where regroup is) or off")
    if r.partial_rollout and cfg.pipeline.mode == "sync":
        p.append("rollout.partial_rollout: needs pipeline.mode=async (a deferred group keeps generating across "
                 "weight syncs); set it to false or use async")
