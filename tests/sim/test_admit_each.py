"""``admit_each_s``: an instance hands its admissions to its engine one at a time, each taking
``admit_each_s`` (the runtime's ``submit`` calls run one after another); fitted from the gaps
between the admission stamps of a burst (``sim/calibrate._burst_gaps``)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asp_ascend.metrics.timeline import Timeline
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.calibrate import _burst_gaps, fit_timeline
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.replay import replay

CM = CostModel(decode_a=0.01, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)   # 10 ms a step


def _jobs(J: int, per_iteration: int, G: int = 2, L: int = 10) -> SimJobs:
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.arange(J) // per_iteration, mini_batch=np.zeros(J, np.int64),
                   instance=np.zeros(J, np.int64), dispatch_rank=np.arange(J), prompt_length=np.full(J, 5),
                   resp=np.full((J, G), L, np.int64))


def _run(each: float, group_slots: bool = True, iterations: int = 1):
    """Sync mode, one instance, iterations of 4 groups of 2 samples x 10 tokens, all admitted at once."""
    jobs = _jobs(4 * iterations, 4)
    tr = TrainerSpec(0.0, 0.05, 0.02, 64, "padded", admit_each_s=each)
    st = ExecutionSettings(policy="asp", num_instances=1, max_num_seqs=8, lag_bound=0, sync_mode=True,
                           group_size=2)
    return Engine(jobs, st, cost=CM, kv_capacity=0, trainer=tr, stream_train=False, group_slots=group_slots).run()


def _groups(tl) -> pd.DataFrame:
    return tl.frame("request").groupby("prompt_id").agg(ta=("t_admit", "min"), first=("t_first_token", "min"),
                                                         fin=("t_finish", "max"))


@pytest.mark.parametrize("group_slots", [True, False])
def test_each_admission_of_a_burst_reaches_the_engine_one_hand_over_later(group_slots):
    """4 groups admissible at t = 0, 10 ms steps, 10 tokens each. Without the term they all start
    at 0 and finish at 0.1 s. With 16 ms a hand-over, group k is stamped at 16k ms and may start at
    the first step boundary at or after 16(k + 1) ms: group 0 at 16 ms (the instance is idle), then
    the instance steps at 26, 36, 46, 56, 66 ms, so group 1 (ready at 32) starts at 36, group 2 (48)
    at 56, group 3 (64) at 66; each finishes 10 steps after its start."""
    g = _groups(_run(0.0, group_slots))
    assert g["ta"].tolist() == [0.0] * 4 and g["fin"].tolist() == pytest.approx([0.1] * 4)
    g = _groups(_run(0.016, group_slots))
    assert g["ta"].tolist() == pytest.approx([0.0, 0.016, 0.032, 0.048])
    assert g["first"].tolist() == pytest.approx([0.026, 0.046, 0.066, 0.076])
    assert g["fin"].tolist() == pytest.approx([0.116, 0.136, 0.156, 0.166])


def test_the_fit_recovers_the_hand_over_from_a_simulated_run():
    tl = _run(0.016, iterations=3)
    fit = fit_timeline(tl)
    assert fit["admit_each_s"] == pytest.approx(0.016, abs=1e-12)
    assert fit_timeline(_run(0.0, iterations=3))["admit_each_s"] == 0.0
    # the replay with the fitted term (and the run's decode costs: this toy run's first tokens share
    # no step boundary with any finish, so the step reconstruction has little to fit them from)
    # stamps and finishes each iteration's groups as the run did (times from the iteration's first
    # admission: the trainer's fitted terms move the iterations' starts)
    fit = dict(fit, decode_a=0.01, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)
    rep = replay(tl, fit, max_num_seqs=8, lag_bound=0, sync_mode=True)
    a, b = _in_iteration(tl), _in_iteration(rep)
    assert b["ta"].to_numpy() == pytest.approx(a["ta"].to_numpy(), abs=1e-9)
    assert b["fin"].to_numpy() == pytest.approx(a["fin"].to_numpy(), abs=1e-9)
    assert a["fin"].max() == pytest.approx(0.166)
    # ... and without it (the replay before the term) every group finishes 0.1 s after the first admission
    short = _in_iteration(replay(tl, dict(fit, admit_each_s=0.0), max_num_seqs=8, lag_bound=0, sync_mode=True))
    assert short["fin"].to_numpy() == pytest.approx([0.1] * 12) and short["ta"].max() == 0.0


def _in_iteration(tl) -> pd.DataFrame:
    """Per group: admission and finish, from its iteration's first admission."""
    r = tl.frame("request")
    g = r.groupby("prompt_id").agg(it=("iteration", "first"), ta=("t_admit", "min"), fin=("t_finish", "max"))
    t0 = g.groupby("it")["ta"].transform("min")
    return pd.DataFrame({"ta": g["ta"] - t0, "fin": g["fin"] - t0}).sort_index()


def _req(pid, it, ta, tf, version=0):
    return dict(epoch=0, iteration=it, instance=0, prompt_id=pid, sample=0, admission_version=version, t_admit=ta,
                t_first_token=ta + 0.001, t_finish=tf, prompt_length=4, response_length=2)


def test_burst_gaps_leave_out_admissions_that_waited_for_something():
    """Gaps between consecutive admissions count only where the later group was admissible at the
    earlier stamp: p0 -> p1 (7 ms) counts; p1 -> p2 has p0's finish between them (a freed slot);
    p2 -> p3 a weight sync's end; p3 -> p4 an optimizer step's start; p4 -> p5 a tail event;
    p5 -> p6 counts (9 ms); p6 -> p7: p7 is of iteration 2, beyond the lag bound of version 0."""
    rows = [_req("p0", 0, 0.000, 0.010), _req("p1", 0, 0.007, 0.9), _req("p2", 0, 0.020, 0.9),
            _req("p3", 1, 0.100, 0.9, 1), _req("p4", 1, 0.200, 0.9, 1), _req("p5", 1, 0.300, 0.9, 1),
            _req("p6", 1, 0.309, 0.9, 1), _req("p7", 3, 0.400, 0.9, 2)]
    req = pd.DataFrame(rows)
    syncs = pd.DataFrame({"t_start": [0.05, 0.35], "t_end": [0.06, 0.36], "version": [1, 2]})
    steps = pd.DataFrame({"t_start": [0.15], "t_end": [0.16]})
    tail = pd.DataFrame({"t": [0.25], "instance": [0]})
    # lag bound 1 (iteration 3 admitted at version 2): p6 -> p7 is in the lag bound of version 2, but
    # that version arrived (0.36) between the two stamps, so it is left out as a sync end
    assert _burst_gaps(req, syncs, tail, steps) == pytest.approx([0.007, 0.009])
    # the same without the sync of version 2: p7 (iteration 3) is beyond version 1 + lag 1
    assert _burst_gaps(req, syncs.iloc[:1], tail, steps) == pytest.approx([0.007, 0.009])
    assert _burst_gaps(req, syncs.iloc[:1], pd.DataFrame(), steps) == pytest.approx([0.007, 0.1, 0.009])


def test_simulate_calibrate_fits_and_uses_admit_each_s(simulate_calibrated):
    cal, used = simulate_calibrated(_run(0.016, iterations=3))
    assert cal["admit_each_s"] == pytest.approx(0.016, abs=1e-12)
    assert used["admit_each_s"] == pytest.approx(0.016, abs=1e-12)


def test_cost_admit_each_s_is_validated(empty_yaml):
    from asp_ascend.config import load_config
    from asp_ascend.errors import ConfigError

    assert load_config(empty_yaml, []).cost.admit_each_s == 0.0
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["cost.admit_each_s=-0.01"])
    assert "cost.admit_each_s: -0.01 must be >= 0" in str(ei.value)
