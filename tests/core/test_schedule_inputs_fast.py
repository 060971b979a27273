"""The fast input path of `asp schedule` gives what the reference path gives.

- data/prompt_index.read_prompt_index == datasets.load_prompts (ids, whitespace-token lengths),
  on files it reads itself and on files it must hand to load_prompts (same error);
- predictions from a history whose prompt ids are encoded as positions == from string ids;
- the schedule and report of build_schedule are those of plan() + estimate() on the same inputs.
"""
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_ascend.data.datasets import load_prompts
from asp_ascend.data.prompt_index import _jsonl_columns, read_prompt_index, whitespace_tokens
from asp_ascend.errors import DataError
from asp_ascend.lengths.history import restrict_to
from asp_ascend.lengths.predictors import predict_lengths

SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6)
texts = st.lists(st.one_of(words, st.sampled_from(SPACES)), max_size=12).map("".join)


def test_separator_table_is_str_isspace():
    # every character str.split() separates on (all of them lie below U+3001) is a separator
    # of whitespace_tokens, and no other: one token per non-space character, none per space
    import pyarrow as pa

    chars = [chr(c) for c in range(0x3001) if not 0xD800 <= c < 0xE000]
    counts = whitespace_tokens(pa.array(chars))
    assert counts.tolist() == [len(c.split()) for c in chars]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, min_size=1, max_size=30))
def test_whitespace_tokens_equal_str_split(strings):
    import pyarrow as pa

    assert whitespace_tokens(pa.array(strings, pa.string())).tolist() == [len(s.split()) for s in strings]
    chunked = pa.chunked_array([pa.array(strings[:3], pa.string()), pa.array(strings[3:], pa.string())])
    assert whitespace_tokens(chunked).tolist() == [len(s.split()) for s in strings]


def same_as_reference(path, **keys):
    ref = load_prompts(path, **keys)
    ids, plen = read_prompt_index(path, **keys)
    assert ids.tolist() == ref.ids
    assert plen.tolist() == list(ref.prompt_lengths)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(-10**6, 10**6), st.text(max_size=5)), texts),
                     min_size=1, max_size=25),
       blank=st.booleans(), crlf=st.booleans())
def test_jsonl_fast_path_equals_load_prompts(tmp_path_factory, rows, blank, crlf):
    path = tmp_path_factory.mktemp("p") / "p.jsonl"
    lines = [json.dumps({"prompt": t, **({} if i is None else {"id": i}), "answer": "1"}) for i, t in rows]
    if blank:
        lines.insert(len(lines) // 2, "  ")
    path.write_text(("\r\n" if crlf else "\n").join(lines) + "\n")
    try:
        ref = load_prompts(path)
    except DataError as exc:  # duplicate ids and the like: the same error from both
        with pytest.raises(DataError, match=str(exc).split(":")[-1].strip()[:20]):
            read_prompt_index(path)
        return
    ids, plen = read_prompt_index(path)
    assert ids.tolist() == ref.ids and plen.tolist() == list(ref.prompt_lengths)


def test_jsonl_fast_path_taken_and_declined(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "x  y", "extra": [1, {"b": 2}]}\n{"id": "b", "prompt": " z "}\n')
    assert _jsonl_columns(good, "prompt", "id") is not None
    same_as_reference(good)
    for name, text in [("two_per_line", '{"id": "a", "prompt": "x"} {"id": "b", "prompt": "y"}\n'),
                       ("chat", '{"id": "a", "prompt": [{"role": "user", "content": "hi there"}]}\n'),
                       ("float_id", '{"id": 1.0, "prompt": "x"}\n'),
                       ("bom", '\ufeff{"id": "a", "prompt": "x"}\n'),
                       ("null_prompt", '{"id": "a", "prompt": null}\n')]:
        p = tmp_path / f"{name}.jsonl"
        p.write_text(text)
        assert _jsonl_columns(p, "prompt", "id") is None or name == "null_prompt", name
        try:
            ref = load_prompts(p)
        except DataError as exc:
            with pytest.raises(DataError) as got:
                read_prompt_index(p)
            assert str(got.value) == str(exc)
            continue
        ids, plen = read_prompt_index(p)
        assert ids.tolist() == ref.ids and plen.tolist() == list(ref.prompt_lengths)


def test_parquet_fast_path_equals_load_prompts(tmp_path):
    p = tmp_path / "p.parquet"
    pd.DataFrame({"prompt": ["a b", "\u3000c", "d"], "id": [3, None, 5]}).to_parquet(p)
    same_as_reference(p)
    blank = tmp_path / "blank.parquet"  # an empty prompt: the same error from both
    pd.DataFrame({"prompt": ["a b", "\u3000"], "id": [3, 4]}).to_parquet(blank)
    for read in (load_prompts, read_prompt_index):
        with pytest.raises(DataError, match=r"blank.parquet:row 1: the prompt in 'prompt' is empty"):
            read(blank)
    q = tmp_path / "chat.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "x y"}]], "answer": ["1"]}).to_parquet(q)
    same_as_reference(q)


@pytest.mark.parametrize("method", ["mean", "ema", "quantile", "regression"])
def test_encoded_history_predicts_the_same(method):
    rng = np.random.default_rng(0)
    ids = np.array([f"p{i}" for i in rng.permutation(200)], dtype=object)
    rows = rng.integers(0, 260, 3000)  # some rows of prompts not in the dataset, some prompts unseen
    hist = pd.DataFrame({"prompt_id": [f"p{i}" for i in rows], "epoch": rng.integers(0, 3, 3000),
                         "response_length": rng.integers(1, 4000, 3000),
                         "prompt_length": rng.integers(5, 300, 3000).astype(float)})
    plen = rng.integers(5, 300, ids.size).astype(float)
    by_str = predict_lengths(restrict_to(hist, ids), ids, plen, method)
    by_pos = predict_lengths(restrict_to(hist, ids, encode=True), np.arange(ids.size), plen, method)
    np.testing.assert_array_equal(by_str, by_pos)


def test_build_schedule_equals_plan_and_estimate(tmp_path):
    from asp_ascend.config import load_config
    from asp_ascend.scheduler.cost import CostModel
    from asp_ascend.scheduler.estimate import estimate
    from asp_ascend.scheduler.planner import plan
    from asp_ascend.scheduler.run import build_schedule, inputs_from_config

    rng = np.random.default_rng(1)
    n = 700
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "w " * int(rng.integers(1, 50))}) + "\n"
                            for i in range(n)))
    hist = tmp_path / "h.parquet"
    pd.DataFrame({"prompt_id": [f"q{i}" for i in range(n) for _ in range(4)],
                  "response_length": rng.integers(1, 2000, 4 * n)}).to_parquet(hist)
    cfg = load_config(None, [f"data.path={data}", f"lengths.path={hist}", "lengths.max_response_length=4096",
                             "train.global_batch_size=64", "train.mini_batch_size=16", "train.epochs=2",
                             "rollout.num_instances=3", f"output_dir={tmp_path / 'o'}", "data.prompt_length=words"])
    sched, report = build_schedule(cfg)
    ref = load_prompts(data)
    pred = predict_lengths(load_history_of(hist), ref.ids, ref.prompt_lengths, "mean",
                           default=min(256.0, cfg.lengths.max_response_length))
    cost = CostModel.from_config(cfg.cost)
    # a group's longest sample: E[max of G = 8 mean-one lognormal(0, workload.group_spread = 0.3)] (2e5 draws here)
    z = np.random.default_rng(7).standard_normal((200_000, 8))
    gmf = inputs_from_config(cfg).group_max_factor
    assert gmf == pytest.approx(np.exp(0.3 * z - 0.045).max(axis=1).mean(), rel=0.003)
    frames = []
    for e in range(2):
        frames.append(plan(ref.ids, pred, ref.prompt_lengths, policy=cfg.scheduler.policy, global_batch_size=64,
                           mini_batch_size=16, num_instances=3, max_num_seqs=cfg.rollout.max_num_seqs,
                           lag_bound=1, cost=cost, epoch=e, iteration_offset=e * 11, seed=cfg.seed,
                           tail=cfg.rollout.tail_concurrency, max_response_length=cfg.lengths.max_response_length,
                           group_max_factor=gmf))
    expect = pd.concat(frames, ignore_index=True)
    pd.testing.assert_frame_equal(sched, expect)
    plen = np.tile(ref.prompt_lengths, 2).astype(float)
    est = estimate(expect["iteration"], expect["instance"], expect["mini_batch"],
                   expect["epoch"] * (len(expect) + 1) + expect["dispatch_rank"], np.tile(pred, 2), plen,
                   group_size=8, num_instances=3, max_num_seqs=cfg.rollout.max_num_seqs, lag_bound=1,
                   micro_batch_size=cfg.train.micro_batch_size, cost=cost, group_max_factor=gmf,
                   micro_batching="packed",   # train.micro_batching auto runs packed
                   max_response_length=cfg.lengths.max_response_length,
                   regroup=True, stream=True)    # pipeline.regroup / stream_groups auto: on for asp
    assert cfg.train.micro_batching == "auto"
    assert (cfg.pipeline.regroup, cfg.pipeline.stream_groups) == ("auto", "auto")
    assert report["predicted"]["iteration_time_mean"] == est["iteration_time_mean"]
    assert set(report["baselines"]) == {"fifo", "random", "sorted", "balanced"}


def load_history_of(path):
    from asp_ascend.lengths.history import load_history

    return load_history(path, 4096)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), S=st.sampled_from([16, 64, 256]), k=st.integers(0, 2),
       tail=st.sampled_from(["auto", 24]))
def test_tail_rooms_equal_tail_model_per_group(seed, S, k, tail):
    """The planner sizes all tail rooms at once; TailModel.room / latency / throughput, group by
    group, is the reference."""
    from asp_ascend.scheduler.cost import CostModel
    from asp_ascend.scheduler.planner import _tail_rooms
    from asp_ascend.scheduler.tail import TailModel, iteration_loads

    rng = np.random.default_rng(seed)
    n, G, R = 600, 8, 4
    it = rng.permutation(np.arange(n) % 10)
    pred, plen = np.minimum(rng.lognormal(6, 1.3, n), 16384), rng.lognormal(5, .5, n)
    cost = CostModel()
    work = G * cost.work(plen, pred, S)
    n_mb = np.full(10, 2)
    is_tail, room, eff = _tail_rooms(it, pred, plen, work, n_mb, G=G, S=S, k=k, R=R, cost=cost, tail=tail,
                                     group_max_factor=1.0)
    train = cost.train_time(np.bincount(it, weights=G * (plen + pred)), n_mb) + cost.sync_s
    tm = TailModel(cost, group_size=G, max_num_seqs=S, lag_bound=k, num_instances=R)
    tm = TailModel(cost, group_size=G, max_num_seqs=S, lag_bound=k, num_instances=R,
                   loads=iteration_loads(it, plen, pred, work, train, tail_model=tm))
    for g in np.flatnonzero(is_tail):
        i, ctx = int(it[g]), tm.loads.context[it[g]]
        r = tm.room(i, float(pred[g]), float(plen[g])) if tail == "auto" else min(tail, S)
        assert room[g] == (r if r < S else 0)
        lost = float(tm.latency(pred[g], plen[g], r, ctx)) * (1 - float(tm.throughput(r, ctx) / tm.throughput(S, ctx)))
        assert eff[g] == work[g] + lost / (k + 1)
    assert (room[~is_tail] == 0).all() and (eff[~is_tail] == work[~is_tail]).all()
    # each iteration's target pays for every group it makes a tail (tail.paid_tails)
    assert (np.bincount(it[is_tail], minlength=10) <= tm.loads.tails).all()


def test_report_carries_the_simulators_figures_for_small_workloads():
    """The analytic estimate is not validated beyond the benchmark workloads; for an experiment
    workload the report holds the event simulator's figures (same cost model and instances) for
    the policy and for fifo."""
    from dataclasses import replace

    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.scheduler.run import build_schedule, format_report
    from asp_ascend.sim.run import simulate_system

    cfg = load_config(None, ["workload.type=synthetic", "workload.num_prompts=512", "train.global_batch_size=64",
                             "train.mini_batch_size=16", "rollout.num_instances=4", "pipeline.mode=async",
                             "scheduler.policy=asp", "output_dir=unused"])
    _, report = build_schedule(cfg)
    sim = report["simulated"]
    assert sim["system"] == "asp" and set(sim["systems"]) == {"asp", "fully_async_fifo"}
    same = replace(cfg, sim=replace(cfg.sim, model_class="custom", infer_tp=1, rollout_devices=4,
                                    total_devices=4 + cfg.sim.total_devices - cfg.sim.rollout_devices,
                                    logprob_passes=1))
    direct = simulate_system(same, workload_from_config(cfg), "fully_async_fifo", record_samples=False).summary
    assert sim["systems"]["fully_async_fifo"]["iteration_time_mean"] == direct["iteration_time_mean"]
    assert "asp (simulated)" in format_report(report)
    big = load_config(None, ["workload.type=synthetic", "workload.num_prompts=70000", "train.global_batch_size=64",
                             "train.mini_batch_size=16", "output_dir=unused"])
    from asp_ascend.scheduler.run import inputs_from_config, simulated_figures

    assert simulated_figures(big, inputs_from_config(big)) is None  # past SIMULATE_LIMIT samples


def test_headline_is_the_simulator_where_the_estimate_is_more_than_10_percent_off():
    from asp_ascend.scheduler.run import format_report, headline

    est = {"iteration_time_mean": 10.0, "padding_bubble": 0.0, "skew_bubble": 0.1, "sorting_bubble": 0.0,
           "lower_bound_ratio": 1.2}
    sim = {"asp": {**est, "iteration_time_mean": 9.5}, "fully_async_fifo": {**est, "iteration_time_mean": 20.0}}
    close = {"predicted": est, "simulated": {"system": "asp", "systems": sim}}
    h = headline(close)
    assert h["source"] == "analytic" and h["iteration_time_mean"] == 10.0
    assert h["analytic_over_simulated"] == pytest.approx(10 / 9.5)
    far = {"predicted": {**est, "iteration_time_mean": 1.0}, "realized": est,
           "simulated": {"system": "asp", "systems": {**sim, "asp": {**est, "iteration_time_mean": 8.0}}}}
    h = headline(far)   # the estimate on the true lengths (realized) against the simulator: 10 / 8
    assert h["source"] == "simulator" and h["iteration_time_mean"] == 8.0 and h["system"] == "asp"
    assert h["analytic_over_simulated"] == pytest.approx(1.25)
    assert headline({"predicted": est}) == {"source": "analytic", "analytic_over_simulated": None, **est}
    report = {"num_prompts": 1, "epochs": 1, "iterations": 1, "num_instances": 1, "policy": "asp", "lag_bound": 1,
              "elapsed_s": 0.0, "predictor": "mean", **far, "headline": headline(far)}
    assert "more than 10% off, the event simulator): mean iteration time 8.00 s" in format_report(report)
