"""`asp schedule` / `asp simulate` on a framework's YAML plan the prompts that framework trains, with the
ids its run uses, or stop naming the key and the fix; never the built-in task (docs/ascend.md step 4,
docs/verl.md "Planning on a login node"). The shipped YAMLs, edited in tmp files."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from asp_ascend.cli import main

from .verl_fixtures import HAVE_VERL, SKIP_REASON

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N = 96


def _chat_parquet(path: Path, n: int = N) -> Path:
    """verl's format: chat `prompt`, plus an `id` column that is NOT the row position (the runs ignore it)."""
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": "w " * (1 + i % 11)}],
             "reward_model": {"ground_truth": "1", "style": "rule"}, "id": f"x{1000 - i}"} for i in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def _model(tmp_path: Path) -> Path:
    """The run's tokenizer directory (engines/tiny_model.build_tokenizer: "w" one token, a chat template):
    what actor_rollout_ref.model.path / megatron_training.tokenizer_name_or_path name; the offline commands
    count the prompts' tokens with it (tests/core/test_prompt_tokens.py)."""
    from asp_ascend.engines.tiny_model import build_tokenizer, task_vocabulary

    d = tmp_path / "model"
    if not d.is_dir():
        tok = build_tokenizer(task_vocabulary(["w"]))
        tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
        tok.save_pretrained(d)
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return d


def _mindspeed_yaml(tmp_path: Path, data_path=None, **asp_data) -> Path:
    raw = yaml.safe_load((CONFIGS / "mindspeed_rl" / "grpo_qwen25_7b_asp_A3.yaml").read_text())
    raw["megatron_training"]["tokenizer_name_or_path"] = str(_model(tmp_path))
    raw["asp"].pop("data", None)
    if data_path:
        raw["asp"]["data"] = {"path": str(data_path), **asp_data}
    raw["asp"]["output_dir"] = str(tmp_path / "run")
    p = tmp_path / "msrl.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


@pytest.mark.parametrize("cmd", ["schedule", "simulate"])
def test_mindspeed_without_an_export_is_refused(tmp_path, capsys, cmd):
    assert main([cmd, str(_mindspeed_yaml(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert ("asp.data.path: not set, so the ASP pass has no prompts of this run to plan (it would plan the built-in "
            "synthetic task, whose prompts MindSpeed-RL never trains); MindSpeed-RL trains megatron_training.data_path: "
            "'./dataset/deepscaler/data' (a Megatron indexed dataset, .bin/.idx), which asp cannot read") in err
    assert "Set asp.data.path to a JSONL or parquet export of the same prompts in the same order" in err
    assert not (tmp_path / "run").exists()


def test_mindspeed_entry_without_an_export_is_refused_before_anything(tmp_path, capsys):
    """The train entry plans asp.data.path when schedule.parquet is missing: without it, refused (Hydra composes)."""
    pytest.importorskip("hydra")
    from asp_ascend.integrations.mindspeed_rl.entry import main as entry

    cfgdir = tmp_path / "configs"
    (cfgdir / "model").mkdir(parents=True)
    (cfgdir / "model" / "qwen25_7b.yaml").write_text("qwen25_7b:\n  num_layers: 28\n")
    _mindspeed_yaml(tmp_path).rename(cfgdir / "run.yaml")
    assert entry(["--config-path", str(cfgdir), "--config-name", "run", "--dry-run"]) == 2
    assert "asp.data.path: not set, so the ASP pass has no prompts of this run to plan" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_mindspeed_schedule_ids_are_dataset_positions(tmp_path, capsys):
    """MindSpeed-RL fetches a prompt by its position in data_path: the file's own `id` column is not read."""
    data = _chat_parquet(tmp_path / "p.parquet")
    assert main(["schedule", str(_mindspeed_yaml(tmp_path, data))]) == 0
    ids = pd.read_parquet(tmp_path / "run" / "schedule.parquet")["prompt_id"]
    assert sorted(ids.astype(int)) == list(range(N))
    assert main(["schedule", str(_mindspeed_yaml(tmp_path, data, id_key="id"))]) == 2
    assert ("asp.data.id_key: 'id' cannot be read: MindSpeed-RL addresses its prompts by position in "
            "megatron_training.data_path") in capsys.readouterr().err


@pytest.mark.parametrize("adaptive", [True, False])
def test_mindspeed_offline_schedule_is_the_runs_plan(tmp_path, adaptive):
    """What the entry plans at the start: every epoch, or epoch 0 alone with asp.scheduler.adaptive (the async
    driver plans the later ones from the lengths it observes, test_mindspeed_adaptive.py)."""
    data = _chat_parquet(tmp_path / "p.parquet")
    assert main(["schedule", str(_mindspeed_yaml(tmp_path, data)), "asp.train.epochs=2",
                 f"asp.scheduler.adaptive={str(adaptive).lower()}"]) == 0
    epochs = sorted(pd.read_parquet(tmp_path / "run" / "schedule.parquet")["epoch"].unique())
    assert epochs == ([0] if adaptive else [0, 1])


def _verl_yaml(tmp_path: Path, data=None, **data_keys) -> Path:
    raw = yaml.safe_load((CONFIGS / "verl" / "grpo_qwen25_7b_asp_cuda.yaml").read_text())
    raw["data"]["train_files"] = str(data or _chat_parquet(tmp_path / "train.parquet"))
    raw["actor_rollout_ref"]["model"]["path"] = str(_model(tmp_path))
    raw["data"].update(data_keys)
    raw["data"]["train_batch_size"] = 32
    raw["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] = 16
    p = tmp_path / "verl.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def test_verl_schedule_plans_the_train_file_where_the_run_reads_it(tmp_path, monkeypatch):
    """data.train_files's prompts, ids = positions in verl's dataset, written to the run's
    trainer.default_local_dir/asp (verl's default), epoch 0 alone when adaptive (as the run plans)."""
    monkeypatch.chdir(tmp_path)
    p = _verl_yaml(tmp_path)
    assert main(["schedule", str(p)]) == 0
    out = tmp_path / "checkpoints" / "asp_verl" / "grpo_qwen25_7b_asp_cuda" / "asp"
    df = pd.read_parquet(out / "schedule.parquet")
    assert sorted(df["prompt_id"].astype(int)) == list(range(N)) and set(df["epoch"]) == {0}
    report = json.loads((out / "schedule_report.json").read_text())
    assert report["num_prompts"] == N and report["group_size"] == 8 and report["global_batch_size"] == 32
    assert report["num_instances"] == 4          # 8 GPUs / TP 2, as the verl run's replicas
    assert main(["schedule", str(p), f"output_dir={tmp_path / 'all'}", "asp.scheduler.adaptive=false"]) == 0
    assert set(pd.read_parquet(tmp_path / "all" / "schedule.parquet")["epoch"]) == {0, 1, 2}   # trainer.total_epochs


@pytest.mark.parametrize("key,value,why", [
    ("filter_overlong_prompts", True, "verl drops the prompts its tokenizer makes longer"),
    ("train_max_samples", 10, "verl trains a subset of the file"),
    ("custom_cls", {"path": "my.py", "name": "D"}, "a custom dataset class decides the rows"),
])
def test_verl_rows_that_are_not_the_run_positions_are_refused(tmp_path, capsys, key, value, why):
    p = _verl_yaml(tmp_path, **{key: value})
    for cmd in ("schedule", "simulate"):
        assert main([cmd, str(p), f"output_dir={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert f"data.{key}" in err and why in err and "set asp.data.path to a JSONL or parquet export" in err
    assert not (tmp_path / "run").exists()
    export = _chat_parquet(tmp_path / "export.parquet", 40)      # the fix: an export of verl's dataset, in order
    assert main(["schedule", str(p), f"output_dir={tmp_path / 'run'}", f"asp.data.path={export}"]) == 0
    assert sorted(pd.read_parquet(tmp_path / "run" / "schedule.parquet")["prompt_id"].astype(int)) == list(range(40))


def test_verl_several_or_missing_train_files_are_refused(tmp_path, capsys):
    a = _chat_parquet(tmp_path / "a.parquet")
    raw = yaml.safe_load(_verl_yaml(tmp_path, a).read_text())
    raw["data"]["train_files"] = [str(a), str(a)]
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(raw))
    assert main(["schedule", str(tmp_path / "two.yaml"), f"output_dir={tmp_path / 'run'}"]) == 2
    assert "verl trains these files concatenated, and asp plans one prompts file" in capsys.readouterr().err
    raw["data"]["train_files"] = str(tmp_path / "absent.parquet")
    (tmp_path / "absent.yaml").write_text(yaml.safe_dump(raw))
    assert main(["simulate", str(tmp_path / "absent.yaml"), f"output_dir={tmp_path / 'run'}"]) == 2
    assert f"data.train_files: '{tmp_path / 'absent.parquet'}' does not exist here" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_verl_simulate_reads_the_same_prompts(tmp_path, capsys):
    data = _chat_parquet(tmp_path / "train.parquet")
    hist = tmp_path / "h.csv"
    pd.DataFrame([{"prompt_id": str(i), "epoch": 0, "sample": s, "response_length": 50 + (i * 37 + s * 11) % 900}
                  for i in range(N) for s in range(8)]).to_csv(hist, index=False)
    out = tmp_path / "sim"
    assert main(["simulate", str(_verl_yaml(tmp_path, data)), f"output_dir={out}", f"asp.lengths.path={hist}",
                 "sim.policies=[asp]", "sim.epochs=1", "sim.total_devices=12", "sim.rollout_devices=4",
                 "sim.infer_tp=2", "sim.write_timeline=always"]) == 0
    events = [json.loads(line) for line in (out / "timeline_asp.jsonl").read_text().splitlines() if line.strip()]
    assert {str(e["prompt_id"]) for e in events if e.get("kind") == "request"} == {str(i) for i in range(N)}


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
@pytest.mark.parametrize("adaptive", [True, False])
def test_verl_offline_schedule_is_the_runs_plan(tmp_path, monkeypatch, adaptive):
    """The schedule `asp schedule` writes from the shipped YAML equals the one the verl run plans at its start
    (main_ppo: the composed config translated, VerlSchedule over verl's own RLHFDataset)."""
    from omegaconf import OmegaConf

    from asp_ascend.integrations.verl.config_bridge import translate
    from asp_ascend.integrations.verl.plan import VerlSchedule, prompt_set_from_dataset

    from verl.utils import hf_tokenizer

    from .verl_fixtures import compose, train_dataset

    monkeypatch.chdir(tmp_path)
    p = _verl_yaml(tmp_path)
    over = [f"asp.scheduler.adaptive={str(adaptive).lower()}"]
    assert main(["schedule", str(p), f"output_dir={tmp_path / 'offline'}", *over]) == 0
    composed = compose([f"data.train_files={tmp_path / 'train.parquet'}", "data.train_batch_size=32",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                        f"actor_rollout_ref.model.path={_model(tmp_path)}", *over],
                       config_dir=str(CONFIGS / "verl"), config_name="grpo_qwen25_7b_asp_cuda")
    cfg, _ = translate(OmegaConf.to_container(composed, resolve=True))
    tok = hf_tokenizer(str(_model(tmp_path)))       # verl's loader, as main_ppo gets it
    run = VerlSchedule(cfg, prompt_set_from_dataset(train_dataset(composed, tok), tok), tmp_path / "run")
    offline = pd.read_parquet(tmp_path / "offline" / "schedule.parquet")
    pd.testing.assert_frame_equal(offline.reset_index(drop=True), run.frame.reset_index(drop=True))
    # both planned the tokens verl prefills: "w w ... w " rendered with the template's space after it: one token
    # per "w", one per trailing space (not the whitespace words the plans used to count)
    words = [len(m[-1]["content"].split()) for m in pd.read_parquet(tmp_path / "train.parquet")["prompt"]]
    assert list(run.prompts.prompt_lengths) == [w + 2 for w in words]
    report = json.loads((tmp_path / "offline" / "schedule_report.json").read_text())
    assert report["prompt_length"]["unit"] == "tokens"
    assert report["prompt_length"]["tokenizer"] == f"actor_rollout_ref.model.path={_model(tmp_path)}"



def test_verl_tokenizer_not_on_this_node_is_named_and_words_are_an_opt_in(tmp_path, capsys):
    """The shipped YAML names a hub id (Qwen/Qwen2.5-7B-Instruct): no tokenizer here counts the prompts' tokens,
    so the commands stop naming verl's key; asp.data.prompt_length=words plans on words, recorded as such."""
    raw = yaml.safe_load(_verl_yaml(tmp_path).read_text())
    raw["actor_rollout_ref"]["model"]["path"] = "Qwen/Qwen2.5-7B-Instruct"
    (tmp_path / "hub.yaml").write_text(yaml.safe_dump(raw))
    for cmd in ("schedule", "simulate"):
        assert main([cmd, str(tmp_path / "hub.yaml"), f"output_dir={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert "actor_rollout_ref.model.path: 'Qwen/Qwen2.5-7B-Instruct' is not a directory on this machine" in err
        assert "or set data.prompt_length=words" in err
    assert not (tmp_path / "run" / "schedule.parquet").exists()
    assert main(["schedule", str(tmp_path / "hub.yaml"), f"output_dir={tmp_path / 'run'}",
                 "asp.data.prompt_length=words"]) == 0
    report = json.loads((tmp_path / "run" / "schedule_report.json").read_text())
    assert report["prompt_length"] == {"unit": "words", "opt_in": "data.prompt_length=words"}
