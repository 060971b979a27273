"""Megatron-core GPT weights (MindSpeed-RL's trainer) -> Hugging Face-named full tensors.

The engine-free weight push (:mod:`.hf_push`) sends HF-named, unsharded tensors; each rollout
instance loads them with vLLM's own loaders, which shard them for the instance's tensor
parallelism (``model.load_weights``, as for a checkpoint on disk). So the trainer needs no vLLM
model of its own: this module is the whole conversion, in two steps per Megatron parameter.

1. :func:`merge_tp`: the tensor-parallel shards -> the unsharded Megatron tensor. Column-parallel
   weights concatenate on dim 0, row-parallel ones on dim 1, vocabulary-parallel embeddings on
   dim 0; replicated ones (norms, row-parallel biases) are taken from rank 0. ``linear_fc1`` of a
   gated MLP is the exception: each shard is ``[gate_r; up_r]``, so the gates and the ups are
   concatenated separately (the unsharded layout is ``[gate; up]``).
2. :func:`to_hf`: one unsharded Megatron tensor -> its HF tensors. The names follow MindSpeed-RL's
   own table (``MegatronVLLMWeightAdaptor.params_mapping`` in
   ``mindspeed_rl/workers/resharding/weight_adaptor.py``), continued to the HF names vLLM's
   loaders take (``qkv_proj`` -> ``q_proj/k_proj/v_proj``, ``gate_up_proj`` -> ``gate_proj/up_proj``).
   ``linear_qkv`` is grouped by query group: ``[ng, (nh/ng) q heads + 1 k head + 1 v head, hd]``
   (the layout ``qkv_split_weight`` / ``qkv_split_bias`` in MindSpeed-RL's
   ``megatron_weight_loaders.py`` undo; a test checks the two agree). Embedding rows past the HF
   vocabulary (Megatron pads it to a multiple of 128 x TP) are dropped.

Dense Qwen2 / Qwen2.5 / Qwen3 / Llama only (the async path refuses MoE in the config bridge).
Torch only; works on ``meta`` tensors too, which is how the sender plans the buckets before it
has gathered anything (:func:`hf_specs`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")
_BY_MODEL_TYPE = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}

# Megatron suffix inside decoder.layers.{i} -> HF suffix inside model.layers.{i} (1:1 tensors)
_LAYER_MAP = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",      # TE-fused norm
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",               # Qwen3
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",        # TE-fused norm
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ModelLayout:
    """What the conversion needs from the model's HF ``config.json``."""
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg: Any) -> "ModelLayout":
        """From a transformers config or the dict of ``config.json``; refuses what is not dense."""
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        archs = list(get("architectures") or [])
        arch = archs[0] if archs else _BY_MODEL_TYPE.get(get("model_type"), f"model_type {get('model_type')}")
        if arch not in SUPPORTED:
            raise ValueError(f"model architecture {arch}: the engine-free weight push converts {', '.join(SUPPORTED)} "
                             f"(dense); set asp.mindspeed.weight_push: resharding for other models")
        for key in ("num_experts", "n_routed_experts", "num_local_experts"):
            if get(key):
                raise ValueError(f"model architecture {arch}: config.json has {key}: {get(key)} (MoE); the engine-free "
                                 f"weight push converts dense models only. Use asp.mindspeed.trainer=sync for MoE models")
        heads, hidden = int(get("num_attention_heads")), int(get("hidden_size"))
        return cls(arch, int(get("num_hidden_layers")), hidden, heads, int(get("num_key_value_heads") or heads),
                   int(get("head_dim") or hidden // heads), int(get("intermediate_size")), int(get("vocab_size")),
                   bool(get("tie_word_embeddings", False)))


def strip_wrappers(name: str) -> str:
    """``module.module.decoder...`` (DDP / Float16Module wrappers) -> ``decoder...``."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def is_gated_fc1(name: str) -> bool:
    return name.endswith("mlp.linear_fc1.weight") or name.endswith("mlp.linear_fc1.bias")


def merge_tp(name: str, shards: list, partition_dim: Optional[int]):
    """The unsharded Megatron tensor from its tensor-parallel shards (rank order)."""
    import torch

    if partition_dim is None or len(shards) == 1:
        return shards[0]
    if is_gated_fc1(name):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=partition_dim)


def split_qkv(qkv, layout: ModelLayout):
    """Megatron's grouped ``linear_qkv`` weight ``[ng*(rep+2)*hd, hidden]`` (or bias) -> q, k, v."""
    ng, hd = layout.num_key_value_heads, layout.head_dim
    rep = layout.num_attention_heads // ng
    if qkv.shape[0] != ng * (rep + 2) * hd:
        raise ValueError(f"linear_qkv has {qkv.shape[0]} rows; {ng} query groups x ({rep} + 2) heads x {hd} "
                         f"= {ng * (rep + 2) * hd} expected (HF config and Megatron model disagree)")
    g = qkv.reshape(ng, rep + 2, hd, *qkv.shape[1:])
    rest = tuple(qkv.shape[1:])
    return (g[:, :rep].reshape(ng * rep * hd, *rest), g[:, rep].reshape(ng * hd, *rest),
            g[:, rep + 1].reshape(ng * hd, *rest))


def to_hf(name: str, full, layout: ModelLayout) -> list[tuple[str, Any]]:
    """HF tensors of one unsharded Megatron parameter (``name`` without wrappers, global layer index)."""
    name = strip_wrappers(name)
    if name in _TOP_MAP:
        hf = _TOP_MAP[name]
        if name == "output_layer.weight" and layout.tie_word_embeddings:
            return []      # tied: the last stage's copy of the embedding; sent once, with the embedding
        if hf in ("model.embed_tokens.weight", "lm_head.weight"):
            if full.shape[0] < layout.vocab_size:
                raise ValueError(f"{name}: {full.shape[0]} rows, the HF vocabulary has {layout.vocab_size}")
            full = full[:layout.vocab_size]
        if hf == "model.embed_tokens.weight" and layout.tie_word_embeddings:
            # tied: lm_head is sent too (as the HF state dict has it). vLLM's in-place reload rebuilds the
            # embedding's storage, which would leave a tied lm_head on the old weights otherwise.
            return [(hf, full), ("lm_head.weight", full)]
        return [(hf, full)]
    m = _LAYER_RE.match(name)
    if m is None:
        raise ValueError(f"Megatron parameter {name!r} has no HF counterpart in the engine-free push "
                         f"({layout.architecture}); set asp.mindspeed.weight_push: resharding")
    i, rest = int(m.group(1)), m.group(2)
    if not 0 <= i < layout.num_layers:
        raise ValueError(f"{name}: layer {i} outside the HF model's {layout.num_layers} layers")
    pre = f"model.layers.{i}."
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = split_qkv(full, layout)
        return [(f"{pre}self_attn.q_proj.{kind}", q), (f"{pre}self_attn.k_proj.{kind}", k),
                (f"{pre}self_attn.v_proj.{kind}", v)]
    if rest in ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias"):
        kind = rest.rsplit(".", 1)[1]
        if full.shape[0] != 2 * layout.intermediate_size:
            raise ValueError(f"{name}: {full.shape[0]} rows, a gated MLP of intermediate size "
                             f"{layout.intermediate_size} has {2 * layout.intermediate_size}")
        gate, up = full.chunk(2, dim=0)
        return [(f"{pre}mlp.gate_proj.{kind}", gate), (f"{pre}mlp.up_proj.{kind}", up)]
    if rest in _LAYER_MAP:
        return [(pre + _LAYER_MAP[rest], full)]
    raise ValueError(f"Megatron parameter {name!r} has no HF counterpart in the engine-free push "
                     f"({layout.architecture}); set asp.mindspeed.weight_push: resharding")


def global_layer_name(name: str, layer_map: dict[int, int]) -> str:
    """Rename ``decoder.layers.{local}`` to the global layer index (pipeline stages hold a slice)."""
    name = strip_wrappers(name)
    m = _LAYER_RE.match(name)
    if m is None:
        return name
    local = int(m.group(1))
    if local not in layer_map:
        raise KeyError(f"{name}: no global index for local layer {local} (layer map {layer_map})")
    return f"decoder.layers.{layer_map[local]}.{m.group(2)}"


def hf_specs(entries: Iterable[tuple[str, tuple[int, ...], str, Optional[int], int]],
             layout: ModelLayout) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, dtype) of every HF tensor, in send order, from the Megatron parameters'
    metadata alone: ``entries`` = (global name, local shape, dtype, partition dim or None, TP size).
    The conversion runs on ``meta`` tensors, so the plan and the data can never disagree."""
    import torch

    out = []
    for name, shape, dtype, pdim, tp in entries:
        local = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device="meta")
        full = merge_tp(name, [local] * (tp if pdim is not None else 1), pdim)
        out.extend((n, tuple(t.shape), dtype) for n, t in to_hf(name, full, layout))
    return out
