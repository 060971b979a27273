"""Micro-batch tensors for the trainer: padded rows, or one packed row without padding.

``padded``: one row per sequence, right-padded to the longest, with an attention mask.
``packed``: the sequences concatenated into one row; ``position_ids`` restart at 0 at each
sequence, which is how transformers marks packed sequences: with no 2-D attention mask and no
KV cache (``use_cache=False``; with a cache the resets are not looked at), its
SDPA/eager mask builder turns position resets into a block-diagonal causal mask (dense: an
[N, N] mask for a row of N tokens), while varlen attention (``varlen``: the row's cumulative
lengths ``cu_seq_lens_q/k`` are passed) keeps sequences apart without one: flash-attn on CUDA,
``npu_fusion_attention`` on Ascend, the length-class SDPA of platforms/attention.py elsewhere;
the trainer uses varlen. Rotary positions are per sequence, so every sequence sees exactly what
it sees alone in a padded row.

Per-token values of the loss (response mask, behaviour log-probs, advantages) are placed with
:meth:`MicroBatch.per_token` / :meth:`MicroBatch.per_sequence` in the frame of next-token
targets ``[rows, T - 1]``: response token j of a sequence whose prompt has p tokens sits at
column ``start + p - 1 + j`` of its row, whatever the layout. Positions where one packed
sequence "predicts" the first token of the next are never response positions.

:func:`packing_supported` checks on the real model that a packed forward gives each sequence
the log-probs it gets alone (a backend that ignores position resets would mix sequences).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..algos.grpo import token_logprobs


@dataclass
class MicroBatch:
    input_ids: object                 # LongTensor [rows, T]
    attention_mask: object            # padded: [rows, T]; packed: None
    forward_kwargs: dict              # packed: position_ids (+ varlen kwargs)
    rows: np.ndarray                  # row of each sequence
    starts: np.ndarray                # first column of each sequence in its row
    lengths: np.ndarray               # tokens of each sequence
    packed: bool
    device: object = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def slots(self) -> int:
        return int(self.input_ids.numel())

    def _index(self, offsets, counts):
        """(row, column) of value j of sequence i, for j < counts[i], at column start + offset - 1 + j."""
        import torch

        key = (tuple(offsets), tuple(counts))
        if key not in self._cache:
            counts = np.asarray(counts, dtype=np.int64)
            first = self.starts + np.asarray(offsets, dtype=np.int64) - 1
            seq = np.repeat(np.arange(len(counts)), counts)
            within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            self._cache[key] = (torch.as_tensor(self.rows[seq]), torch.as_tensor(first[seq] + within), seq)
        return self._cache[key]

    def per_token(self, values: list, offsets: list[int], fill: float = 0.0):
        """``values[i]`` (a list per sequence) placed from column start + offsets[i] - 1: [rows, T - 1]."""
        import torch

        r, c, _ = self._index(offsets, [len(v) for v in values])
        out = torch.full((self.input_ids.shape[0], self.input_ids.shape[1] - 1), fill, dtype=torch.float32)
        if r.numel():
            out[r, c] = torch.tensor([x for v in values for x in v], dtype=torch.float32)
        return out.to(self.device)

    def per_sequence(self, values: list[float], offsets: list[int], counts: list[int], fill: float = 0.0):
        """The scalar ``values[i]`` over sequence i's ``counts[i]`` positions from offsets[i]: [rows, T - 1]."""
        import torch

        r, c, seq = self._index(offsets, counts)
        out = torch.full((self.input_ids.shape[0], self.input_ids.shape[1] - 1), fill, dtype=torch.float32)
        if r.numel():
            out[r, c] = torch.as_tensor(np.asarray(values, dtype=np.float32)[seq])
        return out.to(self.device)


def build_micro_batch(seqs: list[list[int]], *, packed: bool, pad_id: int, device=None,
                      varlen: bool = False) -> MicroBatch:
    """The tensors of one micro-batch of token sequences (each at least two tokens long)."""
    import torch

    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    if packed:
        n = int(lengths.sum())
        starts = np.cumsum(lengths) - lengths
        ids = torch.tensor([[t for s in seqs for t in s]], dtype=torch.long)
        pos = torch.as_tensor(np.arange(n) - np.repeat(starts, lengths)).unsqueeze(0)
        # use_cache=False: transformers looks for position resets only when no KV cache is built
        kw = {"position_ids": pos.to(device), "use_cache": False}
        if varlen:
            cu = torch.tensor(np.r_[0, np.cumsum(lengths)], dtype=torch.int32, device=device)
            kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=int(lengths.max()),
                      max_length_k=int(lengths.max()))
        return MicroBatch(ids.to(device), None, kw, np.zeros(len(seqs), dtype=np.int64), starts, lengths, True, device)
    T = int(lengths.max())
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        att[i, :len(s)] = 1
    return MicroBatch(ids.to(device), att.to(device), {}, np.arange(len(seqs)),
                      np.zeros(len(seqs), dtype=np.int64), lengths, False, device)


def micro_batch_logprobs(model, mb: MicroBatch, temperature: float = 1.0, top_p: float = 1.0):
    """Next-token log-probs of the rollout's sampling distribution, [rows, T - 1]."""
    return token_logprobs(model, mb.input_ids, mb.attention_mask, temperature, top_p, **mb.forward_kwargs)


def packing_supported(model, *, device=None, varlen: bool = False, vocab: int | None = None,
                      tol: float | None = None) -> tuple[bool, float]:
    """(ok, max |difference|): each of three short sequences scored packed in one row against
    scored alone. ``tol`` defaults by the model's dtype (1e-4 in float32, 5e-2 in half types)."""
    import torch

    vocab = int(vocab or model.config.vocab_size)
    g = torch.Generator().manual_seed(1234)
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 5, 9)]
    dtype = next(model.parameters()).dtype
    if tol is None:
        tol = 1e-4 if dtype == torch.float32 else 5e-2
    with torch.no_grad():
        mb = build_micro_batch(seqs, packed=True, pad_id=0, device=device, varlen=varlen)
        lp = micro_batch_logprobs(model, mb)[0]
        diff = 0.0
        for s, st in zip(seqs, mb.starts):
            alone = micro_batch_logprobs(model, build_micro_batch([s], packed=False, pad_id=0, device=device))[0]
            got = lp[int(st):int(st) + len(s) - 1]
            diff = max(diff, float((got.float() - alone.float()).abs().max()))
    return diff <= tol, diff
