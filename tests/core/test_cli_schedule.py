"""`asp schedule` end to end: the built-in task, a real trace, a dataset + history; bad input."""
import json
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from asp_ascend.cli import main

COLUMNS = ["epoch", "prompt_id", "iteration", "mini_batch", "instance", "dispatch_rank", "predicted_length", "room"]
REPORT_KEYS = {"iteration_time_mean", "padding_bubble", "skew_bubble", "sorting_bubble", "lower_bound_ratio"}


def check_outputs(out, n_prompts, epochs=1):
    sched = pd.read_parquet(out / "schedule.parquet")
    assert list(sched.columns) == COLUMNS
    assert len(sched) == n_prompts * epochs
    assert pq.read_schema(out / "schedule.parquet").metadata[b"schema_version"] == b"1"
    rep = json.loads((out / "schedule_report.json").read_text())
    assert rep["schema_version"] == 1
    assert rep["num_prompts"] == n_prompts
    assert REPORT_KEYS <= set(rep["predicted"])
    assert (out / "config.yaml").exists()
    assert not list(out.glob(".*.tmp"))
    return sched, rep


def test_builtin_task(empty_yaml, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["schedule", str(empty_yaml), f"output_dir={out}", "train.epochs=2"]) == 0
    sched, rep = check_outputs(out, 256, epochs=2)
    # iterations are global across epochs; each epoch schedules every prompt once
    assert sched.groupby("epoch")["prompt_id"].nunique().tolist() == [256, 256]
    assert sched.groupby("epoch")["iteration"].min().tolist() == [0, 4]
    assert set(rep["baselines"]) == {"fifo", "random", "sorted", "balanced"}
    printed = capsys.readouterr().out
    assert "asp (predicted)" in printed and "fifo" in printed


def test_trace_workload(empty_yaml, tmp_path, shared_data):
    out = tmp_path / "run"
    assert main(["schedule", str(empty_yaml), f"output_dir={out}", "workload.type=trace",
                 f"workload.trace_path={shared_data / 'azure_llm_trace_2023_code.csv'}", "workload.num_prompts=2000",
                 "lengths.max_response_length=4096", "train.global_batch_size=128", "train.mini_batch_size=32",
                 "rollout.num_instances=4"]) == 0
    sched, rep = check_outputs(out, 2000)
    assert 0 < rep["prediction_quality"]["spearman"] <= 1
    assert REPORT_KEYS <= set(rep["realized"])


def test_dataset_with_history(empty_yaml, tmp_path, caplog):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "w " * (i % 7 + 1)}) + "\n" for i in range(40)))
    hist = tmp_path / "h.csv"
    rows = ([f"q{i},{(i * 37) % 500 + 1},0" for i in range(30)] + [f"q{i},{(i * 37) % 500 + 1},1" for i in range(30)]
            + ["ghost,5,0", "ghost,7,1"])
    hist.write_text("prompt_id,response_length,epoch\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["schedule", str(empty_yaml), f"output_dir={out}", f"data.path={data}", f"lengths.path={hist}",
                 "train.global_batch_size=16", "train.mini_batch_size=4", "scheduler.policy=balanced"]) == 0
    sched, rep = check_outputs(out, 40)
    assert "skipped 2 row(s) of 1 prompt(s) not in the dataset" in caplog.text
    # the prompts with history keep their mean as prediction
    p = sched.set_index("prompt_id")["predicted_length"]
    assert p["q3"] == pytest.approx((3 * 37) % 500 + 1)
    assert rep["policy"] == "balanced"
    # a history with two epochs: every predictor is scored on the held-out last epoch
    assert set(rep["history_holdout"]) == {"mean", "ema", "quantile", "regression"}
    assert rep["history_holdout"]["mean"]["mae"] >= 0


@pytest.mark.parametrize("args, match", [
    (["rollout.num_instances=0"], "rollout.num_instances: 0 must be >= 1"),
    (["train.mini_batch_size=7"], "train.mini_batch_size: 7 does not divide train.global_batch_size=64"),
    (["train.global_batch_size=512", "train.mini_batch_size=64"],
     r"train.global_batch_size: 512 is larger than the dataset \(256 prompts"),
    (["scheduler.policy=shortest"], "scheduler.policy: 'shortest' is not one of asp, fifo, random, sorted, balanced"),
])
def test_bad_input_one_clear_error_and_no_output(empty_yaml, tmp_path, capsys, args, match):
    import re

    out = tmp_path / "run"
    assert main(["schedule", str(empty_yaml), f"output_dir={out}", *args]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


def test_bad_history_rows_error_and_no_output(empty_yaml, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": "x"}) + "\n" for i in range(10)))
    out = tmp_path / "run"
    for content, match in [("prompt_id,response_length\n1,5\n2,-1\n", r"h.csv:3: response_length is -1, negative"),
                           ("prompt_id,response_length\n1,5\n2,\n", r"h.csv:3: response_length is .*not a number"),
                           ("prompt_id,response_length\n1,99999\n", r"h.csv:2: response_length 99999 exceeds")]:
        (tmp_path / "h.csv").write_text(content)
        assert main(["schedule", str(empty_yaml), f"output_dir={out}", f"data.path={data}",
                     f"lengths.path={tmp_path / 'h.csv'}", "train.global_batch_size=8", "train.mini_batch_size=4"]) == 2
        err = capsys.readouterr().err
        assert __import__("re").search(match, err), err
        assert not out.exists()
    data.write_text("")
    assert main(["schedule", str(empty_yaml), f"output_dir={out}", f"data.path={data}"]) == 2
    assert "the dataset is empty" in capsys.readouterr().err


def test_schedule_needs_no_torch_ray_vllm(empty_yaml, tmp_path):
    code = (
        "import sys\n"
        "for m in ('torch', 'ray', 'vllm'): sys.modules[m] = None  # any import of them fails\n"
        "from asp_ascend.cli import main\n"
        f"rc = main(['schedule', {str(empty_yaml)!r}, 'output_dir={tmp_path / 'r'}'])\n"
        "assert rc == 0, rc\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
