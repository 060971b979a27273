"""The broadcast weight-sync group forms on a port its listener already holds.

The trainer is the real ``TrainerEngine`` (a tiny Qwen2) in a Ray actor, driven by the real
``WeightSync``. Each instance is a small Ray actor doing what the vLLM worker's receiver does
(engines/vllm_ext.py): join the group named in ``update_weights`` with ``create_communicator`` and
receive the buckets. Between the moment the group's port is handed to the instances and the
moment they join, another socket tries to take that port: it must find it held (the trainer's
store listens before anyone is told the port), and the weights must still arrive. A port that
was only found free and bound later (the old ``free_port``) is taken by that socket and the group
breaks. A configured ``weight_sync.master_port`` that is taken is a clear error naming the key.
"""
from __future__ import annotations

import errno
import socket
import time

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

from asp_ascend.algos.grpo import LossConfig  # noqa: E402
from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary  # noqa: E402
from asp_ascend.engines.trainer import TrainerEngine  # noqa: E402
from asp_ascend.errors import ConfigError  # noqa: E402
from asp_ascend.pipeline.weight_sync import WeightSync  # noqa: E402

WORDS = "a b c d e f g h i j k l m n o p q r s t"


@ray.remote(num_cpus=0)
class Receiver:
    """One instance with one worker: joins each new generation's group, keeps what arrived."""

    def __init__(self):
        self.comm, self.weights = None, {}

    def update_weights(self, ticket, group):
        from asp_ascend.platforms.transport import BroadcastTransport
        from asp_ascend.platforms.communicators import create_communicator

        if self.comm is None or self.comm[0] != group["gen"]:
            self.comm = None
            self.comm = (group["gen"], create_communicator(group["platform"], group["host"], int(group["port"]),
                                                           int(group["rank"]), int(group["world"]),
                                                           timeout_s=float(group["timeout_s"])))
        rx = BroadcastTransport(self.comm[1], 1)
        self.weights = {n: t.clone() for n, t in rx.recv(ticket)}
        return {"t_end": time.time(), "version": ticket.version}

    def get(self):
        return self.weights


class Contested:
    """An instance handle whose ``update_weights`` is reached only after another socket has tried
    to take the group's port (on every interface of this node, as any process could)."""

    def __init__(self, actor, grabs: list):
        self.actor, self.grabs = actor, grabs
        self.update_weights = self

    def remote(self, ticket, group):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", int(group["port"])))
            s.listen()
            self.grabs.append(("taken", s))        # kept open: the port stays taken
        except OSError as exc:
            s.close()
            self.grabs.append(("held", exc.errno))
        return self.actor.update_weights.remote(ticket, group)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    model = build_tiny_model(task_vocabulary([WORDS]), tmp_path_factory.mktemp("wsport") / "model", hidden_size=32,
                             num_layers=2, num_heads=2, num_kv_heads=1, seed=0)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    trainer = ray.remote(num_cpus=0)(TrainerEngine).remote(
        str(model), lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=2, temperature=1.0, seed=0,
        bucket_bytes=4096)
    yield trainer
    if started:
        ray.shutdown()


def _finish(wsync: WeightSync, s, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while s.in_flight and time.monotonic() < deadline:
        ray.wait(s.waiting(), num_returns=1, timeout=1.0)
        s.poll(ray, 0.0, on_dead=lambda r, exc: pytest.fail(f"instance {r} died: {exc}"))
    assert not s.in_flight, "the sync did not finish"


def test_the_group_port_is_held_before_the_instances_are_told(session):
    trainer = session
    actors = [Receiver.remote() for _ in range(2)]
    grabs: list = []
    wsync = WeightSync(trainer, [Contested(a, grabs) for a in actors], "broadcast", "cpu", tp=1, timeout_s=60)
    try:
        for version in (1, 2):
            s = wsync.start(version, [0, 1])
            _finish(wsync, s)
            assert s.failed is None, s.failed
            assert s.synced == {0, 1}
            want = dict(ray.get(trainer.full_weights.remote()))
            for a in actors:
                got = ray.get(a.get.remote())
                assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
            wsync.regroup()     # the next version forms a new group (a new generation, a new port)
        assert [g[0] for g in grabs] == ["held"] * 4, grabs
        assert all(g[1] == errno.EADDRINUSE for g in grabs)
        assert wsync.gen == 1
    finally:
        for g in grabs:
            if g[0] == "taken":
                g[1].close()


def test_a_taken_configured_port_names_the_key(session):
    trainer = session
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        wsync = WeightSync(trainer, [Receiver.remote()], "broadcast", "cpu", tp=1, base_port=port, timeout_s=5)
        with pytest.raises(ConfigError) as err:
            wsync.start(1, [0])
    assert "weight_sync.master_port" in str(err.value) and f"port {port} is already in use" in str(err.value)
