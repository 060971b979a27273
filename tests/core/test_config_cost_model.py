"""Config keys that `asp simulate` would ignore are refused or honoured, never dropped in silence:
cost.* with a model class (sim.model_class 7b | 32b), the model class's sim.* keys with custom, and
a KV capacity below one sequence's worst case (config/explicit.resolve_cost_model, config/validate.kv_capacity_problem)."""
from pathlib import Path

import pytest

from asp_ascend.config import load_config, save_resolved
from asp_ascend.config.explicit import CLASS_COST_KEYS
from asp_ascend.errors import ConfigError
from asp_ascend.sim.run import simulate_system
from asp_ascend.lengths.workloads import workload_from_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", ["7b", "32b"])
def test_cost_keys_with_a_model_class_are_refused(model):
    with pytest.raises(ConfigError) as ei:
        load_config(None, [f"sim.model_class={model}", "cost.decode_a=0.05", "cost.sync_s=2"])
    msg = str(ei.value)
    assert f"sim.model_class: {model} simulates with the {model} model's own costs and ignores " \
           "cost.decode_a=0.05, cost.sync_s=2.0" in msg
    assert "set sim.model_class: custom" in msg and "remove those keys" in msg


def test_cost_key_at_its_default_with_a_model_class_is_refused_too():
    # the user wrote it: 7b would simulate its own sync time (0.71 s), not this 0.5
    with pytest.raises(ConfigError, match=r"ignores cost.sync_s=0.5; .*remove that key"):
        load_config(None, ["sim.model_class=7b", "cost.sync_s=0.5"])


def test_cost_keys_in_a_yaml_with_a_model_class_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"sim.model_class: 7b .* ignores cost.decode_b=1e-07"):
        load_config(ROOT / "configs" / "sim_7b.yaml", ["cost.decode_b=1e-7"])
    p = tmp_path / "c.yaml"
    p.write_text("sim:\n  model_class: 32b\ncost:\n  train_per_token: 0.001\n")
    with pytest.raises(ConfigError, match=r"ignores cost.train_per_token=0.001"):
        load_config(p)


@pytest.mark.parametrize("key", CLASS_COST_KEYS)
def test_cost_keys_without_a_model_class_imply_custom(key):
    cfg = load_config(None, [f"cost.{key}=0.25"])
    assert cfg.sim.model_class == "custom" and getattr(cfg.cost, key) == 0.25
    assert load_config(None, []).sim.model_class == "7b"      # nothing set: the default class


def test_implied_custom_simulates_with_the_costs_given():
    over = ["workload.type=synthetic", "workload.num_prompts=64", "workload.epochs=2", "train.group_size=4",
            "train.global_batch_size=16", "train.mini_batch_size=4", "train.micro_batch_size=4",
            "sim.total_devices=4", "sim.rollout_devices=2", "sim.infer_tp=1", "sim.epochs=1",
            "lengths.max_response_length=2048", "workload.body_median=150", "workload.tail_scale=500"]
    slow = load_config(None, over + ["cost.decode_a=0.2"])
    fast = load_config(None, over + ["cost.decode_a=0.002"])
    w = workload_from_config(slow)
    t_slow = simulate_system(slow, w, "fully_async_fifo", record_samples=False).summary["run_time_s"]
    t_fast = simulate_system(fast, w, "fully_async_fifo", record_samples=False).summary["run_time_s"]
    assert t_slow > 5 * t_fast     # before, both ran the 7b class's decode and took the same time


def test_speculative_cost_keys_apply_under_every_model_class():
    cfg = load_config(None, ["sim.model_class=7b", "rollout.speculative=ngram", "cost.spec_acceptance=0.3",
                             "cost.spec_draft_s=0.001"])
    assert cfg.sim.model_class == "7b" and cfg.cost.spec_acceptance == 0.3


def test_custom_with_the_model_class_sim_keys_is_refused():
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["sim.model_class=custom", "sim.sync_bandwidth_gbps=10", "sim.tp_efficiency=0.9"])
    msg = str(ei.value)
    assert "sim.model_class: custom" in msg and "ignores sim.tp_efficiency=0.9, sim.sync_bandwidth_gbps=10.0" in msg
    assert "remove those keys, or set sim.model_class: 7b or 32b" in msg
    assert load_config(None, ["sim.sync_bandwidth_gbps=10"]).sim.model_class == "7b"
    assert load_config(None, ["sim.model_class=custom", "cost.sync_s=1"]).cost.sync_s == 1.0


@pytest.mark.parametrize("model", ["7b", "custom"])
def test_a_resolved_config_loads_back(tmp_path, model):
    cfg = load_config(None, [f"output_dir={tmp_path}", f"sim.model_class={model}"])
    again = load_config(save_resolved(cfg))       # lists every key, model class and costs at defaults
    assert again == cfg
    implied = load_config(None, [f"output_dir={tmp_path / 'b'}", "cost.decode_a=0.1"])
    assert load_config(save_resolved(implied)) == implied


def test_a_resolved_config_with_costs_off_their_default_under_a_model_class(tmp_path):
    """A run saved before this rule (7b with its planner's costs) still loads as a run record;
    simulating it as a config of one's own asks which cost model is meant."""
    from asp_ascend.config import run_config

    cfg = load_config(None, [f"output_dir={tmp_path}", "sim.model_class=7b"])
    cfg.cost.decode_a = 0.1
    path = save_resolved(cfg)
    assert run_config(tmp_path).cost.decode_a == 0.1
    with pytest.raises(ConfigError, match=r"ignores cost.decode_a=0.1"):
        load_config(path)


def test_every_cost_key_at_its_default_with_a_model_class_is_refused(tmp_path):
    """Only a config listing every key of the schema counts as resolved: one listing just every cost
    key (at its default) with sim.model_class 7b is the user's, whose costs 7b would ignore."""
    import dataclasses

    from asp_ascend.config import CostConfig

    p = tmp_path / "c.yaml"
    costs = "".join(f"  {f.name}: {'null' if f.default is None else f.default}\n"
                    for f in dataclasses.fields(CostConfig))
    p.write_text("sim:\n  model_class: 7b\ncost:\n" + costs)
    with pytest.raises(ConfigError, match=r"sim.model_class: 7b simulates with the 7b model's own costs and ignores "
                                          r"cost.decode_a=0.02, "):
        load_config(p)


def test_a_loaded_configs_dict_reloads_as_saved(tmp_path):
    """The MindSpeed-RL driver gets the loaded config as a dict (to_dict) and reloads it saved=True:
    as it was, whatever it holds."""
    from omegaconf import OmegaConf

    from asp_ascend.config import to_dict

    cfg = load_config(None, ["sim.model_class=7b"])
    cfg.cost.decode_a = 0.1          # what a run's planner used
    p = tmp_path / "d.yaml"
    p.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    assert load_config(p, check_files=False, saved=True) == cfg
    with pytest.raises(ConfigError, match=r"ignores cost.decode_a=0.1"):
        load_config(p, check_files=False)


def test_kv_capacity_below_one_sequence_is_refused():
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["rollout.kv_cache_tokens=2000", "lengths.max_response_length=4096"])
    msg = str(ei.value)
    assert "rollout.kv_cache_tokens: 2000 is below one sequence's worst case, 4097 tokens" in msg
    assert "use rollout.kv_cache_tokens >= 4097" in msg and "or 0 to leave the capacity to the engine" in msg
    for kv in (0, 4097, 100000):    # 0 = decided by the engine
        assert load_config(None, [f"rollout.kv_cache_tokens={kv}", "lengths.max_response_length=4096"])


def test_simulator_refuses_kv_below_the_longest_prompt_plus_response():
    over = ["workload.type=synthetic", "workload.num_prompts=64", "workload.epochs=2", "train.group_size=4",
            "train.global_batch_size=16", "train.mini_batch_size=4", "train.micro_batch_size=4",
            "sim.total_devices=4", "sim.rollout_devices=2", "sim.infer_tp=1", "sim.epochs=1",
            "sim.model_class=custom", "lengths.max_response_length=2048", "workload.prompt_median=400"]
    cfg = load_config(None, over + ["rollout.kv_cache_tokens=2100"])    # passes the config's one-token check
    w = workload_from_config(cfg)
    need = int(w.prompt_length.max()) + 2048
    with pytest.raises(ConfigError) as ei:
        simulate_system(cfg, w, "fully_async_fifo", record_samples=False)
    msg = str(ei.value)
    assert f"rollout.kv_cache_tokens: 2100 is below one sequence's worst case, {need} tokens" in msg
    assert "the workload's longest prompt" in msg
    ok = load_config(None, over + [f"rollout.kv_cache_tokens={need}"])
    assert simulate_system(ok, w, "fully_async_fifo", record_samples=False).summary["samples"] > 0


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    load_config(path, check_files=False)


def test_calibrate_is_exempt(tmp_path):
    # asp simulate --calibrate: custom with the fitted costs whatever the class (sim/run.apply_calibration)
    cfg = load_config(ROOT / "configs" / "sim_tiny.yaml", [f"sim.calibrate={tmp_path}", "cost.train_per_token=1e-6"],
                      check_files=False)
    assert cfg.sim.model_class == "7b" and cfg.cost.train_per_token == 1e-6
