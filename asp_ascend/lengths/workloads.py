"""Length workloads for experiments: heavy-tailed synthetic and trace-driven.

A :class:`Workload` holds, for N prompts, their prompt lengths and each epoch's
*expected* per-sample response length (``mean_length[e, p]``). Sample lengths of a
group are drawn around that mean on demand (``samples(e)``, deterministic), so a
million-prompt workload stays a few arrays.

Model (both kinds):
- marginal: a sample of per-prompt mean lengths. Synthetic: lognormal body
  (``body_median``, ``body_sigma``) mixed with a Pareto tail (``tail_fraction`` of the
  prompts, shape ``tail_alpha``, scale ``tail_scale``), truncated at
  ``lengths.max_response_length``. Trace: rows of a length table (resampled with
  replacement), times ``length_scale``.
- persistence: a latent Gaussian per prompt follows an AR(1) across epochs with
  correlation ``epoch_correlation``; each epoch maps the latent's rank onto the marginal,
  so every epoch has the same length mix while prompts keep (or lose) their place.
- drift: lengths scale by ``(1 + drift) ** epoch``.
- within-group spread: sample = mean * lognormal(0, ``group_spread``) (mean-preserving).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass
class Workload:
    prompt_ids: np.ndarray        # (N,) str
    prompt_length: np.ndarray     # (N,) int
    mean_length: np.ndarray       # (E, N) float32: expected per-sample response length
    group_size: int
    group_spread: float
    max_response_length: int
    seed: int
    name: str = "workload"

    @property
    def num_prompts(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def epochs(self) -> int:
        return self.mean_length.shape[0]

    def samples(self, epoch: int) -> np.ndarray:
        """(N, G) int response lengths of epoch ``epoch`` (deterministic)."""
        rng = np.random.default_rng([self.seed, 7919, epoch])
        s = self.group_spread
        noise = np.exp(s * rng.standard_normal((self.num_prompts, self.group_size), dtype=np.float32) - s * s / 2)
        L = np.rint(self.mean_length[epoch][:, None] * noise)
        return np.clip(L, 1, self.max_response_length).astype(np.int32)

    def to_history(self, epochs=None) -> pd.DataFrame:
        """Length-history table (DESIGN 6 columns) of the given epochs (default: all)."""
        frames = []
        for e in (range(self.epochs) if epochs is None else epochs):
            L = self.samples(e)
            N, G = L.shape
            frames.append(pd.DataFrame({
                "epoch": np.full(N * G, e, dtype=np.int32),
                "prompt_id": np.repeat(self.prompt_ids, G),
                "sample": np.tile(np.arange(G, dtype=np.int32), N),
                "prompt_length": np.repeat(self.prompt_length, G),
                "response_length": L.reshape(-1)}))
        return pd.concat(frames, ignore_index=True)


def _persistent_means(marginal: np.ndarray, epochs: int, rho: float, drift: float, max_len: int,
                      rng: np.random.Generator, z0: np.ndarray | None = None) -> np.ndarray:
    n = marginal.shape[0]
    sorted_m = np.sort(marginal).astype(np.float32)
    z = rng.standard_normal(n) if z0 is None else z0
    out = np.empty((epochs, n), dtype=np.float32)
    for e in range(epochs):
        if e > 0:
            z = rho * z + np.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal(n)
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(z, kind="stable")] = np.arange(n)
        out[e] = np.minimum(sorted_m[rank] * (1 + drift) ** e, max_len)
    return out


def synthetic_workload(w, group_size: int, max_response_length: int, seed: int = 0) -> Workload:
    """Heavy-tailed synthetic workload from a ``WorkloadConfig``."""
    rng = np.random.default_rng(seed)
    n = w.num_prompts
    body = w.body_median * np.exp(w.body_sigma * rng.standard_normal(n))
    tail = w.tail_scale * (1.0 - rng.random(n)) ** (-1.0 / w.tail_alpha)
    is_tail = rng.random(n) < w.tail_fraction
    marginal = np.clip(np.where(is_tail, tail, body), 1, max_response_length)
    z0 = rng.standard_normal(n)
    means = _persistent_means(marginal, w.epochs, w.epoch_correlation, w.drift, max_response_length, rng, z0)
    c = w.prompt_response_correlation
    pz = c * z0 + np.sqrt(max(0.0, 1 - c * c)) * rng.standard_normal(n)
    plen = np.maximum(1, np.rint(w.prompt_median * np.exp(w.prompt_sigma * pz))).astype(np.int32)
    ids = np.array([f"p{i}" for i in range(n)], dtype=object)
    return Workload(ids, plen, means, group_size, w.group_spread, max_response_length, seed, "synthetic")


def trace_workload(w, group_size: int, max_response_length: int, seed: int = 0) -> Workload:
    """Trace-driven workload: per-prompt mean lengths resampled from a length table."""
    from .history import read_table, validate_lengths

    path = Path(w.trace_path)
    df = read_table(path)
    if w.trace_column not in df.columns:
        raise DataError(f"{path}: no column '{w.trace_column}' (columns: {', '.join(map(str, df.columns))}); "
                        "set workload.trace_column")
    if df.empty:
        raise DataError(f"{path}: the trace is empty")
    lengths = validate_lengths(df, path, None, w.trace_column).to_numpy(float) * w.length_scale
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(df), size=w.num_prompts)
    marginal = np.clip(lengths[pick], 1, max_response_length)
    if w.trace_prompt_column and w.trace_prompt_column in df.columns:
        plen = pd.to_numeric(df[w.trace_prompt_column], errors="coerce").fillna(1).to_numpy()[pick]
    else:
        plen = np.full(w.num_prompts, w.prompt_median)
    plen = np.maximum(1, np.rint(plen)).astype(np.int32)
    # latent ranks follow the trace's own order for epoch 0 (the marginal's rank is the prompt's rank)
    z0 = np.empty(w.num_prompts)
    z0[np.argsort(marginal, kind="stable")] = np.sort(rng.standard_normal(w.num_prompts))
    means = _persistent_means(marginal, w.epochs, w.epoch_correlation, w.drift, max_response_length, rng, z0)
    ids = np.array([f"t{i}" for i in range(w.num_prompts)], dtype=object)
    return Workload(ids, plen, means, group_size, w.group_spread, max_response_length, seed, f"trace:{path.name}")


def history_workload(history: pd.DataFrame, group_size: int, max_response_length: int, seed: int = 0,
                     group_spread: float = 0.3) -> Workload:
    """A workload replaying a real length history: per-epoch per-prompt means."""
    ids = np.sort(history["prompt_id"].unique()).astype(object)
    epochs = np.sort(history["epoch"].unique())
    tab = history.pivot_table(index="prompt_id", columns="epoch", values="response_length", aggfunc="mean")
    tab = tab.reindex(index=ids, columns=epochs)
    means = tab.to_numpy(dtype=np.float32).T
    # prompts missing in an epoch keep their mean over the other epochs
    fill = np.nanmean(means, axis=0)
    means = np.where(np.isnan(means), fill[None, :], means)
    pl = history.groupby("prompt_id")["prompt_length"].first().reindex(ids).to_numpy(float)
    pl = np.where(np.isnan(pl), 1.0, pl).astype(np.int32)
    return Workload(ids, pl, means, group_size, group_spread, max_response_length, seed, "history")


def dataset_workload(cfg, count=None) -> Workload:
    """The prompts of ``data.path`` (ids and prompt lengths as ``asp schedule`` reads them) with the
    per-epoch mean lengths of the history ``lengths.path`` (:func:`history_workload`). A prompt of the
    file without any row in the history has no length to simulate: left out, with a warning naming
    the count; history rows of other prompts are skipped (``restrict_to`` warns). Prompt lengths as
    ``count`` counts them (data/prompt_tokens.rule_for: the run's tokens, or the words opt-in)."""
    from ..data.prompt_index import read_prompt_index
    from ..data.prompt_tokens import rule_for
    from .history import load_history, restrict_to

    d, L = cfg.data, cfg.lengths
    if not L.path:
        raise ConfigError([dataset_needs_lengths(cfg)])
    count = rule_for(cfg, count)
    ids, plen = read_prompt_index(d.path, d.prompt_key, d.id_key, count)
    hist = restrict_to(load_history(L.path, L.max_response_length), ids, str(L.path))
    by_id = pd.Series(np.asarray(plen, dtype=np.int64), index=pd.Index(np.asarray(ids, dtype=object).astype(str)))
    hist["prompt_length"] = by_id.reindex(hist["prompt_id"].astype(str)).to_numpy(dtype=float)
    w = history_workload(hist, cfg.train.group_size, L.max_response_length, cfg.seed, cfg.workload.group_spread)
    missing = len(ids) - w.num_prompts
    if missing:
        log.warning("%s: %d of the %d prompts of data.path have no row in lengths.path=%s, so no length to simulate: "
                    "left out of the workload", d.path, missing, len(ids), L.path)
    w.name = f"{Path(d.path).name} with lengths of {Path(L.path).name}" + (
        ", prompt lengths in WHITESPACE WORDS (data.prompt_length=words)" if count.unit == "words" else "")
    return w


def dataset_needs_lengths(cfg) -> str:
    """The problem line of a simulation of ``data.path`` without ``lengths.path``."""
    return (f"data.path: {cfg.data.path!r} is the workload (its prompts are what every command plans and trains), and "
            "asp simulate needs their response lengths, which a prompts file does not hold; set lengths.path to the "
            "length history of these prompts (a run's lengths.parquet), or remove data.path (data.path=null) to "
            "simulate the experiment workload of workload.type")


def clipped_tail(cfg) -> str | None:
    """A note when the synthetic workload's Pareto tail lies wholly at or above the generation cap:
    every tail prompt's length is then the cap itself, whatever ``workload.tail_alpha``."""
    w, M = cfg.workload, cfg.lengths.max_response_length
    if cfg.data.path or w.type != "synthetic" or w.tail_fraction <= 0 or w.tail_scale < M:
        return None
    return (f"the synthetic tail (workload.tail_scale={w.tail_scale:g} tokens and up) lies at or above "
            f"lengths.max_response_length={M}: its {w.tail_fraction:.0%} of prompts are clipped to exactly {M} tokens "
            f"and workload.tail_alpha has no effect; set workload.tail_scale below {M} or raise "
            "lengths.max_response_length for a heavy tail")


def workload_from_config(cfg, count=None) -> Workload:
    """The workload the config describes, by one rule for every command: ``data.path`` set, the
    prompts of that file (:func:`dataset_workload`, whatever ``workload.type``); otherwise the
    experiment workload ``cfg.workload`` (``type: task`` uses the built-in task's known lengths).
    ``count``: how the prompts of ``data.path`` are counted (:func:`dataset_workload`)."""
    w = cfg.workload
    G, M = cfg.train.group_size, cfg.lengths.max_response_length
    if cfg.data.path:
        return dataset_workload(cfg, count)
    if w.type == "synthetic":
        note = clipped_tail(cfg)
        if note:
            log.warning("%s", note)
        return synthetic_workload(w, G, M, cfg.seed)
    if w.type == "trace":
        return trace_workload(w, G, M, cfg.seed)
    if w.type == "history":
        from .history import load_history

        return history_workload(load_history(cfg.lengths.path, M), G, M, cfg.seed, w.group_spread)
    from ..data.datasets import prompts_from_config

    train, _ = prompts_from_config(cfg)      # no data.path: the built-in task, whose answer lengths are known
    means = np.repeat(train.known_lengths[None, :].astype(np.float32), w.epochs, axis=0)
    return Workload(np.asarray(train.ids, dtype=object), train.prompt_lengths.astype(np.int32), means, G, 0.0, M,
                    cfg.seed, "task")
