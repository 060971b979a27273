"""``asp doctor --mindspeed-src PATH [--vllm-ascend-src PATH] [--vllm-src PATH]``: the adapter's contract
(:mod:`.contract`, :mod:`.contract_vllm`) checked against the real trees with
:mod:`asp_ascend.integrations.apicheck`, plus the keys of our MindSpeed-RL YAMLs
(``configs/mindspeed_rl/*.yaml``) against the config classes that read them
(``BaseConfig.update`` rejects any key a class does not declare).

Trees: ``mindspeed`` (required), ``ours`` (this package), ``vllm`` (``--vllm-src`` or the
installed vllm), ``vllm_ascend`` (``--vllm-ascend-src``), ``ray`` (the installed ray).
An expectation about a tree that was not given is reported as skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ..apicheck import Checker, ConfigKeys, Ref, Report, installed_root, ours_root
from .contract import CONFIG_KEYS, REQUIREMENTS, YAML_GROUPS


def yaml_key_checks(yaml_path: Path) -> list[ConfigKeys]:
    """One ConfigKeys per MindSpeed-RL group of a YAML: every key must be declared by its class."""
    import yaml

    raw = yaml.safe_load(Path(yaml_path).read_text()) or {}
    out = []
    for group, (path, cls_name) in YAML_GROUPS.items():
        keys = tuple(k.replace("-", "_") for k in (raw.get(group) or {}) if k != "model")
        out.append(ConfigKeys(Ref("mindspeed", path, cls_name), keys, why=f"{Path(yaml_path).name}: {group}"))
    return out


def all_expectations(yaml_files: Iterable[Path] = ()) -> list:
    from .contract_vllm import VLLM_REQUIREMENTS

    out = [*REQUIREMENTS, *CONFIG_KEYS, *VLLM_REQUIREMENTS]
    for y in yaml_files:
        out.extend(yaml_key_checks(Path(y)))
    return out


def check_trees(mindspeed_src: str | Path, vllm_ascend_src: Optional[str] = None, vllm_src: Optional[str] = None,
                yaml_files: Iterable[Path] = (), expectations: Optional[list] = None) -> Report:
    root = Path(mindspeed_src)
    if not (root / "mindspeed_rl").is_dir():
        return Report.not_checked("mindspeed", f"{root} has no mindspeed_rl/ package: point --mindspeed-src at the "
                                               f"MindSpeed-RL repository root")
    vllm = Path(vllm_src) if vllm_src else installed_root("vllm")
    trees = {"mindspeed": root, "ours": ours_root(), "vllm": vllm,
             "vllm_ascend": Path(vllm_ascend_src) if vllm_ascend_src else None, "ray": installed_root("ray")}
    missing = {"vllm": "not installed here and --vllm-src not given",
               "vllm_ascend": "not given (pass --vllm-ascend-src PATH, a vllm-ascend checkout)",
               "ray": "not installed here"}
    exps = expectations if expectations is not None else all_expectations(yaml_files)
    versions = {n: f"installed {d} {_version(d)}" for n, d in (("vllm", "vllm"), ("ray", "ray"))
                if trees[n] is not None and not vllm_src}
    return Checker(trees, missing, versions).run(exps)


def _version(dist: str) -> str:
    import importlib.metadata as md

    for name in (dist, f"{dist}-cpu"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return "(version unknown)"


def shipped_yamls() -> list[Path]:
    """Our MindSpeed-RL YAMLs when running from a checkout (configs/mindspeed_rl/*.yaml)."""
    d = ours_root() / "configs" / "mindspeed_rl"
    return sorted(d.glob("*.yaml")) if d.is_dir() else []


def run_check(mindspeed_src: str, vllm_ascend_src: Optional[str] = None, vllm_src: Optional[str] = None,
              as_json: bool = False, verbose: bool = False) -> tuple[int, str]:
    """(exit status, text) for ``asp doctor``: 1 when anything checked does not hold."""
    import json

    report = check_trees(mindspeed_src, vllm_ascend_src, vllm_src, yaml_files=shipped_yamls())
    text = json.dumps(report.to_dict(), indent=2) if as_json else report.render(
        "MindSpeed-RL adapter contract (asp_ascend/integrations/mindspeed_rl/contract*.py):", verbose=verbose)
    return (0 if report.ok else 1), text
