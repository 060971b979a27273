"""Child process for test_weight_transport: one rank of a bucketed gloo broadcast."""
import json
import sys

import torch

from asp_ascend.platforms.transport import BroadcastTransport, create_communicator


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return [("embed.weight", torch.randn(50, 8, generator=g)),
            ("layer.0.w", torch.randn(8, 8, generator=g).to(torch.bfloat16)),
            ("layer.0.b", torch.randn(8, generator=g)),
            ("step", torch.tensor([7], dtype=torch.int64)),
            ("head.weight", torch.randn(8, 50, generator=g))]


def main():
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    comm = create_communicator("cpu", "127.0.0.1", port, rank, world)
    tx = BroadcastTransport(comm, bucket_bytes=1024)
    named = model(seed=0)
    ticket = tx.prepare(3, named)  # every rank plans the same buckets from the same metadata
    if rank == 0:
        tx.send(ticket, named)
        result = {"buckets": len(ticket.buckets)}
    else:
        got = dict(tx.recv(ticket))
        ref = dict(named)
        result = {"names": list(got), "equal": all(torch.equal(got[k], ref[k]) for k in ref),
                  "dtypes": {k: str(v.dtype) for k, v in got.items()}}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
