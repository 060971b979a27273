"""Code that runs inside a vLLM worker (``worker_extension_cls``): weight reload.

vLLM mixes this class into its worker; methods are called through
``collective_rpc``. The state dict travels as ``torch.save`` bytes (tensors passed
directly through vLLM's RPC arrive as lists). ``model_runner.reload_weights`` is
vLLM's own in-place reload; calling ``model.load_weights`` directly is wrong on CPU,
where the loader post-processes parameters after loading.
"""
from __future__ import annotations


class WeightReloadExtension:
    def asp_load_weights(self, blob: bytes) -> int:
        """Load a serialized state dict into the running model; returns the tensor count."""
        from ..platforms.transport import deserialize_state

        named = deserialize_state(blob)
        self.model_runner.reload_weights(weights_iterator=iter(named))
        return len(named)
