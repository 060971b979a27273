"""Child process for test_weight_transport: one rank of a bucketed broadcast (gloo, NCCL or HCCL).

Rank 0 started with port 0 hosts the rendezvous on a port the OS picks and writes it to
``OUT.port``; the other ranks are started with that port."""
import json
import os
import sys

import torch

from asp_ascend.platforms.transport import BroadcastTransport
from asp_ascend.platforms.communicators import create_communicator, listen_store


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return [("embed.weight", torch.randn(50, 8, generator=g)),
            ("layer.0.w", torch.randn(8, 8, generator=g).to(torch.bfloat16)),
            ("layer.0.b", torch.randn(8, generator=g)),
            ("step", torch.tensor([7], dtype=torch.int64)),
            ("head.weight", torch.randn(8, 50, generator=g))]


def main():
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    platform_name = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    from asp_ascend.platforms import get_platform

    platform = get_platform(platform_name)
    platform.set_device(rank)
    store = None
    if rank == 0 and port == 0:  # listen first (the OS picks the port), then tell the others where
        store = listen_store("127.0.0.1", 0, world)
        port = int(store.port)
        with open(out + ".port.tmp", "w") as f:
            f.write(str(port))
        os.replace(out + ".port.tmp", out + ".port")
    comm = create_communicator(platform_name, "127.0.0.1", port, rank, world, device_index=rank, store=store)
    tx = BroadcastTransport(comm, bucket_bytes=1024, synchronize=platform.synchronize)
    named = [(k, v.to(platform.torch_device(rank))) for k, v in model(seed=0)]
    ticket = tx.prepare(3, named)  # every rank plans the same buckets from the same metadata
    if rank == 0:
        tx.send(ticket, named)
        result = {"buckets": len(ticket.buckets)}
    else:
        got = {k: v.cpu() for k, v in tx.recv(ticket)}
        ref = {k: v.cpu() for k, v in named}
        result = {"names": list(got), "equal": all(torch.equal(got[k], ref[k]) for k in ref),
                  "dtypes": {k: str(v.dtype) for k, v in got.items()}}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
