"""Which attention the trainer loads for packed micro-batches, per platform.

Packed rows need attention that keeps sequences apart (engines/packing.py). transformers
offers two ways, both driven by per-sequence ``position_ids``:

- ``varlen``: its flash-attention path calls a varlen kernel with the sequences' cumulative
  lengths (``cu_seq_lens_q/k``): no mask, no pad, cost sum(L^2) per row. On CUDA this is
  ``flash_attention_2`` when the ``flash_attn`` package imports; on Ascend transformers maps
  ``flash_attention_2`` to ``torch_npu.npu_fusion_attention`` (its npu_flash_attention module).
- ``dense``: SDPA with the block-diagonal causal mask transformers builds from the position
  resets (a [N, N] mask for a row of N tokens: attention cost grows with N^2, so the token
  budget keeps rows short). The CPU path, and CUDA without flash-attn.

:func:`packed_attention` answers (``attn_implementation``, varlen?) for a platform name; the
trainer still checks the loaded model with ``engines.packing.packing_supported`` and falls
back to ``sorted`` micro-batches when a model's attention does not honour the resets.
"""
from __future__ import annotations

import importlib.util


def packed_attention(platform: str) -> tuple[str, bool]:
    """(attn_implementation, varlen) for packed training on ``platform`` (cpu | cuda | npu)."""
    if platform == "npu":
        return "flash_attention_2", True
    if platform == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", True
    return "sdpa", False
