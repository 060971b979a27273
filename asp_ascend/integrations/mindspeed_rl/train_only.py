"""What stands in MindSpeed-RL's ``MegatronShardingManager`` place on a trainer with no vLLM engine.

MindSpeed-RL's actor worker builds a colocated vLLM engine (``_build_rollout``) and a
``MegatronShardingManager`` over it (``_build_sharding_manager``); ``update``, ``compute_log_prob``
and ``save_ckpt`` then call the manager's ``enter/exit_train_mode`` and ``enter/exit_forward_mode``.
On the async path generation runs on separate instances and the weights leave through the
engine-free push (:mod:`.hf_push`), so the trainer worker builds no engine (no vLLM model, no KV
cache, no ZMQ channel, no inference weight buffers) and this class takes the manager's place:
the train and forward switches do exactly what MindSpeed-RL's do with the same
``generate_config.offload_train_*`` flags (``mindspeed_rl/workers/resharding/megatron_sharding_manager.py``),
and the inference switches refuse, since nothing on the trainer generates.

With the flags false (the shipped async YAMLs) every switch is a no-op: parameters, gradients and
optimizer state stay on the NPU, which the colocated layout could not afford.
"""
from __future__ import annotations


class TrainOnlyShardingManager:
    def __init__(self, offloader, optimizer_offload: bool = False, grad_offload: bool = False,
                 train_param_offload: bool = False, share_backbone: bool = False):
        self.megatron_offloader = offloader
        self.optimizer_offload, self.grad_offload = bool(optimizer_offload), bool(grad_offload)
        self.train_param_offload, self.share_backbone = bool(train_param_offload), bool(share_backbone)

    def _params_move(self) -> bool:
        return self.train_param_offload and not self.share_backbone

    def enter_forward_mode(self) -> None:
        if self._params_move():
            self.megatron_offloader.onload_param()

    def exit_forward_mode(self) -> None:
        if self._params_move():
            self.megatron_offloader.offload_param()

    def enter_train_mode(self) -> None:
        if self._params_move():
            self.megatron_offloader.onload_param()
        if self.optimizer_offload:
            self.megatron_offloader.onload_optimizer()
        if self.grad_offload:
            self.megatron_offloader.onload_grad()

    def exit_train_mode(self) -> None:
        if self.optimizer_offload:
            self.megatron_offloader.offload_optimizer()
        if self.grad_offload:
            self.megatron_offloader.offload_grad()

    def enter_infer_mode(self) -> None:
        raise RuntimeError("asp async trainer: this worker has no colocated vLLM engine (generation runs on the "
                           "rollout instances); enter_infer_mode was called, so something ran MindSpeed-RL's "
                           "generate_sequences on the trainer")

    exit_infer_mode = enter_infer_mode
