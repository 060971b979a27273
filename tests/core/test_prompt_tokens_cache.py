"""A token-count cache hit loads no tokenizer (data/prompt_tokens.TokenCounter, integrations/prompt_tokens).

The counts of a model directory's prompts are keyed by the content of the tokenizer's files and the loader's
versions (``tokenizer_files_digest``), how chat prompts are rendered and every text, so a re-plan of the
same prompts reads them without importing transformers; a changed file, template or setting is counted
again, and a directory the files cannot describe keeps the key of the loaded tokenizer's definition."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asp_ascend.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_prompt_tokens import PLAIN, TEMPLATE, WORDS, _jsonl, _model  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (the run's tokenizer)")
ROOT = Path(__file__).resolve().parents[2]
TEXTS = [PLAIN[i % 4] + " <user> 1" * (i % 3) for i in range(12)]
MSGS = [[{"role": "system", "content": "what is"}, {"role": "user", "content": t}] for t in TEXTS]


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "asp_ascend" / "prompt_tokens"


def _counter(tmp: Path, model: Path, *over: str, **kw):
    from asp_ascend.integrations.prompt_tokens import counter_for

    cfg = load_config(None, [f"data.path={_jsonl(tmp / 'd.jsonl')}", f"model.path={model}", *over], check_files=False)
    return counter_for(cfg, **kw)


def _fresh(model: Path, texts, msgs=None, **kw) -> list:
    """The counts of a freshly loaded tokenizer, no cache."""
    from asp_ascend.data.prompt_tokens import TokenCounter
    from asp_ascend.engines.tiny_model import load_tokenizer

    return list(TokenCounter(load_tokenizer(model), "t", **kw)(texts, msgs))


def _counts(tmp: Path, model: Path, msgs=None, *over: str, **kw):
    """(counts, from_cache, tokenizer loaded) of a new counter for ``model``."""
    c = _counter(tmp, model, *over, **kw)
    got = c(TEXTS, msgs)
    return list(got), c.from_cache, c.tokenizer is not None


def test_a_hit_loads_no_tokenizer_and_records_the_same(tmp_path, xdg):
    model = _model(tmp_path / "model")
    for msgs in (None, MSGS):
        first = _counter(tmp_path, model)
        assert first.tokenizer is None                       # named by its files: not loaded up front
        want = list(first(TEXTS, msgs))
        assert want == _fresh(model, TEXTS, msgs) and first.from_cache is False and first.tokenizer is not None
        again = _counter(tmp_path, model)
        assert list(again(TEXTS, msgs)) == want and again.from_cache is True and again.tokenizer is None
        assert again.record == {**first.record, "from_cache": True}
        assert again.tokenizer is None and again.record["tokenizer_class"] == "Qwen2Tokenizer"
    assert len(list(xdg.glob("*.npy"))) == 2 and len(list(xdg.glob("*.json"))) == 2
    for f in xdg.glob("*.json"):                              # the record's traits lost: counted again
        f.write_text("{}")
    assert _counts(tmp_path, model) == (_fresh(model, TEXTS), False, True)
    assert _counts(tmp_path, model)[1:] == (True, False)


def test_a_replan_imports_no_transformers(tmp_path):
    """``asp schedule`` twice in fresh processes: the second reads the counts without importing transformers
    (or tokenizers), and its report says the same tokenizer, from the cache."""
    from test_prompt_tokens import _history

    model = _model(tmp_path / "model")
    data = _jsonl(tmp_path / "d.jsonl")
    hist = _history(tmp_path / "h.csv", [f"q{i}" for i in range(40)])
    code = ("import sys, json; from asp_ascend.cli import main; rc = main(sys.argv[1:]); "
            "print(json.dumps([rc, sorted(m for m in ('transformers', 'tokenizers') if m in sys.modules)]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    reports = []
    for run in ("cold", "warm"):
        out = subprocess.run([sys.executable, "-c", code, "schedule", str(ROOT / "configs" / "cpu_tiny_grpo.yaml"),
                              f"output_dir={tmp_path / run}", f"model.path={model}", f"data.path={data}",
                              f"lengths.path={hist}", "train.global_batch_size=8", "train.mini_batch_size=4",
                              "train.group_size=2", "rollout.num_instances=2"],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        reports.append((json.loads(out.stdout.strip().splitlines()[-1]),
                        json.loads((tmp_path / run / "schedule_report.json").read_text())))
    (cold, rep_cold), (warm, rep_warm) = reports
    assert cold == [0, ["tokenizers", "transformers"]] and rep_cold["prompt_length"]["from_cache"] is False
    assert warm == [0, []]
    assert rep_warm["prompt_length"] == {**rep_cold["prompt_length"], "from_cache": True}
    cold_s = (tmp_path / "cold" / "schedule.parquet").read_bytes()
    assert (tmp_path / "warm" / "schedule.parquet").read_bytes() == cold_s


def test_a_changed_file_template_or_setting_is_counted_again(tmp_path, xdg):
    model = _model(tmp_path / "model")
    base = _counts(tmp_path, model, MSGS)[0]
    assert _counts(tmp_path, model, MSGS) == (base, True, False)

    def counted_again(msgs=None, *over, **kw):
        got, hit, loaded = _counts(tmp_path, model, msgs, *over, **kw)
        assert (hit, loaded) == (False, True)
        assert _counts(tmp_path, model, msgs, *over, **kw) == (got, True, False)   # and kept under the new key
        return got

    jinja = model / "chat_template.jinja"
    size = jinja.stat().st_size
    jinja.write_text(jinja.read_text().replace("<assistant>", "<user> what"))   # one token more, the same size
    assert jinja.stat().st_size == size
    assert counted_again(MSGS) == _fresh(model, TEXTS, MSGS) != base        # the template file
    other = _model(tmp_path / "other")
    from asp_ascend.engines.tiny_model import build_tokenizer, task_vocabulary

    build_tokenizer(task_vocabulary([" ".join(w for w in WORDS if w != "count")])).save_pretrained(tmp_path / "fewer")
    shutil.copy(tmp_path / "fewer" / "tokenizer.json", model / "tokenizer.json")   # 'count' no longer a word
    plain = counted_again()
    assert plain == _fresh(model, TEXTS) != _fresh(other, TEXTS)             # the vocabulary
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 2048}))
    assert counted_again() == plain                                          # tokenizer_config.json
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 64}))
    counted_again()                                                          # config.json (model_type: the class)
    (model / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<eos>"}))
    counted_again()                                                          # a file added
    (model / "model.safetensors").write_bytes(b"weights")                    # weights: not the tokenizer's
    assert _counts(tmp_path, model)[1:] == (True, False)
    counted_again(MSGS, "data.chat_template=none")                          # the settings
    counted_again(MSGS, always_template=True)
    counted_again(MSGS, template_kwargs={"enable_thinking": True})
    c = _counter(tmp_path, model)
    c(TEXTS[:-1] + [TEXTS[-1] + " 1"])                                       # the texts
    assert c.from_cache is False and c.tokenizer is not None


def test_the_digest_covers_what_the_loader_reads(tmp_path, monkeypatch):
    from asp_ascend.integrations import prompt_tokens as pt

    model = _model(tmp_path / "model")
    d0 = pt.tokenizer_files_digest(model)
    assert d0 is not None and pt.tokenizer_files_digest(_model(tmp_path / "copy")) == d0   # content, not path
    (model / "pytorch_model-00001-of-00002.bin").write_bytes(b"w")
    (model / "optimizer.pt").write_bytes(b"w")
    assert pt.tokenizer_files_digest(model) == d0
    (model / "tokenizer.bin").write_bytes(b"w")                  # a weights suffix, a tokenizer's name: read
    d1 = pt.tokenizer_files_digest(model)
    assert d1 != d0
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool.jinja").write_text("x")
    assert pt.tokenizer_files_digest(model) not in (d0, d1)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda p: "0.0.1" if p == "transformers" else real(p))
    assert pt.tokenizer_files_digest(model) not in (d0, d1, None)


def test_a_directory_the_files_cannot_describe_keeps_the_tokenizers_key(tmp_path, xdg, monkeypatch):
    """Custom tokenizer code, a config naming files elsewhere, no tokenizer_config.json, too much to hash: the
    tokenizer is loaded up front and the counts are keyed by its definition, as before."""
    from asp_ascend.data.prompt_tokens import TokenCounter
    from asp_ascend.engines.tiny_model import load_tokenizer
    from asp_ascend.integrations import prompt_tokens as pt

    model = _model(tmp_path / "model")
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cases = {"auto_map": {**cfg, "auto_map": {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}},
             "vocab_file": {**cfg, "vocab_file": str(tmp_path / "elsewhere" / "vocab.json")}}
    for name, changed in cases.items():
        (model / "tokenizer_config.json").write_text(json.dumps(changed))
        assert pt.tokenizer_files_digest(model) is None, name
        c = _counter(tmp_path, model)
        assert c.tokenizer is not None and c.files_key is None
        want = list(c(TEXTS))
        key = TokenCounter(load_tokenizer(model), "t")._cache_key(TEXTS, None)
        assert want == _fresh(model, TEXTS) and (xdg / f"{key}.npy").is_file() and not (xdg / f"{key}.json").exists()
        again = _counter(tmp_path, model)
        assert list(again(TEXTS)) == want and again.from_cache is True
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert pt.tokenizer_files_digest(model) is not None
    monkeypatch.setattr(pt, "DIGEST_MAX_BYTES", sum(f.stat().st_size for f in model.iterdir()) - 1)
    assert pt.tokenizer_files_digest(model) is None and _counter(tmp_path, model).tokenizer is not None
    (model / "tokenizer_config.json").unlink()
    assert pt.tokenizer_files_digest(model) is None
    model_cfg = json.loads((model / "config.json").read_text())
    monkeypatch.setattr(pt, "DIGEST_MAX_BYTES", 1 << 30)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    (model / "config.json").write_text(json.dumps({**model_cfg, "auto_map": {"AutoTokenizer": "x--y.Tok"}}))
    assert pt.tokenizer_files_digest(model) is None
    (model / "config.json").write_text(json.dumps({**model_cfg, "auto_map": {"AutoModel": "x--y.M"}}))
    assert pt.tokenizer_files_digest(model) is not None          # custom model code, the tokenizer's own


def test_a_file_changed_while_loading_is_not_kept_under_the_files_key(tmp_path, xdg):
    from asp_ascend.data.prompt_tokens import TokenCounter, default_cache_dir
    from asp_ascend.engines.tiny_model import load_tokenizer
    from asp_ascend.integrations.prompt_tokens import tokenizer_files_digest

    model = _model(tmp_path / "model")

    def load():
        tok = load_tokenizer(model)
        (model / "special_tokens_map.json").write_text("{}")   # as if a copy were still being written
        return tok

    c = TokenCounter(None, "t", cache_dir=default_cache_dir(), load=load,
                     files_key=lambda: tokenizer_files_digest(model))
    assert list(c(TEXTS)) == _fresh(model, TEXTS) and c.from_cache is False
    assert not xdg.exists() or not list(xdg.iterdir())
    assert _counts(tmp_path, model)[1:] == (False, True)         # counted (and kept) by the next plan
    assert _counts(tmp_path, model)[1:] == (True, False)
    assert np.all(np.array(_counts(tmp_path, model)[0]) == _fresh(model, TEXTS))
