"""Child process for test_weight_sync_sender_failed: one rank of a weight-sync group whose sender
fails version 1 after its first bucket (gloo, NCCL or HCCL).

Rank 0 (``SenderEndpoint`` on the configured port) sends bucket 1 of 2, marks version 1 failed and
keeps its communicator open until the receiver has written its result (so only the failure key can
end the receive), then drops the group, forms it again on the same port and sends version 2.
Rank 1 receives version 1 (it must raise ``SenderFailed``), drops its end, joins again and receives
version 2 (after rank 0 wrote ``dropped`` there: the runtime's next version, too, comes after the sender's drop).
Results go to ``OUT`` as JSON; rank 1 writes ``failed`` next to it as soon as version 1 failed.
"""
import json
import os
import sys
import time

import torch

from asp_ascend.platforms.recv_wait import SenderFailed
from asp_ascend.platforms.transport import BroadcastTransport, WeightTicket, plan_buckets, specs_of
from asp_ascend.platforms.communicators import SenderEndpoint, create_communicator

GROUP_TIMEOUT_S = 600     # far above what the test waits: the group's timeout cannot be what ends the receive


def named(version: int, device) -> list:
    g = torch.Generator().manual_seed(version)
    return [("a", torch.randn(64, generator=g).to(device)), ("b", torch.randn(64, generator=g).to(device))]


def write(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def main():
    rank, port, out, platform_name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    from asp_ascend.platforms import get_platform

    platform = get_platform(platform_name)

    def signal(name: str) -> str:
        return os.path.join(os.path.dirname(out), name)
    platform.set_device(rank)
    device = platform.torch_device(rank)
    buckets = plan_buckets(specs_of(named(1, "cpu")), 64 * 4)
    assert len(buckets) == 2
    group = {"gen": 0, "host": "127.0.0.1", "port": port, "world": 2, "platform": platform_name,
             "timeout_s": GROUP_TIMEOUT_S}
    if rank == 0:
        ep = SenderEndpoint(device_index=rank)
        tx = BroadcastTransport(ep.comm(group), 64 * 4, synchronize=platform.synchronize)
        try:
            tx.send(WeightTicket(1, buckets), named(1, device)[:1])   # bucket 1 goes out, "b" is missing
        except KeyError:
            pass
        time.sleep(0.5)                       # the receiver waits for bucket 2 meanwhile
        marked = ep.mark_failed(1)            # ... and its communicator stays open
        t0 = time.monotonic()
        while not os.path.exists(signal("failed")) and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        ep.drop()
        write(signal("dropped"), {})           # the receiver joins again only now (as the runtime's next version)
        v2 = named(2, device)
        tx = BroadcastTransport(ep.comm(group), 64 * 4, synchronize=platform.synchronize)   # formed again
        tx.send(tx.prepare(2, v2), v2)
        write(out, {"marked": marked})
    else:
        rx = BroadcastTransport(create_communicator(platform_name, "127.0.0.1", port, 1, 2, rank, GROUP_TIMEOUT_S),
                                1, synchronize=platform.synchronize)
        t0 = time.monotonic()
        try:
            list(rx.recv(WeightTicket(1, buckets)))
            failed = None
        except SenderFailed as exc:
            failed = str(exc)
        waited = time.monotonic() - t0
        write(signal("failed"), {"failed": failed, "waited": waited})
        while not os.path.exists(signal("dropped")):
            time.sleep(0.05)
        rx = BroadcastTransport(create_communicator(platform_name, "127.0.0.1", port, 1, 2, rank, GROUP_TIMEOUT_S),
                                1, synchronize=platform.synchronize)
        got = {n: t.cpu() for n, t in rx.recv(WeightTicket(2, buckets))}
        ref = {n: t.cpu() for n, t in named(2, "cpu")}
        write(out, {"failed": failed, "waited": waited, "v2_equal": all(torch.equal(got[n], ref[n]) for n in ref)})


if __name__ == "__main__":
    main()
