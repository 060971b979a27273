"""Check a list of expectations (:mod:`.expect`) against source trees that are parsed, never imported."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Iterable, Optional

from . import pattern as pat
from .calls import check_call
from .expect import Call, ConfigKeys, Exists, Expectation, Finding, Order, Params, Pattern, Reaches, Ref, Report
from .kwflow import KwargsFollower
from .source import ClassInfo, Signature, SourceTree, dotted


def git_commit(root: Path) -> Optional[str]:
    """HEAD of ``root`` when ``root`` is itself a git checkout (not a directory inside another one)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return None
    return lines[1]


class Checker:
    """``trees`` maps a tree name to its root directory, or to None with ``missing[name]`` saying why;
    ``versions`` names what an installed tree is (a git checkout reports its commit)."""

    def __init__(self, trees: dict[str, Optional[Path]], missing: Optional[dict[str, str]] = None,
                 versions: Optional[dict[str, str]] = None):
        self.trees = {n: SourceTree(r, n) for n, r in trees.items() if r is not None}
        self.missing = {n: (missing or {}).get(n, "not given") for n, r in trees.items() if r is None}
        self.versions = dict(versions or {})

    def run(self, expectations: Iterable[Expectation]) -> Report:
        report = Report(trees={n: {"root": str(t.root), "commit": git_commit(t.root) or self.versions.get(n)}
                               for n, t in self.trees.items()})
        report.trees.update({n: {"missing": why} for n, why in self.missing.items()})
        for e in expectations:
            tree_name = (e.target if isinstance(e, Call) else e.ref).tree
            needed = {tree_name} | ({e.site.tree} if isinstance(e, Call) and e.site else set())
            absent = [n for n in needed if n not in self.trees]
            if absent:
                report.findings.append(Finding(e, True, f"tree {absent[0]!r} {self.missing.get(absent[0], 'unknown')}",
                                               skipped=True))
                continue
            try:
                report.findings.append(self.check(e))
            except Exception as exc:  # a checker bug must show as a finding, not abort the report
                report.findings.append(Finding(e, False, f"checker error: {type(exc).__name__}: {exc}"))
        return report

    def check(self, e: Expectation) -> Finding:
        return {Exists: self._exists, Params: self._params, Call: self._call, ConfigKeys: self._config_keys,
                Pattern: self._pattern, Order: self._order, Reaches: self._reaches}[type(e)](e)

    # ------------------------------------------------------------------ helpers
    def _tree(self, ref: Ref) -> SourceTree:
        return self.trees[ref.tree]

    def _class_member(self, ref: Ref) -> tuple[Optional[ClassInfo], str, str]:
        cls_name, _, member = ref.name.partition(".")
        tree = self._tree(ref)
        info = tree.module(ref.path)
        if info.error:
            return None, member, info.error
        cls = tree.find_class(ref.path, cls_name)
        return cls, member, "" if cls is not None else f"class {cls_name} not defined"

    def signature(self, ref: Ref, bound: bool = True) -> tuple[Optional[Signature], str]:
        tree = self._tree(ref)
        info = tree.module(ref.path)
        if info.error:
            return None, info.error
        if "." not in ref.name:
            cls = tree.find_class(ref.path, ref.name)
            if cls is not None:
                return tree.constructor(cls), ""
            got = tree.resolve(info, ref.name)
            if got and got[0] == "function":
                minfo, fn = got[1]
                return tree.signature_of_function(fn, f"{minfo.path}::{fn.name}"), ""
            return None, f"{ref.name} is not defined in {ref.path}"
        cls, member, err = self._class_member(ref)
        if cls is None:
            return None, err
        found = tree.find_method(cls, member)
        if found is None:
            return None, f"method {member} not found in {[c.name for c in tree.mro(cls)]}"
        owner, fn = found
        return tree.signature_of_function(fn, f"{owner.path}::{owner.name}.{member}", owner, bound=bound), ""

    def _scope(self, ref: Ref) -> tuple[Optional[ast.AST], bool, str]:
        tree = self._tree(ref)
        info = tree.module(ref.path)
        if info.error:
            return None, False, info.error
        if ref.name in ("", "<module>"):
            return info.tree, ref.name == "<module>", ""
        found = tree.find_scope(ref.path, ref.name)
        return (found[0], False, "") if found else (None, False, f"{ref.name} not defined in {ref.path}")

    # ------------------------------------------------------------------ kinds
    def _exists(self, e: Exists) -> Finding:
        tree, ref = self._tree(e.ref), e.ref
        if e.kind == "file":
            ok = (tree.root / ref.path).is_file()
            return Finding(e, ok, "" if ok else "file not found")
        info = tree.module(ref.path)
        if info.error:
            return Finding(e, False, info.error)
        if e.kind == "module":
            return Finding(e, True)
        if e.kind == "module_attr":
            ok = ref.name in info.assigns
            return Finding(e, ok, "" if ok else "no module-level assignment")
        if e.kind == "function":
            got = tree.resolve(info, ref.name)
            ok = bool(got and got[0] == "function")
            return Finding(e, ok, "" if ok else "function not defined at module level")
        if e.kind in ("class", "ray_actor"):
            cls = tree.find_class(ref.path, ref.name)
            if cls is None:
                return Finding(e, False, "class not defined")
            if e.kind == "ray_actor" and not any(d.startswith("ray.remote") or d == "remote" for d in cls.decorators):
                return Finding(e, False, f"not decorated with @ray.remote (decorators: {cls.decorators})")
            return Finding(e, True)
        cls, member, err = self._class_member(ref)
        if cls is None:
            return Finding(e, False, err)
        chain = tree.mro(cls)
        for c in chain:
            if (e.kind == "method" and member in c.methods) or (e.kind == "attr" and member in c.attrs):
                return Finding(e, True, "" if c is cls else f"inherited from {c.name}")
        what = f"method {member}" if e.kind == "method" else f"self.{member} = ..."
        return Finding(e, False, f"no {what} in {[c.name for c in chain]}")

    def _params(self, e: Params) -> Finding:
        sig, err = self.signature(e.ref)
        if sig is None:
            return Finding(e, False, err)
        names = [p.name for p in sig.params if p.kind in ("posonly", "pos", "kwonly")]
        ok = names == list(e.params) if e.exact else names[:len(e.params)] == list(e.params)
        return Finding(e, ok, "" if ok else f"the real signature is {sig.describe()}, expected "
                                            f"({', '.join(e.params)}{'' if e.exact else ', ...'})")

    def _config_keys(self, e: ConfigKeys) -> Finding:
        tree = self._tree(e.ref)
        info = tree.module(e.ref.path)
        if info.error:
            return Finding(e, False, info.error)
        cls = tree.find_class(e.ref.path, e.ref.name)
        if cls is None:
            return Finding(e, False, "class not defined")
        declared = set().union(*(c.attrs for c in tree.mro(cls)))
        missing = [k for k in e.keys if k not in declared]
        return Finding(e, not missing, f"undeclared keys {missing}" if missing else "")

    def declared_keys(self, keys: ConfigKeys) -> set[str]:
        if keys.ref.tree not in self.trees:
            return set()
        tree = self._tree(keys.ref)
        cls = tree.find_class(keys.ref.path, keys.ref.name)
        return set().union(*(c.attrs for c in tree.mro(cls))) if cls is not None else set()

    def _pattern(self, e: Pattern) -> Finding:
        scope, top, err = self._scope(e.ref)
        if scope is None:
            return Finding(e, False, err)
        hits = pat.find(scope, e.pattern, top_level_only=top)
        key = f"{e.key}: " if e.key else ""
        if e.absent:
            return Finding(e, not hits, "" if not hits else f"{key}`{e.pattern}` occurs at line {hits[0][0]}")
        return Finding(e, bool(hits), f"line {hits[0][0]}" if hits else f"{key}`{e.pattern}` not found")

    def _order(self, e: Order) -> Finding:
        scope, top, err = self._scope(e.ref)
        if scope is None:
            return Finding(e, False, err)
        first, then = pat.find(scope, e.first, top), pat.find(scope, e.then, top)
        if not first or not then:
            missing = [p for p, h in ((e.first, first), (e.then, then)) if not h]
            return Finding(e, False, f"`{missing[0]}` not found")
        ok = first[0] < then[0]
        return Finding(e, ok, f"`{e.first}` line {first[0][0]}, `{e.then}` line {then[0][0]}"
                       + ("" if ok else ": the precondition comes too late"))

    def _reaches(self, e: Reaches) -> Finding:
        tree = self._tree(e.ref)
        found = tree.find_scope(e.ref.path, e.ref.name)
        if found is None:
            return Finding(e, False, f"{e.ref.name} not defined in {e.ref.path}")
        follower = KwargsFollower(tree)
        todo, seen = [(found[0], found[1], [e.ref.name])], set()
        while todo:
            fn, cls, path = todo.pop(0)
            if id(fn) in seen or len(path) > 5:
                continue
            seen.add(id(fn))
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                name = dotted(node.func)
                if name == e.callee or name.endswith("." + e.callee):
                    return Finding(e, True, " -> ".join(path + [name]))
                sig = follower.callee(node, cls, cls.path if cls else e.ref.path)
                if sig is not None and sig.func is not None:
                    todo.append((sig.func, sig.cls, path + [sig.where.split("::")[-1]]))
        return Finding(e, False, f"no call of {e.callee} reachable from {e.ref.name}")

    def _call(self, e: Call) -> Finding:
        return check_call(self, e)
