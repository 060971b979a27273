"""The engine-free push's conversion (hf_weights.py) on real tensors: Megatron TP x PP shards of a
real transformers Qwen2 -> HF-named full tensors equal to the model's own, and (with
ASP_MINDSPEED_SRC) the same QKV split and the same name table as MindSpeed-RL's own helpers."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from asp_ascend.integrations.mindspeed_rl.hf_weights import (  # noqa: E402
    ModelLayout, global_layer_name, hf_specs, merge_tp, split_qkv, to_hf)
from megatron_ref import layer_map, megatron_shards, tiny_qwen2  # noqa: E402

SRC = os.environ.get("ASP_MINDSPEED_SRC")
SRC_REASON = ("ASP_MINDSPEED_SRC is not set: point it at a MindSpeed-RL checkout at 05a90d7; docs/ascend.md, "
              "'Running the real-tree tests', says how to fetch it")


def convert(shards: dict, cfg, tp: int, pp: int) -> dict:
    layout = ModelLayout.from_hf_config(cfg)
    out = {}
    for p in range(pp):
        for name in shards[(0, p)]:
            local = [shards[(r, p)][name][0] for r in range(tp)]
            full = merge_tp(name, local, shards[(0, p)][name][1])
            for hf, t in to_hf(global_layer_name(name, layer_map(cfg, pp, p)), full, layout):
                assert hf not in out, f"{hf} produced twice"
                out[hf] = t
    return out


@pytest.mark.parametrize("tp,pp,tie", [(1, 1, False), (2, 1, False), (2, 2, False), (1, 4, True), (2, 2, True)])
def test_megatron_shards_convert_back_to_the_hf_state_dict(tmp_path, tp, pp, tie):
    model = tiny_qwen2(tmp_path, tie=tie)
    sd = model.state_dict()
    got = convert(megatron_shards(sd, model.config, tp, pp), model.config, tp, pp)
    want = dict(sd)   # tied too: lm_head.weight is the embedding, as in the HF state dict
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_converted_weights_give_the_models_logits(tmp_path):
    model = tiny_qwen2(tmp_path)
    got = convert(megatron_shards(model.state_dict(), model.config, 2, 2), model.config, 2, 2)
    other = tiny_qwen2(tmp_path, seed=1)
    ids = torch.tensor([[1, 5, 7, 9, 2, 3]])
    assert not torch.allclose(other(ids).logits, model(ids).logits)
    other.load_state_dict(got, strict=True)
    assert torch.allclose(other(ids).logits, model(ids).logits, atol=1e-6)


def test_specs_from_metadata_match_the_converted_tensors(tmp_path):
    model = tiny_qwen2(tmp_path)
    tp, pp = 2, 2
    shards = megatron_shards(model.state_dict(), model.config, tp, pp)
    layout = ModelLayout.from_hf_config(model.config)
    entries, real = [], []
    for p in range(pp):
        for name, (t, pdim) in shards[(0, p)].items():
            g = global_layer_name(name, layer_map(model.config, pp, p))
            entries.append((g, tuple(t.shape), "float32", pdim, tp))
            full = merge_tp(name, [shards[(r, p)][name][0] for r in range(tp)], pdim)
            real += [(n, tuple(x.shape), "float32") for n, x in to_hf(g, full, layout)]
    assert hf_specs(entries, layout) == real


def test_refusals_name_the_problem(tmp_path):
    model = tiny_qwen2(tmp_path)
    layout = ModelLayout.from_hf_config(model.config)
    with pytest.raises(ValueError, match="no HF counterpart"):
        to_hf("decoder.layers.0.mlp.router.weight", torch.zeros(2, 2), layout)
    with pytest.raises(ValueError, match="query groups"):
        split_qkv(torch.zeros(10, 64), layout)
    with pytest.raises(ValueError, match="engine-free weight push converts"):
        ModelLayout.from_hf_config({"architectures": ["DeepseekV3ForCausalLM"]})
    with pytest.raises(ValueError, match="rows, the HF vocabulary"):
        to_hf("embedding.word_embeddings.weight", torch.zeros(50, 64), layout)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not SRC, reason=SRC_REASON)
@pytest.mark.parametrize("tp", [1, 2])
def test_qkv_split_agrees_with_mindspeed_rl(tmp_path, tp):
    """MindSpeed-RL's own qkv_split_weight / qkv_split_bias (megatron_weight_loaders.py, loaded by path:
    it needs only torch and transformers) on each TP shard give the rows of our q/k/v for that shard."""
    loaders = _load(Path(SRC) / "mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py", "_msrl_loaders")
    model = tiny_qwen2(tmp_path)
    cfg, sd = model.config, model.state_dict()
    shards = megatron_shards(sd, cfg, tp, 1)
    layout = ModelLayout.from_hf_config(cfg)
    par = loaders.InferParallelConfig(tp, 1, tp, 0)
    for kind, fn in (("weight", loaders.qkv_split_weight), ("bias", loaders.qkv_split_bias)):
        name = f"decoder.layers.1.self_attention.linear_qkv.{kind}"
        full = merge_tp(name, [shards[(r, 0)][name][0] for r in range(tp)], 0)
        ours = dict(to_hf(name, full, layout))
        for r in range(tp):
            theirs = fn(shards[(r, 0)][name][0].clone(), par, cfg)
            for x, t in zip("qkv", theirs):
                assert torch.equal(t, ours[f"model.layers.1.self_attn.{x}_proj.{kind}"].chunk(tp)[r]), (kind, x, r)
            assert torch.equal(ours[f"model.layers.1.self_attn.q_proj.{kind}"], sd[f"model.layers.1.self_attn.q_proj.{kind}"])


@pytest.mark.skipif(not SRC, reason=SRC_REASON)
def test_name_table_agrees_with_mindspeed_rl(tmp_path):
    """For every vLLM parameter name, MindSpeed-RL's adaptor (weight_adaptor.py, torch-only) names the
    Megatron parameter it is filled from; our conversion of that Megatron parameter must produce the HF
    names vLLM's loader stacks into that vLLM parameter."""
    adaptor_mod = _load(Path(SRC) / "mindspeed_rl/workers/resharding/weight_adaptor.py", "_msrl_weight_adaptor")
    adaptor = adaptor_mod.MegatronVLLMWeightAdaptor(SimpleNamespace(lora_target_modules=None))
    model = tiny_qwen2(tmp_path)
    layout = ModelLayout.from_hf_config(model.config)
    stacked = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}   # vLLM's stacked_params_mapping

    def vllm_name(hf):
        for a, b in stacked.items():
            if f".{a}." in hf:
                return hf.replace(f".{a}.", f".{b}.")
        return hf

    shards = megatron_shards(model.state_dict(), model.config, 1, 1)[(0, 0)]
    checked = 0
    for name, (t, _) in shards.items():
        for hf, _ in to_hf(name, t, layout):
            assert adaptor.replace_name_i2t(vllm_name(hf)) == name, (hf, name)
            checked += 1
    assert checked == len(model.state_dict())
