"""The vocabulary of an API contract: what an adapter expects of code it does not own.

Every expectation names the tree it is about (``"mindspeed"``, ``"vllm"``, ``"ours"``, ...;
the caller maps names to directories) and says why it matters, so a failure explains itself.

- :class:`Exists`: a module, class, ``@ray.remote`` class, function, method, instance or
  module attribute, or a plain file.
- :class:`Params`: the parameters of a function we override or call by reflection, in
  order (``exact``: nothing else either).
- :class:`Call`: one call we make into foreign code. ``site`` points at the call in our code
  (positional count and keyword names are read from it); ``args`` names the parameters our
  positional arguments are meant for, in order. Checked against the real signature: the
  order of positionals, arguments the callee requires and we do not pass, keywords it does
  not name (followed through ``**kwargs`` to where they are consumed), duplicates.
- :class:`ConfigKeys`: attributes a config class declares (``BaseConfig.update``-style
  classes reject anything else).
- :class:`Pattern`: a code shape that must be present in a scope, e.g. where a config key is
  given its meaning (``mini_batch_size * n_samples_per_prompt``), or a wait we rely on.
- :class:`Order`: within a scope, one pattern's first occurrence precedes another's
  (a precondition such as "patch the loaders before the engine is built").
- :class:`Reaches`: a function calls (directly or through methods of its class and module
  functions) something whose name ends as given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union


@dataclass(frozen=True)
class Ref:
    """A place in a tree: ``path`` relative to the tree root; ``name`` is ``Class``, ``Class.member``,
    ``function`` or a dotted path of nested defs; ``""`` is the whole file, ``"<module>"`` its top level."""
    tree: str
    path: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.tree}:{self.path}" + (f"::{self.name}" if self.name else "")


@dataclass(frozen=True)
class Exists:
    ref: Ref
    kind: str            # module | file | class | ray_actor | function | method | attr | module_attr
    why: str = ""


@dataclass(frozen=True)
class Params:
    ref: Ref             # a function or Class.method
    params: tuple[str, ...]
    exact: bool = False  # False: these names, in this order, at the front; True: and nothing else
    why: str = ""


@dataclass(frozen=True)
class Site:
    """Where a call sits in our code: the function (dotted path of nested defs) and the callee as written."""
    path: str
    function: str
    callee: str
    tree: str = "ours"


@dataclass(frozen=True)
class Call:
    target: Ref                                # function, Class (constructor) or Class.method
    args: tuple[str, ...] = ()                 # parameter names our positionals are meant for
    kwargs: tuple[str, ...] = ()               # keywords (read from the site when there is one)
    site: Optional[Site] = None
    drop: tuple[str, ...] = ()                 # keywords our own subclass consumes before the target
    splat_keys: tuple[tuple[str, "ConfigKeys"], ...] = ()   # (``**expr`` as written, the keys it holds)
    bound: bool = True                         # False: the callee is called unbound (``Cls.m(self, ...)``)
    why: str = ""


@dataclass(frozen=True)
class ConfigKeys:
    ref: Ref             # the config class
    keys: tuple[str, ...]
    why: str = ""


@dataclass(frozen=True)
class Pattern:
    ref: Ref             # scope: function, "" (file) or "<module>" (top level)
    pattern: str
    key: str = ""        # the config key whose meaning this pins, if any
    absent: bool = False  # True: the shape must NOT occur
    why: str = ""


@dataclass(frozen=True)
class Order:
    ref: Ref
    first: str
    then: str
    why: str = ""


@dataclass(frozen=True)
class Reaches:
    ref: Ref
    callee: str
    why: str = ""


Expectation = Union[Exists, Params, Call, ConfigKeys, Pattern, Order, Reaches]


@dataclass
class Finding:
    expectation: Expectation
    ok: bool
    detail: str = ""
    note: str = ""
    skipped: bool = False

    @property
    def kind(self) -> str:
        e = self.expectation
        return e.kind if isinstance(e, Exists) else type(e).__name__.lower()

    @property
    def where(self) -> str:
        e = self.expectation
        ref = e.target if isinstance(e, Call) else e.ref
        return str(ref)

    def line(self) -> str:
        tag = "skip" if self.skipped else ("ok  " if self.ok else "FAIL")
        extra = f" ({self.detail})" if self.detail else ""
        note = f" [note: {self.note}]" if self.note else ""
        why = getattr(self.expectation, "why", "")
        return f"{tag} {self.kind} {self.where}{extra}{note}" + (f" -- {why}" if why and not self.ok else "")


def _label(tree: dict) -> str:
    c = tree.get("commit") or ""
    return f"commit {c}" if len(c) == 40 and all(ch in "0123456789abcdef" for ch in c) else (c or "commit unknown")


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    trees: dict[str, dict] = field(default_factory=dict)   # name -> {"root", "commit"} or {"missing": why}
    unavailable: str = ""   # the tree the whole contract is about is absent: nothing was checked, and why

    @classmethod
    def not_checked(cls, tree: str, why: str) -> "Report":
        """Nothing could be checked (the framework's tree is missing): not a pass, not a mismatch either."""
        return cls(trees={tree: {"missing": why}}, unavailable=why)

    @property
    def checked(self) -> list[Finding]:
        return [f for f in self.findings if not f.skipped]

    @property
    def ok(self) -> bool:
        return not self.unavailable and all(f.ok for f in self.checked)

    def failures(self) -> list[Finding]:
        return [f for f in self.checked if not f.ok]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "trees": self.trees, "unavailable": self.unavailable or None,
                "findings": [{"ok": f.ok, "skipped": f.skipped, "kind": f.kind, "where": f.where,
                              "detail": f.detail, "note": f.note, "why": getattr(f.expectation, "why", ""),
                              "line": f.line()} for f in self.findings]}

    def render(self, title: str, verbose: bool = False) -> str:
        lines = [title]
        for name, t in self.trees.items():
            lines.append(f"  tree {name}: " + (t["missing"] if "missing" in t else f"{t['root']} ({_label(t)})"))
        if self.unavailable:
            lines.append(f"  not checked: {self.unavailable}")
            return "\n".join(lines)
        for f in self.findings:
            if verbose or not f.ok or f.note:
                if not f.skipped or verbose:
                    lines.append(f"  {f.line()}")
        bad, checked = self.failures(), self.checked
        skipped = len(self.findings) - len(checked)
        lines.append(f"  {len(checked) - len(bad)}/{len(checked)} checks passed"
                     + (f", {skipped} skipped (tree not given)" if skipped else "")
                     + ("" if not bad else f"; {len(bad)} mismatch(es): the adapter needs updating for this tree"))
        return "\n".join(lines)
