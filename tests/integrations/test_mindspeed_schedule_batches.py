"""schedule.parquet -> MindSpeed-RL data_iters: exact order, resume, errors."""
from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp_ascend.errors import DataError
from asp_ascend.integrations.mindspeed_rl.schedule_batches import (
    ScheduleBatches, prompt_dataset_fetch, read_schedule, replica_of_rows)

GBS = 4


def schedule(epochs=2, num_prompts=12, seed=1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    per_epoch = num_prompts // GBS
    for ep in range(epochs):
        for pos, pid in enumerate(rng.permutation(num_prompts)):
            rows.append(dict(epoch=ep, prompt_id=int(pid), iteration=ep * per_epoch + pos // GBS,
                             mini_batch=(pos % GBS) // 2, instance=int(rng.integers(0, 2)),
                             dispatch_rank=int(rng.integers(0, 1000)), predicted_length=float(rng.integers(5, 50))))
    return pd.DataFrame(rows).sample(frac=1.0, random_state=3)  # file order must not matter


def expected_order(df: pd.DataFrame, keys=("instance", "dispatch_rank", "prompt_id")) -> list[list[int]]:
    out = []
    for _, g in df.groupby(["epoch", "iteration"], sort=True):
        out.append([int(p) for p in g.sort_values(list(keys))["prompt_id"]])
    return out


def ids_of(batches) -> list[list[int]]:
    return [[int(x) for x in b["ids"]] for b in batches]


def fetch(pid):
    return {"input_ids": [pid, pid + 100], "labels": [pid], "ids": pid}


def collate_ids(items):
    return {"ids": [it["ids"] for it in items]}


def test_yields_exactly_the_schedule_order(tmp_path):
    df = schedule()
    path = tmp_path / "schedule.parquet"
    df.to_parquet(path)
    it = ScheduleBatches(path, GBS, fetch, collate=collate_ids)
    assert len(it) == 6
    assert ids_of(it) == expected_order(df)
    with pytest.raises(StopIteration):
        next(it)


def test_dispatch_order_variant():
    df = schedule()
    it = ScheduleBatches(df, GBS, fetch, collate=collate_ids, order="dispatch")
    assert ids_of(it) == expected_order(df, ("dispatch_rank", "instance", "prompt_id"))


@pytest.mark.parametrize("consumed", [0, 4, 8, 9, 20, 24])
def test_resume_from_consumed_samples_matches_mindspeed_skip(consumed):
    df = schedule()
    full = expected_order(df)
    it = ScheduleBatches(df, GBS, fetch, collate=collate_ids, consumed_samples=consumed)
    skip = consumed // GBS          # MindSpeed-RL: [next(data_iters) for _ in range(consumed // gbs)]
    assert it.skipped_iterations == skip
    assert ids_of(it) == full[skip:]
    assert it.consumed_samples == len(full) * GBS


def test_resume_past_the_end_is_a_clear_error():
    with pytest.raises(DataError, match="schedule has only 6"):
        ScheduleBatches(schedule(), GBS, fetch, collate=collate_ids, consumed_samples=7 * GBS)


def test_default_collate_is_promptdataloader_layout():
    torch = pytest.importorskip("torch")
    it = ScheduleBatches(schedule(), GBS, fetch, dataset_additional_keys=["labels"])
    batch = next(it)
    assert set(batch) == {"prompts", "labels"}
    assert len(batch["prompts"]) == GBS and batch["prompts"][0].dtype == torch.long
    assert [int(p[1]) - 100 for p in batch["prompts"]] == [int(x[0]) for x in batch["labels"]]
    assert [int(r["prompt_id"]) for r in it.last_rows] == [int(x[0]) for x in batch["labels"]]


def test_errors_name_file_row_and_fix(tmp_path):
    df = schedule()
    with pytest.raises(DataError, match="missing column"):
        read_schedule(df.drop(columns=["dispatch_rank"]), GBS)
    dup = pd.concat([df, df.iloc[[0]]])
    with pytest.raises(DataError, match="appears twice in epoch"):
        read_schedule(dup, GBS)
    with pytest.raises(DataError, match="global_batch_size is 5"):
        read_schedule(df, 5)
    with pytest.raises(DataError, match="asp schedule"):
        read_schedule(tmp_path / "nope.parquet", GBS)
    with pytest.raises(DataError, match="choose one of"):
        ScheduleBatches(df, GBS, fetch, order="random")


def test_prompt_dataset_fetch_and_replica_placement():
    data = [{"input_ids": [i]} for i in range(5)]
    f = prompt_dataset_fetch(data)
    assert f(3) == {"input_ids": [3]} and f("4") == {"input_ids": [4]}
    with pytest.raises(DataError, match="outside the dataset"):
        f(5)
    with pytest.raises(DataError, match="addressed by position"):
        f("abc")
    assert replica_of_rows(8, 2) == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(DataError, match="not divisible"):
        replica_of_rows(6, 4)


def test_schedule_must_cover_train_iters():
    from asp_ascend.errors import ConfigError
    from asp_ascend.integrations.mindspeed_rl.entry import check_schedule_covers

    check_schedule_covers(remaining=6, train_iters=8, done=2)
    with pytest.raises(ConfigError, match="train_iters: 9 iterations, but schedule.parquet has 8"):
        check_schedule_covers(remaining=6, train_iters=9, done=2)


def test_mindspeed_yaml_to_schedule_to_batches(tmp_path):
    """The login-node flow: `asp schedule` on the MindSpeed-RL YAML, then the batches fit() will see."""
    from asp_ascend.cli import main

    cfg = Path(__file__).resolve().parents[2] / "configs" / "mindspeed_rl" / "grpo_qwen25_7b_asp_A3.yaml"
    pd.DataFrame({"prompt": [f"q{i}" for i in range(256)], "answer": ["a"] * 256}).to_parquet(tmp_path / "p.parquet")
    run = ["schedule", str(cfg), f"output_dir={tmp_path / 'run'}", f"data.path={tmp_path / 'p.parquet'}"]
    assert main(run) == 2        # the YAML's tokenizer (./Qwen2.5-7B) is not on this node: named, with the opt-in
    assert main(run + ["asp.data.prompt_length=words"]) == 0
    report = json.loads((tmp_path / "run" / "schedule_report.json").read_text())
    assert report["prompt_length"] == {"unit": "words", "opt_in": "data.prompt_length=words"}
    dataset = [{"input_ids": [i, 7]} for i in range(256)]          # PromptDataset positions = row index
    batches = ScheduleBatches(tmp_path / "run" / "schedule.parquet", 64, prompt_dataset_fetch(dataset),
                              collate=lambda items: [it["input_ids"][0] for it in items])
    seen = [pid for batch in batches for pid in batch]
    assert len(seen) == 256 and sorted(seen) == list(range(256))    # one epoch, every prompt once
    df = read_schedule(tmp_path / "run" / "schedule.parquet", 64)    # 64 prompts in every iteration
    assert df["instance"].between(0, 7).all()                         # asp.rollout.num_instances = 8
