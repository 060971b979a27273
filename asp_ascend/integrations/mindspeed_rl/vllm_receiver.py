"""Instance side of the HCCL weight push: a vLLM worker extension for vllm-ascend instances.

The trainer sends, per inference-TP rank j, MindSpeed-RL's ``get_infer_params()`` shard: vLLM
parameter names, inference-TP layout, Megatron QKV interleave. vLLM's own loaders expect full HF
tensors and shard them, so the instance loads the shards the way MindSpeed-RL's colocated engine
does (``mindspeed_rl/models/rollout/vllm_engine.py``):

1. ``update_megatron_weight_loader()`` replaces the ``weight_loader`` of vLLM's parallel layer
   classes with a plain copy. A parameter's loader is bound when its layer is built, so this must
   run before the model exists. vLLM imports a worker extension's module in each worker before it
   builds the model (``WorkerWrapperBase.init_worker``, then ``load_model``): importing this module
   installs the loaders when ``ASP_MEGATRON_LOADERS`` names MindSpeed-RL's
   ``megatron_weight_loaders.py`` (the instance actor sets it; its workers inherit it). Elsewhere
   (tests, the driver) importing this module changes nothing.
2. The engine starts on dummy weights (``load_format="dummy"``); the first push brings real ones.
3. Each push goes through the architecture's loader from ``MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY``
   (QKV de-interleave, then the copy loaders). ``load_megatron_weights`` itself is not used: it
   ends with ``vllm_model.cuda()``, which only works where MindSpeed-RL's ``transfer_to_npu``
   patch is active, and the received tensors are on the device already.

MindSpeed-RL's loaders file needs only torch, transformers and vllm, so it is loaded from its path
under a private module name: the ``mindspeed_rl`` package (whose ``__init__`` imports acl,
torch_npu's ``transfer_to_npu`` and all of MindSpeed-RL) is never imported into a vllm-ascend worker.

Use as ``worker_extension_cls="asp_ascend.integrations.mindspeed_rl.vllm_receiver.MindSpeedWeightReceiver"``
and call ``llm.collective_rpc("asp_recv_megatron_weights", args=(...))`` on the instance: every TP
worker of the instance joins communicator j = its TP rank.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Optional

from ...platforms.recv_wait import STALL_S

LOADERS_ENV = "ASP_MEGATRON_LOADERS"
LOADERS_REL = "mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py"
_MODULE_NAME = "asp_mindspeed_megatron_weight_loaders"
_INSTALLED: dict[str, Any] = {}


def loaders_path(mindspeed_root: Optional[str] = None) -> Path:
    """MindSpeed-RL's ``megatron_weight_loaders.py``: under ``mindspeed_root``, else where the
    ``mindspeed_rl`` package would be imported from (found without importing it)."""
    if mindspeed_root:
        path = Path(mindspeed_root) / LOADERS_REL
    else:
        spec = importlib.util.find_spec("mindspeed_rl")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"mindspeed_rl is not on the path; cannot find {LOADERS_REL} "
                                    f"(set asp.mindspeed.root to the MindSpeed-RL checkout)")
        path = Path(list(spec.submodule_search_locations)[0]).parent / LOADERS_REL
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: asp.mindspeed.root must be a MindSpeed-RL checkout "
                                f"(docs/ascend.md pins the commit)")
    return path


def load_loaders(path: str | Path):
    """MindSpeed-RL's loaders module from its file, without importing the ``mindspeed_rl`` package."""
    if _MODULE_NAME in _INSTALLED:
        return _INSTALLED[_MODULE_NAME]
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _INSTALLED[_MODULE_NAME] = module
    return module


def install_megatron_loaders(path: str | Path):
    """Patch vLLM's layer classes with MindSpeed-RL's copy loaders (before any model is built)."""
    module = load_loaders(path)
    if not _INSTALLED.get("patched"):
        module.update_megatron_weight_loader()
        _INSTALLED["patched"] = True
    return module


def installed_loaders():
    """The loaders module when installed in this process, else None."""
    return _INSTALLED.get(_MODULE_NAME) if _INSTALLED.get("patched") else None


if os.environ.get(LOADERS_ENV):   # inside an instance's vLLM worker: before its model is built
    install_megatron_loaders(os.environ[LOADERS_ENV])


def check_dense(hf_config) -> None:
    """The receiver loads with ``local_experts=0`` (no expert layout is pushed): refuse a MoE model before the
    first bucket arrives instead of letting MindSpeed-RL's MoE loaders divide by it."""
    from .config_bridge import EXPERT_KEYS

    for key in EXPERT_KEYS:
        val = hf_config.get(key) if isinstance(hf_config, dict) else getattr(hf_config, key, None)
        if val:
            raise RuntimeError(f"the model's config.json has {key}: {val} (a MoE model); the async path's receiver "
                               f"loads dense models only (local_experts=0). Use asp.mindspeed.trainer=sync")


class MindSpeedWeightReceiver:
    """Methods run inside each vLLM worker process (``self.model_runner``, ``self.rank`` available)."""

    def asp_recv_megatron_weights(self, manifests: dict[int, Any], version: int, base_port: int,
                                  instance_index: int, world_size: int, infer_tp: int,
                                  stall_timeout_s: float = STALL_S) -> int:
        """Receive version ``version``: ``manifests[j] = (buckets, sender IP)`` per inference-TP rank j;
        a sender with no progress for ``stall_timeout_s`` seconds ends it (``PushEndpoint.recv``)."""
        from .weight_push import PushEndpoint

        loaders = installed_loaders()
        if loaders is None:
            raise RuntimeError(f"the receiver's loaders were not installed before this worker built its model: "
                               f"{LOADERS_ENV} was not set in the instance (rollout_groups.instance_env)")
        model = self.model_runner.model
        arch = type(model).__name__
        load = loaders.MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY.get(arch)
        if load is None:
            raise RuntimeError(f"MindSpeed-RL has no Megatron weight loader for {arch}; supported: "
                               f"{sorted(loaders.MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY)}")
        j = int(getattr(self, "rank", 0)) % infer_tp
        buckets, host = manifests[j]
        if getattr(self, "_asp_endpoint", None) is None:
            device = self.device.index if getattr(self, "device", None) is not None else j
            self._asp_endpoint = PushEndpoint("npu", device)
        hf_config = self.model_runner.model_config.hf_config
        check_dense(hf_config)
        params = dict(self._asp_endpoint.recv(buckets, version, host, base_port + j, 1 + instance_index, world_size,
                                              stall_timeout_s))
        # dense models only (config_bridge refuses MoE): expert parallel 1, no local experts
        cfg = loaders.InferParallelConfig(infer_tp, 1, infer_tp, 0)
        load(params, model, cfg, hf_config)
        return len(params)
