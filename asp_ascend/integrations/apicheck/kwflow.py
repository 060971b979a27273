"""Where does a keyword that lands in ``**kwargs`` go?

A function that takes ``**kwargs`` accepts any keyword, so "the parameter exists" says
nothing. This follows the dict through the function body:

- ``kwargs["k"]``, ``kwargs.get("k")``, ``kwargs.pop("k")``, ``"k" in kwargs``: used here;
- ``f(**kwargs)`` / ``super().__init__(**kwargs)`` / ``self.m(**kwargs)``: forwarded, followed
  into the callee (which either names ``k``, takes ``**kwargs`` again, or rejects it:
  a TypeError at run time);
- ``self.attr = kwargs``: stored; ``self.attr["k"]`` / ``.get("k")`` / ``**self.attr``
  elsewhere in the class are followed the same way;
- any other use (iteration, ``setattr`` loops, passing the dict along): a sink that may use
  anything (accepted, with a note);
- never read at all: the keyword is silently dropped.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from .source import ClassInfo, FuncNode, ModuleInfo, Signature, SourceTree, dotted

MAX_DEPTH = 6


@dataclass
class Flow:
    status: str        # used | sink | unfollowed | dropped | rejected
    path: list[str]    # the functions the keyword went through
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.status in ("used", "sink", "unfollowed")


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and _is_name(node.value, "self")


def _path_of(where: str) -> str:
    return where.split("::", 1)[0]


def _const(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reads_key(node: ast.AST, is_dict, key: str) -> bool:
    if isinstance(node, ast.Subscript) and is_dict(node.value) and _const(node.slice) == key:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_dict(node.func.value) \
            and node.func.attr in ("get", "pop", "setdefault") and node.args and _const(node.args[0]) == key:
        return True
    return isinstance(node, ast.Compare) and _const(node.left) == key and \
        any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(is_dict(c) for c in node.comparators)


def _pops_key(body: ast.AST, is_dict, key: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pop"
               and is_dict(n.func.value) and n.args and _const(n.args[0]) == key for n in ast.walk(body))


class KwargsFollower:
    def __init__(self, tree: SourceTree):
        self.tree = tree

    def follow(self, sig: Signature, key: str, depth: int = 0) -> Flow:
        """Fate of keyword ``key`` passed to ``sig`` (which must not name it)."""
        here = [sig.where]
        if sig.varkw is None:
            return Flow("rejected", here, f"{sig.where}{sig.describe()} has no parameter {key!r} and no **kwargs")
        if sig.func is None or depth > MAX_DEPTH:
            return Flow("unfollowed", here, "not followed further")
        name = sig.varkw
        flows = self._in_body(sig.func, sig.where, sig.cls, lambda n: _is_name(n, name), key, depth)
        return self._combine(flows, here, f"{sig.where} takes it in **{name} and never reads it")

    def _combine(self, flows: list[Flow], here: list[str], dropped_msg: str) -> Flow:
        if not flows:
            return Flow("dropped", here, dropped_msg)
        for status in ("rejected", "used", "sink", "unfollowed"):
            hit = next((f for f in flows if f.status == status), None)
            if hit is not None:
                return Flow(hit.status, here + hit.path, hit.detail)
        return Flow("dropped", here + flows[0].path, flows[0].detail)

    def _in_body(self, fn: FuncNode, where: str, cls: Optional[ClassInfo], is_dict, key: str, depth: int
                 ) -> list[Flow]:
        flows: list[Flow] = []
        popped = _pops_key(fn, is_dict, key)
        handled: set[int] = set()
        for node in ast.walk(fn):
            if _reads_key(node, is_dict, key):
                flows.append(Flow("used", [], ""))
                handled.update(id(n) for n in ast.walk(node))
            elif isinstance(node, ast.Call):
                if isinstance(node.func, ast.Attribute) and is_dict(node.func.value) \
                        and node.func.attr in ("get", "pop", "setdefault", "keys", "values"):
                    handled.add(id(node.func.value))   # reads other keys
                for kw in node.keywords:
                    if kw.arg is None and is_dict(kw.value):
                        handled.add(id(kw.value))
                        if not popped:
                            flows.append(self._forward(node, where, cls, key, depth))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and is_dict(node.value) \
                    and isinstance(node.targets[0], ast.Attribute) and _is_name(node.targets[0].value, "self"):
                handled.add(id(node.value))
                if cls is not None and not popped:
                    flows.extend(self._stored(cls, node.targets[0].attr, key, depth))
        for node in ast.walk(fn):
            if is_dict(node) and id(node) not in handled and not isinstance(getattr(node, "ctx", None), ast.Store):
                flows.append(Flow("sink", [], f"the dict is used as a whole (line {node.lineno}): may read anything"))
                break
        return flows

    def _stored(self, cls: ClassInfo, attr: str, key: str, depth: int) -> list[Flow]:
        flows = []
        for c in self.tree.mro(cls):
            for fn in c.methods.values():
                flows.extend(self._in_body(fn, f"{c.path}::{c.name}.{fn.name}", c, lambda n: _is_self_attr(n, attr),
                                           key, depth + 1))
        return [Flow(f.status, [f"self.{attr}"] + f.path, f.detail) for f in flows]

    def _forward(self, call: ast.Call, fn_where: str, cls: Optional[ClassInfo], key: str, depth: int) -> Flow:
        target = self.callee(call, cls, _path_of(fn_where))
        text = dotted(call.func) or ast.unparse(call.func)[:60]
        if target is None:
            return Flow("unfollowed", [f"{text}(**...) at line {call.lineno}"],
                        f"forwarded to {text} (not resolvable in the tree), not followed")
        sig = target
        if sig.by_name(key) is not None:
            return Flow("used", [sig.where], "")
        return self.follow(sig, key, depth + 1)

    def callee(self, call: ast.Call, cls: Optional[ClassInfo], path: str) -> Optional[Signature]:
        """The signature a call made in file ``path`` (in a method of ``cls``) binds against, when the tree says."""
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and _is_name(f.value.func, "super"):
            if cls is None:
                return None
            found = self.tree.find_method(cls, f.attr, after=cls)
            return None if found is None else self.tree.signature_of_function(
                found[1], f"{found[0].path}::{found[0].name}.{f.attr}", found[0], bound=True)
        if isinstance(f, ast.Attribute) and _is_name(f.value, "self") and cls is not None:
            found = self.tree.find_method(cls, f.attr)
            return None if found is None else self.tree.signature_of_function(
                found[1], f"{found[0].path}::{found[0].name}.{f.attr}", found[0], bound=True)
        return self.resolve_callable(self.tree.module(path), dotted(f))

    def resolve_callable(self, info: ModuleInfo, name: str, explicit_self: bool = False) -> Optional[Signature]:
        got = self.tree.resolve(info, name)
        if got is None:
            return None
        kind, obj = got
        if kind == "class":
            return self.tree.constructor(obj)
        if kind == "function":
            minfo, node = obj
            return self.tree.signature_of_function(node, f"{minfo.path}::{node.name}")
        if kind == "method":
            c, meth = obj
            found = self.tree.find_method(c, meth)
            if found is None:
                return None
            return self.tree.signature_of_function(found[1], f"{found[0].path}::{found[0].name}.{meth}", found[0],
                                                   bound=not explicit_self)
        return None
