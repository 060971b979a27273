"""Static API-contract checks of an adapter against code it does not own (framework-agnostic).

An adapter (MindSpeed-RL, verl, ...) lists what it relies on as data (:mod:`.expect`):
symbols that must exist, the calls it makes (read from our own call sites and bound against
the real signatures, following ``**kwargs`` to where they are consumed), config keys and the
code that gives them their meaning, and call-order preconditions. :class:`.check.Checker`
parses the trees (never imports them: the frameworks need their accelerators to import) and
returns a :class:`.expect.Report`. Trees are named (``"ours"`` is this package's root); an
expectation about a tree that was not given is reported as skipped, never as passed.

Usage::

    from asp_ascend.integrations.apicheck import Checker, ours_root
    report = Checker({"ours": ours_root(), "vllm": installed_root("vllm")}).run(EXPECTATIONS)
    print(report.render("my adapter")); sys.exit(0 if report.ok else 1)

Only the standard library is used.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

from .check import Checker
from .expect import Call, ConfigKeys, Exists, Finding, Order, Params, Pattern, Reaches, Ref, Report, Site
from .source import SourceTree

__all__ = ["Checker", "Call", "ConfigKeys", "Exists", "Finding", "Order", "Params", "Pattern", "Reaches", "Ref",
           "Report", "Site", "SourceTree", "ours_root", "installed_root"]


def ours_root() -> Path:
    """The directory holding the ``asp_ascend`` package (paths of "ours" start with ``asp_ascend/``)."""
    return Path(__file__).resolve().parents[3]


def installed_root(package: str) -> Optional[Path]:
    """The directory an installed top-level package is imported from (its parent), without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent
