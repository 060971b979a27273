import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Ray's OpenTelemetry metrics off in the clusters the tests start (the tests read no Ray metric).
# Each ray.init in a driver starts an OpenTelemetry export thread that ray.shutdown() does not stop
# (Ray 2.60); this process starts ~20 sessions, and a leaked exporter waking while exit() runs the
# libraries' static destructors logs its failed export through spdlog's destroyed registry: SIGSEGV
# after pytest's summary (about 1 CI run in 30; docs/reliability.md, "Tests"). With it off the driver
# starts no export thread (RAY_enable_metrics_collection=0 does not stop them). Set before any
# ray.init so the GCS, raylet and workers inherit it; a caller's own setting wins.
os.environ.setdefault("RAY_enable_open_telemetry", "0")


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


def pytest_unconfigure(config):
    """ci/test.sh sets ASP_EXIT_CORE_DIR: from here on (the interpreter's exit, where faulthandler is
    already off and Ray's, gRPC's and torch's native threads still run) a native crash of this process
    leaves its core in that folder, for ci/test.sh to print every thread's native stack. Only this
    process, and only past the tests: the processes the tests started keep the caller's core limit."""
    folder = os.environ.get("ASP_EXIT_CORE_DIR")
    if folder:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
        os.chdir(folder)  # kernel.core_pattern "core" (the default) writes it into the working directory
