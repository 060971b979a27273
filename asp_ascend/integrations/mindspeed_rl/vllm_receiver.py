"""Instance side of the HCCL weight push: a vLLM worker extension for vllm-ascend instances.

The trainer sends, per inference-TP rank j, MindSpeed-RL's ``get_infer_params()`` shard:
vLLM parameter names, inference-TP layout, Megatron QKV interleave. vLLM's own loader
expects full HF tensors, so the instance loads them the way MindSpeed-RL's colocated
engine does: ``update_megatron_weight_loader()`` once (per-shard copy loaders), then
``load_megatron_weights(params, model, InferParallelConfig(...), hf_config)``.

Use as ``worker_extension_cls="asp_ascend.integrations.mindspeed_rl.vllm_receiver.MindSpeedWeightReceiver"``
and call ``llm.collective_rpc("asp_recv_megatron_weights", args=(...))`` on the instance:
every TP worker of the instance joins communicator j = its TP rank.
"""
from __future__ import annotations

from typing import Any


class MindSpeedWeightReceiver:
    """Methods run inside each vLLM worker process (``self.model_runner``, ``self.rank`` available)."""

    def asp_recv_megatron_weights(self, manifests: dict[int, Any], version: int, base_port: int,
                                  instance_index: int, world_size: int, infer_tp: int, infer_ep: int = 1,
                                  local_experts: int = 0) -> int:
        """Receive version ``version``: ``manifests[j] = (buckets, sender IP)`` per inference-TP rank j."""
        from . import import_mindspeed
        from .weight_push import PushEndpoint

        loaders = import_mindspeed("mindspeed_rl.models.rollout.vllm_adapter.megatron_weight_loaders",
                                   "loading pushed weights into a vllm-ascend instance")
        InferParallelConfig, load_megatron_weights = loaders.InferParallelConfig, loaders.load_megatron_weights

        j = int(getattr(self, "rank", 0)) % infer_tp
        buckets, host = manifests[j]
        if getattr(self, "_asp_endpoint", None) is None:
            device = self.device.index if getattr(self, "device", None) is not None else j
            self._asp_endpoint = PushEndpoint("npu", device)
            loaders.update_megatron_weight_loader()
        params = dict(self._asp_endpoint.recv(buckets, version, host, base_port + j, 1 + instance_index, world_size))
        model = self.model_runner.model
        cfg = InferParallelConfig(infer_tp, 1, infer_ep * infer_tp, local_experts)
        load_megatron_weights(params, model, cfg, self.model_runner.model_config.hf_config)
        return len(params)
