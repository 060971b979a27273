"""benchmarks/bench_tail_model.py: its columns are what they say, on a small real run: the run's
figures recomputed from the timeline another way, the model's from TailModel's own methods, and
the model the planner's (its rooms are the plan's)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail_model as btm  # noqa: E402
import tail_common as tc  # noqa: E402


@pytest.fixture(scope="module")
def run():
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import planned_tail_models, simulate_system

    data = tc.ROOT.parent / "shared" / "data"
    w = workload_from_config(tc._cfg("reasoning", data, 1024, 32, {}))
    cfg = tc._cfg("reasoning", data, 1024, 32, {**tc.ASP_DEFAULTS, "seed": 1})
    res = simulate_system(cfg, w, "asp", record_samples=True)
    models = planned_tail_models(cfg, w, "asp")
    return res, models, btm.per_iteration(res, models, cfg.pipeline.lag_bound), cfg.pipeline.lag_bound


def held_over(req, instance, t0, t1):
    """Mean sequences on ``instance`` over [t0, t1], by sweeping its admit / finish events."""
    on = req[req["instance"] == instance]
    ev = sorted([(t, 1) for t in on["t_admit"]] + [(t, -1) for t in on["t_finish"]])
    held, last, area = 0, t0, 0.0
    for t, d in ev:
        if t > t0:
            area += held * (min(t, t1) - last)
            last = min(t, t1)
        if t >= t1:
            break
        held += d
    return (area + held * (t1 - last)) / (t1 - t0)


def test_the_runs_columns_come_from_its_timeline(run):
    res, _, rows, _ = run
    req, step = res.timeline.frame("request"), res.timeline.frame("step")
    ends = step.groupby("iteration")["t_end"].max().to_numpy()
    assert len(rows) == ends.size == 4                 # 1024 prompts, 256 an iteration
    for r in rows:
        i = r["iteration"]
        mine = req[req["iteration"] == i]
        groups = mine.groupby(["epoch", "prompt_id"])
        lat = groups["t_finish"].max() - groups["t_admit"].min()
        assert r["latency"][1] == pytest.approx(lat.max())
        assert r["period"][1] == pytest.approx(ends[i] - (ends[i - 1] if i else 0.0))
        assert r["after"][1] == pytest.approx(ends[i] - mine["t_finish"].max()) and r["after"][1] >= 0
        assert r["chained"][1] == pytest.approx((lat.max() + r["after"][1]) / 2)    # k = 1
        top = mine[mine.set_index(["epoch", "prompt_id"]).index == lat.idxmax()]
        beside = held_over(req, top["instance"].iloc[0], top["t_admit"].min(), top["t_finish"].max())
        assert r["batch"][1] == pytest.approx(beside, rel=1e-6)
        assert 8 <= r["batch"][1] <= 256               # the group's own 8 at least, max_num_seqs at most


def test_the_models_columns_are_what_tail_model_reports(run):
    _, models, rows, k = run
    assert len(models) == 1 and models[0].loads.first == 0
    tm = models[0]
    for r in rows:
        i = r["iteration"]
        L, p, ctx = tm.loads.longest[i], tm.loads.longest_prompt[i], tm.loads.context[i]
        per, _, lost = tm.best(i, float(L), float(p), float(tm.loads.tails[i]))
        assert r["period"][0] == pytest.approx(per)
        assert r["batch"][0] == tm.batch(i, per, lost)
        assert r["latency"][0] == pytest.approx(float(tm.latency(L, p, tm.batch(i, per, lost), ctx)))
        assert r["after"][0] is None                   # the model has no trainer-after term
    c = btm.cell(rows, k)
    assert c["steady"] == (2, 2) and c["first"] == rows[0]["period"]
    assert c["period"] == rows[2]["period"]


def test_plan_tail_model_is_the_model_the_planner_sizes_rooms_with():
    """Every group's planned room under tail auto is the one plan_tail_model's TailModel gives it."""
    from asp_ascend.scheduler.cost import CostModel
    from asp_ascend.scheduler.planner import plan, plan_tail_model

    rng = np.random.default_rng(3)       # busy instances, a few long groups: rooms 8, 16, 72
    n, S = 1024, 256
    pred = rng.lognormal(6.5, 0.4, n)
    pred[rng.choice(n, 12, replace=False)] = 2500.0
    plen = rng.lognormal(4.6, 0.3, n)
    kw = dict(group_size=8, mini_batch_size=32, num_instances=16, max_num_seqs=S, lag_bound=1,
              cost=CostModel(train_per_token=1e-7, logprob_per_token=0.0, train_per_step=0.01, sync_s=0.1),
              group_max_factor=1.2, max_response_length=9000)
    df = plan(np.arange(n), pred, plen, global_batch_size=128, tail="auto", seed=5, **kw)
    tm = plan_tail_model(df["iteration"].to_numpy(), pred, plen, **kw)
    L = np.minimum(pred * 1.2, 9000)
    want = [tm.room(i, L[j], plen[j]) if tm.is_tail(i, L[j], plen[j]) else S
            for j, i in enumerate(df["iteration"].to_numpy())]
    got = np.where(df["room"].to_numpy() > 0, df["room"].to_numpy(), S)
    assert (got == np.array(want)).all() and len(set(got[got < S])) > 1


def test_table_prints_min_to_max_over_seeds(capsys):
    btm.main(["--prompts", "1024", "--devices", "32", "--plan-seeds", "0", "1"])
    out = capsys.readouterr().out
    assert "iterations 2-2" in out
    rows = {r.split("|")[1].strip(): r.split("|")[2:4] for r in out.splitlines() if r.startswith("| ") and "---" not in r}
    assert set(rows) - {""} == {label for label, _ in btm.ROWS}
    assert rows["trainer after the last group (s)"][0].strip() == "-"
    lo, hi = (float(x) for x in rows["period (s)"][1].split(".."))
    assert lo < hi
