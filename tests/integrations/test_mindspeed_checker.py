"""The MindSpeed-RL contract: complete with respect to the adapter's code, YAML keys checked, and (with
ASP_MINDSPEED_SRC) satisfied by the real tree, which fails for each kind of planted mismatch."""
from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest

from asp_ascend.integrations.apicheck import Call, SourceTree, installed_root
from asp_ascend.integrations.mindspeed_rl.checker import all_expectations, check_trees, shipped_yamls, yaml_key_checks
from asp_ascend.integrations.mindspeed_rl.contract import REQUIREMENTS

PKG = Path(__file__).resolve().parents[2] / "asp_ascend" / "integrations" / "mindspeed_rl"
SRC = os.environ.get("ASP_MINDSPEED_SRC")
VA_SRC = os.environ.get("ASP_VLLM_ASCEND_SRC")


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
    report = check_trees(root, expectations=yaml_key_checks(y))
    by = {f.expectation.why: f for f in report.findings}
    assert by["run.yaml: megatron_training"].ok and by["run.yaml: generate_config"].ok
    assert not by["run.yaml: rl_config"].ok and "no_such_key" in by["run.yaml: rl_config"].detail


def test_not_a_mindspeed_tree(tmp_path):
    r = check_trees(tmp_path)
    assert not r.ok and "not checked:" in r.render("x") and "has no mindspeed_rl/ package" in r.render("x")
    assert "checks passed" not in r.render("x") and r.to_dict()["unavailable"]


def _foreign_imports(tree: ast.AST) -> dict[str, str]:
    """local name -> module for every from-import of mindspeed_rl / cli in a file."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] in ("mindspeed_rl", "cli"):
            out.update({a.asname or a.name: node.module for a in node.names})
    return out


def _listed_names() -> set[tuple[str, str]]:
    out = set()
    for e in all_expectations():
        ref = e.target if isinstance(e, Call) else e.ref
        if ref.tree == "mindspeed":
            out.add((ref.path, ref.name.split(".")[0]))
    return out


def test_contract_lists_every_mindspeed_name_the_adapter_imports():
    listed, paths = _listed_names(), {p for p, _ in _listed_names()}
    missing = set()
    for py in PKG.glob("*.py"):
        for name, module in _foreign_imports(ast.parse(py.read_text())).items():
            path = module.replace(".", "/") + ".py"
            if (path, name) not in listed and f"{path[:-3]}/{name}.py" not in paths:
                missing.add((py.name, module, name))
    assert not missing, f"add to the contract: {sorted(missing)}"


def test_contract_has_a_call_check_for_every_direct_call_of_an_imported_name():
    """Each call of a name imported from MindSpeed-RL in the adapter is bound against the real signature."""
    sites = {(e.site.path.rsplit("/", 1)[-1], e.site.callee) for e in all_expectations()
             if isinstance(e, Call) and e.site is not None}
    missing = set()
    for py in PKG.glob("*.py"):
        tree = ast.parse(py.read_text())
        names = _foreign_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names \
                    and node.func.id not in ("gpt_model_provider", "initialize_megatron", "get_megatron_module"):
                if (py.name, node.func.id) not in sites:
                    missing.add((py.name, node.func.id, node.lineno))
    assert not missing, f"add Call expectations with a Site for: {sorted(missing)}"


def test_contract_lists_every_worker_group_method_the_protocols_use():
    from asp_ascend.integrations.mindspeed_rl.async_loop import ActorGroup, RefGroup

    listed = {e.target.name for e in REQUIREMENTS if isinstance(e, Call) and e.target.name.startswith("RayActorGroup.")}
    for proto in (ActorGroup, RefGroup):
        for m in [n for n in vars(proto) if not n.startswith("_") and callable(getattr(proto, n))]:
            assert f"RayActorGroup.{m}" in listed, m


def test_every_site_in_the_contract_exists_in_our_code():
    from asp_ascend.integrations.apicheck import ours_root

    tree = SourceTree(ours_root())
    for e in all_expectations():
        if isinstance(e, Call) and e.site is not None:
            assert tree.find_scope(e.site.path, e.site.function) is not None, e.site


needs_src = pytest.mark.skipif(not SRC, reason=("ASP_MINDSPEED_SRC is not set: point it at a MindSpeed-RL checkout at 05a90d7 (and ASP_VLLM_ASCEND_SRC at "
          "vllm-ascend 1b16c01); docs/ascend.md, 'Running the real-tree tests', says how to fetch them"))


@needs_src
def test_real_mindspeed_tree_satisfies_the_contract():
    r = check_trees(SRC, VA_SRC, yaml_files=shipped_yamls())
    assert r.ok, r.render("real tree")
    assert len(r.checked) >= len(REQUIREMENTS)


T = "mindspeed_rl/trainer/grpo_trainer_hybrid.py"
PLANTS = {   # kind of mismatch: (file, old, new, expectations that must fail as (kind, where suffix))
    "positional order": (T, "actor_worker: RayActorGroup,\n            ref_worker: RayActorGroup,",
                         "ref_worker: RayActorGroup,\n            actor_worker: RayActorGroup,",
                         {("call", "grpo_trainer_hybrid.py::RayGRPOTrainer")}),
    "new required argument": ("cli/train_grpo.py", "def parse_training_config(config: Dict[str, Any])",
                              "def parse_training_config(config: Dict[str, Any], stage)",
                              {("call", "train_grpo.py::parse_training_config")}),
    "keyword renamed": ("mindspeed_rl/trainer/utils/transfer_dock.py",
                        "        addition_columns: Union[List[str], None] = None,\n        addition_consumers",
                        "        extra_columns: Union[List[str], None] = None,\n        addition_consumers",
                        {("call", "transfer_dock.py::GRPOTransferDock")}),
    "config key meaning": ("mindspeed_rl/config_cls/rl_config.py",
                           "config_dict.get('mini_batch_size', 1) * self.n_samples_per_prompt",
                           "config_dict.get('mini_batch_size', 1)",
                           {("pattern", "rl_config.py::RLConfig.__init__")}),
    "precondition order": ("mindspeed_rl/models/rollout/vllm_engine.py",
                           "        if load_format == \"megatron\":\n            update_megatron_weight_loader()\n",
                           "", {("order", "vllm_engine.py::VLLMInferEngine.__init__")}),
    "loader registry renamed": ("mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py",
                                "MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY = {", "MODEL_LOADERS = {",
                                {("module_attr", "megatron_weight_loaders.py::MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY")}),
    "loaders patched per instance, not per class": (
        "mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py",
        "        layer_class.weight_loader = weight_loader", "        pass",
        {("pattern", "megatron_weight_loaders.py::update_megatron_weight_loader")}),
    "wait removed": ("mindspeed_rl/trainer/utils/transfer_dock.py",
                     "            self._wait_for_data(single_column, indexes)\n", "",
                     {("reaches", "transfer_dock.py::GRPOTransferDock.get_experience")}),
}


@needs_src
@pytest.mark.parametrize("plant", list(PLANTS), ids=list(PLANTS))
def test_each_kind_of_mismatch_planted_in_the_real_tree_is_reported(tmp_path, plant):
    rel, old, new, expected = PLANTS[plant]
    copy = tmp_path / "ms"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns(".git", "docs", "tests"))
    text = (copy / rel).read_text()
    assert text.count(old) == 1, f"the plant for {plant!r} no longer applies to this tree"
    (copy / rel).write_text(text.replace(old, new))
    r = check_trees(copy, VA_SRC, yaml_files=shipped_yamls())
    got = {(f.kind, f.where.rsplit("/", 1)[-1]) for f in r.failures()}
    assert got == expected, r.render(plant)


@pytest.mark.skipif(installed_root("vllm") is None, reason="vllm is not installed")
def test_a_keyword_vllm_no_longer_consumes_behind_llm_kwargs_is_reported(tmp_path):
    """LLM(**kwargs) hands keywords to EngineArgs (a dataclass): rename one of its fields in a copy of
    the installed vLLM and the instance's LLM(...) call fails on exactly that keyword."""
    from asp_ascend.integrations.apicheck import Checker, ours_root
    from asp_ascend.integrations.mindspeed_rl.contract_vllm import VLLM_REQUIREMENTS

    src = installed_root("vllm") / "vllm"
    copy = tmp_path / "site" / "vllm"
    shutil.copytree(src, copy, ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                                                        and not (Path(d) / n).is_dir()])
    args = copy / "engine" / "arg_utils.py"
    text = args.read_text()
    old = "    worker_extension_cls: str = "
    assert text.count(old) == 1
    args.write_text(text.replace(old, "    worker_extension_class: str = "))
    clean = Checker({"vllm": src.parent, "ours": ours_root()}).run(VLLM_REQUIREMENTS)
    planted = Checker({"vllm": copy.parent, "ours": ours_root()}).run(VLLM_REQUIREMENTS)
    assert not clean.failures(), clean.render("installed vllm")
    bad = planted.failures()
    assert [(f.kind, f.where.rsplit("/", 1)[-1]) for f in bad] == [("call", "llm.py::LLM")], planted.render("x")
    assert "keyword 'worker_extension_cls'" in bad[0].detail and "EngineArgs" in bad[0].detail
