"""pipeline/orchestrator.py: the submit-time entries kept for the admission-latency records
(``_sent_at``) of a failed instance's calls are dropped when it fails (they would never be
reported, so they would stay for the whole run)."""
from types import SimpleNamespace

from asp_ascend.pipeline.orchestrator import Orchestrator


def _bare_orchestrator(sent_at: dict) -> Orchestrator:
    orch = Orchestrator.__new__(Orchestrator)   # only what _instance_failed touches
    orch.dispatcher = SimpleNamespace(running_on=[[], []])
    orch.fleet = SimpleNamespace(failed=lambda r, exc: 0, live=lambda: [0])
    orch.tail = SimpleNamespace(on_instance_failed=lambda r, running: None)
    orch.queue = SimpleNamespace(cancel=lambda lost: None)
    orch.poll_refs = {0: "ref0", 1: "ref1"}
    orch.evaluator = None
    orch._sent_at = sent_at
    return orch


def test_a_failed_instance_s_send_times_are_dropped():
    orch = _bare_orchestrator({"0:a": (0, 1.0), "0:b": (1, 2.0), "0:c": (1, 3.0), "1:d": (0, 4.0)})
    orch._instance_failed(1, RuntimeError("gone"))
    assert orch._sent_at == {"0:a": (0, 1.0), "1:d": (0, 4.0)}
    assert orch.poll_refs == {0: "ref0"}


def test_an_instance_already_failed_changes_nothing():
    orch = _bare_orchestrator({"0:b": (1, 2.0)})
    orch.fleet.failed = lambda r, exc: None      # the fleet had already taken it out
    orch._instance_failed(1, RuntimeError("again"))
    assert orch._sent_at == {"0:b": (1, 2.0)}
