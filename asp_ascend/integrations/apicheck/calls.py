"""Binding one of our calls against the real signature of its target.

What is read from our call site: how many positional arguments, which keywords, which
``**expr`` expansions (a local ``x = dict(...)`` / ``{...}`` is expanded; other expansions
are resolved through the contract's ``splat_keys`` or reported as unchecked). What must
hold in the target, as Python would bind it at run time:

- the i-th positional argument lands on the parameter the contract intends (a reordered
  signature is caught even when the count still fits);
- no more positionals than the target takes;
- every keyword is a named parameter, or travels through ``**kwargs`` to a place that
  consumes it (:mod:`.kwflow`); dropped or rejected keywords fail;
- no keyword also bound positionally or also present in an expansion (TypeError);
- every required parameter receives a value.
"""
from __future__ import annotations

import ast
from typing import Any, Optional

from .expect import Call, Finding
from .kwflow import KwargsFollower
from .source import dotted

Checker = Any   # .check.Checker (not imported: it imports this module)


def _local_dicts(fn: ast.AST) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Dict) or (isinstance(v, ast.Call) and dotted(v.func) == "dict" and not v.args):
                out[node.targets[0].id] = v
    return out


def _keywords(call: ast.Call, dicts: dict[str, ast.AST], depth: int = 0) -> tuple[list[str], list[str]]:
    """(keyword names, unresolved ``**expr`` texts) of a call or of a dict(...) / {...} literal."""
    names, splats = [], []
    items: list[tuple[Optional[str], ast.AST]] = []
    if isinstance(call, ast.Call):
        items = [(k.arg, k.value) for k in call.keywords]
    elif isinstance(call, ast.Dict):
        items = [(k.value if isinstance(k, ast.Constant) else None, v) for k, v in zip(call.keys, call.values)]
    for key, value in items:
        if key is not None:
            names.append(key)
        elif isinstance(value, ast.Name) and value.id in dicts and depth < 4:
            sub_names, sub_splats = _keywords(dicts[value.id], dicts, depth + 1)
            names += sub_names
            splats += sub_splats
        else:
            splats.append(ast.unparse(value))
    return names, splats


def _site_calls(checker: Checker, e: Call) -> tuple[list[tuple[int, int, list[str], list[str], bool]], str]:
    site = e.site
    tree = checker.trees[site.tree]
    found = tree.find_scope(site.path, site.function)
    if found is None:
        return [], f"call site {site.path}::{site.function} not found in our code (update the contract)"
    fn = found[0]
    dicts = _local_dicts(fn)
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and dotted(node.func) == site.callee:
            names, splats = _keywords(node, dicts)
            starred = any(isinstance(a, ast.Starred) for a in node.args)
            out.append((node.lineno, len(node.args), names, splats, starred))
    if not out:
        return [], f"no call of {site.callee} in {site.path}::{site.function} (update the contract)"
    return out, ""


def check_call(checker: Checker, e: Call) -> Finding:
    sig, err = checker.signature(e.target, bound=e.bound)
    if sig is None:
        return Finding(e, False, err)
    if e.site is None:
        calls = [(0, len(e.args), list(e.kwargs), [], False)]
    else:
        calls, err = _site_calls(checker, e)
        if not calls:
            return Finding(e, False, err)
    problems, notes = [], []
    for line, npos, names, splats, starred in calls:
        at = f"line {line}: " if line else ""
        if e.site is not None and not starred and npos > len(e.args):
            problems.append(f"{at}our call passes {npos} positional argument(s), the contract names only {len(e.args)} "
                            f"({', '.join(e.args) or 'none'}): update the contract")
            continue
        p, n = _bind(checker, e, sig, e.args[:npos] if e.site is not None else e.args,
                     [k for k in names if k not in e.drop], splats)
        problems += [at + x for x in p]
        notes += [at + x for x in n]
    detail = "; ".join(problems) if problems else f"binds to {sig.where}{sig.describe()}"
    return Finding(e, not problems, detail, note="; ".join(dict.fromkeys(notes)))


def _bind(checker: Checker, e: Call, sig, args: tuple, names: list[str], splats: list[str]
          ) -> tuple[list[str], list[str]]:
    problems, notes = [], []
    positional = sig.positional()
    for i, intended in enumerate(args):
        if i >= len(positional):
            if not sig.varargs:
                problems.append(f"{sig.where} takes {len(positional)} positional argument(s), we pass {len(args)}")
            break
        if positional[i].name != intended:
            problems.append(f"positional argument {i + 1} is {positional[i].name!r} in {sig.where}{sig.describe()}, "
                            f"we pass {intended} there")
    bound = {p.name for p in positional[:len(args)]}
    splat_keys: set[str] = set()
    for text in splats:
        declared = next((checker.declared_keys(keys) for src, keys in e.splat_keys if src == text), None)
        if declared is None:
            notes.append(f"keywords from **{text} not checked")
        else:
            splat_keys |= declared
    tree = checker.trees[e.target.tree]
    follower = KwargsFollower(tree)
    for kw in names:
        if kw in bound:
            problems.append(f"{kw!r} is passed both positionally and as a keyword")
            continue
        if kw in splat_keys:
            problems.append(f"{kw!r} is passed as a keyword and again inside **{splats[0]} (TypeError)")
        if sig.by_name(kw) is not None:
            continue
        flow = follower.follow(sig, kw)
        route = " -> ".join(flow.path)
        if not flow.accepted:
            problems.append(f"keyword {kw!r}: {flow.detail} (via {route})")
        elif flow.status != "used":
            notes.append(f"{kw!r} via **kwargs: {flow.detail}")
    given = bound | set(names)
    for p in sig.params:
        if p.kind in ("posonly", "pos", "kwonly") and not p.has_default and p.name not in given:
            if p.name in splat_keys:
                continue
            if splats and not splat_keys:
                notes.append(f"required {p.name!r} only possibly inside **{splats[0]}")
            else:
                problems.append(f"required argument {p.name!r} of {sig.where} is not passed")
    return problems, notes
