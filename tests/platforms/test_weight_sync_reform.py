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

from asp_ascend.platforms.transport import BroadcastTransport, SenderEndpoint, create_communicator  # noqa: E402

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
