"""The static MindSpeed-RL checker: it finds what is there, reports what is not, and the contract is complete."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from asp_ascend.integrations.mindspeed_rl.checker import SourceTree, check_requirement, check_source, check_yaml_keys
from asp_ascend.integrations.mindspeed_rl.contract import REQUIREMENTS, Req

PKG = Path(__file__).resolve().parents[2] / "asp_ascend" / "integrations" / "mindspeed_rl"


@pytest.fixture
def tree(tmp_path) -> SourceTree:
    (tmp_path / "mindspeed_rl" / "base").mkdir(parents=True)
    (tmp_path / "mindspeed_rl" / "__init__.py").write_text("")
    (tmp_path / "mindspeed_rl" / "base" / "__init__.py").write_text("")
    (tmp_path / "mindspeed_rl" / "base" / "core.py").write_text(
        "class Base:\n"
        "    def __init__(self):\n        self.inherited_attr = 1\n"
        "    def inherited(self, a, b=2):\n        pass\n")
    (tmp_path / "mindspeed_rl" / "mod.py").write_text(
        "import ray\nfrom .base.core import Base\n"
        "REGISTRY = {}\n"
        "@ray.remote(num_cpus=1)\nclass Actor(Base):\n"
        "    def __init__(self, x, **kwargs):\n        super().__init__()\n        self.x = x\n"
        "    def run(self, blocking=False):\n        return REGISTRY.get('k')\n"
        "class Plain:\n    key_a = 1\n    def __init__(self):\n        self.key_b = 2\n"
        "def helper(a, *, b):\n    pass\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.yaml").write_text("a: 1\n")
    return SourceTree(tmp_path)


@pytest.mark.parametrize("req, ok, text", [
    (Req("class", "mindspeed_rl/mod.py", "Plain"), True, ""),
    (Req("class", "mindspeed_rl/mod.py", "Missing"), False, "class not defined"),
    (Req("ray_actor", "mindspeed_rl/mod.py", "Actor"), True, ""),
    (Req("ray_actor", "mindspeed_rl/mod.py", "Plain"), False, "not decorated"),
    (Req("method", "mindspeed_rl/mod.py", "Actor.run", ("blocking",)), True, ""),
    (Req("method", "mindspeed_rl/mod.py", "Actor.run", ("blocking", "timeout")), False, "does not accept ['timeout']"),
    (Req("method", "mindspeed_rl/mod.py", "Actor.inherited", ("a", "b")), True, ""),
    (Req("method", "mindspeed_rl/mod.py", "Actor.gone"), False, "not found in ['Actor', 'Base']"),
    (Req("method", "mindspeed_rl/mod.py", "Actor.__init__", ("x", "y")), True, ""),
    (Req("attr", "mindspeed_rl/mod.py", "Actor.x"), True, ""),
    (Req("attr", "mindspeed_rl/mod.py", "Actor.inherited_attr"), True, ""),
    (Req("attr", "mindspeed_rl/mod.py", "Actor.nope"), False, "no self.nope"),
    (Req("function", "mindspeed_rl/mod.py", "helper", ("a", "b")), True, ""),
    (Req("function", "mindspeed_rl/mod.py", "helper", ("c",)), False, "does not accept"),
    (Req("module_attr", "mindspeed_rl/mod.py", "REGISTRY"), True, ""),
    (Req("module_attr", "mindspeed_rl/mod.py", "OTHER"), False, "no module-level"),
    (Req("call", "mindspeed_rl/mod.py", "REGISTRY.get("), True, ""),
    (Req("call", "mindspeed_rl/mod.py", "REGISTRY.pop("), False, "not found"),
    (Req("config_keys", "mindspeed_rl/mod.py", "Plain", ("key_a", "key_b")), True, ""),
    (Req("config_keys", "mindspeed_rl/mod.py", "Plain", ("key_a", "key_c")), False, "undeclared keys ['key_c']"),
    (Req("file", "configs/x.yaml"), True, ""),
    (Req("file", "configs/y.yaml"), False, "file not found"),
    (Req("module", "mindspeed_rl/none.py"), False, "file not found"),
])
def test_each_kind_passes_and_fails(tree, req, ok, text):
    f = check_requirement(tree, req)
    assert f.ok is ok, f.line()
    assert text in f.detail


def test_kwargs_only_acceptance_is_noted(tree):
    f = check_requirement(tree, Req("method", "mindspeed_rl/mod.py", "Actor.__init__", ("y",)))
    assert f.ok and "only through **kwargs" in f.note


def test_yaml_keys_are_checked_against_config_classes(tmp_path):
    root = tmp_path / "ms"
    (root / "mindspeed_rl" / "config_cls").mkdir(parents=True)
    for name, cls, keys in (("rl_config", "RLConfig", ["n_samples_per_prompt"]),
                            ("megatron_config", "MegatronConfig", ["global_batch_size", "lr"]),
                            ("generate_config", "GenerateConfig", ["max_num_seqs"])):
        body = "".join(f"        self.{k} = None\n" for k in keys)
        (root / "mindspeed_rl" / "config_cls" / f"{name}.py").write_text(f"class {cls}:\n    def __init__(self):\n{body}")
    y = tmp_path / "run.yaml"
    y.write_text("megatron_training: {model: m, global_batch_size: 8}\nactor_config: {lr: 1.0}\n"
                 "rl_config: {n_samples_per_prompt: 4, no_such_key: 1}\ngenerate_config: {max_num_seqs: 8}\n")
    findings = {f.req.name: f for f in check_yaml_keys(SourceTree(root), y)}
    assert findings["megatron_training -> MegatronConfig"].ok and findings["generate_config -> GenerateConfig"].ok
    assert not findings["rl_config -> RLConfig"].ok and "no_such_key" in findings["rl_config -> RLConfig"].detail


def test_not_a_mindspeed_tree(tmp_path):
    r = check_source(tmp_path)
    assert not r["ok"] and "has no mindspeed_rl/ package" in r["findings"][0]["line"]


def _adapter_imports() -> set[tuple[str, str]]:
    """(file path, name) of every from-import of mindspeed_rl / cli.train_grpo in the adapter."""
    out = set()
    for py in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                    node.module.split(".")[0] in ("mindspeed_rl", "cli"):
                path = node.module.replace(".", "/") + ".py"
                out.update((path, a.name) for a in node.names)
    return out


def test_contract_lists_every_mindspeed_name_the_adapter_imports():
    listed = {(r.path, r.name) for r in REQUIREMENTS if r.kind in ("class", "ray_actor", "function", "module_attr",
                                                                     "config_keys")}
    paths = {r.path for r in REQUIREMENTS}
    imports = _adapter_imports()
    assert imports, "the adapter imports nothing from mindspeed_rl?"
    # `from pkg import module` counts when the contract checks that module's file
    missing = {(p, n) for p, n in imports if (p, n) not in listed and f"{p[:-3]}/{n}.py" not in paths}
    assert not missing, f"add to contract.REQUIREMENTS: {sorted(missing)}"


def test_contract_lists_every_worker_group_method_the_protocols_use():
    from asp_ascend.integrations.mindspeed_rl.async_loop import ActorGroup, RefGroup

    listed = {r.name for r in REQUIREMENTS if r.kind == "method" and r.name.startswith("RayActorGroup.")}
    for proto in (ActorGroup, RefGroup):
        for m in [n for n in vars(proto) if not n.startswith("_") and callable(getattr(proto, n))]:
            assert f"RayActorGroup.{m}" in listed, m


@pytest.mark.skipif(not os.environ.get("ASP_MINDSPEED_SRC"), reason="set ASP_MINDSPEED_SRC to a MindSpeed-RL checkout")
def test_real_mindspeed_tree_satisfies_the_contract():
    from asp_ascend.integrations.mindspeed_rl.checker import shipped_yamls

    r = check_source(os.environ["ASP_MINDSPEED_SRC"], yaml_files=shipped_yamls())
    bad = [f["line"] for f in r["findings"] if not f["ok"]]
    assert r["ok"], "\n".join(bad)
    assert len(r["findings"]) >= len(REQUIREMENTS)
