"""The framework-agnostic API checker: a small framework and an adapter that uses it; every kind of
mismatch, planted one at a time into a copy of the framework, is reported, and nothing else is."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from asp_ascend.integrations.apicheck import (Call, Checker, ConfigKeys, Exists, Order, Params, Pattern, Reaches,
                                              Ref, Site)

FW = {
    "fw/__init__.py": "",
    "fw/base.py": (
        "class BaseEngine:\n"
        "    def __init__(self, seed=0, **rest):\n"
        "        self.seed = seed\n"
        "        self.extra = rest\n"
        "    def describe(self):\n"
        "        return self.extra.get('name')\n"
        "    def run(self):\n"
        "        return self._step()\n"
        "    def _step(self):\n"
        "        self._wait_for_data()\n"
        "    def _wait_for_data(self):\n"
        "        pass\n"),
    "fw/engine.py": (
        "import ray\n"
        "from .base import BaseEngine\n"
        "@ray.remote(num_cpus=1)\n"
        "class Engine(BaseEngine):\n"
        "    def __init__(self, model, tokenizer, *, max_seqs=8, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "        self.model = model\n"
        "    def generate(self, prompts, n=1, **kwargs):\n"
        "        return kwargs.get('temperature', 1.0)\n"
        "    def load(self, weights, strict=True):\n"
        "        pass\n"),
    "fw/config.py": (
        "class RLConfig:\n"
        "    def __init__(self, d):\n"
        "        self.n = d.get('n', 1)\n"
        "        self.mini_batch_size = d.get('mini_batch_size', 1) * self.n\n"),
    "fw/args.py": (
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class EngineArgs:\n"
        "    model: str\n"
        "    tp: int = 1\n"
        "    hidden: list = field(default_factory=list, init=False)\n"),
    "fw/loaders.py": (
        "from .engine import Engine\n"
        "def patch_loaders():\n"
        "    pass\n"
        "def build(cfg):\n"
        "    patch_loaders()\n"
        "    return Engine(cfg, None)\n"),
}
OURS = {
    "ours/adapter.py": (
        "from fw.engine import Engine\n"
        "from fw.args import EngineArgs\n"
        "def make(model, tok):\n"
        "    opts = dict(max_seqs=4, seed=1)\n"
        "    eng = Engine(model, tok, name='x', **opts)\n"
        "    eng.generate(['p'], n=2, temperature=0.5)\n"
        "    EngineArgs(model=model, tp=2)\n"
        "    return eng\n"),
}

E = "fw/engine.py"
EXPECT = {
    "call_ctor": Call(Ref("fw", E, "Engine"), args=("model", "tokenizer"), site=Site("ours/adapter.py", "make", "Engine"),
                      why="the engine we build"),
    "call_method": Call(Ref("fw", E, "Engine.generate"), args=("prompts",),
                        site=Site("ours/adapter.py", "make", "eng.generate")),
    "call_dataclass": Call(Ref("fw", "fw/args.py", "EngineArgs"), site=Site("ours/adapter.py", "make", "EngineArgs")),
    "keys": ConfigKeys(Ref("fw", "fw/config.py", "RLConfig"), ("n", "mini_batch_size")),
    "meaning": Pattern(Ref("fw", "fw/config.py", "RLConfig.__init__"), "_.get('mini_batch_size', _) * _.n",
                       key="rl.mini_batch_size", why="prompts, multiplied by n"),
    "order": Order(Ref("fw", "fw/loaders.py", "build"), "patch_loaders()", "Engine(...)",
                   why="loaders are bound when layers are built"),
    "reaches": Reaches(Ref("fw", "fw/base.py", "BaseEngine.run"), "_wait_for_data", why="reads wait for writes"),
    "params": Params(Ref("fw", E, "Engine.load"), ("weights", "strict"), exact=True),
    "actor": Exists(Ref("fw", E, "Engine"), "ray_actor"),
    "method": Exists(Ref("fw", E, "Engine.describe"), "method"),
    "attr": Exists(Ref("fw", E, "Engine.extra"), "attr"),
}

# one planted mismatch per kind: (file, old text, new text) -> the expectations that must fail
PLANTS = {
    "positional order": ("fw/engine.py", "(self, model, tokenizer, *", "(self, tokenizer, model, *", {"call_ctor"}),
    "new required argument": ("fw/engine.py", "tokenizer, *, max_seqs", "tokenizer, device, *, max_seqs",
                              {"call_ctor"}),
    "keyword renamed": ("fw/engine.py", "*, max_seqs=8", "*, max_num_seqs=8", {"call_ctor"}),
    "keyword no longer consumed behind **kwargs": ("fw/base.py", "self.extra.get('name')", "self.extra.get('nm')",
                                                   {"call_ctor"}),
    "**kwargs read under another name": ("fw/engine.py", "get('temperature'", "get('temp'", {"call_method"}),
    "dataclass field renamed": ("fw/args.py", "    tp: int = 1", "    tensor_parallel: int = 1", {"call_dataclass"}),
    "config key meaning changed": ("fw/config.py", "* self.n", "", {"meaning"}),
    "config key removed": ("fw/config.py", "self.n = ", "self.num = ", {"keys"}),
    "precondition after the build": ("fw/loaders.py", "    patch_loaders()\n    return Engine(cfg, None)",
                                     "    e = Engine(cfg, None)\n    patch_loaders()\n    return e", {"order"}),
    "wait no longer reached": ("fw/base.py", "        self._wait_for_data()\n", "        pass\n", {"reaches"}),
    "overridden signature changed": ("fw/engine.py", "load(self, weights, strict=True)",
                                     "load(self, weights, strict=True, device=None)", {"params"}),
    "not a Ray actor any more": ("fw/engine.py", "@ray.remote(num_cpus=1)\n", "", {"actor"}),
    "method removed": ("fw/base.py", "def describe(self)", "def summary(self)", {"method"}),
}


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture
def trees(tmp_path):
    _write(tmp_path / "fw", FW)
    _write(tmp_path / "ours", OURS)
    return tmp_path / "fw", tmp_path / "ours"


def _failing(report) -> set[str]:
    names = {id(e): k for k, e in EXPECT.items()}
    return {names[id(f.expectation)] for f in report.failures()}


def test_the_unchanged_framework_passes_everything(trees):
    report = Checker({"fw": trees[0], "ours": trees[1]}).run(EXPECT.values())
    assert report.ok, report.render("fw")
    by = {k: f for k, f in zip(EXPECT, report.findings)}
    assert "binds to fw/engine.py::Engine.__init__" in by["call_ctor"].detail
    assert "line 4" in by["meaning"].detail


@pytest.mark.parametrize("plant", list(PLANTS), ids=list(PLANTS))
def test_each_planted_mismatch_is_reported_and_only_it(trees, tmp_path, plant):
    rel, old, new, expected = PLANTS[plant]
    fw = tmp_path / "planted"
    shutil.copytree(trees[0], fw)
    text = (fw / rel).read_text()
    assert old in text
    (fw / rel).write_text(text.replace(old, new))
    report = Checker({"fw": fw, "ours": trees[1]}).run(EXPECT.values())
    assert _failing(report) == expected, report.render(plant)


def test_messages_say_what_is_wrong(trees, tmp_path):
    fw = tmp_path / "p"
    shutil.copytree(trees[0], fw)
    eng = fw / "fw/engine.py"
    eng.write_text(eng.read_text().replace("(self, model, tokenizer, *", "(self, tokenizer, model, *"))
    base = fw / "fw/base.py"
    base.write_text(base.read_text().replace("self.extra.get('name')", "None"))
    f = Checker({"fw": fw, "ours": trees[1]}).run([EXPECT["call_ctor"]]).findings[0]
    assert "positional argument 1 is 'tokenizer'" in f.detail and "we pass model there" in f.detail
    assert "keyword 'name'" in f.detail and "never reads it" in f.detail


def test_contract_out_of_date_with_our_code_fails(trees):
    stale = Call(Ref("fw", E, "Engine"), args=("model",), site=Site("ours/adapter.py", "make", "Engine"))
    gone = Call(Ref("fw", E, "Engine"), args=("model", "tokenizer"), site=Site("ours/adapter.py", "nope", "Engine"))
    report = Checker({"fw": trees[0], "ours": trees[1]}).run([stale, gone])
    assert [f.ok for f in report.findings] == [False, False]
    assert "contract names only 1" in report.findings[0].detail and "not found" in report.findings[1].detail


def test_a_tree_that_was_not_given_is_skipped_not_passed(trees):
    report = Checker({"fw": None, "ours": trees[1]}, {"fw": "pass --fw-src"}).run(EXPECT.values())
    assert all(f.skipped for f in report.findings) and report.checked == []
    assert "skipped" in report.render("fw") and "pass --fw-src" in report.render("fw")


def test_a_dropped_positional_or_an_unknown_keyword_to_a_plain_function(tmp_path):
    _write(tmp_path / "fw", {"fw/f.py": "def f(a, b, *, c):\n    pass\n"})
    _write(tmp_path / "ours", {"ours/u.py": "from fw.f import f\ndef g():\n    f(1, 2, 3, d=4)\n"})
    e = Call(Ref("fw", "fw/f.py", "f"), args=("a", "b", "c"), site=Site("ours/u.py", "g", "f"))
    f = Checker({"fw": tmp_path / "fw", "ours": tmp_path / "ours"}).run([e]).findings[0]
    assert not f.ok
    assert "takes 2 positional argument(s)" in f.detail and "keyword 'd'" in f.detail
    assert "required argument 'c'" in f.detail
