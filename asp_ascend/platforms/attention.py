"""Which attention the trainer loads for packed micro-batches, per platform.

Packed rows (engines/packing.py) need attention that keeps sequences apart. All choices are
driven by the sequences' cumulative lengths ``cu_seq_lens_q/k`` that a packed micro-batch
passes to the forward (``varlen``); none computes a pad token in the linear layers:

- ``flash_attention_2`` on Ascend (transformers maps it to ``torch_npu.npu_fusion_attention``)
  and on CUDA when the ``flash_attn`` package imports: a varlen kernel, cost sum(L^2).
- :data:`VARLEN_SDPA` everywhere else (CPU, CUDA without flash-attn): registered here with
  transformers' ``AttentionInterface``. The sequences of the row are grouped in length classes
  (lengths within a factor of two: ``ceil(log2 L)``); each class runs one SDPA call on its
  sequences gathered into a padded [n, H, L_max, D] block with a causal key-padding mask, and
  the outputs are scattered back into the row. Only attention sees pads, at most 4x sum(L^2)
  in score entries, in about log2(L_max) calls per layer. (One call per sequence costs a kernel
  launch per sequence per layer, which dominates short sequences; one class for the whole row
  pads every sequence's attention to the longest.) Without ``cu_seq_lens_q`` (padded batches,
  the warm start, scoring one sequence) it is transformers' SDPA, unchanged.

The dense alternative (SDPA with the [N, N] block-diagonal mask transformers builds from
position resets) is not used: its attention grows with the row length squared.

:func:`packed_attention` answers (``attn_implementation``, varlen?) for a platform name and
registers :data:`VARLEN_SDPA` when it picks it; the trainer still checks the loaded model with
``engines.packing.packing_supported``.
"""
from __future__ import annotations

import importlib.util
import math

VARLEN_SDPA = "asp_varlen_sdpa"


def packed_attention(platform: str) -> tuple[str, bool]:
    """(attn_implementation, varlen) for packed training on ``platform`` (cpu | cuda | npu)."""
    if platform == "npu":
        return "flash_attention_2", True
    if platform == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", True
    register_varlen_sdpa()
    return VARLEN_SDPA, True


def register_varlen_sdpa() -> str:
    """Register :data:`VARLEN_SDPA` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, _varlen_sdpa_forward)
    AttentionMaskInterface.register(VARLEN_SDPA, _mask)
    return VARLEN_SDPA


def _mask(*args, attention_mask=None, **kwargs):
    """transformers' SDPA mask for padded batches; none for packed rows (no 2-D mask given),
    whose sequences are kept apart by ``cu_seq_lens_q`` in the forward below."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


_GROUPS: dict = {}


def length_classes(bounds: tuple[int, ...]) -> list[tuple]:
    """Per length class of the sequences ``[bounds[i], bounds[i + 1])`` of a packed row:
    (index [n, L_max] into the row (pads point at the sequence's first token), valid [n, L_max],
    mask [n, 1, L_max, L_max] causal over valid keys or None when no sequence is padded)."""
    import torch

    if bounds in _GROUPS:
        return _GROUPS[bounds]
    classes: dict[int, list[int]] = {}
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        classes.setdefault(math.ceil(math.log2(max(e - s, 1))), []).append(i)
    out = []
    for members in classes.values():
        starts = torch.tensor([bounds[i] for i in members])
        lens = torch.tensor([bounds[i + 1] - bounds[i] for i in members])
        ar = torch.arange(int(lens.max()))
        valid = ar[None, :] < lens[:, None]
        index = torch.where(valid, starts[:, None] + ar[None, :], starts[:, None])
        full = bool(valid.all())
        mask = None if full else ((ar[None, :, None] >= ar[None, None, :]) & valid[:, None, :])[:, None]
        out.append((index, valid, mask))
    _GROUPS.clear()  # one micro-batch at a time: every layer, pi_prox and the reference reuse it
    _GROUPS[bounds] = out
    return out


def _varlen_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs):
    """transformers attention function: query [1, H, N, D], key/value [1, H_kv, N, D] -> [1, N, H, D]."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"{VARLEN_SDPA}: a packed micro-batch is one row, got {query.shape[0]} rows")
    rep = getattr(module, "num_key_value_groups", 1)
    q = query[0].transpose(0, 1)  # [N, H, D]
    k = repeat_kv(key, rep)[0].transpose(0, 1)
    v = repeat_kv(value, rep)[0].transpose(0, 1)
    out = q.new_zeros(q.shape)
    dev = q.device
    for index, valid, mask in length_classes(tuple(int(x) for x in cu.tolist())):
        index, valid = index.to(dev), valid.to(dev)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[index].transpose(1, 2), k[index].transpose(1, 2), v[index].transpose(1, 2),
            attn_mask=None if mask is None else mask.to(dev), is_causal=mask is None,
            dropout_p=dropout, scale=scaling)
        out = out.index_put((index[valid],), o.transpose(1, 2)[valid].to(out.dtype))  # autocast: o may be 16-bit
    return out.unsqueeze(0), None
