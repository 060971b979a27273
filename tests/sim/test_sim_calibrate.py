"""`asp simulate --calibrate`: recover known coefficients from a simulated run's timeline."""
from __future__ import annotations

import numpy as np
import pytest

from asp_ascend.errors import DataError
from asp_ascend.metrics.timeline import Timeline
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.sim.calibrate import calibrate_run, fit_timeline
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec

TRUE = CostModel(decode_a=0.02, decode_b=3.5e-8, decode_c=1e-4, prefill_per_token=8e-5)


def _run(cm, seed=0):
    rng = np.random.default_rng(seed)
    J, G, R = 400, 4, 4
    mean = np.exp(rng.normal(np.log(300), 0.8, J))
    resp = np.clip(np.rint(mean[:, None] * np.exp(0.3 * rng.standard_normal((J, G)))), 2, 4000).astype(np.int64)
    jobs = SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // 32, mini_batch=(np.arange(J) % 32) // 8, instance=np.arange(J) % R,
                   dispatch_rank=np.arange(J), prompt_length=rng.integers(50, 500, J), resp=resp)
    tr = TrainerSpec(1e-4, 0.5, 0.7, 8, "padded")
    return Engine(jobs, num_instances=R, cost=cm, max_num_seqs=32, kv_capacity=0, trainer=tr, lag_bound=1,
                  shared_queue=True).run()


def test_sim_calibrate_recovers_known_coefficients(tmp_path):
    tl = _run(TRUE)
    run = tmp_path / "run"
    tl.write_jsonl(run / "timeline.jsonl")          # what a real run leaves behind
    fit = calibrate_run(run)
    assert fit["decode_a"] == pytest.approx(TRUE.decode_a, rel=0.05)
    assert fit["decode_b"] == pytest.approx(TRUE.decode_b, rel=0.35)
    assert fit["decode_c"] == pytest.approx(TRUE.decode_c, rel=0.35)
    assert fit["prefill_per_token"] == pytest.approx(TRUE.prefill_per_token, rel=0.25)
    assert fit["train_per_token"] == pytest.approx(1e-4, rel=1e-6)
    assert fit["train_per_step"] == pytest.approx(0.5, rel=1e-6)
    assert fit["sync_s"] == pytest.approx(0.7, rel=1e-9)
    # the check that matters: simulating with the fitted model reproduces the measured run
    refit = CostModel(decode_a=fit["decode_a"], decode_b=fit["decode_b"], decode_c=fit["decode_c"],
                      prefill_per_token=fit["prefill_per_token"])
    t_true = tl.frame("sync")["t_end"].max()
    t_fit = _run(refit).frame("sync")["t_end"].max()
    assert t_fit == pytest.approx(t_true, rel=0.03)


def test_sim_calibrate_distinguishes_models():
    slow = CostModel(decode_a=0.05, decode_b=1e-7, decode_c=3e-4, prefill_per_token=8e-5)
    a = fit_timeline(_run(TRUE))
    b = fit_timeline(_run(slow))
    assert b["decode_a"] > 2 * a["decode_a"]


def test_sim_calibrate_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="timeline.jsonl"):
        calibrate_run(tmp_path)
    with pytest.raises(DataError, match="no request events"):
        fit_timeline(Timeline())


def test_sim_calibrate_cli_simulates_with_fitted_model(tmp_path):
    from pathlib import Path

    from asp_ascend.cli import main

    run = tmp_path / "run"
    _run(TRUE).write_jsonl(run / "timeline.jsonl")
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
