"""Keys the mode of a config ignores are refused when it loads, naming the key, its value, why and
the fix (config/explicit.py): workload.* of another workload.type, train.tis_cap without an
off-policy correction, the speculative-decoding keys with rollout.speculative none, a streaming
start rule where nothing streams. The modes that read them still load, and so do saved configs."""
import copy
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config, run_config, save_resolved
from asp_ascend.config.explicit import SPEC_KEYS, WORKLOAD_KEYS
from asp_ascend.errors import ConfigError
from asp_ascend.lengths.workloads import workload_from_config

ROOT = Path(__file__).resolve().parents[2]


def _refused(over, *needles, path=None):
    with pytest.raises(ConfigError) as ei:
        load_config(path, over, check_files=False)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ------------------------------------------------------------------ workload.* of another type

def test_a_synthetic_key_with_the_default_task_workload_is_refused():
    _refused(["workload.tail_alpha=1.2"],
             "workload.tail_alpha: 1.2 has no effect: only workload.type synthetic reads it, and workload.type is "
             "task (the default: the built-in task's known lengths); set workload.type: synthetic, or remove "
             "workload.tail_alpha")


def test_synthetic_keys_with_a_trace_are_refused_each():
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["workload.type=trace", "workload.trace_path=t.csv", "workload.body_median=900",
                           "workload.tail_alpha=1.1", "workload.num_prompts=64", "workload.length_scale=2"],
                    check_files=False)
    assert ei.value.problems == [
        f"workload.{k}: {v} has no effect: only workload.type synthetic reads it, and workload.type is trace (a "
        f"length table); set workload.type: synthetic, or remove workload.{k}"
        for k, v in (("body_median", 900.0), ("tail_alpha", 1.1))]      # a trace reads num_prompts, length_scale


def test_trace_keys_with_a_synthetic_workload_are_refused():
    _refused(["workload.type=synthetic", "workload.length_scale=6", "workload.trace_column=Tokens"],
             "workload.trace_column: 'Tokens' has no effect: only workload.type trace reads it, and workload.type "
             "is synthetic (the heavy-tailed generator); set workload.type: trace",
             "workload.length_scale: 6.0 has no effect: only workload.type trace reads it")


def test_history_and_task_keep_only_their_own_keys():
    _refused(["workload.type=history", "lengths.path=h.csv", "workload.epochs=3", "workload.num_prompts=10"],
             "workload.num_prompts: 10 has no effect: only workload.type synthetic or trace reads it, and "
             "workload.type is history (the length history lengths.path)",
             "workload.epochs: 3 has no effect: only workload.type synthetic or trace or task reads it")
    _refused(["workload.type=task", "workload.num_prompts=10"],
             "workload.num_prompts: 10 has no effect: only workload.type synthetic or trace reads it, and "
             "workload.type is task (the built-in task's known lengths); set workload.type: synthetic or trace (the "
             "built-in task's prompt count is data.synthetic.num_prompts), or remove workload.num_prompts")
    assert load_config(None, ["workload.type=task", "workload.epochs=3"]).workload.epochs == 3
    assert load_config(None, ["workload.type=history", "lengths.path=h.csv", "workload.group_spread=0.2"],
                       check_files=False).workload.group_spread == 0.2


def _trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 300
    p = tmp_path / "trace.csv"
    pd.DataFrame({"GeneratedTokens": rng.integers(10, 3000, n), "Alt": rng.integers(10, 900, n),
                  "Ctx2": rng.integers(5, 500, n)}).to_csv(p, index=False)   # no ContextTokens: prompt_median read
    alt = tmp_path / "trace2.csv"
    pd.DataFrame({"GeneratedTokens": rng.integers(10, 3000, n)}).to_csv(alt, index=False)
    return p


def _history(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    rows = [{"epoch": e, "prompt_id": f"q{i}", "sample": s, "prompt_length": 20 + i,
             "response_length": int(rng.integers(5, 400))} for e in range(2) for i in range(40) for s in range(4)]
    p = tmp_path / "hist.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    return p


def _perturbed(name: str, value, tmp_path: Path):
    return {"trace_path": str(tmp_path / "trace2.csv"), "trace_column": "Alt", "trace_prompt_column": "Ctx2",
            "num_prompts": 96, "epochs": 3, "tail_fraction": 0.4}.get(name, value * 0.5 + 0.07 if isinstance(value, float) else value)


def _same(a, b) -> bool:
    return (a.mean_length.shape == b.mean_length.shape and np.array_equal(a.mean_length, b.mean_length)
            and np.array_equal(a.prompt_length, b.prompt_length) and a.group_spread == b.group_spread
            and np.array_equal(a.samples(0), b.samples(0)))


@pytest.mark.parametrize("wtype", sorted(WORKLOAD_KEYS))
def test_the_table_is_what_each_workload_type_reads(tmp_path, wtype):
    """Independent of the table: each workload.* key changed alone changes the workload its type builds
    exactly when the table says that type reads it (so a refused key really had no effect)."""
    _trace(tmp_path)
    over = {"trace": [f"workload.trace_path={tmp_path / 'trace.csv'}"],
            "history": [f"lengths.path={_history(tmp_path)}", "lengths.max_response_length=1024"],
            "synthetic": ["workload.num_prompts=256", "lengths.max_response_length=16384"], "task": ["data.synthetic.num_prompts=32"]}[wtype]
    base = load_config(None, [f"workload.type={wtype}", *over])
    w0 = workload_from_config(base)
    for f in dataclasses.fields(base.workload):
        if f.name == "type":
            continue
        cfg = copy.deepcopy(base)
        setattr(cfg.workload, f.name, _perturbed(f.name, getattr(base.workload, f.name), tmp_path))
        read = not _same(w0, workload_from_config(cfg))
        assert read == (f.name in WORKLOAD_KEYS[wtype]), (wtype, f.name, read)
        key = f"workload.{f.name}={getattr(cfg.workload, f.name)}"
        if read:      # the key set, its type's config loads
            load_config(None, [f"workload.type={wtype}", *over, key], check_files=False)
        else:
            _refused([f"workload.type={wtype}", *over, key], f"workload.{f.name}: ", "has no effect",
                     f"workload.type is {wtype}")


# ------------------------------------------------------------------ train.tis_cap

def test_tis_cap_without_an_off_policy_correction_is_refused():
    _refused(["train.off_policy=none", "train.tis_cap=3"],
             "train.tis_cap: 3.0 has no effect: train.off_policy is none", "set train.off_policy: tis",
             "or decoupled_ppo (the tokens whose weight exceeds it masked), or remove train.tis_cap")
    for mode in ("tis", "decoupled_ppo"):       # both read it (algos/grpo.policy_loss)
        assert load_config(None, [f"train.off_policy={mode}", "train.tis_cap=3"]).train.tis_cap == 3.0
    assert load_config(None, ["train.off_policy=none"]).train.off_policy == "none"


# ------------------------------------------------------------------ speculative decoding

@pytest.mark.parametrize("key", SPEC_KEYS)
def test_speculative_keys_without_speculative_decoding_are_refused(key):
    value = {"rollout.speculative_max_batch": "8", "cost.spec_acceptance": "0.3"}.get(key, "2")
    _refused([f"{key}={value}"], f"{key}: ", "has no effect: rollout.speculative is none, and only speculative "
             f"decoding reads it", f"set rollout.speculative (e.g. ngram), or remove {key}")
    _refused(["rollout.speculative=none", f"{key}={value}"], f"{key}: ")
    assert load_config(None, ["rollout.speculative=ngram", f"{key}={value}"]).rollout.speculative == "ngram"


# ------------------------------------------------------------------ streaming start rules

def test_stream_start_rules_where_nothing_streams_are_refused():
    _refused(["pipeline.stream_groups=off", "pipeline.stream_groups_start=lowest_index"],
             "pipeline.stream_groups_start: 'lowest_index' has no effect: pipeline.stream_groups is off")
    _refused(["pipeline.mode=sync", "pipeline.stream_groups_start=fewest_left"],
             "pipeline.stream_groups_start: 'fewest_left' has no effect: pipeline.mode is sync")
    _refused(["sim.stream_groups_start=lowest_index"],
             "sim.stream_groups_start: 'lowest_index' has no effect: sim.stream_groups is false",
             "set sim.stream_groups: true")
    for over in (["pipeline.stream_groups=on"], ["pipeline.stream_groups=auto"], []):
        load_config(None, over + ["pipeline.stream_groups_start=lowest_index"])
    load_config(None, ["sim.stream_groups=true", "sim.stream_groups_start=lowest_index"])


# ------------------------------------------------------------------ saved and resolved configs

IGNORED = ["workload.type=trace", "workload.trace_path=t.csv", "train.off_policy=none", "rollout.speculative=none",
           "pipeline.stream_groups=off", "sim.model_class=7b"]


def test_a_resolved_config_loads_back_whatever_its_modes(tmp_path):
    """A resolved config.yaml lists every key, most at defaults their mode ignores: given back as a
    config of one's own it loads (only values off their default count as set)."""
    cfg = load_config(None, IGNORED + [f"output_dir={tmp_path}"], check_files=False)
    path = save_resolved(cfg)
    assert load_config(path, check_files=False) == cfg
    assert run_config(tmp_path) == cfg


def test_a_resolved_config_with_an_ignored_value_loads_only_as_a_run_record(tmp_path):
    cfg = load_config(None, IGNORED + [f"output_dir={tmp_path}"], check_files=False)
    cfg.workload.tail_alpha, cfg.train.tis_cap, cfg.rollout.num_speculative_tokens = 1.1, 3.0, 2
    path = save_resolved(cfg)
    assert run_config(tmp_path) == cfg          # a run's record: as written
    msg = _refused([], "workload.tail_alpha: 1.1 has no effect: only workload.type synthetic",
                   "train.tis_cap: 3.0 has no effect", "rollout.num_speculative_tokens: 2 has no effect", path=path)
    assert "body_median" not in msg and "spec_acceptance" not in msg     # at their defaults: the run's record


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_and_their_resolved_form_load(tmp_path, path):
    cfg = load_config(path, [f"output_dir={tmp_path}"], check_files=False)
    assert load_config(save_resolved(cfg), check_files=False) == cfg


def test_an_earlier_versions_resolved_config_loads_back(tmp_path):
    """A config.yaml an earlier version resolved lacks the keys added since (here: a few of today's
    keys removed); it is still a resolved config, not a user's config setting every key it lists."""
    import yaml

    cfg = load_config(None, IGNORED + [f"output_dir={tmp_path}"], check_files=False)
    raw = yaml.safe_load(save_resolved(cfg).read_text())
    for section, key in (("weight_sync", "stall_timeout_s"), ("workload", "prompt_median"), ("sim", "epochs")):
        del raw[section][key]
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(raw))
    assert load_config(old, check_files=False) == cfg
