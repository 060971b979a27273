"""A parsed, never imported, view of a Python source tree: modules, classes, functions, signatures.

Files are parsed with :mod:`ast` on first use. Names are resolved the way Python would at
import time as far as the tree allows: ``from X import Y`` (absolute and relative), module
aliases (``import a.b as c``), re-exports, base classes across files. Anything outside the
tree (torch, ray, ...) is reported as unresolved, never guessed.

A :class:`Signature` is what a call binds against: a function's parameters, a class's
``__init__`` found along its bases, or the fields of a dataclass / msgspec ``Struct``
(vLLM's ``EngineArgs`` and ``SamplingParams`` are built that way).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

FuncNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain; a call contributes its callee (``f(x).g`` -> ``f.g``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func)
    return ""


@dataclass
class ClassInfo:
    name: str
    path: str
    node: ast.ClassDef
    bases: list[str]
    methods: dict[str, FuncNode]
    attrs: set[str]                         # self.X = ... anywhere in the class, and class-level names
    decorators: list[str]


@dataclass
class ModuleInfo:
    path: str
    tree: Optional[ast.Module]
    error: Optional[str]
    text: str = ""
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, FuncNode] = field(default_factory=dict)
    assigns: set[str] = field(default_factory=set)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)   # local name -> (module, name or "")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str            # posonly | pos | kwonly | varargs | varkw
    has_default: bool


@dataclass
class Signature:
    where: str                              # "path::Qualname" for messages
    params: list[Param]
    func: Optional[FuncNode] = None         # None for field-generated constructors
    cls: Optional[ClassInfo] = None         # the class the function belongs to (for super()/self.)

    @property
    def varkw(self) -> Optional[str]:
        return next((p.name for p in self.params if p.kind == "varkw"), None)

    @property
    def varargs(self) -> bool:
        return any(p.kind == "varargs" for p in self.params)

    def positional(self) -> list[Param]:
        return [p for p in self.params if p.kind in ("posonly", "pos")]

    def by_name(self, name: str) -> Optional[Param]:
        return next((p for p in self.params if p.name == name and p.kind in ("pos", "kwonly")), None)

    def describe(self) -> str:
        out = []
        for p in self.params:
            prefix = {"varargs": "*", "varkw": "**"}.get(p.kind, "")
            out.append(f"{prefix}{p.name}{'=' if p.has_default else ''}")
        return f"({', '.join(out)})"


def module_file(root: Path, module: str) -> Optional[str]:
    rel = module.replace(".", "/")
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        if (root / cand).is_file():
            return cand
    return None


def _self_attrs(node: ast.ClassDef) -> set[str]:
    attrs: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                        attrs.add(el.attr)
    for n in node.body:
        if isinstance(n, ast.Assign):
            attrs.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            attrs.add(n.target.id)
    return attrs


class SourceTree:
    """Lazily parsed tree rooted at ``root`` (paths are relative, with ``/``)."""

    def __init__(self, root: str | Path, name: str = ""):
        self.root = Path(root)
        self.name = name or self.root.name
        self._mods: dict[str, ModuleInfo] = {}

    def module(self, path: str) -> ModuleInfo:
        if path not in self._mods:
            self._mods[path] = self._load(path)
        return self._mods[path]

    def _load(self, path: str) -> ModuleInfo:
        f = self.root / path
        if not f.is_file():
            return ModuleInfo(path, None, "file not found")
        text = f.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text, filename=str(f))
        except SyntaxError as exc:
            return ModuleInfo(path, None, f"does not parse: {exc}", text=text)
        info = ModuleInfo(path, tree, None, text=text)
        pkg = str(Path(path).parent).replace("/", ".")   # relative imports resolve against the package
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                info.classes[node.name] = ClassInfo(node.name, path, node, [dotted(b) for b in node.bases], methods,
                                                    _self_attrs(node), [dotted(d) for d in node.decorator_list])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.functions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                info.assigns.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    base = pkg.split(".") if pkg not in ("", ".") else []
                    base = base[: len(base) - node.level + 1] if node.level > 1 else base
                    mod = ".".join([*base, node.module] if node.module else base)
                for a in node.names:
                    info.imports[a.asname or a.name] = (mod, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        info.imports[a.asname] = (a.name, "")
                    else:
                        top = a.name.split(".")[0]
                        info.imports[top] = (top, "")
        return info

    # ------------------------------------------------------------------ resolution
    def resolve(self, info: ModuleInfo, name: str, depth: int = 0):
        """What ``name`` (possibly dotted) denotes in module ``info``: ("class", ClassInfo),
        ("function", (ModuleInfo, node)), ("module", ModuleInfo) or None."""
        if depth > 8 or not name or info.tree is None:
            return None
        head, _, rest = name.partition(".")
        if not rest:
            if head in info.classes:
                return "class", info.classes[head]
            if head in info.functions:
                return "function", (info, info.functions[head])
        if head in info.imports:
            mod, orig = info.imports[head]
            target = self._import_target(mod, orig, depth)
            if target is None:
                return None
            if not rest:
                return target
            if target[0] == "module":
                return self.resolve(target[1], rest, depth + 1)
            if target[0] == "class" and "." not in rest:
                return "method", (target[1], rest)
        if rest and head in info.classes and "." not in rest:
            return "method", (info.classes[head], rest)
        return None

    def _import_target(self, mod: str, orig: str, depth: int):
        if orig:  # from mod import orig
            sub = module_file(self.root, f"{mod}.{orig}")
            if sub is not None:
                return "module", self.module(sub)
            path = module_file(self.root, mod)
            if path is None:
                return None
            return self.resolve(self.module(path), orig, depth + 1)
        path = module_file(self.root, mod)
        return ("module", self.module(path)) if path is not None else None

    def resolve_class(self, info: ModuleInfo, name: str) -> Optional[ClassInfo]:
        got = self.resolve(info, name)
        return got[1] if got and got[0] == "class" else None

    def find_class(self, path: str, name: str) -> Optional[ClassInfo]:
        info = self.module(path)
        if name in info.classes:
            return info.classes[name]
        return self.resolve_class(info, name)

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if any(c is o for o in out):
                continue
            out.append(c)
            info = self.module(c.path)
            todo.extend(b for b in (self.resolve_class(info, name) for name in c.bases) if b is not None)
        return out

    def find_method(self, cls: ClassInfo, name: str, after: Optional[ClassInfo] = None
                    ) -> Optional[tuple[ClassInfo, FuncNode]]:
        chain = self.mro(cls)
        if after is not None:
            idx = next((i for i, c in enumerate(chain) if c is after), -1)
            chain = chain[idx + 1:]
        for c in chain:
            if name in c.methods:
                return c, c.methods[name]
        return None

    def find_scope(self, path: str, qualname: str) -> Optional[tuple[FuncNode, Optional[ClassInfo]]]:
        """A function by dotted path of defs/classes, nested ones included (``f.Inner.m``)."""
        info = self.module(path)
        if info.tree is None:
            return None
        parts = qualname.split(".")
        body, cls_info = info.tree.body, None
        node = None
        for i, part in enumerate(parts):
            node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         and n.name == part), None)
            if node is None:
                node = next((n for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                             and n.name == part), None)
            if node is None:
                return None
            if isinstance(node, ast.ClassDef):
                cls_info = info.classes.get(node.name) or ClassInfo(
                    node.name, path, node, [dotted(b) for b in node.bases],
                    {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))},
                    _self_attrs(node), [dotted(d) for d in node.decorator_list])
            body = node.body
        if isinstance(node, ast.ClassDef):
            return None
        return node, cls_info

    # ------------------------------------------------------------------ signatures
    def signature_of_function(self, fn: FuncNode, where: str, cls: Optional[ClassInfo] = None,
                              bound: bool = False) -> Signature:
        a = fn.args
        n_pos = len(a.posonlyargs) + len(a.args)
        first_default = n_pos - len(a.defaults)
        params: list[Param] = []
        for i, x in enumerate([*a.posonlyargs, *a.args]):
            params.append(Param(x.arg, "posonly" if i < len(a.posonlyargs) else "pos", i >= first_default))
        if a.vararg:
            params.append(Param(a.vararg.arg, "varargs", True))
        for x, d in zip(a.kwonlyargs, a.kw_defaults):
            params.append(Param(x.arg, "kwonly", d is not None))
        if a.kwarg:
            params.append(Param(a.kwarg.arg, "varkw", True))
        decos = {dotted(d) for d in fn.decorator_list}
        if bound and "staticmethod" not in decos and params and params[0].kind in ("posonly", "pos"):
            params = params[1:]
        return Signature(where, params, fn, cls)

    def constructor(self, cls: ClassInfo) -> Signature:
        """How ``cls(...)`` binds: its ``__init__`` along the bases, or its dataclass/Struct fields."""
        where = f"{cls.path}::{cls.name}"
        fields = self._fields(cls)
        if fields is not None:
            return Signature(where, fields, None, cls)
        found = self.find_method(cls, "__init__")
        if found is None:
            return Signature(where, [], None, cls)
        owner, fn = found
        return self.signature_of_function(fn, f"{owner.path}::{owner.name}.__init__", owner, bound=True)

    def _fields(self, cls: ClassInfo) -> Optional[list[Param]]:
        chain = self.mro(cls)
        kind = None
        for c in chain:
            if "__init__" in c.methods:
                return None
            if any(d.split(".")[-1] in ("dataclass", "dataclasses.dataclass") for d in c.decorators):
                kind = kind or "dataclass"
            if any(b.split(".")[-1] == "Struct" for b in c.bases):
                kind = "struct"
        if kind is None:
            return None
        kw_only = kind == "struct" and any(k.arg == "kw_only" for c in chain for k in c.node.keywords)
        seen: dict[str, Param] = {}
        for c in reversed(chain):
            for n in c.node.body:
                if not (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)):
                    continue
                ann = ast.unparse(n.annotation)
                if ann.startswith(("ClassVar", "typing.ClassVar", "InitVar")) or n.target.id == "_":
                    continue
                if isinstance(n.value, ast.Call) and dotted(n.value.func).split(".")[-1] == "field":
                    kws = {k.arg: k.value for k in n.value.keywords}
                    if isinstance(kws.get("init"), ast.Constant) and kws["init"].value is False:
                        continue
                    default = "default" in kws or "default_factory" in kws
                else:
                    default = n.value is not None
                seen[n.target.id] = Param(n.target.id, "kwonly" if kw_only else "pos", default)
        return list(seen.values())
