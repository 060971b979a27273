"""MindSpeed-RL classes, created on demand: AsyncGRPOTrainer, the trainer worker, the loss.

Every function here imports ``mindspeed_rl`` when called (it needs torch_npu, CANN,
vllm and vllm-ascend); on a machine without them it raises BackendMissingError saying
what to install. The loop itself is :class:`.async_loop.AsyncGRPOLoop`; this module only
connects it to MindSpeed-RL's objects:

- ``AsyncGRPOTrainer(RayGRPOTrainer)``: ``fit`` runs the async loop instead of generating;
  the TransferDock gets an extra column ``rollout_log_prob``; ``skip_actor_log_prob`` is
  forced off (old log-probs are always recomputed: the default skip would treat the
  current policy as the behaviour policy, wrong for stale samples).
- ``AspIntegratedWorker``: MindSpeed-RL's ``IntegratedWorker`` plus the weight push to the
  rollout instances over HCCL. Default (``asp.mindspeed.weight_push: hf``): no colocated vLLM
  engine at all; the ranks gather their Megatron shards into HF-named full tensors and broadcast
  them (:mod:`.hf_push`). ``resharding``: the colocated engine is kept and its resharding manager
  (``get_infer_params``) feeds :mod:`.weight_push`. Registered in ``launcher.resource_mapping``
  (keyed by Ray actor class name, otherwise a renamed worker gets 0 NPUs).
- ``register_offpolicy_loss``: registers, as ``('ray_grpo', 'actor')``, a GRPO loss that
  refuses to run without recomputed ``old_log_prob`` (the stock loss silently falls back to
  the current log-prob). The off-policy weight itself travels in the advantages
  (see :mod:`.async_loop`), so the loss arithmetic stays MindSpeed-RL's own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import import_mindspeed, require_mindspeed
from .async_loop import AsyncGRPOLoop, LoopPorts, LoopSettings

ROLLOUT_LOG_PROB = "rollout_log_prob"
_CACHE: dict[str, Any] = {}


class TransferDockStore:
    """:class:`.async_loop.ExperienceStore` over MindSpeed-RL's DataStrategy (strategy ``td``).

    Reads go through the dock's waiting API: ``get_experience(consumer, columns, indexes=...)``
    blocks until every requested row of every column has been written. MindSpeed-RL's workers
    write ``old_log_prob`` and ``advantages`` fire-and-forget (``collect_transfer_dock_data``,
    ``compute_advantage``), so a worker-group call can return before its rows land; a snapshot
    (``get_experience_data``) would then hold ``None`` rows. The reads use the dock's own
    ``trainer`` consumer, which nothing else in the GRPO flow reads; ``clear`` resets it.
    Writes (``DataStrategy.put_main``) wait for the dock to apply them.

    ``get`` resolves a remote call (``ray.get``); ``unpad`` turns the dock's padded batch back into
    per-row tensors (MindSpeed-RL's ``remove_padding_tensor_dict_to_dict``).
    """

    CONSUMER = "trainer"

    def __init__(self, data_strategy, unpad: Callable[[Any], dict], get: Optional[Callable[[Any], Any]] = None):
        self.ds, self.unpad = data_strategy, unpad
        if get is None:
            import ray

            get = ray.get
        self.get = get

    def put_experience(self, data_dict, indexes, is_prompt=False):
        self.ds.put_experience(data_dict, indexes, is_prompt=is_prompt)

    def read_columns(self, columns, indexes):
        want = list(indexes)
        batch, got = self.get(self.ds.td.get_experience.remote(self.CONSUMER, list(columns), indexes=want,
                                                               get_n_samples=False))
        if list(got) != want:
            raise RuntimeError(f"TransferDock returned rows {list(got)[:8]}... for a read of rows {want[:8]}...")
        rows = self.unpad(batch)
        return {c: list(rows[c]) for c in columns}

    def clear_main(self):
        self.ds.clear_main()


def register_offpolicy_loss():
    """Register the guarded GRPO actor loss for stage ``ray_grpo``; call in every trainer worker
    process before ``initialize()`` (``BaseTrainingEngine`` looks the loss up at construction)."""
    if "loss" in _CACHE:
        return _CACHE["loss"]
    GRPOActorLossFunc = import_mindspeed("mindspeed_rl.models.loss.grpo_actor_loss_func",
                                         "the off-policy GRPO loss").GRPOActorLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory

    @LossFuncFactory.register_loss("ray_grpo", "actor")
    class AspGRPOActorLossFunc(GRPOActorLossFunc):
        """GRPO loss for the async trainer: old log-probs must be the recomputed ones."""

        def compute_loss(self, output, batch, forward_only=False, non_loss_data=True, **kwargs):
            if not forward_only and batch.get("old_log_prob") is None:
                raise RuntimeError("asp async trainer: the update batch has no old_log_prob; the async loop "
                                   "recomputes it every iteration (skip_actor_log_prob must stay False)")
            return super().compute_loss(output, batch, forward_only=forward_only,
                                        non_loss_data=non_loss_data, **kwargs)

    _CACHE["loss"] = AspGRPOActorLossFunc
    return AspGRPOActorLossFunc


def make_trainer_worker_class(engine_free: bool = True):
    """``AspIntegratedWorker``: IntegratedWorker + weight push, registered in resource_mapping.

    ``engine_free`` (``asp.mindspeed.weight_push: hf``, the default): the worker builds no vLLM engine
    (``_build_rollout`` returns None) and a :class:`.train_only.TrainOnlyShardingManager` takes the
    sharding manager's place; weights leave through :mod:`.hf_push` (``asp_hf_manifest``,
    ``asp_hf_listen``, ``asp_hf_push``). Otherwise (``resharding``) MindSpeed-RL's colocated engine is
    kept and its resharding manager feeds :mod:`.weight_push` (``asp_weight_manifest`` /
    ``asp_push_weights``)."""
    key = f"worker_{'hf' if engine_free else 'resharding'}"
    if key in _CACHE:
        return _CACHE[key]
    require_mindspeed("the trainer worker")
    import ray
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker
    from mindspeed_rl.workers.scheduler import launcher

    base = IntegratedWorker.__ray_actor_class__

    class AspIntegratedWorker(base):
        """IntegratedWorker that can push its weights to asp rollout instances."""

        def initialize(self):
            register_offpolicy_loss()
            return super().initialize()

        # ---------------------------------------------------------------- engine-free (hf)
        def _build_rollout(self):
            if not engine_free:
                return super()._build_rollout()
            return None   # no colocated vLLM engine: generation runs on the rollout instances

        def _build_sharding_manager(self):
            if not engine_free:
                return super()._build_sharding_manager()
            from .train_only import TrainOnlyShardingManager

            g = self.generate_config
            return TrainOnlyShardingManager(self.actor_offloader, g.offload_train_optimizer, g.offload_train_grad,
                                            g.offload_train_param, self.rl_config.share_backbone)

        def _asp_hf_pusher(self, hf_config: dict):
            if getattr(self, "_asp_hf", None) is None:
                import torch.distributed as dist

                from .hf_push import HfPusher, RankRole
                from .hf_weights import ModelLayout

                if len(self.model) != 1:
                    raise RuntimeError(f"the engine-free weight push supports one model chunk per rank, this rank has "
                                       f"{len(self.model)} (virtual pipeline stages); unset "
                                       f"num_layers_per_virtual_pipeline_stage or use asp.mindspeed.weight_push=resharding")
                ps, chunk = self.parallel_state, self.model[0]
                core = chunk
                while hasattr(core, "module"):
                    core = core.module
                layers = getattr(getattr(core, "decoder", None), "layers", [])
                layer_map = {i: int(layer.layer_number) - 1 for i, layer in enumerate(layers)}
                pp_group = ps.get_pipeline_model_parallel_group()
                role = RankRole(first_replica=ps.get_data_parallel_rank(with_context_parallel=True) == 0,
                                tp_rank=ps.get_tensor_model_parallel_rank(),
                                tp_size=ps.get_tensor_model_parallel_world_size(),
                                pp_rank=ps.get_pipeline_model_parallel_rank(),
                                pp_size=ps.get_pipeline_model_parallel_world_size(),
                                tp_group=ps.get_tensor_model_parallel_group(), pp_group=pp_group,
                                pp_ranks=tuple(dist.get_process_group_ranks(pp_group)))
                self._asp_hf = HfPusher(role, list(chunk.named_parameters()), layer_map,
                                        ModelLayout.from_hf_config(hf_config))
                self._asp_hf_endpoint = None
            return self._asp_hf

        def asp_hf_manifest(self, bucket_bytes: int, hf_config: dict):
            """(bucket plan, node IP) on the sender, None elsewhere; collective over the trainer ranks."""
            from .hf_push import manifest_reply

            return manifest_reply(self._asp_hf_pusher(hf_config), bucket_bytes, ray.util.get_node_ip_address())

        def asp_hf_listen(self, group: dict):
            """The sender starts the weight-sync group's store and returns its port; None elsewhere."""
            from .hf_push import listen_reply, sender_endpoint

            pusher = self._asp_hf
            if pusher.role.sender and self._asp_hf_endpoint is None:
                self._asp_hf_endpoint = sender_endpoint(int(ray.get_runtime_context().get_accelerator_ids()["NPU"][0]))
            return listen_reply(pusher, self._asp_hf_endpoint, group)

        def asp_hf_push(self, version: int, group: dict):
            """Every trainer rank: gather, convert and (sender) broadcast this version's HF tensors."""
            from .hf_push import push_version

            pusher = self._asp_hf
            sm = self.sharding_manager
            sm.enter_forward_mode()       # parameters on the device (when offload_train_param moved them)
            try:
                return push_version(pusher, self._asp_hf_endpoint, group, version)
            finally:
                sm.exit_forward_mode()

        # ---------------------------------------------------------------- colocated (resharding)
        def _asp_first_dp_group(self) -> Optional[int]:
            """This rank's inference-TP index if it belongs to the first inference DP group, else None."""
            import torch.distributed as dist
            from mindspeed_rl.models.rollout.vllm_adapter.vllm_parallel_state import get_vllm_tp_group_ranks

            groups = get_vllm_tp_group_ranks()
            first = list(groups[0]) if groups and isinstance(groups[0], (list, tuple)) else list(groups or [])
            rank = dist.get_rank()
            return first.index(rank) if rank in first else None

        def _asp_params(self):
            sm = self.sharding_manager
            sm.enter_forward_mode()
            sm.onload_infer_params()
            return sm.vllm_weight_container.get_infer_params()

        def _asp_release(self):
            sm = self.sharding_manager
            sm.offload_infer_params()
            sm.exit_forward_mode()

        def asp_weight_manifest(self, bucket_bytes: int):
            """(tp_index, buckets, node IP) on senders, None elsewhere; collective over the trainer ranks.
            The sender of TP index j hosts communicator j's store, so instances connect to its IP."""
            from asp_ascend.platforms.transport import plan_buckets, specs_of

            params = self._asp_params()
            j = self._asp_first_dp_group()
            out = None if j is None else (j, plan_buckets(specs_of(list(params.items())), bucket_bytes),
                                          ray.util.get_node_ip_address())
            self._asp_release()
            return out

        def asp_push_weights(self, version: int, base_port: int, num_instances: int, bucket_bytes: int,
                             stall_timeout_s: Optional[float] = None):
            """Broadcast this rank's inference shard to TP rank j of every instance (senders only); no
            receiver progressing for ``stall_timeout_s`` (asp.weight_sync.stall_timeout_s) ends it."""
            from ...platforms.recv_wait import STALL_S
            from .weight_push import PushEndpoint

            params = self._asp_params()
            j = self._asp_first_dp_group()
            if j is not None:
                if getattr(self, "_asp_endpoint", None) is None:
                    device = int(ray.get_runtime_context().get_accelerator_ids()["NPU"][0])
                    self._asp_endpoint = PushEndpoint("npu", device)
                self._asp_endpoint.send(params.items(), version, ray.util.get_node_ip_address(), base_port + j,
                                        1 + num_instances, bucket_bytes,
                                        STALL_S if stall_timeout_s is None else stall_timeout_s)
            self._asp_release()
            return j

    AspIntegratedWorker.__name__ = AspIntegratedWorker.__qualname__ = "AspIntegratedWorker"
    remote_cls = ray.remote(resources={"NPU": 0.7})(AspIntegratedWorker)
    launcher.resource_mapping[AspIntegratedWorker.__name__] = lambda config: config.actor_resource
    _CACHE[key] = remote_cls
    return remote_cls


def make_async_grpo_trainer_class():
    """``AsyncGRPOTrainer(RayGRPOTrainer)``, created on the first call (imports mindspeed_rl)."""
    if "trainer" in _CACHE:
        return _CACHE["trainer"]
    require_mindspeed("the async GRPO trainer")
    import ray
    from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
    from mindspeed_rl.utils.loggers import Loggers
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    class AsyncGRPOTrainer(RayGRPOTrainer):
        """GRPO on samples from separate rollout instances, policy lag <= k.

        Extra keyword arguments: ``asp_samples`` (SampleSource), ``asp_publish`` (version ->
        None, pushes weights to every instance), ``asp_settings`` (LoopSettings without the
        iteration range), ``asp_on_iteration`` and ``asp_timeline`` (optional sinks).
        """

        def __init__(self, *args, asp_samples, asp_publish: Callable[[int], Any], asp_settings: LoopSettings,
                     asp_on_iteration=None, asp_timeline=None, **kwargs):
            self.asp_samples, self.asp_publish, self.asp_settings = asp_samples, asp_publish, asp_settings
            self.asp_on_iteration, self.asp_timeline = asp_on_iteration, asp_timeline
            super().__init__(*args, **kwargs)

        def transfer_dock_init(self):
            keys = self.dataset_additional_keys
            self.dataset_additional_keys = list(keys or []) + [ROLLOUT_LOG_PROB]
            try:
                super().transfer_dock_init()
            finally:
                self.dataset_additional_keys = keys

        def set_actor_log_prob_skip_flag(self):
            self.skip_actor_log_prob = False
            self.actor_worker.skip_actor_log_prob = False

        def _asp_rewards(self):
            refs = []
            for reward in self.reward_list:
                if isinstance(reward, RayActorGroup):
                    reward.compute_rm_score(blocking=self.blocking)
                else:
                    refs.append(reward.compute_rm_score.remote())
            ray.get(refs)

        def fit(self, data_iters=None):
            """Run iterations from the worker's checkpointed iteration to ``train_iters``."""
            logger = Loggers("asp_async_grpo")
            start = self.actor_worker.get_iteration()
            s = self.asp_settings
            settings = LoopSettings(**{**s.__dict__, "start_iteration": start, "iterations": self.train_iters})
            from mindspeed_rl.utils.pad_process import remove_padding_tensor_dict_to_dict

            store = TransferDockStore(self.data_strategy, remove_padding_tensor_dict_to_dict)
            ports = LoopPorts(
                actor=self.actor_worker, ref=self.ref_worker, store=store,
                samples=self.asp_samples, kl_ctrl=self.kl_ctrl, timeline=self.asp_timeline,
                compute_rewards=self._asp_rewards,
                compute_advantage=lambda: self.compute_advantage(blocking=True, guarantee_order=self.guarantee_order),
                publish_weights=self.asp_publish)
            loop = AsyncGRPOLoop(ports, settings)
            logger.info(f"asp async GRPO: iterations {start}..{self.train_iters - 1}, lag bound {s.lag_bound}")
            for i in range(start, self.train_iters):
                row = loop.run_iteration(i)
                logger.info(row, i + 1, self.train_iters)
                if self.asp_on_iteration is not None:
                    self.asp_on_iteration(row)
                if self.tensorboard is not None:
                    for k, v in row.items():
                        if isinstance(v, (int, float)):
                            self.tensorboard.add_scalar(f"train/{k}", v, i + 1)
                if (i + 1) % self.save_interval == 0 or i + 1 == self.train_iters:
                    save_state = getattr(self.asp_samples, "checkpoint", None)
                    if save_state is not None:   # the source's resume state (partial rollout) before the weights
                        save_state(i + 1)
                    self.save_checkpoint(i + 1)
            logger.info("asp async GRPO done")

    _CACHE["trainer"] = AsyncGRPOTrainer
    return AsyncGRPOTrainer
