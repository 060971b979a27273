import logging

import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import DataError
from asp_ascend.lengths.history import load_history, restrict_to
from asp_ascend.lengths.predictors import evaluate, holdout_report, predict_lengths, spearman
from asp_ascend.lengths.workloads import trace_workload, workload_from_config


def hist(rows):
    return pd.DataFrame(rows, columns=["prompt_id", "epoch", "response_length", "prompt_length"])


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_history_formats_roundtrip(tmp_path, suffix):
    df = pd.DataFrame({"prompt_id": ["a", "a", "b"], "response_length": [10, 20, 5], "epoch": [0, 1, 0]})
    p = tmp_path / f"h.{suffix}"
    {"csv": lambda: df.to_csv(p, index=False), "jsonl": lambda: df.to_json(p, orient="records", lines=True),
     "parquet": lambda: df.to_parquet(p)}[suffix]()
    h = load_history(p, 100)
    assert h["prompt_id"].tolist() == ["a", "a", "b"]
    assert h["response_length"].tolist() == [10, 20, 5]
    assert h["sample"].tolist() == [0, 1, 0]  # generated per prompt when absent


@pytest.mark.parametrize("value, match", [
    ("-3", r"h.csv:3: response_length is -3, negative"),
    ("nan", r"h.csv:3: response_length is .*not a number"),
    ("abc", r"h.csv:3: response_length is 'abc', not a number"),
    ("5000", r"h.csv:3: response_length 5000 exceeds lengths.max_response_length=1024"),
])
def test_history_bad_rows_name_file_and_line(tmp_path, value, match):
    p = tmp_path / "h.csv"
    p.write_text(f"prompt_id,response_length\na,10\nb,{value}\n")
    with pytest.raises(DataError, match=match):
        load_history(p, 1024)


@pytest.mark.parametrize("col", [pd.Series([10, 20, 5]), pd.Series([10.0, np.nan, np.inf]),
                                 pd.Series([10, None, 5], dtype="Int64"), pd.Series([True, False, True]),
                                 pd.Series(["10", "x", None], dtype=object), pd.Series(["7", "8", "9"], dtype="string")])
def test_numeric_columns_read_as_to_numeric_reads_them(col):
    """history._numeric skips to_numeric's copy of a numeric column (0.4 s per 10^7 rows): same values, same dtype."""
    from asp_ascend.lengths.history import _numeric

    pd.testing.assert_series_equal(_numeric(col), pd.to_numeric(col, errors="coerce"))


@pytest.mark.parametrize("col, match", [([10.0, np.nan], "response_length is empty, not a number"),
                                        ([10.0, np.inf], "response_length is inf, not a number"),
                                        (pd.array([10, None], dtype="Int64"), "response_length is .*not a number")])
def test_typed_parquet_history_bad_rows(tmp_path, col, match):
    p = tmp_path / "h.parquet"
    pd.DataFrame({"prompt_id": ["a", "b"], "response_length": col}).to_parquet(p)
    with pytest.raises(DataError, match=f"h.parquet: row 1: {match}"):
        load_history(p, 1024)


def test_history_missing_column_and_empty(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("prompt_id,len\na,1\n")
    with pytest.raises(DataError, match="missing column.*response_length"):
        load_history(p)
    p.write_text("prompt_id,response_length\n")
    with pytest.raises(DataError, match="empty"):
        load_history(p)


def test_unknown_prompts_skipped_with_counted_warning(caplog):
    h = hist([("a", 0, 10, 1), ("zz", 0, 5, 1), ("zz", 1, 6, 1), ("b", 0, 3, 1)])
    with caplog.at_level(logging.WARNING):
        kept = restrict_to(h, ["a", "b"], "h.csv")
    assert kept["prompt_id"].tolist() == ["a", "b"]
    assert "skipped 2 row(s) of 1 prompt(s) not in the dataset" in caplog.text


def test_predictors_hand_computed():
    h = hist([("a", 0, 10, 10), ("a", 0, 30, 10), ("a", 1, 40, 10), ("b", 0, 100, 100), ("b", 1, 200, 100)])
    assert predict_lengths(h, ["a", "b"], method="mean").tolist() == pytest.approx([80 / 3, 150])
    # EMA over per-epoch means with alpha 0.5: a: 20 -> 30; b: 100 -> 150
    assert predict_lengths(h, ["a", "b"], method="ema", alpha=0.5).tolist() == pytest.approx([30, 150])
    assert predict_lengths(h, ["a", "b"], method="quantile", q=1.0).tolist() == pytest.approx([40, 200])
    # unseen prompt: global-mean prior
    assert predict_lengths(h, ["c"], method="mean", prior="global_mean")[0] == pytest.approx(76.0)


def test_regression_prior_follows_prompt_length():
    rng = np.random.default_rng(0)
    pl = rng.integers(10, 1000, 400)
    rows = [(f"p{i}", 0, int(3 * x), int(x)) for i, x in enumerate(pl)]
    h = hist(rows)
    pred = predict_lengths(h, ["new1", "new2"], [20, 800], method="mean", prior="regression")
    assert pred[0] == pytest.approx(60, rel=0.05) and pred[1] == pytest.approx(2400, rel=0.05)


def test_evaluate_and_spearman():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    e = evaluate([1, 2, 3], [2, 2, 2])
    assert e["mae"] == pytest.approx(2 / 3)


def test_synthetic_workload_shape_tail_and_persistence(empty_yaml):
    cfg = load_config(empty_yaml, ["workload.type=synthetic", "workload.num_prompts=20000", "workload.epochs=3",
                                   "lengths.max_response_length=8192", "workload.epoch_correlation=0.9"])
    w = workload_from_config(cfg)
    assert w.mean_length.shape == (3, 20000)
    m = w.mean_length[0]
    assert m.max() <= 8192 and m.min() >= 1
    assert np.percentile(m, 99) > 4 * np.median(m)  # heavy tail
    # the same length mix every epoch, prompts keep their rank (correlation ~0.9)
    assert np.allclose(np.sort(w.mean_length[0]), np.sort(w.mean_length[1]))
    assert 0.8 < spearman(w.mean_length[0], w.mean_length[1]) < 0.97
    s = w.samples(0)
    assert s.shape == (20000, cfg.train.group_size) and s.max() <= 8192
    assert np.array_equal(s, w.samples(0))  # deterministic


def test_workload_drift_and_zero_correlation(empty_yaml):
    cfg = load_config(empty_yaml, ["workload.type=synthetic", "workload.num_prompts=5000", "workload.epochs=2",
                                   "workload.drift=0.1", "workload.epoch_correlation=0",
                                   "lengths.max_response_length=100000"])
    w = workload_from_config(cfg)
    assert np.median(w.mean_length[1]) == pytest.approx(1.1 * np.median(w.mean_length[0]), rel=0.01)
    assert abs(spearman(w.mean_length[0], w.mean_length[1])) < 0.05


def test_trace_workload_from_real_trace(empty_yaml, shared_data):
    cfg = load_config(empty_yaml, ["workload.type=trace", f"workload.trace_path={shared_data / 'azure_llm_trace_2023_code.csv'}",
                                   "workload.num_prompts=3000", "workload.length_scale=4",
                                   "lengths.max_response_length=8192"])
    w = workload_from_config(cfg)
    raw = pd.read_csv(shared_data / "azure_llm_trace_2023_code.csv")["GeneratedTokens"]
    assert np.median(w.mean_length[0]) == pytest.approx(4 * raw.median(), rel=0.15)
    assert w.prompt_length.max() > 1000  # prompt lengths come from ContextTokens


def test_trace_missing_column(tmp_path, empty_yaml):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n")
    cfg = load_config(empty_yaml, ["workload.type=trace", f"workload.trace_path={p}"])
    with pytest.raises(DataError, match="no column 'GeneratedTokens'.*set workload.trace_column"):
        trace_workload(cfg.workload, 8, 1024)


def test_holdout_report_prefers_history_over_regression(empty_yaml):
    cfg = load_config(empty_yaml, ["workload.type=synthetic", "workload.num_prompts=3000", "workload.epochs=3",
                                   "lengths.max_response_length=8192"])
    rep = holdout_report(workload_from_config(cfg).to_history())
    assert set(rep) == {"mean", "ema", "quantile", "regression"}
    assert rep["ema"]["spearman"] > rep["regression"]["spearman"]
    assert rep["mean"]["mae"] < rep["regression"]["mae"]


def test_prediction_quality_from_the_history():
    """lengths.predictors.prediction_quality (scheduler.membership: auto's trust in the predictions): a prompt
    that keeps its length from one epoch to the next gives 1, lengths redrawn at random near 0, a top tenth
    that falls back to the median near 0 too (the floors' groups), one epoch None (the persistence is not in it)."""
    from asp_ascend.lengths.predictors import prediction_quality

    rng = np.random.default_rng(0)
    n = 400
    first = np.exp(rng.normal(6.0, 1.0, n))

    def hist(second):
        return pd.DataFrame({"prompt_id": np.tile(np.arange(n).astype(str), 2), "epoch": np.repeat([0, 1], n),
                             "prompt_length": 50, "response_length": np.concatenate([first, second]).round()})

    assert prediction_quality(hist(first * 1.1)) > 0.99
    assert prediction_quality(hist(rng.permutation(first))) < 0.15
    # the body persists but the tenth longest falls back to the median: ranked well overall, not at the top
    fallen = first.copy()
    top = np.argsort(-first)[: n // 10]
    fallen[top] = np.median(first)
    assert np.corrcoef(np.log(first), np.log(fallen))[0, 1] > 0.6
    assert prediction_quality(hist(fallen)) < 0.1
    assert prediction_quality(hist(first)[lambda h: h.epoch == 0]) is None
    assert prediction_quality(None) is None


def test_schedule_inputs_carry_the_predictions_trust():
    """`asp schedule`'s inputs carry the history's forecast record for scheduler.membership: auto, its quality
    measured on a history of two epochs (high where prompts keep their lengths, low where they do not), unknown on
    one, 1 for the oracle."""
    from asp_ascend.scheduler.run import inputs_from_config

    def trust(epochs, rho, predictor="mean"):
        cfg = load_config(None, ["workload.type=synthetic", "workload.num_prompts=2000", f"workload.epochs={epochs}",
                                 f"workload.epoch_correlation={rho}", f"lengths.predictor={predictor}",
                                 "scheduler.membership=auto"])
        rec = inputs_from_config(cfg).trust
        return None if rec is None else rec.quality

    assert trust(3, 0.95) > 0.7 > 0.3 > trust(3, 0.0)
    assert trust(2, 0.95) is None
    assert trust(3, 0.0, "oracle") == 1.0
