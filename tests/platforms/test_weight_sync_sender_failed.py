"""A receiver whose weight sender failed or hangs stops promptly, whatever the backend (platforms/recv_wait.py).

On NCCL / HCCL nothing a failed sender does to its own end reaches a receiver blocked in the
device collective; the receiver learns of it from the group's store: the version's counter marked
failed, the store no longer answering, or (a hung sender) neither a bucket arriving nor the
sender's counter moving for the stall timeout. These tests run that logic on real gloo groups with
a group timeout of 600 s and the sender's gloo connections left OPEN, so that the store is the only
thing that can end the receive; the bounds below are the test's own join timeouts, far below the
group's. The same failure scenario in processes runs on gloo here and on two CUDA GPUs (NCCL,
vLLM's PyNcclCommunicator) where they exist.
"""
from __future__ import annotations

import datetime
import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from asp_ascend.integrations.mindspeed_rl.weight_push import PushEndpoint  # noqa: E402
from asp_ascend.platforms.recv_wait import (FAILED, POLL_S, STALL_S, ReceiverFailed, ReceiverStalled,  # noqa: E402
                                            SenderFailed, SenderStalled, SenderWatch, SendProgress, read_sync, recv_key,
                                            store_of, sync_key)
from asp_ascend.platforms.transport import BroadcastTransport, WeightTicket, plan_buckets, specs_of  # noqa: E402
from asp_ascend.platforms.communicators import (SenderEndpoint, close_communicator, create_communicator,  # noqa: E402
                                                listen_store)

GROUP_TIMEOUT_S = 600
BOUND_S = 30           # the test's bound on a receive that must fail: 20x below the group's timeout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _named(version: int) -> list:
    g = torch.Generator().manual_seed(version)
    return [("a", torch.randn(4, generator=g)), ("b", torch.randn(4, generator=g).to(torch.bfloat16)),
            ("c", torch.randn(4, generator=g))]


def _release_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "asp-weight-sync-release"]


def _wait_released() -> None:
    """The aborted groups' release threads end within BOUND_S."""
    t0 = time.monotonic()
    while _release_threads() and time.monotonic() - t0 < BOUND_S:
        time.sleep(0.05)
    assert not _release_threads()


def _next_version_arrives(ep, group, rx, buckets) -> None:
    """Version 2 on the group formed again reaches both receivers bit-exact; then the sender drops."""
    v2 = _named(2)
    ths = rx.start(buckets, 2)
    tx = BroadcastTransport(ep.comm(group), 16)
    tx.send(tx.prepare(2, v2), v2)
    _join(ths)
    for r in (1, 2):
        assert all(torch.equal(rx.got[2, r][n], t) for n, t in v2), r
    del tx
    ep.drop()


class Receivers:
    """Rank 1: a BroadcastTransport over its own communicator (what the vLLM worker extension runs);
    rank 2: the MindSpeed-RL PushEndpoint. Each receives one version per :meth:`start` in a thread;
    ``got[version, rank]`` is the tensors, or (seconds waited, the error) if the receive raised."""

    def __init__(self, port: int, stall_s: float = STALL_S):
        self.port, self.comm, self.push, self.got, self.checks = port, None, PushEndpoint("cpu"), {}, {}
        self.stall_s = stall_s

    def start(self, buckets, version: int, go: threading.Event = None) -> list:
        def one(rank):
            t0 = time.monotonic()
            try:
                if rank == 1 and self.comm is None:
                    self.comm = create_communicator("cpu", "127.0.0.1", self.port, 1, 3, timeout_s=GROUP_TIMEOUT_S)
                if go is not None:
                    go.wait(BOUND_S)
                t0 = time.monotonic()
                if rank == 1:
                    rx = BroadcastTransport(self.comm, 1, stall_s=self.stall_s)
                    try:
                        self.got[version, 1] = {n: t.clone() for n, t in rx.recv(WeightTicket(version, buckets))}
                    except BaseException:
                        self.comm = None            # what the vLLM worker extension does: join again next time
                        raise
                    finally:
                        self.checks[version] = (rx.store_checks, time.monotonic() - t0)
                else:
                    self.got[version, 2] = dict(self.push.recv(buckets, version, "127.0.0.1", self.port, 2, 3,
                                                               stall_s=self.stall_s))
            except RuntimeError as exc:
                self.got[version, rank] = (time.monotonic() - t0, exc)
        ths = [threading.Thread(target=one, args=(r,), daemon=True) for r in (1, 2)]
        for th in ths:
            th.start()
        return ths


def _join(ths: list, timeout: float = BOUND_S) -> None:
    for th in ths:
        th.join(timeout)
    assert not any(th.is_alive() for th in ths), "a receive still waits"


def test_a_failure_key_ends_the_receive_while_the_senders_connections_stay_open():
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 3, "platform": "cpu", "timeout_s": GROUP_TIMEOUT_S}
    v1 = _named(1)
    buckets = plan_buckets(specs_of(v1), 16)
    assert len(buckets) == 3
    ep, rx = SenderEndpoint(), Receivers(port)
    ths = rx.start(buckets, 1)
    tx = BroadcastTransport(ep.comm(group), 16)
    with pytest.raises(KeyError):
        tx.send(WeightTicket(1, buckets), v1[:1])   # bucket 1 goes out, then the sender fails
    time.sleep(0.5)
    assert all(th.is_alive() for th in ths)          # nothing failed yet: they wait for bucket 2
    t_mark = time.monotonic()
    assert ep.mark_failed(1)                          # only the key: the group and its connections stay
    _join(ths)
    took = time.monotonic() - t_mark
    for r in (1, 2):
        waited, exc = rx.got[1, r]
        assert isinstance(exc, SenderFailed), exc
        assert "receiving version 1 stopped at bucket 2/3" in str(exc) and "marked version 1 failed" in str(exc)
    assert took < BOUND_S
    assert _release_threads()                         # the aborted gloo groups wait to be released ...
    del tx
    ep.drop()                                         # ... until the sender's drop closes its connections
    _wait_released()
    _next_version_arrives(ep, group, rx, buckets)     # the next version, on the group formed again


def test_the_success_path_is_bit_exact_and_asks_the_store_only_while_it_waits():
    """A store check comes only after POLL_S of waiting for a bucket: none when the data is already
    on its way as the receive starts, about one per POLL_S while the sender is late; the store gets
    two keys per version (the sender's and the receivers' counters), never marked failed (counted
    from version 1's end on, when every rank is past the group's rendezvous, whose keys come and go
    while it forms)."""
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 3, "platform": "cpu", "timeout_s": GROUP_TIMEOUT_S}
    ep, rx = SenderEndpoint(), Receivers(port)
    buckets = plan_buckets(specs_of(_named(1)), 16)
    ths = rx.start(buckets, 1)                        # version 1 forms the group
    comm = ep.comm(group)
    store = store_of(comm)
    keys = None
    tx = BroadcastTransport(comm, 16)
    for version, late in ((1, 0.0), (2, None), (3, 0.5)):
        named = _named(version)
        if version > 1:
            go = threading.Event() if late is None else None
            ths = rx.start(buckets, version, go)
        if late:
            time.sleep(late)                          # 3: the receivers wait 0.5 s for the sender
        send = threading.Thread(target=tx.send, args=(tx.prepare(version, named), named), daemon=True)
        send.start()
        if late is None:
            time.sleep(0.3)                           # 2: the sender is sending before the receive starts
            go.set()
        _join(ths + [send])
        for r in (1, 2):
            got = rx.got[version, r]
            assert all(torch.equal(got[n], t) and got[n].dtype == t.dtype for n, t in named), (version, r)
        checks, waited = rx.checks[version]
        assert checks * POLL_S <= waited + 0.01, (version, checks, waited)   # never more than one per POLL_S
        if version == 1:
            assert store.check([sync_key(1), recv_key(1)])
            keys = store.num_keys()
    assert rx.checks[3][0] >= 1                       # ... and it did check while the sender was late
    assert store.num_keys() == keys + 4               # two counters per version (sender, receivers) ...
    assert all(0 < read_sync(store, v, key) < FAILED for v in (1, 2, 3) for key in (sync_key, recv_key))  # ... none failed
    del store
    del comm
    ep.drop()


STALL_TEST_S = 2.0     # the stall timeout these tests run with (the default is STALL_S)


class Slow:
    """A tensor whose gather (``detach``, where the sender reads it) takes ``delay`` seconds, or hangs
    until ``gate`` is set (``hanging`` is set once it hangs): a slow or a hung sender."""

    def __init__(self, t, delay: float = 0.0, gate: threading.Event = None):
        self.t, self.delay, self.gate, self.hanging = t, delay, gate, threading.Event()

    def detach(self):
        if self.gate is not None:
            self.hanging.set()
            self.gate.wait()
        time.sleep(self.delay)
        return self.t.detach()


def test_a_sender_that_hangs_mid_sync_is_given_up_after_the_stall_timeout():
    """The sender sends bucket 1, then hangs in its gather of bucket 2: its process, its store and its
    gloo connections stay, it sets no failure mark. Both receivers stop within the stall timeout
    plus a poll of it (plus the test machine's slack), naming the version, the bucket, the seconds
    and the key to raise; their store checks (counted on a failed receive too) stay within one per
    POLL_S. Without the stall check they would wait for the group's 600 s."""
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 3, "platform": "cpu", "timeout_s": GROUP_TIMEOUT_S}
    v1 = _named(1)
    buckets = plan_buckets(specs_of(v1), 16)
    ep, rx = SenderEndpoint(), Receivers(port, stall_s=STALL_TEST_S)
    ths = rx.start(buckets, 1)
    tx = BroadcastTransport(ep.comm(group), 16)
    gate, errors = threading.Event(), []
    hung = [v1[0], (v1[1][0], Slow(v1[1][1], gate=gate)), v1[2]]

    def send():
        try:
            tx.send(WeightTicket(1, buckets), hung)
        except RuntimeError as exc:               # released after the drop: the group is closed
            errors.append(exc)
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    assert hung[1][1].hanging.wait(BOUND_S)
    t_hang = time.monotonic()
    _join(ths)
    took = time.monotonic() - t_hang
    for r, key in ((1, "weight_sync.stall_timeout_s"), (2, "asp.weight_sync.stall_timeout_s")):
        waited, exc = rx.got[1, r]
        assert isinstance(exc, SenderStalled), exc
        text = str(exc)
        assert "receiving version 1 stopped at bucket 2/3: no progress for" in text, text
        assert f"raise {key} (now 2 s)" in text, text
        said = float(text.split("no progress for ")[1].split(" s")[0])
        assert STALL_TEST_S <= said <= STALL_TEST_S + 2 * POLL_S + 1.0, text
    print(f"hang -> both receivers stopped: {took:.2f} s (stall timeout {STALL_TEST_S:g} s)")   # shown with -s
    assert STALL_TEST_S - 0.3 <= took <= STALL_TEST_S + 3.0, took
    checks, waited = rx.checks[1]
    assert 1 <= checks and checks * POLL_S <= waited + 0.01, (checks, waited)
    assert read_sync(store_of(tx.comm), 1) < FAILED   # nothing marked: the stall alone ended it
    assert _release_threads()                         # the aborted gloo receives still hold their threads ...
    ep.drop()                                         # ... until the sender's group goes
    gate.set()
    sender.join(BOUND_S)
    assert not sender.is_alive() and errors
    _wait_released()
    del tx
    _next_version_arrives(ep, group, rx, buckets)     # the next version, on the group formed again


def test_a_slow_sender_that_keeps_progressing_is_not_cut():
    """Version 1: every bucket's gather takes 0.8 s (longer than a poll, shorter than the 2 s stall
    timeout; 2.4 s in all, longer than the timeout): buckets arriving reset the clock. Version 2: the
    sender spends 3.2 s (longer than the timeout) before bucket 2, but steps its counter every 0.4 s
    while it does (SendProgress, as HfPusher.push steps per tensor gathered): the steps reset it.
    Both arrive bit-exact on both receivers, within one store check per POLL_S."""
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 3, "platform": "cpu", "timeout_s": GROUP_TIMEOUT_S}
    ep, rx = SenderEndpoint(), Receivers(port, stall_s=STALL_TEST_S)
    buckets = plan_buckets(specs_of(_named(1)), 16)
    v1 = _named(1)
    ths = rx.start(buckets, 1)
    tx = BroadcastTransport(ep.comm(group), 16)
    t0 = time.monotonic()
    tx.send(WeightTicket(1, buckets), [(n, Slow(t, delay=0.8)) for n, t in v1])
    _join(ths)
    assert time.monotonic() - t0 > STALL_TEST_S
    v2 = _named(2)
    ths = rx.start(buckets, 2)
    comm = tx.comm
    progress = SendProgress(comm, 2)
    progress.step()
    for i, b in enumerate(buckets):
        if i == 1:
            for _ in range(8):                        # a long gather (3.2 s), stepping as it goes
                time.sleep(0.4)
                progress.step()
        comm.broadcast(torch.cat([dict(v2)[s.name].reshape(-1) for s in b.tensors]), src=0)
        progress.step()
    _join(ths)
    for version, named in ((1, v1), (2, v2)):
        for r in (1, 2):
            got = rx.got[version, r]
            assert isinstance(got, dict), got
            assert all(torch.equal(got[n], t) and got[n].dtype == t.dtype for n, t in named), (version, r)
        checks, waited = rx.checks[version]
        assert checks * POLL_S <= waited + 0.01, (version, checks, waited)
    del tx, comm
    ep.drop()


def test_a_store_that_goes_away_counts_as_a_failed_sender():
    """The store is hosted apart from the sender's group (rank 0 joins it as a client), so it can go
    while the sender's gloo connections stay open."""
    port = _free_port()
    host_store = listen_store("127.0.0.1", port, 2, GROUP_TIMEOUT_S)
    got = {}

    def receive():
        comm = create_communicator("cpu", "127.0.0.1", port, 1, 2, timeout_s=GROUP_TIMEOUT_S)
        t0 = time.monotonic()
        try:
            list(BroadcastTransport(comm, 1).recv(WeightTicket(1, buckets)))
        except RuntimeError as exc:
            got["r"] = (time.monotonic() - t0, exc)
    buckets = plan_buckets(specs_of(_named(1)), 16)
    th = threading.Thread(target=receive, daemon=True)
    th.start()
    client = torch.distributed.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    sender = create_communicator("cpu", "127.0.0.1", port, 0, 2, timeout_s=GROUP_TIMEOUT_S, store=client)
    time.sleep(0.5)
    assert th.is_alive()                              # waiting for bucket 1, the store answering
    del host_store
    gc.collect()                                      # the store's server stops; the gloo group stays
    _join([th])
    waited, exc = got["r"]
    assert isinstance(exc, SenderFailed) and "store no longer answers" in str(exc), exc
    assert "receiving version 1 stopped at bucket 1/3" in str(exc)
    close_communicator(sender)                        # the receiver's aborted group is released now
    _wait_released()


def test_a_failed_send_marks_the_version_before_it_drops_the_group():
    """SenderEndpoint.send: the version is marked failed in the store before the drop closes it (read here
    on a reference to that store the test keeps, so that the drop cannot close it)."""
    port = _free_port()
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu", "timeout_s": GROUP_TIMEOUT_S}
    ep, seen = SenderEndpoint(), {}
    buckets = plan_buckets(specs_of(_named(1)), 16)

    def receive():
        comm = create_communicator("cpu", "127.0.0.1", port, 1, 2, timeout_s=GROUP_TIMEOUT_S)
        try:
            list(BroadcastTransport(comm, 1).recv(WeightTicket(7, buckets)))
        except RuntimeError as exc:
            seen["exc"] = exc
    th = threading.Thread(target=receive, daemon=True)
    th.start()
    store = store_of(ep.comm(group))
    assert read_sync(store, 7) == 0

    def half(comm):
        BroadcastTransport(comm, 16).send(WeightTicket(7, buckets), _named(1)[:1])
    with pytest.raises(KeyError):
        ep.send(group, half, 7)
    _join([th])
    assert isinstance(seen["exc"], RuntimeError)
    assert read_sync(store, 7) >= FAILED and read_sync(store, 6) == 0


@pytest.mark.parametrize("platform", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_processes_a_receiver_of_a_failed_version_fails_then_receives_the_next(tmp_path, platform):
    if platform == "cuda":
        from asp_ascend.platforms import CudaPlatform

        p = CudaPlatform()
        if not p.is_available() or p.device_count() < 2:
            pytest.skip("needs 2 CUDA GPUs (NCCL refuses two ranks on one device)")
        pytest.importorskip("vllm")
    worker = Path(__file__).with_name("_sync_fail_worker.py")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    outs = [str(tmp_path / f"rank{r}.json") for r in (0, 1)]
    procs = [subprocess.Popen([sys.executable, str(worker), str(r), str(port), outs[r], platform], env=env)
             for r in (0, 1)]
    try:
        for p in procs:
            assert p.wait(timeout=180) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    sender, receiver = (json.loads(Path(o).read_text()) for o in outs)
    assert sender["marked"]
    assert receiver["failed"] and "receiving version 1 stopped at bucket 2/2" in receiver["failed"]
    assert receiver["waited"] < 120                   # the group's timeout is 600 s
    assert receiver["v2_equal"]


@pytest.mark.parametrize("healthy", [0, 1])
def test_a_receiver_that_hangs_mid_sync_ends_the_send_and_the_others_receives(healthy):
    """The last rank takes bucket 1, then hangs (its process, its store connection and its gloo
    connections stay; it never posts bucket 2's receive, so the broadcast of bucket 2 cannot complete
    everywhere). The sender (``SenderEndpoint.send``, as the trainer's ``send_weights``) gives up within
    the 2 s stall timeout plus slack. Alone with the hung receiver (``healthy`` 0) it is its own stall
    rule that stops it: ``ReceiverStalled`` naming version, bucket, seconds and key. Beside a healthy
    receiver (``healthy`` 1), which may itself be stuck behind the hung one (gloo's broadcast may relay
    through it) and then give up on its own stall timeout and mark that, the sender stops on whichever
    comes first, and marks the version failed; the healthy one stops within the timeout plus slack
    too. The aborted send holds its group (and a release thread) until the hung receiver's end closes;
    the next version, on a new group (the runtime's next generation, on another port), arrives
    bit-exact at every receiver. Without the sender's checks it would wait for the group's 600 s."""
    world = 2 + healthy
    ports = [_free_port(), _free_port()]
    groups = [{"gen": g, "host": "127.0.0.1", "port": p, "world": world, "platform": "cpu",
               "timeout_s": GROUP_TIMEOUT_S} for g, p in enumerate(ports)]
    v1 = _named(1)
    buckets = plan_buckets(specs_of(v1), 16)
    ep, got, comms, gate, hanging = SenderEndpoint(), {}, {}, threading.Event(), threading.Event()
    hung_rank = world - 1

    def receive(rank, version, hang=False):
        try:
            comms[rank] = create_communicator("cpu", "127.0.0.1", groups[version - 1]["port"], rank, world,
                                              timeout_s=GROUP_TIMEOUT_S)
            out = {}
            for name, t in BroadcastTransport(comms[rank], 1, stall_s=STALL_TEST_S).recv(WeightTicket(version, buckets)):
                out[name] = t.clone()
                if hang:                              # bucket 1 taken; bucket 2's receive is never posted
                    hanging.set()
                    gate.wait()
                    return
            got[version, rank] = out
        except RuntimeError as exc:
            got[version, rank] = (time.monotonic(), exc)

    ths = [threading.Thread(target=receive, args=(r, 1, r == hung_rank), daemon=True) for r in range(1, world)]
    for th in ths:
        th.start()
    sent = {}

    def sender(version, named):
        try:
            ep.send(groups[version - 1], lambda comm: BroadcastTransport(comm, 16, stall_s=STALL_TEST_S).send(
                WeightTicket(version, buckets), named), version)
            sent[version] = True
        except RuntimeError as exc:
            sent[version] = (time.monotonic(), exc)
    sth = threading.Thread(target=sender, args=(1, v1), daemon=True)
    sth.start()
    assert hanging.wait(BOUND_S)
    t_hang = time.monotonic()
    _join([sth] + ths[:healthy])
    t_raised, exc = sent[1]
    took = t_raised - t_hang
    assert isinstance(exc, ReceiverFailed), exc
    text = str(exc)
    assert "sending version 1 stopped at bucket" in text, text
    if not healthy:
        assert isinstance(exc, ReceiverStalled), exc
        assert "sending version 1 stopped at bucket 2/3: no progress for" in text, text
        assert "raise weight_sync.stall_timeout_s (now 2 s)" in text, text
    print(f"receiver hang -> sender stopped: {took:.2f} s, {type(exc).__name__} "
          f"(stall timeout {STALL_TEST_S:g} s, {healthy} healthy receiver)")   # shown with -s
    assert STALL_TEST_S - 0.3 <= took <= STALL_TEST_S + 3.0, took
    if healthy:
        t_other, other = got[1, 1]
        assert isinstance(other, SenderFailed), other
        assert t_other - t_hang <= STALL_TEST_S + 3.0, t_other - t_hang
    assert _release_threads()                         # the aborted send holds its group ...
    close_communicator(comms.pop(hung_rank))          # ... until the hung receiver's end closes (it dies)
    gate.set()
    ths[-1].join(BOUND_S)
    _wait_released()
    v2 = _named(2)                                    # the next version, on the next group
    ths = [threading.Thread(target=receive, args=(r, 2), daemon=True) for r in range(1, world)]
    for th in ths:
        th.start()
    sender(2, v2)
    _join(ths)
    assert sent[2] is True, sent[2]
    for r in range(1, world):
        assert isinstance(got[2, r], dict), got[2, r]
        assert all(torch.equal(got[2, r][n], t) and got[2, r][n].dtype == t.dtype for n, t in v2), r
    for c in comms.values():
        close_communicator(c)
    ep.drop()


def test_a_receiver_that_gives_up_marks_it_and_the_sender_stops_within_a_poll():
    """A receiver that gives up (here on a sender whose gather of bucket 1 hangs past the receiver's
    2 s stall timeout) marks the version's receiver counter failed before it aborts. On gloo its
    abort also closes its connections, which fails the sender's pending send at once; on NCCL / HCCL
    nothing reaches the sender's kernel, so the mark is what ends it. Second group: a receiver marks
    (``SenderWatch.give_up``) while its connections stay open and the sender waits on a bucket; the
    sender stops at its next poll with ``ReceiverFailed`` instead of waiting out its own stall
    timeout (here the default, 300 s)."""
    buckets = plan_buckets(specs_of(_named(1)), 16)
    ep, got, sent, gate = SenderEndpoint(), {}, {}, threading.Event()

    def join(port, then=None):
        got["comm"] = create_communicator("cpu", "127.0.0.1", port, 1, 2, timeout_s=GROUP_TIMEOUT_S)
        try:
            if then is not None:
                then(got["comm"])
        except RuntimeError as exc:
            got["exc"] = exc

    def send(comm, named, version):
        try:
            BroadcastTransport(comm, 16).send(WeightTicket(version, buckets), named)
            sent["ok"] = True
        except RuntimeError as exc:
            sent["exc"] = (time.monotonic(), exc)

    for version in (1, 2):
        port = _free_port()
        group = {"gen": version, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu",
                 "timeout_s": GROUP_TIMEOUT_S}
        recv = (lambda c: list(BroadcastTransport(c, 1, stall_s=STALL_TEST_S).recv(WeightTicket(1, buckets)))
                if version == 1 else None)      # version 2: the receiver joins and posts nothing
        rth = threading.Thread(target=join, args=(port, recv), daemon=True)
        rth.start()
        comm = ep.comm(group)
        store = store_of(comm)                        # kept by the test, to read the counters after the abort
        named = [(n, Slow(t, gate=gate)) if n == "a" else (n, t) for n, t in _named(1)] if version == 1 else _named(2)
        sth = threading.Thread(target=send, args=(comm, named, version), daemon=True)
        sth.start()
        _join([rth])
        if version == 1:                              # the receiver gave up after its stall timeout ...
            assert isinstance(got["exc"], SenderStalled), got["exc"]
            assert read_sync(store, 1, recv_key) >= FAILED   # ... and said so
            t_go = time.monotonic()
            gate.set()                                # the sender goes on: bucket 1 is issued, no one takes it
        else:
            time.sleep(0.5)
            assert sth.is_alive()                     # waiting on bucket 1, which the receiver never posted
            t_go = time.monotonic()
            SenderWatch(got["comm"], 2).give_up()     # what a receiver that gives up writes; its group stays open
        _join([sth])
        t_raised, exc = sent.pop("exc")
        assert t_raised - t_go <= 1.0, (version, t_raised - t_go)
        if version == 2:
            assert isinstance(exc, ReceiverFailed) and not isinstance(exc, ReceiverStalled), exc
            assert "sending version 2 stopped at bucket 1/3: a receiver gave up on version 2" in str(exc), exc
            assert read_sync(store, 2) >= FAILED      # the sender marked its side before aborting
            close_communicator(got["comm"])
        del store, comm
        ep.drop()
