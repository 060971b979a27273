"""Structural code patterns: find an expression or statement shape in a function, in order.

A pattern is Python source (one expression or one statement) matched against the AST:

- ``_`` matches any node; ``...`` as the last call argument matches any remaining arguments;
- a bare name matches that name or any attribute ending in it (``mini_batch_size`` matches
  ``self.rl_config.mini_batch_size``), ``_.attr`` does the same explicitly;
- ``a * b`` and ``a + b`` match either operand order;
- call keywords in the pattern must be present (others may be too); constants must be equal.

``find(scope, pattern)`` returns the (line, column) of every match inside ``scope`` in source
order; ``scope`` is a function node, a module (every statement) or the module's top level
only (statements not inside a def or class: what runs at import).
"""
from __future__ import annotations

import ast
from functools import lru_cache
from typing import Iterable

_COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr)


@lru_cache(maxsize=512)
def compile_pattern(src: str) -> ast.AST:
    mod = ast.parse(src.strip())
    if len(mod.body) != 1:
        raise ValueError(f"pattern {src!r}: write exactly one expression or statement")
    stmt = mod.body[0]
    return stmt.value if isinstance(stmt, ast.Expr) else stmt


def _is_wild(p: ast.AST) -> bool:
    return isinstance(p, ast.Name) and p.id == "_"


def _is_rest(p: ast.AST) -> bool:
    return isinstance(p, ast.Constant) and p.value is Ellipsis


def match(p: ast.AST, n: ast.AST) -> bool:
    if _is_wild(p):
        return True
    if isinstance(p, ast.Name):
        return (isinstance(n, ast.Name) and n.id == p.id) or (isinstance(n, ast.Attribute) and n.attr == p.id)
    if isinstance(p, ast.Attribute):
        return isinstance(n, ast.Attribute) and n.attr == p.attr and match(p.value, n.value)
    if isinstance(p, ast.Call):
        return isinstance(n, ast.Call) and match(p.func, n.func) and _args(p.args, n.args) and \
            all(any(k.arg == pk.arg and match(pk.value, k.value) for k in n.keywords) for pk in p.keywords)
    if isinstance(p, ast.BinOp):
        if not (isinstance(n, ast.BinOp) and type(n.op) is type(p.op)):
            return False
        if match(p.left, n.left) and match(p.right, n.right):
            return True
        return isinstance(p.op, _COMMUTATIVE) and match(p.left, n.right) and match(p.right, n.left)
    if isinstance(p, ast.Constant):
        return isinstance(n, ast.Constant) and n.value == p.value and type(n.value) is type(p.value)
    if type(p) is not type(n):
        return False
    for name, pv in ast.iter_fields(p):
        if name in ("ctx", "type_comment", "lineno", "col_offset", "end_lineno", "end_col_offset"):
            continue
        nv = getattr(n, name, None)
        if isinstance(pv, list):
            if not isinstance(nv, list) or not _args(pv, nv):
                return False
        elif isinstance(pv, ast.AST):
            if not isinstance(nv, ast.AST) or not match(pv, nv):
                return False
        elif pv != nv:
            return False
    return True


def _args(ps: list, ns: list) -> bool:
    if ps and isinstance(ps[-1], ast.AST) and _is_rest(ps[-1]):
        ps = ps[:-1]
        if len(ns) < len(ps):
            return False
        ns = ns[:len(ps)]
    if len(ps) != len(ns):
        return False
    return all(match(a, b) if isinstance(a, ast.AST) else a == b for a, b in zip(ps, ns))


def _nodes(scope: ast.AST, top_level_only: bool) -> Iterable[ast.AST]:
    if not top_level_only:
        yield from ast.walk(scope)
        return
    todo = list(getattr(scope, "body", []))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def find(scope: ast.AST, pattern: str, top_level_only: bool = False) -> list[tuple[int, int]]:
    p = compile_pattern(pattern)
    hits = {(n.lineno, n.col_offset) for n in _nodes(scope, top_level_only)
            if hasattr(n, "lineno") and match(p, n)}
    return sorted(hits)
