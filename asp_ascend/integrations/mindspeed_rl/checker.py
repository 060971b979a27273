"""Static check of a MindSpeed-RL source tree against :data:`.contract.REQUIREMENTS`.

Parses files with :mod:`ast`; never imports them (MindSpeed-RL cannot be imported
without torch_npu, CANN and vllm-ascend). Base classes are followed through
``from X import Y`` / relative imports inside the tree, so inherited methods and
attributes count. Also checks the keys of our MindSpeed-RL YAMLs
(``configs/mindspeed_rl/*.yaml``) against the config classes, since
``BaseConfig.update`` rejects any key a class does not declare.
"""
from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .contract import REQUIREMENTS, YAML_GROUPS, Req


@dataclass
class ClassInfo:
    name: str
    path: str
    bases: list[str]                      # dotted names as written
    methods: dict[str, ast.FunctionDef]
    attrs: set[str]
    decorators: list[str]


@dataclass
class ModuleInfo:
    path: str
    tree: Optional[ast.Module]
    error: Optional[str]
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    assigns: set[str] = field(default_factory=set)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module path, name)
    text: str = ""


@dataclass
class Finding:
    req: Req
    ok: bool
    detail: str = ""
    note: str = ""

    def line(self) -> str:
        tag = "ok  " if self.ok else "FAIL"
        what = f"{self.req.kind} {self.req.path}" + (f" :: {self.req.name}" if self.req.name else "")
        extra = f" ({self.detail})" if self.detail else ""
        note = f" [note: {self.note}]" if self.note else ""
        return f"{tag} {what}{extra}{note}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


def _module_file(root: Path, module: str) -> Optional[str]:
    rel = module.replace(".", "/")
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        if (root / cand).is_file():
            return cand
    return None


class SourceTree:
    """Parsed view of a source tree, loaded lazily file by file."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._mods: dict[str, ModuleInfo] = {}

    def module(self, path: str) -> ModuleInfo:
        if path in self._mods:
            return self._mods[path]
        f = self.root / path
        if not f.is_file():
            info = ModuleInfo(path, None, "file not found")
        else:
            text = f.read_text(encoding="utf-8", errors="replace")
            try:
                tree = ast.parse(text, filename=str(f))
                info = ModuleInfo(path, tree, None, text=text)
                self._index(info)
            except SyntaxError as exc:
                info = ModuleInfo(path, None, f"does not parse: {exc}", text=text)
        self._mods[path] = info
        return info

    def _index(self, info: ModuleInfo) -> None:
        pkg = str(Path(info.path).parent).replace("/", ".")
        for node in info.tree.body:
            if isinstance(node, ast.ClassDef):
                methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                attrs = set()
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for t in targets:
                            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) \
                                        and el.value.id == "self":
                                    attrs.add(el.attr)
                for n in node.body:  # class-level assignments
                    if isinstance(n, ast.Assign):
                        attrs.update(t.id for t in n.targets if isinstance(t, ast.Name))
                    elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                        attrs.add(n.target.id)
                info.classes[node.name] = ClassInfo(node.name, info.path, [_dotted(b) for b in node.bases], methods,
                                                    attrs, [_dotted(d) for d in node.decorator_list])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.functions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                info.assigns.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - node.level + 1] if node.level > 1 else base
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                for a in node.names:
                    info.imports[a.asname or a.name] = (mod, a.name)

    def resolve_class(self, info: ModuleInfo, dotted: str, depth: int = 0) -> Optional[ClassInfo]:
        if depth > 8 or not dotted:
            return None
        name = dotted.split(".")[-1]
        if "." not in dotted and name in info.classes:
            return info.classes[name]
        if name in info.imports:
            mod, orig = info.imports[name]
            path = _module_file(self.root, mod)
            if path is None:   # outside the tree (torch, ray, ...): not followed
                return None
            target = self.module(path)
            if target.tree is None:
                return None
            if orig in target.classes:
                return target.classes[orig]
            return self.resolve_class(target, orig, depth + 1)  # re-exported
        return None

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if any(c is o for o in out):
                continue
            out.append(c)
            info = self.module(c.path)
            for b in c.bases:
                bc = self.resolve_class(info, b)
                if bc is not None:
                    todo.append(bc)
        return out


def _params(fn: ast.FunctionDef) -> tuple[set[str], bool]:
    a = fn.args
    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return names, a.kwarg is not None


def check_requirement(tree: SourceTree, req: Req) -> Finding:
    if req.kind == "file":
        ok = (tree.root / req.path).is_file()
        return Finding(req, ok, "" if ok else "file not found")
    info = tree.module(req.path)
    if info.error and req.kind != "call":
        return Finding(req, False, info.error)
    if req.kind == "module":
        return Finding(req, True)
    if req.kind == "call":
        if info.error == "file not found":
            return Finding(req, False, info.error)
        ok = req.name in info.text
        return Finding(req, ok, "" if ok else f"text {req.name!r} not found")
    if req.kind == "module_attr":
        ok = req.name in info.assigns
        return Finding(req, ok, "" if ok else "no module-level assignment")
    if req.kind == "function":
        fn = info.functions.get(req.name)
        if fn is None:
            return Finding(req, False, "function not defined at module level")
        return _check_params(req, fn)
    if req.kind in ("class", "ray_actor", "config_keys"):
        cls = info.classes.get(req.name)
        if cls is None:
            return Finding(req, False, "class not defined")
        if req.kind == "ray_actor" and not any(d.startswith("ray.remote") or d == "remote" for d in cls.decorators):
            return Finding(req, False, f"not decorated with @ray.remote (decorators: {cls.decorators})")
        if req.kind == "config_keys":
            declared = set().union(*(c.attrs for c in tree.mro(cls)))
            missing = [k for k in req.params if k not in declared]
            return Finding(req, not missing, f"undeclared keys {missing}" if missing else "")
        return Finding(req, True)
    cls_name, _, member = req.name.partition(".")
    cls = info.classes.get(cls_name)
    if cls is None:
        return Finding(req, False, f"class {cls_name} not defined")
    chain = tree.mro(cls)
    if req.kind == "method":
        for c in chain:
            if member in c.methods:
                f = _check_params(req, c.methods[member])
                if c is not cls and f.ok:
                    f.note = (f.note + "; " if f.note else "") + f"inherited from {c.name}"
                return f
        return Finding(req, False, f"method {member} not found in {[c.name for c in chain]}")
    if req.kind == "attr":
        for c in chain:
            if member in c.attrs:
                return Finding(req, True, note="" if c is cls else f"set in {c.name}")
        return Finding(req, False, f"no self.{member} = ... in {[c.name for c in chain]}")
    return Finding(req, False, f"unknown requirement kind {req.kind!r}")


def _check_params(req: Req, fn) -> Finding:
    names, has_kwargs = _params(fn)
    missing = [p for p in req.params if p not in names]
    if missing and not has_kwargs:
        return Finding(req, False, f"does not accept {missing}")
    return Finding(req, True, note=f"{missing} only through **kwargs" if missing else "")


def check_yaml_keys(tree: SourceTree, yaml_path: Path) -> list[Finding]:
    """Every key of our MindSpeed-RL YAML groups is declared by the config class that reads it."""
    import yaml

    raw = yaml.safe_load(yaml_path.read_text()) or {}
    out = []
    for group, (path, cls_name) in YAML_GROUPS.items():
        keys = [k.replace("-", "_") for k in (raw.get(group) or {}) if k != "model"]
        req = Req("config_keys", path, cls_name, tuple(keys), why=f"{yaml_path.name}: {group}")
        f = check_requirement(tree, req)
        f.req = Req("yaml_keys", str(yaml_path.name), f"{group} -> {cls_name}", tuple(keys), why=req.why)
        out.append(f)
    return out


def git_commit(root: Path) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def check_source(root: str | Path, yaml_files: Iterable[Path] = (),
                 requirements: Iterable[Req] = REQUIREMENTS) -> dict:
    """Run every check; returns ``{root, commit, ok, findings: [...]}``."""
    root = Path(root)
    if not (root / "mindspeed_rl").is_dir():
        return {"root": str(root), "commit": None, "ok": False,
                "findings": [{"ok": False, "line": f"FAIL {root} has no mindspeed_rl/ package: point "
                              f"--mindspeed-src at the MindSpeed-RL repository root"}]}
    tree = SourceTree(root)
    findings = [check_requirement(tree, r) for r in requirements]
    for y in yaml_files:
        findings.extend(check_yaml_keys(tree, Path(y)))
    return {"root": str(root), "commit": git_commit(root), "ok": all(f.ok for f in findings),
            "findings": [{"ok": f.ok, "kind": f.req.kind, "path": f.req.path, "name": f.req.name,
                          "detail": f.detail, "note": f.note, "why": f.req.why, "line": f.line()} for f in findings]}


def shipped_yamls() -> list[Path]:
    """Our MindSpeed-RL YAMLs when running from a checkout (configs/mindspeed_rl/*.yaml)."""
    d = Path(__file__).resolve().parents[3] / "configs" / "mindspeed_rl"
    return sorted(d.glob("*.yaml")) if d.is_dir() else []
