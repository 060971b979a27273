"""Weight-sync transports side by side: Ray object store vs bucketed broadcast (gloo on CPU).

    python benchmarks/bench_weight_sync.py [--mib 64 512] [--receivers 2] [--repeats 3] [--buckets-mib 64 1024]

One sender actor (the trainer's role) holds a synthetic float32 state dict shaped like a
transformer (embedding, per-layer square and wide matrices, norms); ``--receivers`` actors (the
rollout instances' role) each end up holding every tensor, checked by a checksum. Each case
runs once to warm up, then ``--repeats`` times; the median wall time from "publish" to "every receiver holds the
weights" is printed, with the ratio to the object store. The transports are the runtime's own
(asp_ascend/platforms/transport.py); vLLM is not involved (its reload cost is the same for
both). Figures are printed, not asserted.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def state_dict(mib: int):
    """float32 tensors summing to about ``mib`` MiB: 1 embedding + L layers of (h x h, h x 4h, 2 x h)."""
    import torch

    h = 1024
    per_layer = (h * h + 4 * h * h + 2 * h) * 4
    layers = max(1, (mib << 20) // per_layer - 1)
    g = torch.Generator().manual_seed(0)
    named = [("embed.weight", torch.randn(4 * h, h, generator=g))]
    for i in range(layers):
        named += [(f"layers.{i}.attn.weight", torch.randn(h, h, generator=g)),
                  (f"layers.{i}.mlp.weight", torch.randn(4 * h, h, generator=g)),
                  (f"layers.{i}.norm1.weight", torch.ones(h)), (f"layers.{i}.norm2.weight", torch.ones(h))]
    return named


def checksum(named) -> float:
    return float(sum(float(t.double().sum()) for _, t in named))


class Sender:
    def __init__(self, mib: int):
        self.named = state_dict(mib)
        self.sum = checksum(self.named)
        self.comm = None

    def info(self):
        import ray

        from asp_ascend.platforms.transport import specs_of

        return ray.util.get_node_ip_address(), self.sum, sum(t.numel() * 4 for _, t in self.named), specs_of(self.named)

    def free_port(self) -> int:
        from asp_ascend.engines.trainer import TrainerEngine

        return TrainerEngine.free_port()

    def publish_object_store(self, version: int):
        from asp_ascend.platforms.transport import RayObjectStoreTransport

        return RayObjectStoreTransport().prepare(version, self.named)

    def join(self, host: str, port: int, world: int) -> None:
        from asp_ascend.platforms.transport import create_communicator

        self.comm = create_communicator("cpu", host, port, 0, world)

    def send(self, version: int, bucket_bytes: int) -> float:
        from asp_ascend.platforms.transport import BroadcastTransport

        tx = BroadcastTransport(self.comm, bucket_bytes)
        t0 = time.time()
        tx.send(tx.prepare(version, self.named), self.named)
        return time.time() - t0


class Receiver:
    def __init__(self):
        self.comm = None

    def recv_object_store(self, ticket) -> float:
        from asp_ascend.platforms.transport import RayObjectStoreTransport

        return checksum(list(RayObjectStoreTransport().recv(ticket)))

    def join(self, host: str, port: int, rank: int, world: int) -> None:
        from asp_ascend.platforms.transport import create_communicator

        self.comm = create_communicator("cpu", host, port, rank, world)

    def recv_broadcast(self, layout: list, version: int) -> float:
        from asp_ascend.platforms.transport import BroadcastTransport, WeightTicket

        rx = BroadcastTransport(self.comm, 1)
        return checksum(list(rx.recv(WeightTicket.from_layout(version, layout))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, nargs="+", default=[64, 512])
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--buckets-mib", type=int, nargs="+", default=[64, 1024])
    a = p.parse_args()
    import ray

    from asp_ascend.platforms.transport import WeightTicket, plan_buckets

    ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=4 << 30)
    S, R = ray.remote(num_cpus=0)(Sender), ray.remote(num_cpus=0)(Receiver)
    print(f"{'MiB':>6s} {'case':32s} {'median s':>9s} {'GB/s':>7s} {'vs object store':>16s}")
    for mib in a.mib:
        sender = S.remote(mib)
        host, ref_sum, nbytes, specs = ray.get(sender.info.remote())
        receivers = [R.remote() for _ in range(a.receivers)]
        results = {}

        def timed(fn):
            fn(-1)  # warm-up (actor start, imports, first connections): not timed
            times = []
            for v in range(a.repeats):
                t0 = time.time()
                sums = fn(v)
                times.append(time.time() - t0)
                assert all(abs(s - ref_sum) <= 1e-6 * max(1.0, abs(ref_sum)) for s in sums), "receiver got other data"
            return statistics.median(times)

        results["object_store"] = timed(lambda v: ray.get(
            [r.recv_object_store.remote(sender.publish_object_store.remote(v)) for r in receivers]))
        world = 1 + a.receivers
        port = ray.get(sender.free_port.remote())
        ray.get([sender.join.remote(host, port, world)] +
                [r.join.remote(host, port, 1 + i, world) for i, r in enumerate(receivers)])
        for bmib in a.buckets_mib:
            bucket = bmib << 20

            def bcast(v, bucket=bucket):
                ticket = WeightTicket(v, plan_buckets(specs, bucket))  # what publish(v, "broadcast") returns
                refs = [r.recv_broadcast.remote(ticket.layout(), v) for r in receivers]
                ray.get(sender.send.remote(v, bucket))
                return ray.get(refs)

            results[f"broadcast, {bmib} MiB buckets"] = timed(bcast)
        base = results["object_store"]
        for case, t in results.items():
            print(f"{mib:6d} {case:32s} {t:9.3f} {nbytes / t / 1e9:7.2f} {base / t:15.2f}x")
        for h in [sender, *receivers]:
            ray.kill(h)
    ray.shutdown()


if __name__ == "__main__":
    main()
