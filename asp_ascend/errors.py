"""User-facing error types.

Every error a user can cause (bad config, bad data, missing backend) is raised as
an :class:`AspError` subclass whose message names the file and row or the config
key, the bad value and the fix. The CLI prints these without a traceback.
"""
from __future__ import annotations


class AspError(Exception):
    """Base class for errors the user can fix."""


class ConfigError(AspError):
    """One or more config problems; ``problems`` lists each (key, message)."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"invalid config{f' {source}' if source else ''}: {len(self.problems)} problem(s)"
        super().__init__(head + "\n" + "\n".join(f"  - {p}" for p in self.problems))


class DataError(AspError):
    """A dataset or length table is malformed: names the file, the row and the fix."""


class TrainingDiverged(AspError):
    """A loss, gradient norm or reward turned NaN/inf: the run stops (names the iteration)."""


class BackendMissingError(AspError):
    """An optional backend (torch, ray, vllm, torch_npu, ...) is not installed."""

    def __init__(self, module: str, install_hint: str, purpose: str = ""):
        self.module = module
        msg = f"{module} is not installed"
        if purpose:
            msg += f" (needed for {purpose})"
        msg += f"; install it with: {install_hint}"
        super().__init__(msg)


def require(module: str, install_hint: str, purpose: str = ""):
    """Import ``module`` or raise :class:`BackendMissingError` with an install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised via tests with fake names
        raise BackendMissingError(module, install_hint, purpose) from exc
