"""A dropped weight-sync group frees its port at once, even while its failure is still referenced.

torch's TCPStore stops listening only when nothing references it any more; a caller that keeps the
failed push's exception keeps its traceback's frames, and with them the transport, the communicator
and (before SenderEndpoint.drop closed the communicator) the store: re-forming on the same configured
port then failed as 'already in use'. Real gloo, threads in place of processes.
"""
from __future__ import annotations

import gc
import socket
import threading

import pytest

torch = pytest.importorskip("torch")

from asp_ascend.platforms.transport import BroadcastTransport  # noqa: E402
from asp_ascend.platforms.communicators import SenderEndpoint, create_communicator  # noqa: E402

TIMEOUT_S = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(port: int, out: dict, key) -> threading.Thread:
    """Rank 1 joins, receives one (3,) tensor and goes away (its communicator with its thread)."""
    def run():
        comm = create_communicator("cpu", "127.0.0.1", port, 1, 2, timeout_s=TIMEOUT_S)
        t = torch.zeros(3)
        comm.broadcast(t, src=0)
        out[key] = float(t[0])
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _push(ep: SenderEndpoint, group: dict, value: float) -> None:
    """What TrainerEngine.send_weights does: broadcast, and drop the group if that fails."""
    named = [("w", torch.full((3,), value))]
    tx = BroadcastTransport(ep.comm(group), 1 << 20)
    try:
        tx.send(tx.prepare(int(value), named), named)
    except BaseException:
        ep.drop()
        raise


def test_a_kept_failure_does_not_hold_the_port_after_drop():
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu", "timeout_s": TIMEOUT_S}
    ep, got = SenderEndpoint(port_key="asp.weight_sync.master_port"), {}
    assert ep.listen(group) == port
    th = _receiver(port, got, 1)
    _push(ep, group, 1.0)
    th.join(30)
    assert got[1] == 1.0
    gc.collect()                                # the receiver's communicator is gone: the next push fails
    with pytest.raises(RuntimeError, match="Connection closed by peer") as failed:
        _push(ep, group, 2.0)
    kept = failed.value                         # the caller keeps the exception, traceback and all
    assert kept.__traceback__ is not None
    gc.collect()
    assert ep.listen(group) == port             # before: ConfigError, port ... is already in use
    th = _receiver(port, got, 3)
    _push(ep, group, 3.0)
    th.join(30)
    assert got[3] == 3.0
    assert kept.__traceback__ is not None       # still held throughout


def test_a_kept_failed_formation_does_not_hold_the_port():
    """Nobody joins: forming the group fails at its timeout. The kept exception's frames (the
    formation's) held the store; comm clears them, and the next formation listens on the same port."""
    port = _free_port()
    ep, got = SenderEndpoint(), {}
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu", "timeout_s": 1}
    with pytest.raises(RuntimeError) as failed:
        ep.comm(group)
    kept = failed.value
    gc.collect()
    group = {**group, "gen": 1, "timeout_s": TIMEOUT_S}
    assert ep.listen(group) == port             # before: ConfigError, port ... is already in use
    th = _receiver(port, got, 1)
    _push(ep, group, 1.0)
    th.join(30)
    assert got[1] == 1.0 and kept is failed.value


def test_receivers_learn_of_a_failed_send_in_seconds_not_at_the_timeout():
    """The sender fails between buckets for a reason of its own (here a tensor of the plan is missing
    from what it sends; in the hf push, a gathered tensor that does not match the plan) and keeps the
    exception. Its drop aborts the gloo group, so the receivers (the MindSpeed weight push's
    PushEndpoint, whose group timeout is 300 s) fail in well under a second instead of waiting out the
    timeout; each drops its end and the next version, formed again on the same port, reaches both.
    Before: both receivers waited 300 s."""
    import time

    from asp_ascend.integrations.mindspeed_rl.weight_push import PushEndpoint
    from asp_ascend.platforms.transport import WeightTicket, plan_buckets, specs_of

    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 3, "platform": "cpu"}
    named = [("a", torch.arange(4.0)), ("b", torch.arange(4.0) + 10)]
    buckets = plan_buckets(specs_of(named), 16)
    assert len(buckets) == 2
    ep, receivers, got = SenderEndpoint(port_key="asp.weight_sync.master_port"), [PushEndpoint("cpu") for _ in range(2)], {}

    def receive(version):
        def run(r):
            t0 = time.monotonic()
            try:
                got[version, r] = dict(receivers[r].recv(buckets, version, "127.0.0.1", port, 1 + r, 3))
            except RuntimeError as exc:
                got[version, r] = (time.monotonic() - t0, str(exc))
        ths = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
        for th in ths:
            th.start()
        return ths

    ths = receive(1)
    tx = BroadcastTransport(ep.comm(group), 16)
    with pytest.raises(KeyError) as failed:
        try:
            tx.send(WeightTicket(1, buckets), named[:1])   # bucket 1 goes out, then the sender fails
        except BaseException:
            ep.drop()
            raise
    kept = failed.value
    for th in ths:
        th.join(15)
    for r in range(2):
        waited, why = got[1, r]                       # before: still waiting here (group timeout 300 s)
        assert waited < 10, (waited, why)
    del tx
    ths = receive(2)
    _push_named(ep, group, named)
    for th in ths:
        th.join(30)
    for r in range(2):
        assert torch.equal(got[2, r]["b"], named[1][1])
    assert kept is failed.value


def _push_named(ep: SenderEndpoint, group: dict, named: list) -> None:
    tx = BroadcastTransport(ep.comm(group), 16)
    tx.send(tx.prepare(2, named), named)


def test_a_receiver_still_joining_learns_of_a_drop_at_once():
    """The sender listened, a receiver is joining (PushEndpoint, store timeout 300 s), the sender drops
    the group before forming it: the store closes and the receiver fails at once."""
    import time

    from asp_ascend.integrations.mindspeed_rl.weight_push import PushEndpoint
    from asp_ascend.platforms.transport import plan_buckets, specs_of

    port = _free_port()
    ep, got = SenderEndpoint(), {}
    ep.listen({"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu"})
    buckets = plan_buckets(specs_of([("a", torch.zeros(4))]), 16)

    def run():
        t0 = time.monotonic()
        try:
            got["r"] = PushEndpoint("cpu").recv(buckets, 1, "127.0.0.1", port, 1, 2)
        except RuntimeError as exc:
            got["r"] = (time.monotonic() - t0, str(exc))
    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(1.0)                                   # the receiver waits in the rendezvous
    ep.drop()
    th.join(15)
    waited, why = got["r"]                            # before: still waiting here (300 s)
    assert waited < 10, (waited, why)


def test_send_weights_without_its_publish_frees_the_group_port():
    """An out-of-order send_weights (no publish of that version) is refused and drops the group it
    was to use: the port listen held is free again (receivers joining it learn at once)."""
    from asp_ascend.engines.trainer import TrainerEngine

    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu", "timeout_s": TIMEOUT_S}
    trainer = TrainerEngine.__new__(TrainerEngine)   # no model: the refusal comes before any weight is read
    trainer._sender, trainer._pending = SenderEndpoint(), None
    assert trainer._sender.listen(group) == port
    with pytest.raises(RuntimeError, match="did not run first"):
        trainer.send_weights(3, group)
    with socket.socket() as s:   # free: nothing holds the store any more
        s.bind(("127.0.0.1", port))
