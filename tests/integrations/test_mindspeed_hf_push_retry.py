"""The engine-free push after a failed push: the sender drops the broken communicator and the next
push forms the group again on the same port (hf_push.push_version, as the trainer's send_weights).

Real parts only: one trainer rank (TP 1 x PP 1, so it is the sender) runs hf_push.HfPusher over a
real gloo group; the receiving instance worker is a thread joining that group as rank 1 with
create_communicator and receiving with BroadcastTransport, what engines/vllm_ext.py does before
loading. A worker that goes away (its communicator destroyed, as when its process dies) breaks
the group: the next push fails, and the push after it, to a worker that joins again, must arrive.
"""
from __future__ import annotations

import gc
import threading

import pytest

torch = pytest.importorskip("torch")

from asp_ascend.integrations.mindspeed_rl.hf_push import (  # noqa: E402
    HfPusher, RankRole, listen_reply, push_version, sender_endpoint)
from asp_ascend.integrations.mindspeed_rl.hf_weights import ModelLayout  # noqa: E402
from asp_ascend.platforms.transport import BroadcastTransport, WeightTicket  # noqa: E402
from asp_ascend.platforms.communicators import create_communicator  # noqa: E402

HF_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 1, "hidden_size": 8,
             "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 12,
             "tie_word_embeddings": False}
TIMEOUT_S = 20


def _params(version: int) -> list:
    """Megatron-named parameters of one version (the embedding padded past the HF vocabulary)."""
    return [("module.module.embedding.word_embeddings.weight", torch.nn.Parameter(torch.full((16, 8), float(version)))),
            ("module.module.decoder.final_layernorm.weight", torch.nn.Parameter(torch.arange(8.0) + version))]


class Worker:
    """An instance worker: joins the group as rank 1, receives versions until told to leave."""

    def __init__(self, port: int):
        self.port, self.comm, self.got = port, None, {}

    def receive(self, buckets, version: int) -> threading.Thread:
        def run():
            if self.comm is None:
                self.comm = create_communicator("cpu", "127.0.0.1", self.port, 1, 2, timeout_s=TIMEOUT_S)
            rx = BroadcastTransport(self.comm, 1)
            self.got[version] = {n: t.clone() for n, t in rx.recv(WeightTicket(version, buckets))}

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def leave(self) -> None:
        """Destroy the communicator (its sockets close, as when the worker's process dies)."""
        self.comm = None
        gc.collect()


def test_a_failed_push_drops_the_communicator_and_the_next_push_forms_it_again():
    pusher = HfPusher(RankRole(True, 0, 1, 0, 1), _params(1), {0: 0}, ModelLayout.from_hf_config(HF_CONFIG))
    buckets = pusher.manifest(64)
    assert len(buckets) >= 2          # the 64-byte cap: one bucket per tensor at least
    endpoint = sender_endpoint()
    group = {"gen": 0, "host": "127.0.0.1", "port": 0, "world": 2, "platform": "cpu", "timeout_s": TIMEOUT_S}
    group["port"] = listen_reply(pusher, endpoint, group)

    def load(version: int) -> None:
        with torch.no_grad():
            for (_, p, _), (_, new) in zip(pusher.entries, _params(version)):
                p.copy_(new)

    first = Worker(group["port"])
    t = first.receive(buckets, 1)
    assert push_version(pusher, endpoint, group, 1) == 2
    t.join(TIMEOUT_S)
    assert torch.equal(first.got[1]["model.embed_tokens.weight"], torch.full((12, 8), 1.0))

    first.leave()                     # the instance's worker is gone: the group is broken
    load(2)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        push_version(pusher, endpoint, group, 2)

    load(3)
    second = Worker(group["port"])    # the restarted worker joins the group's port again
    t = second.receive(buckets, 3)
    assert push_version(pusher, endpoint, group, 3) == 2   # a sender that kept the broken group fails here
    t.join(TIMEOUT_S)
    assert not t.is_alive()
    assert torch.equal(second.got[3]["model.embed_tokens.weight"], torch.full((12, 8), 3.0))
    assert torch.equal(second.got[3]["model.norm.weight"], torch.arange(8.0) + 3)
