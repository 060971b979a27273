"""``admit_engine_s``: what an admission costs its instance's engine (the runtime's hand-over runs
on the instance's core). The step fit finds it as a fifth column, admissions stamped per
interval (``sim/decode_fit.py``); the simulator charges it when the admitted group's sequences
start beside running ones (``sim/instances.py``)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.metrics.timeline import Timeline
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.calibrate import fit_timeline
from asp_ascend.sim.decode_fit import fit_decode_steps, step_intervals
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec


def _hand_made(adm: float, a: float = 0.008, c: float = 5e-4, groups: int = 40, G: int = 4, seed: int = 0):
    """One instance stepping by hand: group g is stamped in the middle of step 5g and its G
    sequences (random lengths) join in step 5g + 1 (first token at its end); step q takes
    ``a + c * (running) + adm * (stamps in it)``."""
    rng = np.random.default_rng(seed)
    join = np.repeat(1 + 5 * np.arange(groups), G)
    L = rng.integers(2, 40, size=groups * G)
    last = join + L - 1                           # the step whose end is the sequence's finish
    Q = int(last.max()) + 1
    n = np.array([int(((join <= q) & (last >= q)).sum()) for q in range(Q)])
    stamps = np.bincount(5 * np.arange(groups), minlength=Q)[:Q]
    d = a + c * n + adm * stamps
    T = np.concatenate([[0.0], np.cumsum(d)])     # step q spans [T[q], T[q + 1]]
    t_admit = np.repeat(T[5 * np.arange(groups)] + d[5 * np.arange(groups)] / 2, G)
    return pd.DataFrame({"instance": 0, "epoch": 0, "prompt_id": [f"p{g}" for g in np.repeat(np.arange(groups), G)],
                         "t_admit": t_admit, "t_first_token": T[join + 1], "t_finish": T[last + 1],
                         "response_length": L, "prompt_length": 5})


def test_the_step_fit_recovers_a_known_admission_cost():
    req = _hand_made(0.003)
    iv, conflicts = step_intervals(req)
    assert conflicts == 0 and iv["A"].sum() == 39        # every stamp but the first (the idle step 0)
    fit = fit_decode_steps(req, pd.DataFrame())
    assert fit["admit_engine_s"] == pytest.approx(0.003, rel=1e-6)
    assert fit["decode_a"] == pytest.approx(0.008, rel=1e-6)
    assert fit["decode_c"] == pytest.approx(5e-4, rel=1e-6)
    assert fit_decode_steps(_hand_made(0.0), pd.DataFrame())["admit_engine_s"] == pytest.approx(0.0, abs=1e-9)


def _timeline(req: pd.DataFrame) -> Timeline:
    tl = Timeline()
    tl.extend("request", req.assign(iteration=0, admission_version=0,
                                    sample=req.groupby("prompt_id").cumcount()).to_dict("records"))
    return tl


def _burst_first(h: float, a: float = 0.008, c: float = 5e-4, groups: int = 10, G: int = 4, seed: int = 0):
    """A sync run's burst as the runtime hands it over (one submit call before the engine's first
    step): groups stamped ``h`` apart on an idle instance, all sequences joining the step that starts
    after the last hand-over; steps of ``a + c * (running)``. No stamp lies in an interval with
    sequences running through it."""
    rng = np.random.default_rng(seed)
    L = rng.integers(2, 40, size=groups * G)
    Q = int(L.max())
    n = np.array([int((L > q).sum()) for q in range(Q)])
    T = groups * h + np.concatenate([[0.0], np.cumsum(a + c * n)])
    return pd.DataFrame({"instance": 0, "epoch": 0, "prompt_id": [f"p{g}" for g in np.repeat(np.arange(groups), G)],
                         "t_admit": np.repeat(h * np.arange(groups), G), "t_first_token": T[1], "t_finish": T[L],
                         "response_length": L, "prompt_length": 5})


def test_admissions_the_step_fit_cannot_see_cost_their_hand_over():
    """A run whose admissions all land before its instance steps (the sync runs on the CPU default
    since an instance's burst is one ``submit_many`` call) leaves the step fit's admission column
    empty: the fit then takes the hand-over (``admit_each_s``, the runtime holds the engine lock for
    it) as the admission's engine cost instead of 0, which priced every busy admission of an async
    run as free."""
    req = _burst_first(0.004)
    assert step_intervals(req)[0]["A"].sum() == 0
    fit = fit_timeline(_timeline(req))
    assert fit["admit_each_s"] == pytest.approx(0.004) and fit["admit_engine_s"] == pytest.approx(0.004)
    assert fit["decode_admissions"] == 0 and fit["admit_engine_from"] == "handover"
    assert fit["decode_a"] == pytest.approx(0.008, rel=1e-6) and fit["decode_c"] == pytest.approx(5e-4, rel=1e-6)
    # a run with admissions in its fitted intervals keeps the fitted cost
    fit = fit_timeline(_timeline(_hand_made(0.003)))
    assert fit["decode_admissions"] >= 8 and fit["admit_engine_from"] == "steps"
    assert fit["admit_engine_s"] == pytest.approx(0.003, rel=1e-6)


CM = CostModel(decode_a=0.01, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)   # 10 ms a step


def _sim(engine_s: float, each: float = 0.016, groups: int = 4, iterations: int = 1):
    """Sync mode, one instance, iterations of ``groups`` groups of 2 samples x 10 tokens, admissible
    at once."""
    J = groups * iterations
    jobs = SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // groups, mini_batch=np.zeros(J, np.int64),
                   instance=np.zeros(J, np.int64), dispatch_rank=np.arange(J),
                   prompt_length=np.full(J, 5), resp=np.full((J, 2), 10, np.int64))
    tr = TrainerSpec(0.0, 0.05, 0.02, 64, "padded", admit_each_s=each, admit_engine_s=engine_s)
    st = ExecutionSettings(policy="asp", num_instances=1, max_num_seqs=8, lag_bound=0, sync_mode=True, group_size=2)
    return Engine(jobs, st, cost=CM, kv_capacity=0, trainer=tr, stream_train=False, group_slots=True).run()


def _run(engine_s: float, each: float = 0.016, groups: int = 4):
    req = _sim(engine_s, each, groups).frame("request")
    return req.groupby("prompt_id").agg(ta=("t_admit", "min"), first=("t_first_token", "min"), fin=("t_finish", "max"))


def test_an_admission_beside_running_sequences_stalls_the_engine():
    """Hand-overs of 16 ms (tests/sim/test_admit_each.py: first tokens at 26, 46, 66, 76 ms without
    an engine cost). With 5 ms a busy admission: group 0 starts on the idle instance at 16 ms (no
    stall), first token 26; steps end at 26, 36; group 1 (ready 32) starts at 36 and stalls the
    engine 5 ms: first token 51; group 2 (ready 48) starts at 51: 66; group 3 (ready 64) at 66: 81.
    Every group's remaining steps are 10 ms, after the stalls that fall in its life."""
    g = _run(0.0)
    assert g["first"].tolist() == pytest.approx([0.026, 0.046, 0.066, 0.076])
    g = _run(0.005)
    assert g["ta"].tolist() == pytest.approx([0.0, 0.016, 0.032, 0.048])
    assert g["first"].tolist() == pytest.approx([0.026, 0.051, 0.066, 0.081])
    assert g["fin"].tolist() == pytest.approx([0.131, 0.151, 0.161, 0.171])
    # one group alone never starts beside another: nothing is charged
    assert _run(0.005, groups=1)["fin"].tolist() == pytest.approx(_run(0.0, groups=1)["fin"].tolist())
    # without hand-overs the burst starts at one boundary: the first group is free, the other three stall
    assert _run(0.005, each=0.0)["first"].tolist() == pytest.approx([0.025] * 4)


def test_simulate_calibrate_stores_and_uses_admit_engine_s(simulate_calibrated, monkeypatch):
    from asp_ascend.sim import calibrate

    fitted = calibrate.fit_timeline
    monkeypatch.setattr(calibrate, "fit_timeline", lambda tl, *a, **k: dict(fitted(tl, *a, **k), admit_engine_s=0.004))
    cal, used = simulate_calibrated(_sim(0.005, iterations=3))
    assert cal["admit_engine_s"] == pytest.approx(0.004)
    assert used["admit_engine_s"] == pytest.approx(0.004)


def test_cost_admit_engine_s_is_validated(empty_yaml):
    from asp_ascend.config import load_config
    from asp_ascend.errors import ConfigError

    assert load_config(empty_yaml, []).cost.admit_engine_s == 0.0
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["cost.admit_engine_s=-0.01"])
    assert "cost.admit_engine_s: -0.01 must be >= 0" in str(ei.value)
