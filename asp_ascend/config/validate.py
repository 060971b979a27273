"""Cross-field checks of a :class:`~.schema.Config`, in one place.

Every check appends a message naming the dotted key, the bad value and the fix; the caller
reports them all at once. Also the parsers of keys that take a word or a number.
"""
from __future__ import annotations

from pathlib import Path

from .schema import Config


def validate(cfg: Config, *, check_files: bool = True) -> list[str]:
    """Cross-field checks in one place. Returns every problem found."""
    p: list[str] = []
    t, r, pl = cfg.train, cfg.rollout, cfg.pipeline

    def pos(key, val, minimum=1):
        if val < minimum:
            p.append(f"{key}: {val!r} must be >= {minimum}")

    pos("rollout.num_instances", r.num_instances)
    pos("rollout.max_num_seqs", r.max_num_seqs)
    pos("rollout.devices_per_instance", r.devices_per_instance)
    pos("rollout.kv_cache_tokens", r.kv_cache_tokens, 0)
    if t.group_size < 2:
        p.append(f"train.group_size: {t.group_size!r} must be >= 2 (GRPO normalises rewards within a group: with one "
                 "sample every advantage is zero and nothing is learned); use e.g. train.group_size=8")
    if not r.temperature > 0:
        p.append(f"rollout.temperature: {r.temperature!r} must be > 0 (vLLM samples greedily at 0 while the trainer "
                 "divides logits by it); use e.g. rollout.temperature=1.0")
    if not 0.0 < r.top_p <= 1.0:
        p.append(f"rollout.top_p: {r.top_p!r} must be in (0, 1] (1.0 = no nucleus); use e.g. rollout.top_p=1.0")
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
                         ("workload.trace_path", cfg.workload.trace_path if w.type == "trace" else None)):
            if val and not Path(val).exists():
                p.append(f"{key}: {val} does not exist; fix the path or remove the key")
    return p


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
    """``rollout.tail_concurrency``: ``"auto"``, ``"off"`` or a positive int (raises ValueError)."""
    return _count_or(value, ("auto", "off"), "sequences")


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
    if r.max_split < 1:
        p.append(f"rollout.max_split: {r.max_split} must be >= 1 (iterations a deferred group may move)")
    if r.partial_rollout and cfg.pipeline.mode == "sync":
        p.append("rollout.partial_rollout: needs pipeline.mode=async (a deferred group keeps generating across "
                 "weight syncs); set it to false or use async")
