"""Bad inputs a new user tries: each ends in one clear error naming the file and line or the key
(never a traceback, never a message about internals), before any output is written."""
import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest

from asp_ascend.cli import main
from asp_ascend.config import load_config
from asp_ascend.data.datasets import load_prompts
from asp_ascend.errors import ConfigError, DataError
from asp_ascend.io import write_json_atomic, write_text_atomic
from asp_ascend.lengths.history import load_history, restrict_to


@pytest.mark.parametrize("prompt", ["", "   ", "\t\n"])
def test_empty_or_blank_prompt_names_file_and_line(tmp_path, prompt):
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"prompt": "count to 3"}) + "\n\n" + json.dumps({"prompt": prompt}) + "\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:3: the prompt in 'prompt' is empty"):
        load_prompts(p)


def test_empty_prompt_cell_in_parquet(tmp_path):
    p = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": ["a b", None, "c"], "id": ["x", "y", "z"]}).to_parquet(p)
    with pytest.raises(DataError, match=r"prompts.parquet:row 1: no 'prompt' field|prompts.parquet:row 1: .*empty"):
        load_prompts(p)
    pd.DataFrame({"prompt": ["a b", " ", "c"]}).to_parquet(p)
    with pytest.raises(DataError, match=r"row 1: the prompt in 'prompt' is empty \(only whitespace\)"):
        load_prompts(p)


def test_prompts_path_that_is_a_directory(tmp_path):
    with pytest.raises(DataError, match=r"is a directory; point data.path at a prompts file"):
        load_prompts(tmp_path)
    with pytest.raises(DataError, match=r"is a directory"):
        load_history(tmp_path)


def test_length_history_matching_no_prompt_is_an_error(tmp_path):
    h = tmp_path / "h.csv"
    h.write_text("prompt_id,response_length\nq1,10\nq2,20\n")
    hist = load_history(h)
    with pytest.raises(DataError, match=r"h.csv: none of its 2 prompt id\(s\) .* is a prompt of the dataset"):
        restrict_to(hist, ["0", "1", "2"], str(h))
    assert len(restrict_to(hist, ["q1", "x"], str(h))) == 1  # a partial match plans (and warns)


def test_length_history_matching_no_prompt_fails_asp_schedule(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"w{i} w"}) + "\n" for i in range(8)))
    h = tmp_path / "h.csv"
    h.write_text("prompt_id,response_length\nother1,10\nother2,20\n")
    out = tmp_path / "sched"
    cfg = load_config(None, [f"data.path={data}", f"lengths.path={h}", f"output_dir={out}",
                             "train.global_batch_size=4", "train.mini_batch_size=2", "train.group_size=2",
                             "data.prompt_length=words"])
    from asp_ascend.scheduler.run import run_schedule

    with pytest.raises(DataError, match="none of its 2 prompt id"):
        run_schedule(cfg)


def test_empty_cell_in_length_table_reads_as_empty(tmp_path):
    h = tmp_path / "h.csv"
    h.write_text("prompt_id,response_length\na,10\nb,\n")
    with pytest.raises(DataError) as e:
        load_history(h)
    assert "h.csv:3: response_length is empty, not a number" in str(e.value)
    assert "np.float64" not in str(e.value)


def test_messages_show_the_syntax_not_internals():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["output_dir=", "sim.policies=asp"])
    msg = str(e.value)
    assert "None is not a valid" not in msg and "output_dir: empty; give it a value" in msg
    assert "sim.policies: 'asp' is not a list" in msg and "sim.policies=[a,b]" in msg


def test_overrides_are_optional_in_the_usage(capsys):
    with pytest.raises(SystemExit):
        main(["train"])
    err = capsys.readouterr().err
    assert "required: config" in err and "overrides" not in err


@pytest.mark.parametrize("cmd", ["schedule", "simulate", "train"])
def test_output_dir_that_is_a_file_fails_before_any_work(tmp_path, capsys, cmd):
    f = tmp_path / "afile"
    f.write_text("x")
    assert main([cmd, str(_empty_yaml(tmp_path)), f"output_dir={f}"]) == 2
    err = capsys.readouterr().err
    assert "output_dir:" in err and "is a file, not a directory" in err and "Traceback" not in err
    assert main([cmd, str(_empty_yaml(tmp_path)), f"output_dir={f / 'sub'}"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_dir_where_nobody_can_write(tmp_path):
    """/proc takes no files, not even root's (the permission bits alone would say root may write)."""
    from asp_ascend.io import check_output_dir

    with pytest.raises(ConfigError, match=r"/proc/asp-run cannot be created \(/proc is not writable\)"):
        check_output_dir("/proc/asp-run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_dir_not_writable(tmp_path):
    from asp_ascend.io import check_output_dir

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            check_output_dir(ro / "run")
    finally:
        ro.chmod(0o700)


def _empty_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("{}\n")
    return p


def test_report_on_a_corrupt_summary_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "timeline.jsonl").write_text("")
    (run / "summary.json").write_text('{"asp": {"throughput": 1')
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "summary.json: not valid JSON" in err and "delete it" in err and "Traceback" not in err


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_respect_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        write_text_atomic(tmp_path / "b.txt", "y")
    finally:
        os.umask(old)
    for name in ("a.json", "b.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


SIM = ["workload.type=synthetic", "workload.num_prompts=32", "workload.epochs=2", "train.group_size=2",
       "train.global_batch_size=8", "train.mini_batch_size=8", "sim.total_devices=8", "sim.rollout_devices=4",
       "sim.infer_tp=1"]


@pytest.mark.parametrize("bad,expect", [
    (["sim.sweep_devices=[0,-4]"], "sim.sweep_devices: 0 is not a device count"),
    (["sim.infer_tp=3", "sim.rollout_devices=4"], "sim.infer_tp: 3 does not divide sim.rollout_devices=4"),
    (["sim.policies=[asp,nope]"], "sim.policies: unknown 'nope'"),
    (["sim.sweep_rollout_devices=[9]"], "sim.sweep_rollout_devices: 9 must be"),
])
def test_simulate_checks_every_key_before_any_output(tmp_path, capsys, bad, expect):
    out = tmp_path / "sim"
    assert main(["simulate", str(_empty_yaml(tmp_path)), f"output_dir={out}", *SIM, *bad]) == 2
    err = capsys.readouterr().err
    assert expect in err and "sim.rollout_devices: -1" not in err and "Traceback" not in err
    assert not out.exists()  # nothing written, not even an empty folder
