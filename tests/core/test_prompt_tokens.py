"""Prompt lengths of ``data.path`` are the run's tokens in every planner (data/prompt_tokens.py).

The offline plan (``asp schedule`` / ``asp simulate`` through integrations/prompt_tokens.counter_for)
counts exactly what ``asp train`` tokenizes (pipeline/run._tokenize, encode_prompts): plain prompts with
newlines and space runs (where words and tokens differ), chat prompts through the tokenizer's template;
without ``model.path`` the tiny model's tokenizer asp train builds. No tokenizer: an error naming the key;
``data.prompt_length=words`` is an opt-in recorded in schedule_report.json. A local tokenizer, no network."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from asp_ascend.cli import main
from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (the run's tokenizer)")
ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
WORDS = "count 1 to 12 : what is 3 plus 2 <user> <system> <assistant>".split()
PLAIN = ["count 1 to 12 :", "what is 3 plus 2", "12 1\nto  count", "to count 3 : 2 1 12 12 12\n\n1 2"]


def _model(d: Path, template: bool = True) -> Path:
    """A Qwen2-format tokenizer directory (engines/tiny_model.build_tokenizer: each word one token, a newline
    or a second space one more), with a chat template: what model.path names for the offline commands."""
    from asp_ascend.engines.tiny_model import build_tokenizer, task_vocabulary

    tok = build_tokenizer(task_vocabulary([" ".join(WORDS)]))
    if template:
        tok.chat_template = TEMPLATE
    d.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return d


def _jsonl(p: Path, n: int = 40) -> Path:
    p.write_text("".join(json.dumps({"id": f"q{i}", "prompt": PLAIN[i % 4] + " 1" * (i % 5), "answer": "1"}) + "\n"
                         for i in range(n)))
    return p


def _chat_parquet(p: Path, n: int = 40) -> Path:
    rows = [{"id": f"c{i}", "prompt": [{"role": "system", "content": "what is"},
                                       {"role": "user", "content": " ".join(WORDS[: 1 + i % 9])}]} for i in range(n)]
    pd.DataFrame(rows).to_parquet(p)
    return p


def _history(p: Path, ids) -> Path:
    pd.DataFrame({"prompt_id": np.repeat(ids, 2), "response_length": np.arange(2 * len(ids)) % 50 + 1,
                  "epoch": 0, "sample": np.tile([0, 1], len(ids))}).to_csv(p, index=False)
    return p


def _cfg(tmp: Path, data: Path, *over: str):
    return load_config(None, [f"output_dir={tmp / 'out'}", f"data.path={data}", "train.global_batch_size=8",
                              "train.mini_batch_size=4", "train.group_size=2", "rollout.num_instances=2", *over])


def _run_lengths(cfg, model_dir: Path) -> np.ndarray:
    """The prompt lengths asp train plans with: its own tokenization of the loaded prompts."""
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.pipeline.run import _tokenize

    train, _ = prompts_from_config(cfg)
    _tokenize(cfg, model_dir, train, None)
    return np.asarray(train.prompt_lengths)


@pytest.mark.parametrize("kind", ["jsonl", "chat_parquet"])
def test_offline_plan_counts_what_asp_train_tokenizes(tmp_path, kind):
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.integrations.prompt_tokens import counter_for
    from asp_ascend.lengths.workloads import dataset_workload
    from asp_ascend.scheduler.run import inputs_from_config

    model = _model(tmp_path / "model")
    data = _jsonl(tmp_path / "d.jsonl") if kind == "jsonl" else _chat_parquet(tmp_path / "d.parquet")
    cfg = _cfg(tmp_path, data, f"model.path={model}")
    count = counter_for(cfg)
    inp = inputs_from_config(cfg, count=count)
    want = _run_lengths(cfg, model)
    assert np.array_equal(inp.prompt_lengths, want)
    words = np.asarray([len(t.split()) for t in prompts_from_config(cfg)[0].prompts])
    assert not np.array_equal(want, words)          # newlines, space runs, the template: tokens are not words
    if kind == "chat_parquet":                      # "<system> what is\n<user> ...\n<assistant>"
        assert list(want[:2]) == [1 + 2 + 1 + 1 + 1 + 1 + 1, 1 + 2 + 1 + 1 + 2 + 1 + 1]
    assert inp.prompt_length["unit"] == "tokens" and inp.prompt_length["tokenizer"] == f"model.path={model}"
    # asp simulate plans and prefills the same prompts with the same lengths
    cfg = _cfg(tmp_path, data, f"model.path={model}", f"lengths.path={_history(tmp_path / 'h.csv', inp.prompt_ids)}")
    w = dataset_workload(cfg, count)
    by_id = dict(zip(inp.prompt_ids, want))
    assert len(w.prompt_ids) == len(want) and list(w.prompt_length) == [by_id[p] for p in w.prompt_ids]


def test_without_model_path_the_tiny_models_tokenizer_counts(tmp_path):
    """No model.path: asp train builds the tiny model from data.path's texts; the offline count uses the same one."""
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.integrations.prompt_tokens import counter_for
    from asp_ascend.pipeline.run import prepare_model
    from asp_ascend.scheduler.run import inputs_from_config

    cfg = _cfg(tmp_path, _jsonl(tmp_path / "d.jsonl"))
    count = counter_for(cfg)
    inp = inputs_from_config(cfg, count=count)
    train, ev = prompts_from_config(cfg)
    model = prepare_model(cfg, train, ev, tmp_path / "run")
    assert np.array_equal(inp.prompt_lengths, _run_lengths(cfg, model))
    assert "tiny model" in inp.prompt_length["tokenizer"]


def test_cli_records_tokens_and_the_words_opt_in(tmp_path, capsys):
    model = _model(tmp_path / "model")
    data = _jsonl(tmp_path / "d.jsonl")
    base = ["train.global_batch_size=8", "train.mini_batch_size=4", "train.group_size=2", "rollout.num_instances=2",
            f"data.path={data}"]
    cfg = ROOT / "configs" / "cpu_tiny_grpo.yaml"
    assert main(["schedule", str(cfg), f"output_dir={tmp_path / 'tok'}", f"model.path={model}", *base]) == 0
    rep = json.loads((tmp_path / "tok" / "schedule_report.json").read_text())
    assert rep["prompt_length"]["unit"] == "tokens" and rep["prompt_length"]["tokenizer"] == f"model.path={model}"
    assert f"prompt lengths: tokens of model.path={model}" in capsys.readouterr().out
    assert main(["schedule", str(cfg), f"output_dir={tmp_path / 'words'}", "data.prompt_length=words", *base]) == 0
    rep = json.loads((tmp_path / "words" / "schedule_report.json").read_text())
    assert rep["prompt_length"] == {"unit": "words", "opt_in": "data.prompt_length=words"}
    assert "WHITESPACE WORDS (data.prompt_length=words)" in capsys.readouterr().out


def test_a_tokenizer_not_here_is_an_error_naming_the_key(tmp_path):
    """The framework's key where the bridge read model.path from (verl's shipped YAML names a hub id: a login
    node has no such directory); the CLI case: tests/integrations/test_framework_offline_prompts.py."""
    from asp_ascend.integrations.prompt_tokens import counter_for

    cfg = load_config(None, [f"data.path={_jsonl(tmp_path / 'd.jsonl')}", "model.path=Qwen/Qwen2.5-7B-Instruct"],
                      check_files=False)
    with pytest.raises(ConfigError) as e:
        counter_for(cfg, "actor_rollout_ref.model.path")
    assert ("actor_rollout_ref.model.path: 'Qwen/Qwen2.5-7B-Instruct' is not a directory on this machine, and its "
            "tokenizer counts the prompt tokens of data.path=") in str(e.value)
    assert "or set data.prompt_length=words" in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = load_config(None, [f"data.path={tmp_path / 'd.jsonl'}", f"model.path={empty}"], check_files=False)
    with pytest.raises(ConfigError, match=f"model.path: '{empty}': no tokenizer could be loaded"):
        counter_for(cfg)
    cfg = load_config(None, [f"data.path={tmp_path / 'd.jsonl'}"], check_files=False)
    with pytest.raises(ConfigError, match="megatron_training.tokenizer_name_or_path: not set"):
        counter_for(cfg, "megatron_training.tokenizer_name_or_path")
    assert counter_for(load_config(None, [])) is None        # no data.path: the built-in task's own lengths


def test_a_planner_without_the_tokenizer_never_falls_back_to_words(tmp_path):
    from asp_ascend.data.datasets import load_prompts
    from asp_ascend.scheduler.run import build_schedule

    data = _jsonl(tmp_path / "d.jsonl")
    with pytest.raises(ConfigError, match="data.prompt_length: 'tokens' .* needs the run's tokenizer"):
        build_schedule(_cfg(tmp_path, data), compare=False)
    with pytest.raises(ConfigError, match="were counted in whitespace words"):
        build_schedule(_cfg(tmp_path, data), load_prompts(data), compare=False)
    _, rep = build_schedule(_cfg(tmp_path, data, "data.prompt_length=words"), compare=False)
    assert rep["prompt_length"]["unit"] == "words"


def test_the_planners_import_no_tokenizer_library():
    code = ("import sys, asp_ascend.scheduler.run, asp_ascend.sim.run, asp_ascend.data.prompt_tokens, "
            "asp_ascend.integrations.prompt_tokens, asp_ascend.cli; "
            "print(sorted(m for m in ('transformers', 'tokenizers', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


def test_asp_trains_plan_records_the_models_tokens(tmp_path):
    """asp train plans its prompts after tokenizing them (pipeline/run._tokenize, then planning.plan_run):
    its report says tokens of the run's model, and the lengths are those tokens."""
    from asp_ascend.data.datasets import prompts_from_config
    from asp_ascend.pipeline.run import _tokenize
    from asp_ascend.scheduler.run import build_schedule, inputs_from_config

    model = _model(tmp_path / "model")
    cfg = _cfg(tmp_path, _chat_parquet(tmp_path / "d.parquet"), f"model.path={model}")
    train, _ = prompts_from_config(cfg)
    assert train.length_unit == {"unit": "words"}
    tok, ids, _ = _tokenize(cfg, model, train, None)
    _, rep = build_schedule(cfg, train, compare=False)
    assert rep["prompt_length"]["unit"] == "tokens" and rep["prompt_length"]["tokenizer"] == f"the run's model ({model})"
    assert list(inputs_from_config(cfg, train).prompt_lengths) == [len(ids[p]) for p in train.ids]


def test_batch_counts_equal_tokenizing_each_prompt_alone(tmp_path):
    """TokenCounter's batches (the Rust backend's encode_batch_fast) give asp train's per-prompt count
    (``len(tok(text, add_special_tokens=False).input_ids)``) for a byte-level BPE too, and where the backend
    would truncate it goes through the tokenizer itself."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from asp_ascend.data.prompt_tokens import TokenCounter

    texts = [" ".join(WORDS[i % 7:]) * (1 + i % 3) + ("\n" if i % 2 else "") for i in range(50)] + ["ünï côdé  x"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts[:20], trainers.BpeTrainer(vocab_size=300,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    want = [len(tok(t, add_special_tokens=False).input_ids) for t in texts]
    assert list(TokenCounter(tok, "t")(texts)) == want and want != [len(t.split()) for t in texts]
    tok.backend_tokenizer.enable_truncation(4)
    assert list(TokenCounter(tok, "t")(texts)) == [len(tok(t, add_special_tokens=False).input_ids) for t in texts]


def test_counts_are_kept_by_content_and_read_back(tmp_path):
    """The cache (data/prompt_tokens.TokenCounter.cache_dir) returns what counting returns, and only for the
    same tokenizer, template and texts; a damaged entry is counted again."""
    from asp_ascend.data.prompt_tokens import TokenCounter
    from asp_ascend.engines.tiny_model import load_tokenizer

    tok = load_tokenizer(_model(tmp_path / "model"))
    texts, cache = PLAIN * 3, tmp_path / "cache"
    want = TokenCounter(tok, "t")(texts)
    first = TokenCounter(tok, "t", cache_dir=cache)
    assert list(first(texts)) == list(want) and first.from_cache is False and first.record["from_cache"] is False
    again = TokenCounter(tok, "t", cache_dir=cache)
    assert list(again(texts)) == list(want) and again.from_cache is True
    other = texts[:-1] + [texts[-1] + " 1"]                           # one text changed: counted, not read
    c = TokenCounter(tok, "t", cache_dir=cache)
    assert c(other)[-1] == want[-1] + 1 and c.from_cache is False
    msgs = [[{"role": "user", "content": t}] for t in texts]
    chat = TokenCounter(tok, "t", cache_dir=cache)                    # same texts as chats: another key
    assert list(chat(texts, msgs)) == list(TokenCounter(tok, "t")(texts, msgs)) and chat.from_cache is False
    plain = TokenCounter(tok, "t", chat_template="none", cache_dir=cache)   # another template rule: counted
    assert list(plain(texts, msgs)) == list(want) and plain.from_cache is False
    for f in cache.glob("*.npy"):
        f.write_bytes(b"not an array")
    broken = TokenCounter(tok, "t", cache_dir=cache)
    assert list(broken(texts)) == list(want) and broken.from_cache is False


def test_chat_batches_equal_rendering_and_tokenizing_each_prompt_alone(tmp_path, monkeypatch):
    """The chat path (verl's in-run plan: every chat prompt through the template, with
    ``data.apply_chat_template_kwargs``) renders a batch of conversations in one apply_chat_template call and
    encodes the rendered texts in one backend call; the counts equal verl's per-prompt
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``, across batch boundaries
    and with plain prompts mixed in (tokenized as they are)."""
    from asp_ascend.data import prompt_tokens
    from asp_ascend.data.prompt_tokens import TokenCounter
    from asp_ascend.engines.tiny_model import load_tokenizer

    tok = load_tokenizer(_model(tmp_path / "m"))
    tok.chat_template = TEMPLATE.replace("{% if add_generation_prompt %}",
                                         "{% if enable_thinking %}what {% endif %}{% if add_generation_prompt %}")
    msgs = [None if i % 5 == 4 else [{"role": "system", "content": "what is"},
                                     {"role": "user", "content": " ".join(WORDS[i % 6: 3 + i % 9]) + "\n" * (i % 2)}]
            for i in range(23)]
    texts = [PLAIN[i % 4] if m is None else m[-1]["content"] for i, m in enumerate(msgs)]
    monkeypatch.setattr(prompt_tokens, "BATCH", 4)   # 23 prompts: six batches, the last one short
    for kwargs in ({}, {"enable_thinking": True}):
        want = [len(tok(t, add_special_tokens=False).input_ids) if m is None else
                len(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs))
                for t, m in zip(texts, msgs)]
        got = TokenCounter(tok, "t", template_kwargs=kwargs, always_template=True)(texts, msgs)
        assert list(got) == want
    assert want != [len(tok(t, add_special_tokens=False).input_ids) for t in texts]   # the template counts
