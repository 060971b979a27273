"""Everything the adapter relies on in MindSpeed-RL, as data (checked by :mod:`.checker`).

Written in the vocabulary of :mod:`asp_ascend.integrations.apicheck.expect`: symbols that must
exist, every call we make into MindSpeed-RL (read from our call sites and bound against the
real signatures), config keys with the code that gives them their meaning, and the waits and
call orders our correctness rests on. Paths are relative to the MindSpeed-RL root (tree
``"mindspeed"``) or to this repository (tree ``"ours"``). Tests keep the list complete: every
``mindspeed_rl`` / ``cli.train_grpo`` name the adapter imports, and every call of one, is here.
vLLM, vllm-ascend and Ray entry points are in :mod:`.contract_vllm`.
"""
from __future__ import annotations

from ..apicheck import Call, ConfigKeys, Exists, Order, Params, Pattern, Reaches, Ref, Site

T = "mindspeed_rl/trainer/grpo_trainer_hybrid.py"
DS = "mindspeed_rl/trainer/utils/data_strategy.py"
TD = "mindspeed_rl/trainer/utils/transfer_dock.py"
L = "mindspeed_rl/workers/scheduler/launcher.py"
IW = "mindspeed_rl/workers/integrated_worker.py"
AHW = "mindspeed_rl/workers/actor_hybrid_worker.py"
SM = "mindspeed_rl/workers/resharding/megatron_sharding_manager.py"
OFF = "mindspeed_rl/workers/resharding/megatron_off_loader.py"
WC = "mindspeed_rl/workers/resharding/vllm_weight_container.py"
VPS = "mindspeed_rl/models/rollout/vllm_adapter/vllm_parallel_state.py"
MWL = "mindspeed_rl/models/rollout/vllm_adapter/megatron_weight_loaders.py"
VE = "mindspeed_rl/models/rollout/vllm_engine.py"
LOSS = "mindspeed_rl/models/loss/grpo_actor_loss_func.py"
LFF = "mindspeed_rl/models/loss/loss_func_factory.py"
BTE = "mindspeed_rl/models/base/base_training_engine.py"
RR = "mindspeed_rl/workers/rule_reward.py"
CLI = "cli/train_grpo.py"
RL = "mindspeed_rl/config_cls/rl_config.py"
MC = "mindspeed_rl/config_cls/megatron_config.py"
GC = "mindspeed_rl/config_cls/generate_config.py"
BC = "mindspeed_rl/config_cls/base_config.py"
UT = "mindspeed_rl/utils/utils.py"
PKG = "asp_ascend/integrations/mindspeed_rl"


def M(path: str, name: str = "") -> Ref:
    return Ref("mindspeed", path, name)


def S(file: str, function: str, callee: str) -> Site:
    return Site(f"{PKG}/{file}", function, callee)


RL_KEYS = ConfigKeys(M(RL, "RLConfig"), ())
ASYNC_TRAINER = "make_async_grpo_trainer_class.AsyncGRPOTrainer"
WORKER = "make_trainer_worker_class.AspIntegratedWorker"

SYMBOLS = (
    Exists(M(T, "RayGRPOTrainer"), "class", why="AsyncGRPOTrainer subclasses it"),
    Params(M(T, "RayGRPOTrainer.transfer_dock_init"), (), exact=True, why="overridden: adds rollout_log_prob"),
    Params(M(T, "RayGRPOTrainer.set_actor_log_prob_skip_flag"), (), exact=True,
           why="overridden: old log-probs are always recomputed"),
    Params(M(T, "RayGRPOTrainer.fit"), ("data_iters",), exact=True, why="overridden by the async loop"),
    *(Exists(M(T, f"RayGRPOTrainer.{a}"), "attr", why="read by AsyncGRPOTrainer") for a in (
        "data_strategy", "actor_worker", "ref_worker", "reward_list", "kl_ctrl", "blocking", "guarantee_order",
        "dataset_additional_keys", "train_iters", "save_interval", "tensorboard", "skip_actor_log_prob",
        "global_batch_size", "n_samples_per_prompt")),
    Exists(M(DS, "DataStrategy"), "class"),
    Exists(M(DS, "DataStrategy.td"), "method", why="TransferDockStore reads the TD actor"),
    Exists(M(TD, "GRPOTransferDock"), "ray_actor", why="the TD actor behind strategy 'td'"),
    Exists(M(L, "RayActorGroup"), "class"),
    Exists(M(L, "resource_mapping"), "module_attr", why="AspIntegratedWorker registered by Ray actor class name"),
    Exists(M(IW, "IntegratedWorker"), "ray_actor", why="subclassed through __ray_actor_class__"),
    Params(M(IW, "IntegratedWorker.initialize"), (), exact=True, why="overridden to register the loss first"),
    Exists(M(AHW, "ActorHybridWorkerBase.sharding_manager"), "attr", why="the weight push reads the resharding manager"),
    *(Exists(M(SM, f"MegatronShardingManager.{m}"), "method") for m in (
        "onload_infer_params", "offload_infer_params", "enter_forward_mode", "exit_forward_mode")),
    Exists(M(SM, "MegatronShardingManager.vllm_weight_container"), "attr"),
    # the engine-free trainer (asp.mindspeed.weight_push: hf)
    Params(M(AHW, "ActorHybridWorkerBase._build_rollout"), (), exact=True,
           why="overridden: returns None, no colocated vLLM engine on the trainer"),
    Params(M(AHW, "ActorHybridWorkerBase._build_sharding_manager"), (), exact=True,
           why="overridden: TrainOnlyShardingManager in the resharding manager's place"),
    *(Exists(M(SM, f"MegatronShardingManager.{m}"), "method", why="TrainOnlyShardingManager mirrors it")
      for m in ("enter_train_mode", "exit_train_mode")),
    *(Exists(M(OFF, f"MegatronOffLoader.{m}"), "method", why="TrainOnlyShardingManager calls it")
      for m in ("onload_param", "offload_param", "onload_optimizer", "offload_optimizer", "onload_grad",
                "offload_grad")),
    *(Exists(M(AHW, f"ActorHybridWorkerBase.{a}"), "attr", why="read by the engine-free push")
      for a in ("actor_offloader", "model")),
    Exists(M(WC, "MegatronStyleVllmWeightContainer.get_infer_params"), "method", why="inference-layout weights"),
    Exists(M(LOSS, "GRPOActorLossFunc"), "class"),
    Exists(M(LFF, "LossFuncFactory"), "class"),
    Exists(M(RR, "RuleReward"), "ray_actor"),
    *(Exists(M(CLI, f), "function") for f in ("gpt_model_provider", "initialize_megatron", "get_megatron_module")),
    Exists(M("mindspeed_rl/datasets/prompt_dataset.py", "PromptDataset"), "class"),
    Exists(M("mindspeed_rl/datasets/prompt_dataset.py", "PromptDataset.__getitem__"), "method"),
    Exists(M("mindspeed_rl/utils/loggers.py", "Loggers"), "class"),
    Exists(M("configs/envs/runtime_env.yaml"), "file", why="Ray runtime env of the launch"),
    Exists(M("configs/model/qwen25_7b.yaml"), "file", why="defaults: model of the 7B config"),
    Exists(M("configs/model/qwen25_32b.yaml"), "file", why="defaults: model of the 32B config"),
)

CALLS = (
    Call(M(CLI, "parse_training_config"), ("config",), site=S("entry.py", "_train", "parse_training_config")),
    Call(M("mindspeed_rl/utils/tokenizer.py", "get_tokenizer"), site=S("entry.py", "_train", "get_tokenizer")),
    Call(M(L, "RayActorGroup"), site=S("entry.py", "_train", "RayActorGroup"), why="entry.py builds the trainer group"),
    Call(M(L, "RayActorGroup.initialize"), site=S("entry.py", "_train", "RayActorGroup.initialize")),
    Call(M(L, "RayActorGroup.wait_all_ref_objs_run_over"), site=S("entry.py", "_train",
                                                                  "actor.wait_all_ref_objs_run_over")),
    Call(M(L, "RayActorGroup.get_consumed_train_samples"), site=S("entry.py", "_train",
                                                                  "actor.get_consumed_train_samples")),
    Call(M(UT, "get_node_nums"), site=S("entry.py", "_train", "get_node_nums")),
    Call(M(RR, "RuleReward.initialize"), ("megatron_config", "rl_config", "tokenizer", "trust_remote_code"),
         site=S("entry.py", "_train", "rr.initialize.remote")),
    Call(M("mindspeed_rl/datasets/build_dataset.py", "build_train_valid_test_datasets"),
         site=S("entry.py", "_train", "build_train_valid_test_datasets")),
    Call(M(T, "RayGRPOTrainer"), ("actor_worker", "ref_worker", "reward_list"),
         site=S("entry.py", "_train", "RayGRPOTrainer"), splat_keys=(("rl_config.dict()", RL_KEYS),),
         why="the sync path: MindSpeed-RL's own trainer fed by the schedule"),
    Call(M(T, "RayGRPOTrainer"), ("actor_worker", "ref_worker", "reward_list"),
         site=S("entry.py", "_train", "AsyncGRPOTrainer"), splat_keys=(("rl_config.dict()", RL_KEYS),),
         drop=("asp_samples", "asp_publish", "asp_settings", "asp_on_iteration", "asp_timeline"),
         why="AsyncGRPOTrainer forwards everything but its asp_* arguments"),
    Call(M(T, "RayGRPOTrainer.compute_advantage"), site=S("trainer.py", f"{ASYNC_TRAINER}.fit",
                                                          "self.compute_advantage")),
    Call(M(T, "RayGRPOTrainer.save_checkpoint"), ("iteration",), site=S("trainer.py", f"{ASYNC_TRAINER}.fit",
                                                                        "self.save_checkpoint")),
    Call(M(L, "RayActorGroup.get_iteration"), site=S("trainer.py", f"{ASYNC_TRAINER}.fit",
                                                     "self.actor_worker.get_iteration")),
    Call(M(L, "RayActorGroup.compute_rm_score"), site=S("trainer.py", f"{ASYNC_TRAINER}._asp_rewards",
                                                        "reward.compute_rm_score")),
    Call(M(RR, "RuleReward.compute_rm_score"), site=S("trainer.py", f"{ASYNC_TRAINER}._asp_rewards",
                                                      "reward.compute_rm_score.remote")),
    Call(M("mindspeed_rl/utils/loggers.py", "Loggers"), ("name",), site=S("trainer.py", f"{ASYNC_TRAINER}.fit",
                                                                          "Loggers")),
    Call(M("mindspeed_rl/utils/loggers.py", "Loggers.info"), ("msg", "iteration", "steps"),
         site=S("trainer.py", f"{ASYNC_TRAINER}.fit", "logger.info")),
    Call(M(DS, "DataStrategy.put_experience"), ("data_dict", "indexes"),
         site=S("trainer.py", "TransferDockStore.put_experience", "self.ds.put_experience")),
    Call(M(DS, "DataStrategy.clear_main"), site=S("trainer.py", "TransferDockStore.clear_main", "self.ds.clear_main")),
    Call(M(TD, "GRPOTransferDock.get_experience"), ("consumer", "experience_columns"),
         site=S("trainer.py", "TransferDockStore.read_columns", "self.ds.td.get_experience.remote"),
         why="the off-policy reweighting reads through the dock's waiting API"),
    Exists(M("mindspeed_rl/utils/pad_process.py", "remove_padding_tensor_dict_to_dict"), "function",
           why="undoes get_experience's padding"),
    Call(M(LOSS, "GRPOActorLossFunc.compute_loss"), ("output", "batch"),
         site=S("trainer.py", "register_offpolicy_loss.AspGRPOActorLossFunc.compute_loss", "super.compute_loss")),
    Call(M(LFF, "LossFuncFactory.register_loss"), ("stage", "role"),
         site=S("trainer.py", "register_offpolicy_loss", "LossFuncFactory.register_loss")),
    Call(M(VPS, "get_vllm_tp_group_ranks"), site=S("trainer.py", f"{WORKER}._asp_first_dp_group",
                                                   "get_vllm_tp_group_ranks")),
    Call(M(WC, "MegatronStyleVllmWeightContainer.get_infer_params"),
         site=S("trainer.py", f"{WORKER}._asp_params", "sm.vllm_weight_container.get_infer_params")),
    # the worker-group methods the async loop's Protocols call (phase(...) passes them as callables)
    Call(M(L, "RayActorGroup.compute_log_prob"), kwargs=("blocking",), why="ActorGroup Protocol"),
    Call(M(L, "RayActorGroup.compute_ref_log_prob"), kwargs=("blocking",), why="RefGroup Protocol"),
    Call(M(L, "RayActorGroup.update"), ("kl_ctrl", "skip_actor_log_prob"), why="ActorGroup Protocol"),
    Call(M(L, "RayActorGroup.execute_sync_command"), ("method_name",), why="weight manifest and push"),
    Call(M(DS, "DataStrategy.build_grpo"), kwargs=("prompts_num", "n_samples_per_prompt", "metrics", "max_age",
                                                   "gbs_train", "addition_columns"),
         why="transfer_dock_init builds the TD; we add rollout_log_prob through addition_columns"),
    Call(M(TD, "GRPOTransferDock"), kwargs=("prompts_num", "n_samples_per_prompt", "metrics", "addition_columns")),
    Call(M(MWL, "InferParallelConfig"), ("infer_tensor_parallel_size", "infer_pipeline_parallel_size",
                                         "infer_expert_parallel_size", "infer_local_num_experts"),
         site=S("vllm_receiver.py", "MindSpeedWeightReceiver.asp_recv_megatron_weights", "loaders.InferParallelConfig")),
    Call(M(MWL, "update_megatron_weight_loader"),
         site=S("vllm_receiver.py", "install_megatron_loaders", "module.update_megatron_weight_loader")),
    Exists(M(MWL, "MODEL_MEGATRON_WEIGHT_LOADER_REGISTRY"), "module_attr",
           why="the receiver picks the architecture's loader from it (load_megatron_weights ends in .cuda())"),
    *(Params(M(MWL, f), ("actor_weights", "vllm_model", "infer_paralle_config", "hf_config"), exact=True,
             why="called through the registry as load(params, model, InferParallelConfig, hf_config)")
      for f in ("qwen_megatron_weight_loader", "llama_megatron_core_weight_loader")),
)

# where MindSpeed-RL gives a key its meaning, and the behaviour the adapter's correctness rests on
MEANINGS = (
    Pattern(M(RL, "RLConfig.__init__"), "_.get('mini_batch_size', _) * self.n_samples_per_prompt",
            key="rl_config.mini_batch_size",
            why="prompts in the YAML, rows (x n) after parsing: train.mini_batch_size is read as prompts"),
    Pattern(M(AHW, "ActorHybridWorkerBase.initialize"),
            "ActorRolloutHybrid(..., mini_batch_size_per_dp=_.mini_batch_size // _.get_data_parallel_world_size())",
            key="rl_config.mini_batch_size", why="each DP rank cuts its rows into mini_batch_size*n/dp-row steps"),
    Pattern(M(BTE, "BaseTrainingEngine.update"), "self._split_batches(_, ..., batch_size=self.mini_batch_size_per_dp)",
            key="rl_config.shuffle_mini_batch", why="consecutive mini-batches unless shuffled (dp_group_order)"),
    Pattern(M(AHW, "ActorHybridWorkerBase.update"),
            "self.get_dp_range_indexes(_, use_vllm=False, assign_batch_size=experience_count)",
            key="rl_config.guarantee_order", why="update: one contiguous row range per DP rank (dp_group_order)"),
    Pattern(M(UT, "get_current_dp_range_indexes"),
            "range(assign_batch_size * current_dp_rank, assign_batch_size * (current_dp_rank + 1))",
            why="rank d trains rows [d*E, (d+1)*E)"),
    Pattern(M("mindspeed_rl/config_cls/validate_config.py", "validate_rl_args"),
            "_.global_batch_size * _.n_samples_per_prompt // actor_data_parallel_size",
            key="rl_config.actor_update_dispatch_size", why="default: the whole iteration split evenly over DP"),
    *(Pattern(M(RL, "RLConfig.__init__"), f"self.{k} = {v!r}", key=f"rl_config.{k}",
              why="the default the config bridge assumes when the key is absent")
      for k, v in (("use_integrated_worker", True), ("partial_rollout_max_split", 1), ("data_strategy", "td"),
                   ("guarantee_order", False), ("shuffle_mini_batch", False))),
    Pattern(M(T, "RayGRPOTrainer.transfer_dock_init"),
            "self.data_strategy.build_grpo(..., addition_columns=self.dataset_additional_keys)",
            why="extra TD columns come from dataset_additional_keys (we append rollout_log_prob there)"),
    Pattern(M(T, "RayGRPOTrainer.fit"), "next(data_iters)", why="fit only calls next() on data_iters"),
    Pattern(M("mindspeed_rl/datasets/dataloader.py", ""), "_['prompts'] = [torch.tensor(_['input_ids']) for _ in _]",
            why="ScheduleBatches' collate yields PromptDataLoader's batch layout"),
    Order(M(L, "get_rl_resource_by_worker_type"), "actor_class = _.__ray_actor_class__.__name__",
          "resource_mapping.get(actor_class, ...)", why="resources are looked up by the actor class name"),
    Pattern(M(L, "RayActorGroup.initialize"), "return self", why="entry.py uses RayActorGroup(...).initialize()"),
    Pattern(M(BTE, "BaseTrainingEngine.__init__"), "LossFuncFactory.get_instance(...)",
            why="the loss is looked up when the engine is built: register before initialize()"),
    Pattern(M(LOSS, ""), "LossFuncFactory.register_loss('ray_grpo', 'actor')", why="the key we re-register"),
    Pattern(M(BC, "BaseConfig.update"), "ValueError(...)", why="unknown keys are rejected: the reason for asp:"),
    Pattern(M(CLI, ""), "_['env_vars']['HCCL_BUFFSIZE'] = _", why="entry.runtime_env adds the same variables"),
    Pattern(M(CLI, ""), "_['env_vars']['IS_MULTIMODAL'] = _"),
    Pattern(M(DS, "DataStrategy.put_main"), "ray.get(_.put_experience.remote(...))",
            why="our rewritten advantages land before the update reads them"),
    Reaches(M(TD, "GRPOTransferDock.get_experience"), "_wait_for_data",
            why="a read through get_experience waits until the rows are written"),
    Pattern(M(TD, "GRPOTransferDock.__init__"), "self.experience_consumers = ['trainer', ...]",
            why="the consumer TransferDockStore reads as (none of MindSpeed-RL's GRPO stages reads it)"),
    Order(M(AHW, "ActorHybridWorkerBase.initialize"), "self.actor_offloader = MegatronOffLoader(...)",
          "self.sharding_manager = self._build_sharding_manager()",
          why="our _build_sharding_manager reads actor_offloader: it must exist by then"),
    Pattern(M(AHW, "ActorHybridWorkerBase.initialize"), "self.inference_model = self._build_rollout()",
            why="the only place the colocated engine is built: overriding _build_rollout removes it"),
    Order(M(VE, "VLLMInferEngine.__init__"), "update_megatron_weight_loader()", "LLM(...)",
          why="loaders are bound to each parameter when its layer is built: patch first"),
    Pattern(M(MWL, "update_megatron_weight_loader"), "layer_class.weight_loader = weight_loader",
            why="a class-level patch: parameters built before it keep vLLM's sharding loaders (receivers patch "
                "before the model is built)"),
    Pattern(M(VE, "VLLMInferEngine.__init__"), "LLM(..., load_format='dummy' if _ else _)",
            why="the engine starts on dummy weights; the first push brings the real ones"),
)

REQUIREMENTS = (*SYMBOLS, *CALLS, *MEANINGS)

# YAML group -> config class whose declared attributes bound the group's keys
YAML_GROUPS = {
    "megatron_training": (MC, "MegatronConfig"),
    "actor_config": (MC, "MegatronConfig"),
    "rl_config": (RL, "RLConfig"),
    "generate_config": (GC, "GenerateConfig"),
}
CONFIG_KEYS = (
    ConfigKeys(M(RL, "RLConfig"), (
        "n_samples_per_prompt", "mini_batch_size", "clip_ratio", "init_kl_coef", "use_integrated_worker",
        "partial_rollout_max_split", "data_strategy", "guarantee_order", "blocking", "rule_reward",
        "num_cpus_for_local_task", "adv_dispatch_size", "max_prompt_length", "actor_resource", "runtime_env_path",
        "epochs", "shuffle_mini_batch", "actor_update_dispatch_size", "hccl_buffersize", "is_multimodal")),
    ConfigKeys(M(MC, "MegatronConfig"), (
        "global_batch_size", "train_iters", "save_interval", "seed", "lr", "weight_decay", "micro_batch_size",
        "tokenizer_name_or_path", "data_path", "split", "seq_length", "dataset_additional_keys", "stage",
        "prompt_type", "prompt_type_path", "tensor_model_parallel_size", "pipeline_model_parallel_size",
        "context_parallel_size")),
    ConfigKeys(M(GC, "GenerateConfig"), ("max_num_seqs", "infer_tensor_parallel_size", "sampling_config",
                                         "trust_remote_code")),
)
