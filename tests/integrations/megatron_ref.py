"""Reference: a Hugging Face Qwen2 state dict laid out as Megatron-core's TP x PP shards.

Written from Megatron-core's layouts, independently of the code under test
(asp_ascend/integrations/mindspeed_rl/hf_weights.py), so that the two can disagree:
- ``linear_qkv``: per query group g, its rep = nh/ng query heads, then its key head, then its
  value head; column-parallel: TP rank r holds query groups [r*ng/tp, (r+1)*ng/tp).
- ``linear_fc1`` (gated): column-parallel with each rank holding [gate_r; up_r].
- ``linear_proj`` / ``linear_fc2``: row-parallel (input dim split); their biases replicated.
- embedding / output layer: vocabulary-parallel after padding the vocabulary to 128 x TP rows
  (the padding rows hold garbage that must never reach the instances).
- pipeline stage p holds layers [p*L/pp, (p+1)*L/pp) under local indices 0..L/pp-1; the
  embedding sits on the first stage, the final norm and output layer on the last.
Each entry: name -> (local tensor, partition dim or None).
"""
from __future__ import annotations

import torch


def tiny_qwen2(tmp_path, tie: bool = False, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tie, torch_dtype="float32")
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():   # every tensor random, biases too, so a misplaced row shows
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def megatron_shards(hf_sd: dict, cfg, tp: int, pp: int) -> dict[tuple[int, int], dict]:
    """(tp rank, pp rank) -> {local Megatron name: (tensor, partition dim or None)}."""
    nh, ng, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    hd, rep, L = hidden // nh, nh // ng, cfg.num_hidden_layers
    per_stage = L // pp
    pad_to = 128 * tp
    vocab = hf_sd["model.embed_tokens.weight"].shape[0]
    padded = (vocab + pad_to - 1) // pad_to * pad_to
    gen = torch.Generator().manual_seed(7)

    def pad_vocab(w):
        return torch.cat([w, torch.randn(padded - vocab, w.shape[1], generator=gen) * 100])

    def qkv(kind, r):
        q, k, v = (hf_sd[f"{pre}self_attn.{x}_proj.{kind}"] for x in ("q", "k", "v"))
        rows = []
        for g in range(r * ng // tp, (r + 1) * ng // tp):
            rows += [q[(g * rep + j) * hd:(g * rep + j + 1) * hd] for j in range(rep)]
            rows += [k[g * hd:(g + 1) * hd], v[g * hd:(g + 1) * hd]]
        return torch.cat(rows)

    out = {(r, p): {} for r in range(tp) for p in range(pp)}
    for r in range(tp):
        for p in range(pp):
            d = out[(r, p)]
            if p == 0:
                d["embedding.word_embeddings.weight"] = (pad_vocab(hf_sd["model.embed_tokens.weight"]).chunk(tp)[r], 0)
            for local in range(per_stage):
                i = p * per_stage + local
                pre = f"model.layers.{i}."
                m = f"decoder.layers.{local}."
                d[m + "input_layernorm.weight"] = (hf_sd[pre + "input_layernorm.weight"], None)
                d[m + "self_attention.linear_qkv.weight"] = (qkv("weight", r), 0)
                d[m + "self_attention.linear_qkv.bias"] = (qkv("bias", r), 0)
                d[m + "self_attention.linear_proj.weight"] = (hf_sd[pre + "self_attn.o_proj.weight"].chunk(tp, 1)[r], 1)
                d[m + "pre_mlp_layernorm.weight"] = (hf_sd[pre + "post_attention_layernorm.weight"], None)
                gate, up = hf_sd[pre + "mlp.gate_proj.weight"], hf_sd[pre + "mlp.up_proj.weight"]
                d[m + "mlp.linear_fc1.weight"] = (torch.cat([gate.chunk(tp)[r], up.chunk(tp)[r]]), 0)
                d[m + "mlp.linear_fc2.weight"] = (hf_sd[pre + "mlp.down_proj.weight"].chunk(tp, 1)[r], 1)
            if p == pp - 1:
                d["decoder.final_layernorm.weight"] = (hf_sd["model.norm.weight"], None)
                if "lm_head.weight" in hf_sd and not cfg.tie_word_embeddings:
                    d["output_layer.weight"] = (pad_vocab(hf_sd["lm_head.weight"]).chunk(tp)[r], 0)
    return out


def layer_map(cfg, pp: int, p: int) -> dict[int, int]:
    per_stage = cfg.num_hidden_layers // pp
    return {local: p * per_stage + local for local in range(per_stage)}
