"""MindSpeed-RL YAML + asp: group -> our Config."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asp_ascend.errors import ConfigError
from asp_ascend.integrations.mindspeed_rl.config_bridge import (
    TRANSLATION, load_mindspeed_yaml, lookup, translate, translate_file)
from asp_ascend.integrations.mindspeed_rl.entry import split_overrides

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "mindspeed_rl"


def raw7b() -> dict:
    return load_mindspeed_yaml(CONFIGS / "grpo_qwen25_7b_asp_A3.yaml")  # as Hydra reads it (1e-6 is a float)


@pytest.mark.parametrize("name", ["grpo_qwen25_7b_asp_A3", "grpo_qwen25_32b_asp_A3"])
def test_shipped_configs_translate(name):
    raw = load_mindspeed_yaml(CONFIGS / f"{name}.yaml")
    cfg, msrl = translate_file(CONFIGS / f"{name}.yaml")
    assert "asp" not in msrl and set(msrl) >= {"megatron_training", "actor_config", "rl_config", "generate_config"}
    assert cfg.platform == "npu"
    assert cfg.train.global_batch_size == raw["megatron_training"]["global_batch_size"]
    assert cfg.train.group_size == raw["rl_config"]["n_samples_per_prompt"]
    assert cfg.train.mini_batch_size == raw["rl_config"]["mini_batch_size"]
    assert cfg.train.lr == float(raw["actor_config"]["lr"])          # actor_config wins over megatron_training
    assert cfg.rollout.devices_per_instance == raw["generate_config"]["infer_tensor_parallel_size"]
    assert cfg.lengths.max_response_length == raw["generate_config"]["sampling_config"]["max_tokens"]
    assert cfg.rollout.num_instances == raw["asp"]["rollout"]["num_instances"]
    assert cfg.pipeline.lag_bound == raw["asp"]["pipeline"]["lag_bound"]
    # the layout fits two A3 nodes: trainer + instances = 32 dies
    assert raw["rl_config"]["actor_resource"]["num_npus"] + cfg.rollout.num_instances * cfg.rollout.devices_per_instance == 32


def test_actor_config_overrides_megatron_training():
    raw = {"megatron_training": {"lr": 1.0}, "actor_config": {"lr": 2.0}}
    assert lookup(raw, "megatron_training.lr") == (True, 2.0, "actor_config.lr")
    assert lookup({"megatron_training": {"lr": 1.0}}, "megatron_training.lr") == (True, 1.0, "megatron_training.lr")
    assert lookup({}, "rl_config.clip_ratio")[0] is False


def test_asp_contradicting_a_mindspeed_key_names_both():
    raw = raw7b()
    raw["asp"]["train"] = {"group_size": 4}
    with pytest.raises(ConfigError, match=r"asp.train.group_size=4 contradicts rl_config.n_samples_per_prompt=8"):
        translate(raw)
    raw["asp"]["train"] = {"group_size": 8}   # repeating the same value is fine
    assert translate(raw)[0].train.group_size == 8


def test_async_requirements_are_checked_with_the_fix():
    raw = raw7b()
    raw["rl_config"]["partial_rollout_max_split"] = 2
    raw["rl_config"]["data_strategy"] = "tq"
    with pytest.raises(ConfigError) as e:
        translate(raw)
    msg = str(e.value)
    assert "rl_config.partial_rollout_max_split: 2" in msg and "set rl_config.partial_rollout_max_split: 1" in msg
    assert "rl_config.data_strategy: 'tq'" in msg
    raw["asp"]["mindspeed"]["trainer"] = "sync"     # the sync path runs the stock trainer: allowed
    assert translate(raw)[0].mindspeed.trainer == "sync"


def test_unknown_asp_key_and_bad_value_are_reported_together():
    raw = raw7b()
    raw["asp"]["rollout"]["num_instancez"] = 3
    raw["asp"]["pipeline"]["lag_bound"] = -1
    with pytest.raises(ConfigError) as e:
        translate(raw)
    assert "num_instancez" in str(e.value) and "lag_bound" in str(e.value)


def test_missing_groups_and_overrides():
    with pytest.raises(ConfigError, match="missing group"):
        translate({"asp": {}})
    cfg, _ = translate(raw7b(), ["pipeline.lag_bound=3"])
    assert cfg.pipeline.lag_bound == 3


def test_every_translated_key_exists_in_our_schema():
    from asp_ascend.config import Config, describe

    ours = {k for k, _, _ in describe(Config)}
    assert set(TRANSLATION) <= ours


def test_split_overrides():
    msrl, ours = split_overrides(["rl_config.epochs=1", "asp.pipeline.lag_bound=2", "+megatron_training.x=1"])
    assert msrl == ["rl_config.epochs=1", "+megatron_training.x=1"] and ours == ["pipeline.lag_bound=2"]


def test_entry_dry_run_composes_with_hydra(tmp_path):
    pytest.importorskip("hydra")
    import shutil

    from asp_ascend.integrations.mindspeed_rl.entry import main

    cfgdir = tmp_path / "configs"
    (cfgdir / "model").mkdir(parents=True)
    shutil.copy(CONFIGS / "grpo_qwen25_7b_asp_A3.yaml", cfgdir / "run.yaml")
    (cfgdir / "model" / "qwen25_7b.yaml").write_text("qwen25_7b:\n  num_layers: 28\n")
    rc = main(["--config-path", str(cfgdir), "--config-name", "run", "--dry-run",
               "rl_config.clip_ratio=0.3", f"asp.output_dir={tmp_path / 'out'}"])
    assert rc == 0
    written = yaml.safe_load((tmp_path / "out" / "mindspeed_config.yaml").read_text())
    assert written["rl_config"]["clip_ratio"] == 0.3 and "asp" not in written
    assert written["model"]["qwen25_7b"]["num_layers"] == 28
    ours = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert ours["train"]["clip_eps"] == 0.3 and ours["platform"] == "npu"


def test_mini_batch_must_split_over_trainer_dp():
    from asp_ascend.integrations.mindspeed_rl.config_bridge import trainer_dp

    raw = raw7b()
    assert trainer_dp(raw) == 16 // (2 * 2)
    raw["rl_config"]["mini_batch_size"] = 6
    raw["megatron_training"]["global_batch_size"] = 66
    with pytest.raises(ConfigError, match="cannot be split over the trainer's 4 data-parallel ranks"):
        translate(raw)
    raw = raw7b()
    raw["rl_config"]["actor_update_dispatch_size"] = 64
    with pytest.raises(ConfigError, match="must be unset or global_batch_size x n_samples_per_prompt / DP = 128"):
        translate(raw)
    raw = raw7b()
    raw["rl_config"]["guarantee_order"] = False
    with pytest.raises(ConfigError, match="rl_config.guarantee_order: False"):
        translate(raw)


def test_runtime_env_mirrors_mindspeed_main(tmp_path):
    from asp_ascend.integrations.mindspeed_rl.entry import runtime_env

    (tmp_path / "configs" / "envs").mkdir(parents=True)
    (tmp_path / "configs" / "envs" / "runtime_env.yaml").write_text("env_vars:\n  HCCL_CONNECT_TIMEOUT: '1800'\n")
    env = runtime_env({"rl_config": {"hccl_buffersize": 128}, "generate_config": {}}, tmp_path)["env_vars"]
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800" and env["HCCL_BUFFSIZE"] == "128" and env["IS_MULTIMODAL"] == "False"
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "true"
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)


def test_asp_cli_reads_a_mindspeed_yaml_without_torch(tmp_path):
    """`asp schedule|simulate` on a MindSpeed-RL YAML translate it (login node: no torch, no hydra)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from asp_ascend.cli import _has_group\n"
            "from asp_ascend.integrations.mindspeed_rl.config_bridge import translate_file\n"
            f"p = {str(CONFIGS / 'grpo_qwen25_7b_asp_A3.yaml')!r}\n"
            "assert _has_group(p, 'megatron_training')\n"
            "cfg, _ = translate_file(p, ['pipeline.lag_bound=2'])\n"
            "print(cfg.pipeline.lag_bound, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]


def test_moe_is_refused_by_name_on_the_async_path():
    raw = raw7b()
    raw["model"] = {"qwen25_7b": {"num_experts": 128}}
    raw["generate_config"]["infer_expert_parallel_size"] = 4
    raw["generate_config"]["enable_expert_parallel"] = True
    with pytest.raises(ConfigError) as e:
        translate(raw)
    text = str(e.value)
    for key in ("model.qwen25_7b.num_experts: 128", "generate_config.infer_expert_parallel_size: 4",
                "generate_config.enable_expert_parallel: true"):
        assert key in text, key
    cfg, _ = translate(raw, mode="sync")   # the stock trainer (colocated generation) takes MoE models
    assert cfg.platform == "npu"


def test_partial_rollout_maps_onto_the_asp_carry_over():
    raw = raw7b()
    raw["asp"].setdefault("rollout", {}).update(partial_rollout=True, max_split=2)
    cfg, _ = translate(raw)
    assert cfg.rollout.partial_rollout and cfg.rollout.max_split == 2 and cfg.mindspeed.weight_push == "hf"
    raw["asp"].setdefault("scheduler", {})["reestimate"] = False
    with pytest.raises(ConfigError, match="asp.rollout.partial_rollout: true needs asp.scheduler.reestimate"):
        translate(raw)
    raw = raw7b()
    raw["rl_config"]["partial_rollout_max_split"] = 3     # MindSpeed-RL's own mechanism: refused, pointing at ours
    with pytest.raises(ConfigError, match="asp.rollout.max_split: N - 1"):
        translate(raw)


def test_moe_hf_config_is_refused_by_file_key_value_and_fix(tmp_path):
    """A MoE model the MindSpeed-RL groups do not call one (only its HF config.json names experts) is refused
    on the async path: neither push carries an expert layout (the receiver loads with local_experts=0)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}))
    raw = raw7b()
    raw["megatron_training"]["tokenizer_name_or_path"] = str(tmp_path)
    with pytest.raises(ConfigError) as e:
        translate(raw)
    text = str(e.value)
    assert f"{tmp_path / 'config.json'}: num_experts: 128" in text and "asp.mindspeed.trainer=sync" in text
    cfg, _ = translate(raw, ["mindspeed.trainer=sync"])   # an override of the mode counts as the YAML's would
    assert cfg.mindspeed.trainer == "sync"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    translate(raw)                                        # dense: fine


def test_receiver_and_engine_free_conversion_refuse_experts():
    from asp_ascend.integrations.mindspeed_rl.hf_weights import ModelLayout
    from asp_ascend.integrations.mindspeed_rl.vllm_receiver import check_dense

    with pytest.raises(RuntimeError, match=r"n_routed_experts: 64 .*local_experts=0.*asp.mindspeed.trainer=sync"):
        check_dense({"n_routed_experts": 64})
    check_dense({"num_hidden_layers": 2})
    dense = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8,
             "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 32}
    ModelLayout.from_hf_config(dense)
    with pytest.raises(ValueError, match=r"num_local_experts: 8 \(MoE\).*asp.mindspeed.trainer=sync"):
        ModelLayout.from_hf_config({**dense, "num_local_experts": 8})


@pytest.mark.parametrize("group", ["actor_config", "megatron_training"])
def test_virtual_pipeline_stages_need_the_resharding_push(group):
    raw = raw7b()
    raw.setdefault(group, {})["num_layers_per_virtual_pipeline_stage"] = 4
    if group == "megatron_training":
        raw["actor_config"].pop("num_layers_per_virtual_pipeline_stage", None)
    with pytest.raises(ConfigError) as e:
        translate(raw)
    text = str(e.value)
    assert f"{group}.num_layers_per_virtual_pipeline_stage: 4" in text
    assert "asp.mindspeed.weight_push: resharding" in text and f"unset {group}" in text
    cfg, _ = translate(raw, ["mindspeed.weight_push=resharding"])    # MindSpeed-RL's resharding handles VPP
    assert cfg.mindspeed.weight_push == "resharding"
    raw["asp"].setdefault("mindspeed", {})["weight_push"] = "resharding"
    translate(raw)
    translate(raw7b())                                               # no VPP: the default push


def test_an_instance_spanning_nodes_is_refused_by_key():
    """An instance's TP group must sit on one node (STRICT_PACK bundle, HCCL inside the node)."""
    from asp_ascend.integrations.mindspeed_rl.rollout_groups import check_instances_fit_nodes
    from asp_ascend.platforms import NpuPlatform

    with pytest.raises(ConfigError) as e:
        check_instances_fit_nodes([{"NPU": 16.0}, {"NPU": 16.0}], NpuPlatform(), 32)
    text = str(e.value)
    assert "generate_config.infer_tensor_parallel_size: 32" in text and "cannot span nodes" in text
    assert "Use at most 16" in text


def test_stream_groups_is_refused_with_the_key_and_the_fix():
    """Only asp train streams groups into its trainer: the MindSpeed-RL bridge refuses the key
    (in the config's asp group or as an override) instead of silently not streaming."""
    for raw, over in ((raw7b(), ["pipeline.stream_groups=true"]), (raw7b(), ["pipeline.stream_groups=on"]),
                      ({**raw7b(), "asp": {"pipeline": {"stream_groups": True}}}, [])):
        with pytest.raises(ConfigError, match="asp.pipeline.stream_groups: true is not supported with MindSpeed-RL.*"
                                              "set asp.pipeline.stream_groups: false"):
            translate(raw, over)
    cfg, _ = translate(raw7b(), ["pipeline.stream_groups=false"])
    assert cfg.pipeline.stream_groups == "off"
    # auto (the default, on for asp train's asp runs) is accepted: the bridge's trainer streams nothing
    assert translate(raw7b(), [])[0].pipeline.stream_groups == "auto"


def test_sequence_admission_is_refused_with_the_key_and_the_fix():
    """``rollout.admission: sequences`` counts the unfinished samples asp train's instances report;
    MindSpeed-RL's source admits by group slots: the bridge refuses the key, naming the fix."""
    for raw, over in ((raw7b(), ["rollout.admission=sequences"]),
                      ({**raw7b(), "asp": {"rollout": {"admission": "sequences"}}}, [])):
        with pytest.raises(ConfigError, match="asp.rollout.admission: sequences is not supported with MindSpeed-RL.*"
                                              "set asp.rollout.admission: groups"):
            translate(raw, over)
    assert translate(raw7b(), ["rollout.admission=groups"])[0].rollout.admission == "groups"


def test_regroup_is_refused_with_the_key_and_the_fix():
    """``pipeline.regroup`` re-composes mini-batches before an iteration is generated, which only
    asp train's trainer does: the bridge refuses it, naming the fix."""
    with pytest.raises(ConfigError, match="asp.pipeline.regroup: true is not supported with MindSpeed-RL.*"
                                          "set asp.pipeline.regroup: false"):
        translate(raw7b(), ["pipeline.regroup=on"])
    for value in ("off", "auto"):                             # auto: off under the bridges, as is the default
        assert translate(raw7b(), [f"pipeline.regroup={value}"])[0].pipeline.regroup == value
    for value in ("true", "on"):
        with pytest.raises(ConfigError, match="asp.pipeline.regroup_heavy: true is not supported with MindSpeed-RL.*"
                                              "set asp.pipeline.regroup_heavy: false"):
            translate(raw7b(), [f"pipeline.regroup_heavy={value}"])
    # auto (the default, on for asp train) resolves off in the bridge's source, as regroup does
    from asp_ascend.pipeline.planning import tail_options

    cfg = translate(raw7b(), ["pipeline.regroup_heavy=auto"])[0]
    assert cfg.scheduler.policy == "asp" and cfg.pipeline.regroup_heavy == cfg.pipeline.regroup == "auto"
    opts = tail_options(cfg, Path("none.parquet"), bridge=True)
    assert not opts.regroup and not opts.regroup_heavy
    assert tail_options(cfg, Path("none.parquet")).regroup_heavy     # asp train's loop: on


def test_tis_cap_the_async_trainer_would_ignore_is_refused():
    """MindSpeed-RL's async trainer (async_loop.behaviour_weights) caps the weight with tis only."""
    raw = raw7b()
    raw["asp"]["train"] = {"off_policy": "decoupled_ppo", "tis_cap": 3.0}
    with pytest.raises(ConfigError, match=r"asp.train.tis_cap: 3.0 has no effect: MindSpeed-RL's async trainer "
                                          r"applies the cap with train.off_policy tis only.*set asp.train.off_policy: "
                                          r"tis, or remove asp.train.tis_cap"):
        translate(raw)
    with pytest.raises(ConfigError, match="asp.train.tis_cap: 3.0 has no effect"):
        translate(raw7b(), ["train.tis_cap=3"])
    raw["asp"]["train"] = {"off_policy": "tis", "tis_cap": 3.0}
    assert translate(raw)[0].train.tis_cap == 3.0
    assert translate(raw7b(), ["train.off_policy=tis", "train.tis_cap=3"])[0].train.tis_cap == 3.0
    raw["asp"]["train"] = {"off_policy": "none", "tis_cap": 3.0}      # the config's own rule, named under asp.
    with pytest.raises(ConfigError, match=r"asp.train.tis_cap: 3.0 has no effect: train.off_policy is none"):
        translate(raw)


def test_adaptive_is_refused_on_the_sync_trainer_with_the_key_and_the_fix():
    # RayGRPOTrainer draws every batch from schedule.parquet as planned: the key would do nothing there
    # (the async trainer re-plans: test_mindspeed_adaptive.py)
    msg = (r"asp.scheduler.adaptive: true is not supported with asp.mindspeed.trainer: sync \(RayGRPOTrainer draws "
           r"every batch from schedule.parquet.*set asp.mindspeed.trainer: async, or asp.scheduler.adaptive: false")
    with pytest.raises(ConfigError, match=msg):
        translate(raw7b(), ["scheduler.adaptive=true", "mindspeed.trainer=sync"])
    raw = raw7b()
    raw["asp"]["scheduler"]["adaptive"] = True
    assert translate(raw)[0].scheduler.adaptive is True                       # async (the shipped trainer)
    raw["asp"]["mindspeed"]["trainer"] = "sync"
    with pytest.raises(ConfigError, match=msg):
        translate(raw)
    assert translate(raw7b(), ["mindspeed.trainer=sync"])[0].scheduler.adaptive is False
