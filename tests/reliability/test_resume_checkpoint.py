"""Checkpoints for `asp train ... resume=true`: crash-safe writing, what a resume picks, its plan.

Without Ray or vLLM. The last test saves and restores a real TrainerEngine (torch + transformers).
"""
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.pipeline import checkpoint as ck
from asp_ascend.scheduler.execution import ExecutionSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu_tiny_grpo.yaml"


def _trainer_files(version: int, fail_after: int | None = None):
    """Writes what TrainerEngine.save_checkpoint writes (stand-in bytes); may crash midway."""
    def write(tmp: Path):
        tmp.mkdir(exist_ok=True)
        for n, name in enumerate(("config.json", "model.safetensors", "optimizer.pt", "rng.pt")):
            if fail_after is not None and n == fail_after:
                raise OSError("disk full (injected)")
            (tmp / name).write_bytes(b"{}" if name.endswith(".json") else b"\0" * 16)
        (tmp / "trainer_state.json").write_text(json.dumps({"schema_version": 1, "version": version}))
    return write


def _save(root, v, history=(), **kw):
    return ck.save(root, v, _trainer_files(v, **kw), ck.run_state(list(history), v, 8))


def test_save_then_find_latest_and_load(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 1, [{"prompt_id": "a", "epoch": 0, "response_length": 3}])
    p = _save(root, 2, [{"prompt_id": "a", "epoch": 0, "response_length": 3},
                        {"prompt_id": "b", "epoch": 0, "response_length": 5}])
    assert (root / "latest").read_text().strip() == "iter_000002"
    assert ck.find_latest(root) == p
    res = ck.load(p)
    assert res.version == 2 and [h["prompt_id"] for h in res.history] == ["a", "b"]
    assert not [q for q in root.iterdir() if ".tmp-" in q.name or ".old-" in q.name]
    # re-saving a version (the final save) replaces it whole
    _save(root, 2, [])
    assert ck.load(ck.find_latest(root)).history == []


@pytest.mark.parametrize("fail_after", [0, 1, 2])
def test_crash_mid_write_leaves_previous_checkpoint_valid(tmp_path, fail_after):
    root = tmp_path / "checkpoints"
    good = _save(root, 2)
    with pytest.raises(OSError, match="injected"):
        _save(root, 3, fail_after=fail_after)
    assert not (root / "iter_000003").exists()        # never renamed into place
    assert any(".tmp-" in q.name for q in root.iterdir())  # the half-written folder is left aside...
    assert ck.find_latest(root) == good                # ...and never taken as valid


def test_half_written_folders_are_ignored_even_when_newer(tmp_path):
    root = tmp_path / "checkpoints"
    good = _save(root, 2)
    # a complete-looking temp folder (crash just before the rename)
    tmp = root / f"iter_000004.tmp-{os.getpid() + 1}"
    _trainer_files(4)(tmp)
    (tmp / ck.STATE_FILE).write_text(json.dumps({"version": 4, "history": []}))
    # a renamed folder missing a file, and one whose state file was cut off mid-write
    partial = root / "iter_000005"
    _trainer_files(5)(partial)
    cut = root / "iter_000006"
    _trainer_files(6)(cut)
    (cut / ck.STATE_FILE).write_text('{"version": 6, "histo')
    assert ck.find_latest(root) == good
    # `latest` pointing at a broken folder: fall back to the newest complete one
    (root / "latest").write_text("iter_000006\n")
    assert ck.find_latest(root) == good
    (root / "latest").write_text("../../etc\n")
    assert ck.find_latest(root) == good
    # version mismatch between the trainer's and the driver's state
    (partial / ck.STATE_FILE).write_text(json.dumps({"version": 4, "history": []}))
    assert not ck.is_valid(partial)


def test_the_next_start_removes_stale_save_folders_but_not_one_a_live_process_may_write(tmp_path):
    """``clean_stale_saves`` (run at an attempt's start): every ``*.tmp-*`` folder goes (a crash mid-write,
    the trainer's inner one, this process's own pid: it has not saved yet) unless one of the pids in its
    name is a live process here; complete checkpoints, ``latest`` and files stay."""
    import subprocess

    root = tmp_path / "checkpoints"
    _save(root, 1)
    with pytest.raises(OSError):
        _save(root, 2, fail_after=2)                       # leaves iter_000002.tmp-<this pid>
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        for name in (f"iter_000003.tmp-{gone.pid}", f"iter_000003.tmp-{gone.pid}.tmp-{gone.pid}",
                     f"iter_000004.tmp-{gone.pid}.tmp-{live.pid}", f"iter_000005.tmp-{live.pid}"):
            (root / name).mkdir()
        (root / "notes.tmp-1").write_text("a user's file")
        said: list[str] = []
        removed = sorted(p.name for p in ck.clean_stale_saves(root, said.append))
        assert removed == [f"iter_000002.tmp-{os.getpid()}", f"iter_000003.tmp-{gone.pid}",
                           f"iter_000003.tmp-{gone.pid}.tmp-{gone.pid}"], said
        assert sorted(p.name for p in root.iterdir()) == sorted(["iter_000001", "latest", "notes.tmp-1",
                                                                 f"iter_000004.tmp-{gone.pid}.tmp-{live.pid}",
                                                                 f"iter_000005.tmp-{live.pid}"])
        assert len(said) == 5 and sum(f"process {live.pid} is alive" in m for m in said) == 2, said
    finally:
        live.kill()
        live.wait()
    assert len(ck.clean_stale_saves(root)) == 2 and ck.find_latest(root).name == "iter_000001"
    assert ck.clean_stale_saves(tmp_path / "none") == []


_CRASHING_RESAVE = """
import os, shutil, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_resume_checkpoint import _save
from asp_ascend.pipeline import checkpoint as ck
replace, at = os.replace, sys.argv[3]
def rep(a, b):
    a, b = Path(a), Path(b)
    if at == "new" and ".tmp-" in a.name and b.name == "iter_000002":
        os._exit(3)                                      # the process dies here, nothing cleaned up
    replace(a, b)
def rmtree(p, *args, **kw):
    os._exit(3)                                          # dies before removing the old copy
os.replace = rep
if at == "removal":
    ck.shutil.rmtree = rmtree
_save(Path(sys.argv[1]), 2, [{"prompt_id": "new", "epoch": 0, "response_length": 1}])
"""


@pytest.mark.parametrize("crash_before", ["new", "removal"])
def test_a_re_save_interrupted_between_its_renames_resumes_that_version(tmp_path, crash_before):
    """A re-save of version 2 (the final save) whose process dies after moving the old ``iter_000002``
    aside and before renaming the new one in leaves no ``iter_000002``: the look-up puts the old copy
    back instead of falling back to version 1. Dying after the new one is in place, before the old
    copy is removed, leaves it beside the new one: the next start removes it."""
    import subprocess
    import sys

    root = tmp_path / "checkpoints"
    _save(root, 1)
    _save(root, 2, [{"prompt_id": "old", "epoch": 0, "response_length": 3}])
    r = subprocess.run([sys.executable, "-c", _CRASHING_RESAVE, str(root), str(Path(__file__).parent), crash_before],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    olds = [p.name for p in root.iterdir() if ".old-" in p.name]
    assert len(olds) == 1, sorted(p.name for p in root.iterdir())
    assert (root / "iter_000002").exists() == (crash_before == "removal")
    said: list[str] = []
    if crash_before == "removal":
        ck.clean_stale_saves(root, said.append)
        assert any("removed" in m and olds[0] in m for m in said), said
    found = ck.find_latest(root)
    assert found == root / "iter_000002"
    want = "old" if crash_before == "new" else "new"
    assert [h["prompt_id"] for h in ck.load(found).history] == [want]
    assert not [p for p in root.iterdir() if ".old-" in p.name]


def test_find_resume_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="resume: .*schedule.parquet"):
        ck.find_resume(tmp_path)
    pd.DataFrame({"epoch": [0], "prompt_id": ["a"], "iteration": [0], "mini_batch": [0], "instance": [0],
                  "dispatch_rank": [0], "predicted_length": [1.0]}).to_parquet(tmp_path / "schedule.parquet")
    with pytest.raises(ConfigError, match="resume: no complete checkpoint"):
        ck.find_resume(tmp_path)
    _save(tmp_path / "checkpoints", 1)
    res = ck.find_resume(tmp_path)
    assert res.version == 1 and res.attempt == 1
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    dest = ck.archive_run_files(tmp_path, ["metrics.jsonl", "timeline.jsonl"], res.attempt)
    assert (dest / "metrics.jsonl").is_file() and not (tmp_path / "metrics.jsonl").exists()
    assert ck.find_resume(tmp_path).attempt == 2


def test_trained_history_drops_groups_of_untrained_iterations():
    iters = {2: {0: [(0, "c")]}, 3: {0: [(0, "d")]}}   # an ExecutionPlan's iterations
    hist = [{"epoch": 0, "prompt_id": p, "response_length": 1} for p in "abcd"]
    assert [h["prompt_id"] for h in ck.trained_history(hist, iters, 2)] == ["a", "b"]
    assert [h["prompt_id"] for h in ck.trained_history(hist, iters, 3)] == ["a", "b", "c"]


def _schedule(n_iter=4, per_iter=4, R=2, epochs=1):
    rows = []
    for e in range(epochs):
        for i in range(n_iter):
            for j in range(per_iter):
                it = e * n_iter + i
                rows.append({"epoch": e, "prompt_id": f"p{i}-{j}", "iteration": it, "mini_batch": j // 2,
                             "instance": j % R, "dispatch_rank": it * per_iter + j, "predicted_length": 5.0})
    return pd.DataFrame(rows)


def test_resume_plan_continues_the_saved_schedule(tmp_path):
    sched = _schedule(epochs=2)
    sched.to_parquet(tmp_path / "schedule.parquet")
    (tmp_path / "schedule_report.json").write_text(json.dumps({"shared_queue": False}))
    cfg = load_config(CONFIG, ["rollout.num_instances=2", "pipeline.lag_bound=1"])

    def resume(cfg, start):
        return ck.resume_plan(cfg, ExecutionSettings.from_config(cfg), tmp_path, start)

    plan = resume(cfg, 3)
    assert plan.total_iterations == 5 and plan.start == 3 and sorted(plan.iterations) == [3, 4, 5, 6, 7]
    for i, mbs in plan.iterations.items():
        want = sched[sched["iteration"] == i]
        got = {(m, e, p) for m, keys in mbs.items() for e, p in keys}
        assert got == set(zip(want["mini_batch"], want["epoch"], want["prompt_id"]))
    d = plan.dispatcher
    assert d.adm.published == 3 and d.adm.instance_version == [3, 3]
    assert d.pending() == 20
    job, v = d.next_for(0)
    assert job.iteration == 3 and v == 3
    # max_iterations counts from the start of the run; a finished run has nothing to resume
    cfg2 = load_config(CONFIG, ["rollout.num_instances=2", "train.max_iterations=5"])
    assert resume(cfg2, 3).total_iterations == 2
    with pytest.raises(ConfigError, match="nothing to resume"):
        resume(cfg2, 5)
    with pytest.raises(ConfigError, match="rollout.num_instances=1"):
        resume(load_config(CONFIG, ["rollout.num_instances=1"]), 3)


@pytest.mark.runtime
def test_trainer_state_round_trip(tmp_path):
    """A real TrainerEngine: weights, optimizer, version and RNG come back exactly."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary
    from asp_ascend.engines.trainer import TrainerEngine

    model_dir = build_tiny_model(task_vocabulary(["count 1 to 3 :", "1 2 3"]), tmp_path / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, max_positions=64, seed=0)
    kw = dict(lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=8, temperature=1.0, seed=0)
    tr = TrainerEngine(str(model_dir), **kw)
    ids = tr.tokenizer("count 1 to 3 :", add_special_tokens=False).input_ids
    resp = tr.tokenizer("1 2 3", add_special_tokens=False).input_ids
    sample = {"prompt_ids": ids, "response_ids": resp, "behav_logprobs": [-1.0] * len(resp), "advantage": 1.0}
    tr.begin_iteration(0, 1)
    tr.train_step([sample])
    tr.publish(1)
    root = tmp_path / "checkpoints"
    path = ck.save(root, 1, lambda tmp: tr.save_checkpoint(str(tmp), {"iteration": 1}), ck.run_state([], 1, 4))
    assert ck.find_latest(root) == path and ck.is_valid(path)
    expected_rand = torch.rand(3)

    tr2 = TrainerEngine(str(path), **kw)
    assert tr2.load_checkpoint(str(path)) == 1 and tr2.version == 1
    assert torch.equal(torch.rand(3), expected_rand)  # RNG continues where the checkpoint left it
    for (n, a), (_, b) in zip(tr.model.state_dict().items(), tr2.model.state_dict().items()):
        assert torch.equal(a, b), n
    s1, s2 = tr.opt.state_dict(), tr2.opt.state_dict()
    for key in s1["state"]:
        assert torch.equal(s1["state"][key]["exp_avg"], s2["state"][key]["exp_avg"])
    # the next optimizer step is the same step on both
    tr.begin_iteration(1, 1)
    tr2.begin_iteration(1, 1)
    a, b = tr.train_step([sample]), tr2.train_step([sample])
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    for (n, x), (_, y) in zip(tr.model.state_dict().items(), tr2.model.state_dict().items()):
        assert torch.allclose(x, y, atol=1e-6), n


def test_an_adaptive_run_resumed_before_its_last_epoch_is_planned_re_plans_it(tmp_path):
    """``scheduler.adaptive``: a checkpoint in epoch 0 (version 2) resumes (it was refused) with the run's
    re-planner: the resumed plan re-plans epoch 1 next, from the checkpoint's length history, with the
    call a fresh run makes (scheduler/run.plan_epoch_frame), appended to schedule.parquet."""
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.pipeline.planning import plan_run, resume_replanner
    from asp_ascend.scheduler.run import inputs_from_config, plan_epoch_frame

    cfg = load_config(CONFIG, ["rollout.num_instances=2", "pipeline.lag_bound=1", "scheduler.adaptive=true",
                               "train.epochs=3", f"output_dir={tmp_path}"])
    settings = ExecutionSettings.from_config(cfg)
    train, _ = prompts_from_config(cfg)
    fresh, _ = plan_run(cfg, settings, train, tmp_path)          # epoch 0 alone
    sched0 = pd.read_parquet(tmp_path / "schedule.parquet")
    assert set(sched0["epoch"]) == {0} and fresh.next_epoch == 1
    # the checkpoint's history (driver_state): the rows of iterations 0 and 1, trained
    trained = sched0[sched0["iteration"] < 2]
    history = [{"prompt_id": p, "epoch": 0, "sample": s, "prompt_length": 4, "response_length": 3 + (i * 7 + s) % 40}
               for i, p in enumerate(trained["prompt_id"]) for s in range(cfg.train.group_size)]
    plan = ck.resume_plan(cfg, settings, tmp_path, 2)
    per_epoch = int(sched0["iteration"].max()) + 1
    assert plan.start == 2 and plan.next_epoch == 1 and plan.end == fresh.end == 3 * per_epoch
    assert plan.next_unplanned == per_epoch
    replan = resume_replanner(cfg, settings, train, tmp_path)
    assert replan is not None
    plan.add_epoch(replan(plan.next_epoch, history, plan.next_unplanned))
    sched = pd.read_parquet(tmp_path / "schedule.parquet")
    want = plan_epoch_frame(cfg, inputs_from_config(cfg, train, pd.DataFrame(history)), 1, per_epoch,
                            lag_bound=settings.lag_bound)
    pd.testing.assert_frame_equal(sched[sched["epoch"] == 1].reset_index(drop=True), want.reset_index(drop=True),
                                  check_dtype=False)
    assert plan.next_epoch == 2
    # all epochs planned: nothing to re-plan, the schedule replays
    done = load_config(CONFIG, ["rollout.num_instances=2", "scheduler.adaptive=true", "train.epochs=2",
                                f"output_dir={tmp_path}"])
    assert resume_replanner(done, ExecutionSettings.from_config(done), train, tmp_path) is None
