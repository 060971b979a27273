"""`asp train` and its output_dir: a run already there is never mixed with a new one; a resume
compares the command with the run's saved config; Ctrl-C names the checkpoint and the command.

Without Ray or vLLM: every check here runs before `asp train` starts anything."""
import json
from pathlib import Path

import pytest

from asp_ascend.cli import main
from asp_ascend.config import load_config, run_config, save_resolved
from asp_ascend.errors import ConfigError
from asp_ascend.pipeline import checkpoint as ck
from asp_ascend.pipeline.rundir import check_run_dir, clear_run, interrupted_message, resolve_resume

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu_tiny_grpo.yaml"
FIRST = ["rollout.num_instances=1", "train.max_iterations=3", "train.checkpoint_every=1"]


def _checkpoint(root: Path, v: int) -> Path:
    def write(tmp: Path):
        for name in ("config.json", "model.safetensors", "optimizer.pt", "rng.pt"):
            (tmp / name).write_bytes(b"{}" if name.endswith(".json") else b"\0" * 16)
        (tmp / "trainer_state.json").write_text(json.dumps({"schema_version": 1, "version": v}))
    return ck.save(root, v, write, ck.run_state([], v, 8))


def _interrupted_run(out: Path, overrides=FIRST) -> Path:
    """What an `asp train` stopped after 3 iterations leaves: config, schedule, rows, a checkpoint."""
    cfg = load_config(CONFIG, overrides + [f"output_dir={out}"])
    save_resolved(cfg, out)
    (out / "schedule.parquet").write_bytes(b"PAR1")
    (out / "metrics.jsonl").write_text('{"iteration": 0}\n')
    (out / "instances.jsonl").write_text('{"instance": 0}\n')
    return _checkpoint(out / "checkpoints", 3)


def test_new_run_into_a_finished_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    _interrupted_run(out)
    (out / "summary.json").write_text("{}")
    assert main(["train", str(CONFIG), f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "already holds a finished run (summary.json)" in err
    assert "resume=true" in err and "overwrite=true" in err
    assert (out / "metrics.jsonl").read_text() == '{"iteration": 0}\n'  # nothing touched


def test_new_run_into_an_interrupted_run_names_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    _interrupted_run(out)
    with pytest.raises(ConfigError, match=r"an interrupted run \(its newest checkpoint is checkpoints/iter_000003\)"):
        check_run_dir(load_config(CONFIG, [f"output_dir={out}"]))


def test_an_empty_dir_is_not_a_run(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}"]))


def test_a_schedule_from_asp_schedule_with_the_same_config_is_followed(tmp_path, capsys):
    """`asp schedule` then `asp train` into the same output_dir: the run plans the same schedule
    (the planner is deterministic), so it may go ahead; keys that do not change the plan may differ."""
    assert main(["schedule", str(CONFIG), f"output_dir={tmp_path}"]) == 0
    check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}"]))
    check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}", "logging.tensorboard=false",
                                       "train.max_iterations=5"]))


def test_a_schedule_planned_with_another_config_is_not_replaced_silently(tmp_path, capsys):
    assert main(["schedule", str(CONFIG), f"output_dir={tmp_path}", "train.global_batch_size=32"]) == 0
    before = (tmp_path / "schedule.parquet").read_bytes()
    assert main(["train", str(CONFIG), f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "holds a schedule" in err and "train.global_batch_size: 32 there, 16 now" in err
    assert "overwrite=true" in err and "Traceback" not in err
    assert (tmp_path / "schedule.parquet").read_bytes() == before  # nothing touched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "schedule.parquet", "schedule_report.json"]
    check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}", "overwrite=true"]))  # the way out it names


def test_a_schedule_without_its_config_is_not_replaced_silently(tmp_path):
    (tmp_path / "schedule.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match="without the config.yaml it was planned with"):
        check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}"]))


def test_resume_and_overwrite_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="resume / overwrite: both are true"):
        check_run_dir(load_config(CONFIG, [f"output_dir={tmp_path}", "resume=true", "overwrite=true"]))


def test_overwrite_deletes_the_old_runs_files_only(tmp_path):
    out = tmp_path / "run"
    _interrupted_run(out)
    (out / "previous" / "attempt_1").mkdir(parents=True)
    (out / "gantt.png").write_bytes(b"png")
    (out / "my_notes.txt").write_text("mine")
    check_run_dir(load_config(CONFIG, [f"output_dir={out}", "overwrite=true"]))
    gone = clear_run(out)
    assert {"config.yaml", "metrics.jsonl", "instances.jsonl", "checkpoints", "previous", "gantt.png"} <= set(gone)
    assert sorted(p.name for p in out.iterdir()) == ["my_notes.txt"]


def test_resume_refuses_changes_to_what_is_trained_or_scheduled(tmp_path, capsys):
    out = tmp_path / "run"
    _interrupted_run(out)
    rc = main(["train", str(CONFIG), f"output_dir={out}", "resume=true", "rollout.temperature=0.5",
               "rollout.num_instances=2", "logging.progress=false"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "rollout.temperature: the run was made with 1.0, this command asks for 0.5" in err
    assert "rollout.num_instances: the run was made with 1, this command asks for 2" in err
    assert "logging.progress" not in err  # safe: not refused
    assert not (out / "previous").exists()


def test_resume_keeps_saved_values_the_command_leaves_out(tmp_path):
    out = tmp_path / "run"
    _interrupted_run(out, FIRST + ["rollout.temperature=0.7"])
    overrides = ["resume=true", f"output_dir={out}", "logging.progress=false", "rollout.request_timeout_s=30"]
    res = resolve_resume(load_config(CONFIG, overrides), overrides)
    c = res.cfg
    assert c.train.max_iterations == 3 and c.rollout.temperature == 0.7 and c.rollout.num_instances == 1
    assert c.logging.progress is False and c.rollout.request_timeout_s == 30 and c.resume is True
    assert res.changed == {"logging.progress": (True, False), "rollout.request_timeout_s": (600.0, 30.0)}
    assert res.kept["train.max_iterations"] == (3, 0) and res.kept["rollout.temperature"] == (0.7, 1.0)
    # extending a run stopped by train.max_iterations is allowed
    more = overrides + ["train.max_iterations=0"]
    assert resolve_resume(load_config(CONFIG, more), more).cfg.train.max_iterations == 0


def test_resume_without_a_saved_config(tmp_path):
    with pytest.raises(ConfigError, match="config.yaml does not exist"):
        resolve_resume(load_config(CONFIG, [f"output_dir={tmp_path}", "resume=true"]), [])


def test_each_attempt_writes_its_resolved_config(tmp_path):
    """The new attempt's config.yaml says resume: true and holds the values it ran with; the
    interrupted attempt's config moves to previous/attempt_1/."""
    from asp_ascend.pipeline.rundir import prepare_outputs

    out = tmp_path / "run"
    _interrupted_run(out)
    overrides = ["resume=true", f"output_dir={out}", "rollout.request_timeout_s=30"]
    cfg = resolve_resume(load_config(CONFIG, overrides), overrides).cfg
    prepare_outputs(cfg, out, ck.find_resume(out))
    now, before = run_config(out), run_config(out / "previous" / "attempt_1")
    assert now.resume is True and now.rollout.request_timeout_s == 30 and now.train.max_iterations == 3
    assert before.resume is False and before.rollout.request_timeout_s == 600
    assert (out / "previous" / "attempt_1" / "instances.jsonl").is_file() and not (out / "instances.jsonl").exists()


def test_ctrl_c_message_names_the_checkpoint_and_the_resume_command(tmp_path):
    out = tmp_path / "run"
    path = _interrupted_run(out)
    msg = interrupted_message("configs/x.yaml", [f"output_dir={out}", "seed=1", "resume=true"], out)
    assert str(path) in msg
    assert f"asp train configs/x.yaml output_dir={out} seed=1 resume=true" in msg
    msg = interrupted_message("configs/x.yaml", ["a b=1"], tmp_path / "none")
    assert "no checkpoint was written" in msg and "asp train configs/x.yaml 'a b=1' overwrite=true" in msg
