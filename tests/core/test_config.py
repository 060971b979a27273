import pytest

from asp_ascend.config import Config, describe, load_config, save_resolved
from asp_ascend.errors import ConfigError


def test_defaults_load_and_validate(empty_yaml):
    cfg = load_config(empty_yaml)
    assert isinstance(cfg, Config)
    assert cfg.scheduler.policy == "asp"
    assert cfg.train.global_batch_size % cfg.train.mini_batch_size == 0


def test_overrides_are_typed(empty_yaml):
    cfg = load_config(empty_yaml, ["rollout.num_instances=4", "train.lr=3e-6", "scheduler.adaptive=true",
                                   "data.path=null"])
    assert cfg.rollout.num_instances == 4
    assert cfg.train.lr == pytest.approx(3e-6)
    assert cfg.scheduler.adaptive is True


def test_every_problem_reported_at_once(empty_yaml):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["rollout.num_instances=0", "train.mini_batch_size=5", "scheduler.policy=foo",
                                 "train.lr=abc", "rollout.num_instanses=3", "pipeline.lag_bound=-1"])
    msg = str(ei.value)
    problems = ei.value.problems
    assert len(problems) == 6, msg
    assert "rollout.num_instances: 0 must be >= 1" in msg
    assert "train.mini_batch_size: 5 does not divide train.global_batch_size=64" in msg
    assert "use a divisor such as 4" in msg
    assert "scheduler.policy: 'foo' is not one of asp, fifo, random, sorted, balanced" in msg
    assert "train.lr: 'abc' is not a valid float" in msg
    assert "did you mean rollout.num_instances?" in msg
    assert "pipeline.lag_bound: -1 must be >= 0" in msg


def test_yaml_file_values_and_bad_yaml(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("rollout:\n  num_instances: 3\ntrain:\n  group_size: 4\n")
    cfg = load_config(good, ["rollout.num_instances=5"])
    assert cfg.rollout.num_instances == 5 and cfg.train.group_size == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_missing_files_named(empty_yaml, tmp_path):
    with pytest.raises(ConfigError, match=r"data.path: .*nope.jsonl does not exist"):
        load_config(empty_yaml, [f"data.path={tmp_path / 'nope.jsonl'}"])


def test_resolved_config_written(empty_yaml, tmp_path):
    cfg = load_config(empty_yaml, [f"output_dir={tmp_path / 'run'}"])
    path = save_resolved(cfg)
    text = path.read_text()
    assert "num_instances" in text and "policy: asp" in text
    again = load_config(path)  # the resolved config loads back to the same values
    assert again == cfg


def test_describe_lists_every_key():
    keys = [k for k, _, _ in describe()]
    for key in ("output_dir", "data.path", "lengths.path", "lengths.max_response_length", "rollout.num_instances",
                "rollout.max_num_seqs", "train.group_size", "train.global_batch_size", "train.mini_batch_size",
                "train.epochs", "train.lr", "pipeline.mode", "pipeline.lag_bound", "scheduler.policy",
                "scheduler.adaptive", "model.path", "platform", "seed"):
        assert key in keys


def test_weight_sync_keys_checked(empty_yaml):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["weight_sync.master_port=70000", "weight_sync.timeout_s=0",
                                 "weight_sync.bucket_mb=0", "weight_sync.transport=nccl",
                                 "weight_sync.stall_timeout_s=0.5"])
    msg = str(ei.value)
    assert len(ei.value.problems) == 5, msg
    assert "weight_sync.master_port: 70000 must be a TCP port" in msg
    assert "weight_sync.timeout_s: 0.0 must be > 0" in msg
    assert "weight_sync.bucket_mb: 0 must be >= 1" in msg
    assert "weight_sync.stall_timeout_s: 0.5 must be >= 1" in msg and "stall_timeout_s=300 (the default)" in msg
    assert "weight_sync.transport" in msg
    assert load_config(empty_yaml, []).weight_sync.master_port == 0  # a free port per group by default


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "0", "-1e-5"])
def test_learning_rate_must_be_finite_and_positive(empty_yaml, value):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, [f"train.lr={value}"])
    assert len(ei.value.problems) == 1, str(ei.value)
    msg = ei.value.problems[0]
    assert msg.startswith("train.lr: ") and "use e.g. train.lr=1e-05" in msg, msg
    assert ("must be a finite number" in msg) if "n" in value else ("must be > 0" in msg), msg


def test_every_float_key_refuses_nan_once(empty_yaml):
    # NaN compares false with every bound, so a range check alone accepts it: each float key of
    # the schema must refuse it, with one message naming the key.
    from asp_ascend.config.validate import _float_fields
    keys = [k for k, _, _ in _float_fields(Config())]
    assert "train.lr" in keys and "rollout.top_p" in keys and "cost.publish_s" in keys
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, [f"{k}=.nan" for k in keys])
    problems = ei.value.problems
    assert sorted(m.split(":", 1)[0] for m in problems) == sorted(keys), problems
    assert all("must be a finite number" in m for m in problems), problems


def test_float_key_ranges(empty_yaml):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["train.weight_decay=-0.1", "train.clip_eps=0", "sim.tp_efficiency=1.5",
                                 "rollout.kv_cache_space_gib=0", "cost.sync_s=-1", "train.warmup_sft_lr=0"])
    msg = str(ei.value)
    assert len(ei.value.problems) == 6, msg
    assert "train.weight_decay: -0.1 must be >= 0; use e.g. train.weight_decay=0.0" in msg
    assert "train.clip_eps: 0.0 must be > 0" in msg
    assert "sim.tp_efficiency: 1.5 must be in (0, 1]" in msg
    assert "rollout.kv_cache_space_gib: 0.0 must be > 0" in msg
    assert "cost.sync_s: -1.0 must be >= 0" in msg
    assert "train.warmup_sft_lr: 0.0 must be > 0" in msg


@pytest.mark.parametrize("value", ["-0.01", "0.5"])
def test_concentrate_tail_range(empty_yaml, value):
    with pytest.raises(ConfigError, match=r"scheduler.concentrate_tail: .* must be in \[0, 0.5\)"):
        load_config(empty_yaml, [f"scheduler.concentrate_tail={value}"])
    assert load_config(empty_yaml, ["scheduler.concentrate_tail=0.02"]).scheduler.concentrate_tail == 0.02
