"""One reading of the data settings across commands (docs/simulator.md, "Keys a mode ignores"):
with data.path set, its prompts are the workload of asp schedule, asp simulate (with the lengths of
lengths.path), asp train and the re-planners; a workload.* key it leaves unread is refused when the
config loads, and an experiment workload given to a training run is refused before it starts."""
import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from asp_ascend.cli import main
from asp_ascend.config import load_config
from asp_ascend.config.explicit import DATASET_KEYS
from asp_ascend.errors import ConfigError
from asp_ascend.lengths.workloads import workload_from_config
from asp_ascend.scheduler.group_max import group_max_factor
from asp_ascend.scheduler.run import inputs_from_config

N = 48


def _dataset(tmp_path, with_history=N):
    """A prompts file of N prompts (prompt i: i % 9 + 1 words) and a 2-epoch history of the first
    ``with_history`` of them, G = 4 samples each, plus rows of a prompt the file does not hold."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "w " * (i % 9 + 1)}) + "\n" for i in range(N)))
    rng = np.random.default_rng(3)
    rows = [{"epoch": e, "prompt_id": p, "sample": s, "response_length": int(rng.integers(5, 900))}
            for e in range(2) for p in [f"q{i}" for i in range(with_history)] + ["ghost"] for s in range(4)]
    hist = tmp_path / "h.csv"
    pd.DataFrame(rows).to_csv(hist, index=False)
    return data, hist


def _over(tmp_path, *extra, with_history=N):
    data, hist = _dataset(tmp_path, with_history)
    return [f"data.path={data}", f"lengths.path={hist}", f"output_dir={tmp_path / 'run'}", "train.group_size=4",
            "train.global_batch_size=8", "train.mini_batch_size=4", "rollout.num_instances=2",
            "rollout.max_num_seqs=8", "sim.total_devices=4", "sim.rollout_devices=2", "sim.infer_tp=1",
            "sim.epochs=1", "sim.model_class=custom", "cost.train_per_token=1e-6",
            "data.prompt_length=words", *extra]   # no tokenizer here: the opt-in (tests/core/test_prompt_tokens.py)


def test_workload_keys_with_data_path_are_refused(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(None, ["data.path=p.jsonl", "workload.type=synthetic", "workload.tail_alpha=1.2",
                           "workload.num_prompts=64", "workload.group_spread=0.2"], check_files=False)
    why = ("has no effect: data.path is set, and its prompts are the workload of every command (asp schedule and asp "
           "train plan them, asp simulate simulates them with the lengths of lengths.path); remove data.path "
           "(data.path=null) to use the experiment workload of workload.type, or remove ")
    assert ei.value.problems == [f"workload.type: 'synthetic' {why}workload.type",
                                 f"workload.num_prompts: 64 {why}workload.num_prompts",
                                 f"workload.tail_alpha: 1.2 {why}workload.tail_alpha"]   # group_spread is read
    with pytest.raises(ConfigError, match=r"workload.type: 'task' has no effect: data.path is set"):
        load_config(None, ["data.path=p.jsonl", "workload.type=task"], check_files=False)
    # the history type reads the same (data.path's prompts, lengths.path's lengths); so does group_spread
    cfg = load_config(None, ["data.path=p.jsonl", "lengths.path=h.csv", "workload.type=history",
                             "workload.group_spread=0.1"], check_files=False)
    assert cfg.workload.group_spread == 0.1


def test_the_dataset_workload_reads_only_group_spread(tmp_path):
    """Independent of DATASET_KEYS: each workload.* key changed alone changes the workload built from
    data.path exactly when it is listed there (type included: no type changes it)."""
    base = load_config(None, _over(tmp_path))
    w0 = workload_from_config(base)
    assert list(w0.prompt_ids) == sorted(f"q{i}" for i in range(N))    # the file's prompts, not the ghost
    for f in dataclasses.fields(base.workload):
        cfg = copy.deepcopy(base)
        v = getattr(base.workload, f.name)
        setattr(cfg.workload, f.name, {"type": "synthetic", "trace_path": "t.csv", "trace_column": "X",
                                       "trace_prompt_column": "Y"}.get(f.name, v * 2 + 1 if isinstance(v, (int, float))
                                                                       else v))
        w = workload_from_config(cfg)
        same = (np.array_equal(w.mean_length, w0.mean_length) and np.array_equal(w.samples(1), w0.samples(1))
                and np.array_equal(w.prompt_length, w0.prompt_length))
        assert same == (f.name not in DATASET_KEYS), f.name


def test_schedule_and_simulate_read_the_same_prompts(tmp_path, capsys):
    """The config's one workload: asp schedule plans the file's prompts (with their lengths) and asp
    simulate simulates exactly those prompts, whatever the default workload.type says."""
    cfg = load_config(None, _over(tmp_path))
    inp, w = inputs_from_config(cfg), workload_from_config(cfg)
    assert sorted(inp.prompt_ids) == sorted(w.prompt_ids)
    plen = dict(zip(inp.prompt_ids, inp.prompt_lengths))
    assert [plen[p] for p in w.prompt_ids] == list(w.prompt_length)   # the file's word counts, in both
    out = tmp_path / "sim"
    assert main(["simulate", str(_yaml(tmp_path)), *_over(tmp_path), f"output_dir={out}", "sim.policies=[asp]",
                 "sim.write_timeline=always"]) == 0
    printed = capsys.readouterr().out
    assert ("asp simulate: d.jsonl with lengths of h.csv, prompt lengths in WHITESPACE WORDS (data.prompt_length=words), "
            "48 prompts x G=4") in printed   # the opt-in, said where the run is named
    req = pd.read_json(out / "timeline_asp.jsonl", lines=True)
    req = req[req["kind"] == "request"] if "kind" in req else req
    assert set(req["prompt_id"].dropna().astype(str)) == {f"q{i}" for i in range(N)}
    sched = tmp_path / "sched"
    assert main(["schedule", str(_yaml(tmp_path)), *_over(tmp_path), f"output_dir={sched}"]) == 0
    assert set(pd.read_parquet(sched / "schedule.parquet")["prompt_id"]) == {f"q{i}" for i in range(N)}


def _yaml(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("{}\n")
    return p


def test_simulating_a_dataset_needs_its_lengths(tmp_path, capsys):
    data, _ = _dataset(tmp_path)
    out = tmp_path / "sim"
    assert main(["simulate", str(_yaml(tmp_path)), f"data.path={data}", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert (f"data.path: '{data}' is the workload (its prompts are what every command plans and trains), and asp "
            "simulate needs their response lengths, which a prompts file does not hold; set lengths.path") in err
    assert not out.exists()          # refused before any output


def test_prompts_without_lengths_are_left_out_with_a_warning(tmp_path, caplog):
    cfg = load_config(None, _over(tmp_path, with_history=40))
    w = workload_from_config(cfg)
    assert w.num_prompts == 40
    assert "8 of the 48 prompts of data.path have no row in lengths.path" in caplog.text


def test_a_training_run_refuses_an_experiment_workload(tmp_path):
    from asp_ascend.integrations.train_only import train_only_problems
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(None, ["workload.type=synthetic", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"workload.type: 'synthetic' has no effect in asp train, which trains and "
                                          r"plans the prompts of data.path \(without it, the built-in task\): an "
                                          r"experiment workload \(the heavy-tailed generator\) is only planned and "
                                          r"simulated \(asp schedule, asp simulate\); remove workload.type to train"):
        run_train(cfg)
    assert not (tmp_path / "run" / "schedule.parquet").exists()
    for fw in ("verl", "MindSpeed-RL"):
        assert (f"asp.workload.type: 'synthetic' has no effect in a {fw} run, which trains and plans {fw}'s own "
                "training dataset") in train_only_problems(cfg, fw)[0]
    assert train_only_problems(load_config(None, []), "verl") == []


def test_group_spread_is_read_by_schedule_and_simulate(tmp_path):
    """workload.group_spread with data.path: asp simulate draws each group's samples at that spread and
    plans with the longest it implies; asp schedule plans with the same expectation (before: 1.0, the
    spread unread). Changed alone, it changes what each command writes."""
    def run(cmd, spread):
        out = tmp_path / f"{cmd}_{spread}"
        assert main([cmd, str(_yaml(tmp_path)), *_over(tmp_path), f"output_dir={out}",
                     f"workload.group_spread={spread}", "sim.policies=[asp]"]) == 0
        if cmd == "schedule":
            return json.loads((out / "schedule_report.json").read_text())["predicted"]
        return json.loads((out / "summary.json").read_text())["asp"]

    for spread in (0.05, 0.8):   # the expected longest sample, as asp schedule reads it for a history workload
        cfg = load_config(None, _over(tmp_path, f"workload.group_spread={spread}"))
        hist = load_config(None, [o for o in _over(tmp_path, f"workload.group_spread={spread}")
                                  if not o.startswith("data.path")] + ["workload.type=history"])
        assert inputs_from_config(cfg).group_max_factor == inputs_from_config(hist).group_max_factor > 1.0
        # the factor asp simulate plans with (sim/run.build_jobs: the same exact function of the spread)
        w = workload_from_config(cfg)
        assert inputs_from_config(cfg).group_max_factor == group_max_factor(w.group_spread, w.group_size)
    assert run("schedule", 0.05) != run("schedule", 0.8)
    assert run("simulate", 0.05) != run("simulate", 0.8)
    # the built-in task's lengths are exact: no spread to plan with
    assert inputs_from_config(load_config(None, ["train.group_size=4"])).group_max_factor == 1.0
