"""The weight push orchestration on CPU: Ray actors, per-TP-rank gloo communicators, two versions.

The same ``PushEndpoint`` and ``weight_push_fn`` the NPU path uses (there over HCCL): trainer ranks
of the first inference-DP group send shard j, every instance's TP worker j receives it; ranks
outside that group only take part in the (here: absent) resharding collective.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from asp_ascend.integrations.mindspeed_rl.weight_push import PushEndpoint, weight_push_fn  # noqa: E402

TP, INSTANCES = 2, 2


def shard(j: int, version: int) -> list:
    g = torch.Generator().manual_seed(100 * version + j)
    return [(f"layers.0.qkv.{j}", torch.randn(24, 8, generator=g)),
            (f"layers.0.mlp.{j}", torch.randn(40, 8, generator=g).to(torch.bfloat16)),
            ("embed", torch.full((16, 8), float(version + j)))]


@ray.remote(num_cpus=0)
class TrainerRank:
    """What AspIntegratedWorker does around get_infer_params(), with the shard made up locally."""

    def __init__(self, tp_index):
        self.j, self.version, self.stalls = tp_index, 0, []
        self.ep = PushEndpoint("cpu")

    def stall_timeouts(self):
        return self.stalls

    def asp_weight_manifest(self, bucket_bytes):
        from asp_ascend.platforms.transport import plan_buckets, specs_of

        if self.j is None:
            return None
        return self.j, plan_buckets(specs_of(shard(self.j, 0)), bucket_bytes), ray.util.get_node_ip_address()

    def asp_push_weights(self, version, base_port, num_instances, bucket_bytes, stall_timeout_s):
        self.stalls.append(stall_timeout_s)
        if self.j is not None:
            self.ep.send(shard(self.j, version), version, ray.util.get_node_ip_address(), base_port + self.j,
                         1 + num_instances, bucket_bytes, stall_timeout_s)
        return self.j


@ray.remote(num_cpus=0)
class InstanceWorker:
    """TP worker j of one instance (inside vLLM: a worker extension reached by collective_rpc)."""

    def __init__(self, j):
        self.j, self.ep, self.weights = j, PushEndpoint("cpu"), {}

    def recv(self, manifests, version, base_port, rank, world, stall_s):
        buckets, host = manifests[self.j]
        self.weights = {k: v.clone() for k, v in self.ep.recv(buckets, version, host, base_port + self.j, rank, world,
                                                              stall_s)}
        return version

    def get(self):
        return self.weights


@ray.remote(num_cpus=0)
def _all_done(*versions):
    return list(versions)


class Instance:
    def __init__(self):
        self.workers = [InstanceWorker.remote(j) for j in range(TP)]

    def receive_weights(self, manifests, version, base_port, rank, world, stall_timeout_s):
        return _all_done.remote(*[w.recv.remote(manifests, version, base_port, rank, world, stall_timeout_s)
                                  for w in self.workers])


class Group:
    """RayActorGroup.execute_sync_command: the method on every rank, results in rank order."""

    def __init__(self, handles):
        self.handles = handles

    def execute_sync_command(self, name, *args):
        return ray.get([getattr(h, name).remote(*args) for h in self.handles])


def _free_port_block(n: int) -> int:
    """A base port whose n ports (base .. base + n - 1) were all free at once a moment ago: the
    resharding push binds a configured range itself, so a test can only pick one that is free now."""
    import contextlib
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65000:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", p))
            except OSError:
                continue
        return base


def test_two_versions_reach_every_instance_tp_rank():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = Group([TrainerRank.remote(0), TrainerRank.remote(1), TrainerRank.remote(None)])
        instances = [Instance() for _ in range(INSTANCES)]
        publish = weight_push_fn(trainer, instances, base_port=_free_port_block(TP), bucket_bytes=512,
                                 stall_timeout_s=60.0)
        for version in (1, 2):
            publish(version)
            for inst in instances:
                for j, w in enumerate(inst.workers):
                    got = ray.get(w.get.remote())
                    want = dict(shard(j, version))
                    assert list(got) == list(want)
                    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
        # the senders were given the configured stall timeout (not the 300 s default)
        assert [ray.get(r.stall_timeouts.remote()) for r in trainer.handles] == [[60.0, 60.0]] * 3
    finally:
        ray.shutdown()


def test_a_taken_resharding_port_names_the_mindspeed_key_and_a_fix_this_push_takes():
    """The sender binds asp.weight_sync.master_port + j itself; a taken one is a ConfigError in
    MindSpeed-RL's spelling of the key, without suggesting 0 (refused for this push)."""
    import socket

    from asp_ascend.errors import ConfigError

    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"asp\.weight_sync\.master_port: port {port} is already in use") as e:
            PushEndpoint("cpu").send(shard(0, 0), 0, "127.0.0.1", port, 2, 1 << 20)
    assert "or 0 to let the OS pick" not in str(e.value) and "master_port + j" in str(e.value)


def _receive(ep, buckets, version, port, got):
    """Receive ``version`` as rank 1 in a thread: got[version] = the tensors, or the error's text."""
    import threading

    def run():
        try:
            got[version] = dict(ep.recv(buckets, version, "127.0.0.1", port, 1, 2))
        except RuntimeError as exc:
            got[version] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_failed_version_drops_the_group_and_the_next_version_forms_it_again():
    """Communicator j on one configured port, over real gloo (threads in place of processes): a
    receiver that goes away (its endpoint destroyed, as when its process dies) fails the sender's
    next version; the sender drops its group, and the version after it reaches a receiver that joins
    again. Then the sender goes away mid-life: the receiver's next version fails, it drops its group
    and joins a new sender's at the version after. Before: both kept the broken group and failed
    again."""
    import gc
    import threading

    from asp_ascend.platforms.transport import plan_buckets, specs_of

    buckets = plan_buckets(specs_of(shard(0, 0)), 512)
    port = _free_port_block(1)
    sender, got = PushEndpoint("cpu"), {}
    first = PushEndpoint("cpu")
    t = _receive(first, buckets, 1, port, got)
    sender.send(shard(0, 1), 1, "127.0.0.1", port, 2, 512)
    t.join(30)
    assert torch.equal(got[1]["embed"], dict(shard(0, 1))["embed"])
    del first
    gc.collect()
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        sender.send(shard(0, 2), 2, "127.0.0.1", port, 2, 512)
    receiver = PushEndpoint("cpu")
    t = _receive(receiver, buckets, 3, port, got)
    sender.send(shard(0, 3), 3, "127.0.0.1", port, 2, 512)   # a sender that kept the broken group fails here
    t.join(30)
    assert not isinstance(got[3], str), got[3]
    assert torch.equal(got[3]["layers.0.qkv.0"], dict(shard(0, 3))["layers.0.qkv.0"])

    del sender
    gc.collect()
    t = _receive(receiver, buckets, 4, port, got)
    t.join(30)
    assert "Connection closed by peer" in got[4]     # the sender's end closed: version 4 failed
    sender = PushEndpoint("cpu")
    sending = threading.Thread(target=sender.send, args=(shard(0, 5), 5, "127.0.0.1", port, 2, 512), daemon=True)
    sending.start()
    t = _receive(receiver, buckets, 5, port, got)
    t.join(30)
    assert not isinstance(got[5], str), got[5]       # a receiver that kept the broken group failed here
    sending.join(30)
    assert torch.equal(got[5]["embed"], dict(shard(0, 5))["embed"])
