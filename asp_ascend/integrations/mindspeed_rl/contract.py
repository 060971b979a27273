"""Everything the adapter relies on in MindSpeed-RL, as data (checked by :mod:`.checker`).

Each entry names the file (relative to the MindSpeed-RL root), the object, and what must
hold. ``asp doctor --mindspeed-src PATH`` parses those files (never imports them) and
reports every entry that does not hold. A test keeps this list complete: every
``mindspeed_rl`` / ``cli.train_grpo`` import in the adapter's code must appear here.

Kinds:
- ``module``: the file exists and parses.
- ``class`` / ``function``: defined at module level (``ray_actor``: a class decorated ``@ray.remote``).
- ``method``: defined on the class or a base class found in the tree; ``params`` must be accepted
  (by name, or through ``**kwargs``, which is reported as a note).
- ``attr``: ``self.<name> = ...`` somewhere in the class or its bases (instance attribute).
- ``module_attr``: a module-level assignment (e.g. a registry dict).
- ``config_keys``: attributes a config class declares (``BaseConfig.update`` rejects others).
- ``file``: a non-Python file exists (YAML the launch relies on).
- ``call``: a text occurs in the file (a lookup we rely on happening, e.g. the loss registry).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Req:
    kind: str
    path: str
    name: str = ""
    params: tuple[str, ...] = ()
    why: str = ""


T = "mindspeed_rl/trainer/grpo_trainer_hybrid.py"
BASE_T = "mindspeed_rl/trainer/base.py"
DS = "mindspeed_rl/trainer/utils/data_strategy.py"
TD = "mindspeed_rl/trainer/utils/transfer_dock.py"
L = "mindspeed_rl/workers/scheduler/launcher.py"
IW = "mindspeed_rl/workers/integrated_worker.py"
AHW = "mindspeed_rl/workers/actor_hybrid_worker.py"
SM = "mindspeed_rl/workers/resharding/megatron_sharding_manager.py"
WC = "mindspeed_rl/workers/resharding/vllm_weight_container.py"
VPS = "mindspeed_rl/models/rollout/vllm_adapter/vllm_parallel_state.py"
MWL = "mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py"
LOSS = "mindspeed_rl/models/loss/grpo_actor_loss_func.py"
LFF = "mindspeed_rl/models/loss/loss_func_factory.py"
BTE = "mindspeed_rl/models/base/base_training_engine.py"
RR = "mindspeed_rl/workers/rule_reward.py"
CLI = "cli/train_grpo.py"
RL = "mindspeed_rl/config_cls/rl_config.py"
MC = "mindspeed_rl/config_cls/megatron_config.py"
GC = "mindspeed_rl/config_cls/generate_config.py"
BC = "mindspeed_rl/config_cls/base_config.py"

REQUIREMENTS: tuple[Req, ...] = (
    # --- the trainer we subclass (trainer.py: AsyncGRPOTrainer)
    Req("class", T, "RayGRPOTrainer", why="AsyncGRPOTrainer subclasses it"),
    Req("method", T, "RayGRPOTrainer.__init__",
        ("actor_worker", "ref_worker", "reward_list", "train_iters", "save_interval", "global_batch_size",
         "micro_batch_size", "n_samples_per_prompt", "tokenizer", "dataset_additional_keys", "blocking",
         "guarantee_order"), why="constructed with these keyword arguments + **rl_config.dict()"),
    Req("method", T, "RayGRPOTrainer.transfer_dock_init", why="overridden to add the rollout_log_prob column"),
    Req("method", T, "RayGRPOTrainer.set_actor_log_prob_skip_flag", why="overridden: never skip old log-probs"),
    Req("method", T, "RayGRPOTrainer.fit", ("data_iters",), why="overridden by the async loop; sync path feeds it"),
    Req("method", T, "RayGRPOTrainer.compute_advantage", ("blocking", "guarantee_order"), why="advantage phase"),
    Req("method", T, "RayGRPOTrainer.save_checkpoint", ("iteration",), why="checkpoint every save_interval"),
    Req("call", T, "self.data_strategy.build_grpo(", why="transfer_dock_init builds the TD through the data strategy"),
    Req("call", T, "addition_columns=self.dataset_additional_keys",
        why="extra TD columns come from dataset_additional_keys (we append rollout_log_prob there)"),
    *(Req("attr", T, f"RayGRPOTrainer.{a}", why="read by AsyncGRPOTrainer") for a in (
        "data_strategy", "actor_worker", "ref_worker", "reward_list", "kl_ctrl", "blocking", "guarantee_order",
        "dataset_additional_keys", "train_iters", "save_interval", "tensorboard", "skip_actor_log_prob",
        "global_batch_size", "n_samples_per_prompt")),
    # --- data strategy and transfer dock
    Req("class", DS, "DataStrategy"),
    Req("method", DS, "DataStrategy.build_grpo",
        ("prompts_num", "n_samples_per_prompt", "metrics", "max_age", "gbs_train", "addition_columns"),
        why="called by transfer_dock_init"),
    Req("method", DS, "DataStrategy.put_experience", ("data_dict", "indexes", "is_prompt"), why="rows of an iteration"),
    Req("method", DS, "DataStrategy.clear_main", why="end of an iteration"),
    Req("method", DS, "DataStrategy.td", why="TransferDockStore reads the TD actor"),
    Req("ray_actor", TD, "GRPOTransferDock", why="the TD actor behind strategy 'td'"),
    Req("method", TD, "GRPOTransferDock.__init__", ("addition_columns",), why="rollout_log_prob column"),
    Req("method", TD, "GRPOTransferDock.get_experience_data", why="off-policy reweighting reads old_log_prob etc."),
    Req("method", TD, "GRPOTransferDock.put_experience", ("data_dict", "indexes", "is_prompt"),
        why="rewrites the advantages"),
    # --- worker groups (Protocols in async_loop.py)
    Req("class", L, "RayActorGroup"),
    Req("method", L, "RayActorGroup.__init__",
        ("worker", "placement_group", "megatron_config", "rl_config", "model_provider", "initialize_func",
         "profiler_config", "msprobe_config", "tokenizer", "generate_config", "get_megatron_module"),
        why="entry.py builds the trainer group"),
    Req("method", L, "RayActorGroup.initialize"),
    Req("method", L, "RayActorGroup.compute_log_prob", ("blocking",), why="ActorGroup Protocol"),
    Req("method", L, "RayActorGroup.compute_ref_log_prob", ("blocking",), why="RefGroup Protocol"),
    Req("method", L, "RayActorGroup.compute_rm_score", ("blocking",), why="reward-model groups"),
    Req("method", L, "RayActorGroup.update", ("kl_ctrl", "skip_actor_log_prob"), why="ActorGroup Protocol"),
    Req("method", L, "RayActorGroup.wait_all_ref_objs_run_over", why="ActorGroup/RefGroup Protocol"),
    Req("method", L, "RayActorGroup.execute_sync_command", ("method_name",), why="weight manifest and push"),
    Req("method", L, "RayActorGroup.get_iteration", why="resume"),
    Req("method", L, "RayActorGroup.get_consumed_train_samples", why="resume of the schedule iterator"),
    Req("module_attr", L, "resource_mapping", why="AspIntegratedWorker registered by Ray actor class name"),
    Req("call", L, "resource_mapping.get(actor_class", why="resources are looked up by the actor class name"),
    # --- how the update cuts rows into optimizer steps (async_loop.dp_group_order relies on it)
    Req("function", "mindspeed_rl/utils/utils.py", "get_current_dp_range_indexes",
        ("experience_count", "assign_batch_size", "current_dp_rank"), why="rank d trains rows [d*E, (d+1)*E)"),
    Req("call", AHW, "assign_batch_size=experience_count", why="update: one contiguous row range per DP rank"),
    Req("call", AHW, "mini_batch_size_per_dp=self.rl_config.mini_batch_size",
        why="each rank cuts its rows into mini_batch_size/dp-sized consecutive mini-batches"),
    Req("method", BTE, "BaseTrainingEngine._split_batches", ("batch", "batch_size", "shuffle_mini_batch"),
        why="consecutive split unless shuffle_mini_batch"),
    # --- the trainer worker we subclass
    Req("ray_actor", IW, "IntegratedWorker", why="subclassed through __ray_actor_class__"),
    Req("method", IW, "IntegratedWorker.initialize", why="overridden to register the loss first"),
    Req("attr", AHW, "ActorHybridWorkerBase.sharding_manager", why="weight push reads the resharding manager"),
    Req("method", SM, "MegatronShardingManager.onload_infer_params"),
    Req("method", SM, "MegatronShardingManager.offload_infer_params"),
    Req("method", SM, "MegatronShardingManager.enter_forward_mode"),
    Req("method", SM, "MegatronShardingManager.exit_forward_mode"),
    Req("attr", SM, "MegatronShardingManager.vllm_weight_container"),
    Req("method", WC, "MegatronStyleVllmWeightContainer.get_infer_params", why="inference-layout weights to push"),
    Req("function", VPS, "get_vllm_tp_group_ranks", why="which trainer ranks send which TP shard"),
    # --- instance-side loading (vllm_receiver.py)
    Req("class", MWL, "InferParallelConfig"),
    Req("method", MWL, "InferParallelConfig.__init__",
        ("infer_tensor_parallel_size", "infer_pipeline_parallel_size", "infer_expert_parallel_size",
         "infer_local_num_experts")),
    Req("function", MWL, "load_megatron_weights", ("actor_weights", "vllm_model", "infer_paralle_config", "hf_config")),
    Req("function", MWL, "update_megatron_weight_loader"),
    # --- loss registration (trainer.py: register_offpolicy_loss)
    Req("class", LOSS, "GRPOActorLossFunc"),
    Req("method", LOSS, "GRPOActorLossFunc.compute_loss", ("output", "batch", "forward_only", "non_loss_data")),
    Req("call", LOSS, "@LossFuncFactory.register_loss('ray_grpo', 'actor')", why="the key we re-register"),
    Req("class", LFF, "LossFuncFactory"),
    Req("method", LFF, "LossFuncFactory.register_loss", ("stage", "role")),
    Req("call", BTE, "LossFuncFactory.get_instance(", why="the loss is looked up when the engine is built"),
    # --- rewards
    Req("ray_actor", RR, "RuleReward"),
    Req("method", RR, "RuleReward.compute_rm_score"),
    Req("method", RR, "RuleReward.initialize", ("megatron_config", "rl_config", "tokenizer", "trust_remote_code",
                                                "dp_rank")),
    # --- the driver pieces entry.py reuses
    Req("function", CLI, "parse_training_config", ("config",)),
    Req("function", CLI, "gpt_model_provider", ("pre_process", "post_process")),
    Req("function", CLI, "initialize_megatron"),
    Req("function", CLI, "get_megatron_module"),
    Req("call", CLI, '"actor_config": actor_config', why="parse_training_config returns these keys"),
    Req("call", CLI, '"profiler_config": profiler_config'),
    Req("call", CLI, 'runtime_env["env_vars"]["HCCL_BUFFSIZE"]', why="entry.runtime_env adds the same variables"),
    Req("call", CLI, 'runtime_env["env_vars"]["IS_MULTIMODAL"]'),
    Req("function", "mindspeed_rl/datasets/build_dataset.py", "build_train_valid_test_datasets",
        ("data_prefix", "splits_string", "seq_length", "train_valid_test_num_samples", "seed", "dataset_cls",
         "extra_param")),
    Req("class", "mindspeed_rl/datasets/prompt_dataset.py", "PromptDataset"),
    Req("method", "mindspeed_rl/datasets/prompt_dataset.py", "PromptDataset.__getitem__"),
    Req("call", "mindspeed_rl/datasets/prompt_dataset.py", "input_ids", why="items carry input_ids"),
    Req("call", "mindspeed_rl/datasets/dataloader.py", "features_dict[\"prompts\"] = [torch.tensor(value['input_ids'])",
        why="ScheduleBatches' collate yields PromptDataLoader's batch layout"),
    Req("call", T, "batch = next(data_iters)", why="fit only calls next() on data_iters"),
    Req("function", "mindspeed_rl/utils/tokenizer.py", "get_tokenizer",
        ("tokenizer_model", "prompt_type", "prompt_type_path")),
    Req("function", "mindspeed_rl/utils/utils.py", "get_node_nums"),
    Req("class", "mindspeed_rl/utils/loggers.py", "Loggers"),
    # --- config classes and the keys we read or require
    Req("method", BC, "BaseConfig.update", why="rejects unknown keys: the reason for the asp: group"),
    Req("call", BC, "is missing", why="the unknown-key error"),
    Req("config_keys", RL, "RLConfig",
        ("n_samples_per_prompt", "mini_batch_size", "clip_ratio", "init_kl_coef", "use_integrated_worker",
         "partial_rollout_max_split", "data_strategy", "guarantee_order", "blocking", "rule_reward",
         "num_cpus_for_local_task", "adv_dispatch_size", "max_prompt_length", "actor_resource", "runtime_env_path",
         "epochs", "shuffle_mini_batch", "actor_update_dispatch_size", "hccl_buffersize", "is_multimodal")),
    Req("config_keys", MC, "MegatronConfig",
        ("global_batch_size", "train_iters", "save_interval", "seed", "lr", "weight_decay", "micro_batch_size",
         "tokenizer_name_or_path", "data_path", "split", "seq_length", "dataset_additional_keys", "stage",
         "prompt_type", "prompt_type_path", "tensor_model_parallel_size", "pipeline_model_parallel_size",
         "context_parallel_size")),
    Req("config_keys", GC, "GenerateConfig",
        ("max_num_seqs", "infer_tensor_parallel_size", "sampling_config", "trust_remote_code")),
    Req("file", "configs/envs/runtime_env.yaml", why="Ray runtime env of the launch"),
    Req("file", "configs/model/qwen25_7b.yaml", why="defaults: model of the 7B config"),
    Req("file", "configs/model/qwen25_32b.yaml", why="defaults: model of the 32B config"),
)

# YAML group -> config class whose declared attributes bound the group's keys
YAML_GROUPS = {
    "megatron_training": (MC, "MegatronConfig"),
    "actor_config": (MC, "MegatronConfig"),
    "rl_config": (RL, "RLConfig"),
    "generate_config": (GC, "GenerateConfig"),
}
