import json

import numpy as np
import pandas as pd
import pytest

from asp_ascend.config import load_config
from asp_ascend.data.datasets import load_prompts, prompts_from_config
from asp_ascend.data.synthetic import make_synthetic_task, score
from asp_ascend.errors import DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_ids_and_answers(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "x y", "answer": "1"}, {"id": 7, "prompt": "z"}])
    ps = load_prompts(p)
    assert ps.ids == ["a", "7"]
    assert ps.answers == ["1", None]
    assert ps.prompt_lengths.tolist() == [2, 1]


def test_jsonl_without_ids_gets_row_ids(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    assert load_prompts(p).ids == ["0", "1"]


def test_parquet_verl_style_chat_prompt(tmp_path):
    df = pd.DataFrame({"prompt": [[{"role": "user", "content": "what is 1+1"}], [{"role": "user", "content": "hi"}]],
                       "reward_model": [{"ground_truth": "2"}, {"ground_truth": "x"}], "id": ["q1", "q2"]})
    p = tmp_path / "d.parquet"
    df.to_parquet(p)
    ps = load_prompts(p)
    assert ps.prompts[0] == "what is 1+1" and ps.answers == ["2", "x"] and ps.ids == ["q1", "q2"]


@pytest.mark.parametrize("content, match", [
    ("", "the dataset is empty"),
    ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', r"d.jsonl:2: duplicate prompt id '1' \(first at line 1\)"),
    ('{"id": 1, "question": "a"}\n', r"d.jsonl:1: no 'prompt' field .*set data.prompt_key"),
    ('{"id": 1, "prompt": "a"}\n\n{"id": 2, "prompt": \n', r"d.jsonl:3: not valid JSON"),
    ('[1, 2]\n', r"d.jsonl:1: expected a JSON object"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, match):
    p = tmp_path / "d.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=match):
        load_prompts(p)


def test_blank_lines_keep_real_line_numbers(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": 1, "prompt": "a"}\n\n\n{"id": 1, "prompt": "b"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:4: duplicate prompt id"):
        load_prompts(p)


def test_parquet_missing_prompt_column(tmp_path):
    p = tmp_path / "d.parquet"
    pd.DataFrame({"question": ["a"]}).to_parquet(p)
    with pytest.raises(DataError, match="no 'prompt' column .*columns: question"):
        load_prompts(p)


def test_synthetic_task_is_heterogeneous_and_deterministic(empty_yaml):
    cfg = load_config(empty_yaml)
    tr1, ev1 = make_synthetic_task(cfg.data.synthetic, seed=3)
    tr2, _ = make_synthetic_task(cfg.data.synthetic, seed=3)
    assert tr1.prompts == tr2.prompts and len(tr1) == cfg.data.synthetic.num_prompts
    assert len(ev1) == cfg.data.synthetic.num_eval_prompts
    assert set(tr1.ids).isdisjoint(ev1.ids)
    L = tr1.known_lengths
    # heavy-tailed: the longest answers are several times the median
    assert L.max() >= 4 * np.median(L)
    # lengths known by construction: answer symbols + end of sequence
    assert all(len(a.split()) + 1 == n for a, n in zip(tr1.answers, L))


def test_synthetic_score():
    assert score("a b c", "a b c") == 1.0
    assert score("", "a b") == 0.0
    assert 0 < score("a b x", "a b c") < 1.0
    assert score("a b c d e f", "a b c") < score("a b c", "a b c")


def test_prompts_from_config_default_is_builtin(empty_yaml):
    tr, ev = prompts_from_config(load_config(empty_yaml))
    assert tr.source.startswith("builtin") and ev is not None
