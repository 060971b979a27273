"""Weight-sync transports: bucket planning, in-process, Ray object store, gloo broadcast."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asp_ascend.errors import BackendMissingError, ConfigError
from asp_ascend.platforms.transport import (
    InProcessTransport, WeightTransport, make_transport, plan_buckets)


def test_plan_buckets_one_dtype_each_order_kept_size_capped():
    specs = [("a", (4, 4), "float32"), ("b", (16,), "float32"), ("c", (8,), "bfloat16"),
             ("d", (100,), "float32"), ("e", (2,), "float32")]
    buckets = plan_buckets(specs, bucket_bytes=128)
    assert [b.dtype for b in buckets] == ["float32", "bfloat16", "float32", "float32"]
    assert [[t.name for t in b.tensors] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [[t.name for t in b.tensors] for b in plan_buckets(specs, 64)] == [["a"], ["b"], ["c"], ["d"], ["e"]]
    big = plan_buckets(specs, bucket_bytes=10_000)
    assert [[t.name for t in b.tensors] for b in big] == [["a", "b"], ["c"], ["d", "e"]]
    assert [(t.offset, t.numel) for t in big[0].tensors] == [(0, 16), (16, 16)]
    assert big[0].numel == 32
    # every tensor exactly once, offsets contiguous
    for b in big:
        assert sum(t.numel for t in b.tensors) == b.numel
    with pytest.raises(ConfigError, match="bucket_bytes"):
        plan_buckets(specs, 0)


def test_factory_rejects_unknown_and_needs_communicator():
    with pytest.raises(ConfigError, match="choose inprocess, object_store or broadcast"):
        make_transport("carrier-pigeon")
    with pytest.raises(ConfigError, match="needs a communicator"):
        make_transport("broadcast")
    assert isinstance(make_transport("inprocess"), WeightTransport)


def test_inprocess_roundtrip_copies():
    torch = pytest.importorskip("torch")
    w = torch.arange(6.0).reshape(2, 3)
    tx = InProcessTransport()
    ticket = tx.prepare(1, [("w", w)])
    tx.send(ticket, [("w", w)])
    w.add_(100)  # the trainer keeps training: the published version must not change
    got = dict(tx.recv(ticket))
    assert torch.equal(got["w"], torch.arange(6.0).reshape(2, 3))
    assert ticket.version == 1 and ticket.names == ["w"] and ticket.nbytes == 24


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for this module, with 4 declared NPUs (Ray counts them; none need to exist)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    noset = {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}  # as MindSpeed-RL's runtime env
    ray.init(num_cpus=1, resources={"NPU": 4}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": noset})
    yield ray
    ray.shutdown()


def test_object_store_roundtrip(ray_session):
    import torch

    from asp_ascend.platforms.transport import RayObjectStoreTransport

    ray = ray_session
    tx = RayObjectStoreTransport()
    named = [("a", torch.randn(3, 4)), ("b", torch.ones(2, dtype=torch.bfloat16))]
    ticket = tx.prepare(2, named)

    @ray.remote(num_cpus=0)
    def receive(t):
        return {k: v.clone() for k, v in RayObjectStoreTransport().recv(t)}

    got = ray.get(receive.remote(ticket))
    assert list(got) == ["a", "b"]
    assert all(torch.equal(got[k], v) for k, v in named)


def test_actor_binds_its_ray_npus_to_ascend_visible_devices(ray_session):
    ray = ray_session

    @ray.remote(resources={"NPU": 2}, num_cpus=0)
    class Instance:
        def bind(self):
            import os

            from asp_ascend.platforms import NpuPlatform, bind_visible_devices

            return bind_visible_devices(NpuPlatform()), os.environ.get("ASCEND_RT_VISIBLE_DEVICES")

    ids, env = ray.get(Instance.remote().bind.remote())
    assert len(ids) == 2 and env == ",".join(map(str, ids))


def _broadcast(tmp_path, world: int, platform: str = "cpu") -> None:
    """Rank 0 starts first and listens on a port the OS picks; the other ranks get that port."""
    worker = Path(__file__).with_name("_broadcast_worker.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))

    def start(rank: int, port: int):
        return subprocess.Popen([sys.executable, str(worker), str(rank), str(world), str(port),
                                 str(tmp_path / f"{rank}.json"), platform], env=env)

    procs = [start(0, 0)]
    try:
        port_file, deadline = tmp_path / "0.json.port", time.monotonic() + 120
        while not port_file.exists():
            assert procs[0].poll() is None, "rank 0 exited before listening"
            assert time.monotonic() < deadline, "rank 0 did not report its port"
            time.sleep(0.05)
        procs += [start(r, int(port_file.read_text())) for r in range(1, world)]
        for p in procs:
            assert p.wait(timeout=300) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    sender = json.loads((tmp_path / "0.json").read_text())
    assert sender["buckets"] >= 3  # the 1 KiB cap splits the model into several buckets
    for r in range(1, world):
        got = json.loads((tmp_path / f"{r}.json").read_text())
        assert got["names"] == ["embed.weight", "layer.0.w", "layer.0.b", "step", "head.weight"]
        assert got["equal"] is True
        assert got["dtypes"]["layer.0.w"] == "torch.bfloat16" and got["dtypes"]["step"] == "torch.int64"


def test_bucketed_gloo_broadcast_three_ranks(tmp_path):
    pytest.importorskip("torch")
    _broadcast(tmp_path, 3, "cpu")


def test_rendezvous_holds_its_port_and_a_taken_configured_port_names_the_key():
    pytest.importorskip("torch")
    from asp_ascend.platforms.communicators import create_communicator, listen_store

    store = listen_store("127.0.0.1", 0, 2, timeout_s=10)     # port 0: the OS picks, the store holds it
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("", int(store.port)))
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        for make in (lambda: listen_store("127.0.0.1", port, 2, timeout_s=10),
                     lambda: create_communicator("cpu", "127.0.0.1", port, 0, 2, timeout_s=10)):
            with pytest.raises(ConfigError, match=f"weight_sync.master_port: port {port} is already in use"):
                make()


def test_sender_endpoint_forms_each_generation_on_the_port_it_holds():
    """listen holds the port before anyone joins; comm forms the group on that store, keeps it while
    the generation stays, and a new generation is a new group; a taken port names the caller's key."""
    torch = pytest.importorskip("torch")
    import threading

    from asp_ascend.platforms.communicators import SenderEndpoint, create_communicator

    ep = SenderEndpoint(port_key="asp.weight_sync.master_port")
    sent = []
    for gen in (0, 1):
        group = {"gen": gen, "host": "127.0.0.1", "port": 0, "world": 2, "platform": "cpu", "timeout_s": 20}
        group["port"] = ep.listen(group)
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("", group["port"]))
        got = []
        peer = threading.Thread(target=lambda: got.extend(
            _recv_twice(create_communicator("cpu", "127.0.0.1", group["port"], 1, 2, timeout_s=20), torch)))
        peer.start()
        time.sleep(1.0)                                     # the peer has joined the held store
        comm = ep.comm(group)
        for v in (gen * 10 + 1.0, gen * 10 + 2.0):
            assert ep.comm(group) is comm                   # kept while the generation stays
            comm.broadcast(torch.full((3,), v), src=0)
        peer.join(30)
        assert got == [gen * 10 + 1.0, gen * 10 + 2.0]
        sent.append(comm)
    assert sent[0] is not sent[1]
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        group = {"gen": 2, "host": "127.0.0.1", "port": port, "world": 2, "platform": "cpu", "timeout_s": 5}
        for make in (ep.listen, ep.comm):                   # comm without a held store listens itself
            with pytest.raises(ConfigError, match=rf"asp\.weight_sync\.master_port: port {port} is already in use"):
                make(group)


def _recv_twice(comm, torch) -> list[float]:
    out = []
    for _ in range(2):
        t = torch.zeros(3)
        comm.broadcast(t, src=0)
        out.append(float(t[0]))
    return out


@pytest.mark.gpu
def test_bucketed_nccl_broadcast(tmp_path):
    """vLLM's PyNcclCommunicator over a StatelessProcessGroup; NCCL needs one GPU per rank."""
    from asp_ascend.platforms import CudaPlatform

    if not CudaPlatform().is_available() or CudaPlatform().device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    pytest.importorskip("vllm")
    _broadcast(tmp_path, 2, "cuda")


@pytest.mark.npu
def test_bucketed_hccl_broadcast(tmp_path):
    """vllm-ascend's PyHcclCommunicator over a StatelessProcessGroup."""
    pytest.importorskip("torch_npu")
    pytest.importorskip("vllm_ascend")
    from asp_ascend.platforms import NpuPlatform

    if not NpuPlatform().is_available() or NpuPlatform().device_count() < 2:
        pytest.skip("needs 2 NPUs")
    _broadcast(tmp_path, 2, "npu")


def test_device_communicators_fail_clearly_without_the_device():
    pytest.importorskip("torch")
    from asp_ascend.platforms import CudaPlatform, NpuPlatform
    from asp_ascend.platforms.communicators import create_communicator

    if not NpuPlatform().is_available():
        with pytest.raises((BackendMissingError, ConfigError), match="torch_npu|platform: 'npu'"):
            create_communicator("npu", "127.0.0.1", 1, 0, 2)
    if not CudaPlatform().is_available():
        with pytest.raises(ConfigError, match="platform: 'cuda' is not usable"):
            create_communicator("cuda", "127.0.0.1", 1, 0, 2)
    with pytest.raises(ConfigError, match="no weight-sync communicator for 'tpu'"):
        create_communicator("tpu", "127.0.0.1", 1, 0, 2)
