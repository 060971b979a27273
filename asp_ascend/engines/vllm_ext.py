"""Code that runs inside a vLLM worker (``worker_extension_cls``): weight reload.

vLLM mixes this class into its worker; methods are called through ``collective_rpc``
(arguments must be plain data: tensors passed directly arrive as lists).

- ``asp_load_weights(blob)``: the state dict as ``torch.save`` bytes (the object-store path).
- ``asp_recv_broadcast(layout, version, group)``: the worker joins the weight-sync group
  (rank ``group["rank"]`` + its own rank inside the instance, so every tensor-parallel worker
  receives the full tensors) and receives the trainer's bucketed broadcast (gloo on CPU, NCCL
  on CUDA, HCCL on NPU). The communicator is kept for the next version while the group's
  generation ``gen`` stays the same (a new generation = the set of instances changed).

``model_runner.reload_weights`` is vLLM's own in-place reload (full HF tensors; its weight
loaders shard them for tensor parallelism); calling ``model.load_weights`` directly is wrong
on CPU, where the loader post-processes parameters after loading. vLLM releases whose runner
has no ``reload_weights(weights_iterator=...)`` (vLLM 0.11 and vllm-ascend's ``NPUModelRunner``,
the MindSpeed-RL stack) get ``model.load_weights`` itself, which is what that reload wraps: the
same vLLM loaders; on vllm-ascend nothing is post-processed after loading while
``VLLM_ASCEND_ENABLE_NZ`` is 0 (MindSpeed-RL's runtime env; ``AscendUnquantizedLinearMethod``).
"""
from __future__ import annotations

import inspect


def load_hf_weights(model_runner, named: list) -> None:
    """Full HF-named tensors into the running model through vLLM's own loaders."""
    reload = getattr(model_runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        reload(weights_iterator=iter(named))
    else:
        model_runner.model.load_weights(iter(named))


class WeightReloadExtension:
    def asp_worker_info(self) -> dict:
        """This worker's rank inside its instance and its device (one entry per tensor-parallel worker)."""
        return {"rank": int(getattr(self, "rank", 0) or 0), "device": str(getattr(self, "device", "cpu"))}

    def asp_load_weights(self, blob: bytes) -> int:
        """Load a serialized state dict into the running model; returns the tensor count."""
        from ..platforms.transport import deserialize_state

        named = deserialize_state(blob)
        load_hf_weights(self.model_runner, named)
        return len(named)

    def asp_recv_broadcast(self, layout: list, version: int, group: dict):
        """Receive version ``version`` over the weight-sync group and load it. Returns the tensor
        count, or the error as a string: an exception raised here would be logged by vLLM as a
        worker failure; the caller (``RolloutEngine.update_weights``) raises it instead."""
        try:
            return self._asp_recv_broadcast(layout, version, group)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            self._asp_comm = None  # a broken group is never reused
            return f"{type(exc).__name__}: {exc}"

    def _asp_recv_broadcast(self, layout: list, version: int, group: dict) -> int:
        from ..platforms import get_platform
        from ..platforms.recv_wait import STALL_KEY, STALL_S
        from ..platforms.transport import BroadcastTransport, WeightTicket
        from ..platforms.communicators import create_communicator

        platform = get_platform(group["platform"], check=False)
        comm = getattr(self, "_asp_comm", None)
        if comm is None or comm[0] != group["gen"]:
            self._asp_comm = None  # leave the old group before joining the new one
            rank = int(group["rank"]) + int(getattr(self, "rank", 0) or 0)
            device = getattr(self, "device", None)
            index = getattr(device, "index", None) or 0
            self._asp_comm = (group["gen"], create_communicator(group["platform"], group["host"], int(group["port"]),
                                                                rank, int(group["world"]), index,
                                                                float(group.get("timeout_s", 300.0))))
        rx = BroadcastTransport(self._asp_comm[1], 1, synchronize=platform.synchronize,
                                stall_s=float(group.get("stall_timeout_s", STALL_S)),
                                stall_key=group.get("stall_key", STALL_KEY))
        # receive every bucket before loading: the broadcast must complete on every rank even
        # if the loader stops early
        named = list(rx.recv(WeightTicket.from_layout(version, layout)))
        load_hf_weights(self.model_runner, named)
        return len(named)
