import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """The real length traces shipped beside the repository (skip when absent)."""
    if not (SHARED_DATA / "azure_llm_trace_2023_conv.csv").exists():
        pytest.skip("../shared/data traces not present")
    return SHARED_DATA


@pytest.fixture
def empty_yaml(tmp_path) -> Path:
    p = tmp_path / "empty.yaml"
    p.write_text("{}\n")
    return p


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """The offline commands keep prompt token counts under $XDG_CACHE_HOME (data/prompt_tokens.py): the
    tests' go to a temporary directory of the session, never the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg_cache"))


@pytest.fixture(autouse=True)
def _no_ray_session_leaks():
    """A Ray session that a test started (a test touching Ray from a helper thread can start
    one implicitly) ends with the test, so the next test does not inherit it; sessions that
    were already running when the test began (a module's own fixture) are left alone."""
    ray = sys.modules.get("ray")
    before = ray is not None and getattr(ray, "is_initialized", lambda: False)()
    yield
    ray = sys.modules.get("ray")
    if not before and ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()
