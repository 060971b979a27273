"""The vLLM, vllm-ascend and Ray entry points the rollout instances and the weight push use.

Checked against the vLLM installed here (or ``--vllm-src``), a vllm-ascend checkout
(``--vllm-ascend-src``) and the installed Ray. vllm-ascend pins an older vLLM than the one
installed for CPU runs; an entry point that exists in one and not the other shows as a
mismatch of the tree it is missing from.
"""
from __future__ import annotations

from ..apicheck import Call, Exists, Order, Pattern, Ref, Site

RO = "asp_ascend/engines/rollout.py"
TX = "asp_ascend/platforms/communicators.py"
RG = "asp_ascend/integrations/mindspeed_rl/rollout_groups.py"
VR = "asp_ascend/integrations/mindspeed_rl/vllm_receiver.py"
SS = "asp_ascend/integrations/mindspeed_rl/sample_source.py"
TR = "asp_ascend/integrations/mindspeed_rl/trainer.py"
EN = "asp_ascend/integrations/mindspeed_rl/entry.py"
LLM = "vllm/entrypoints/llm.py"
PYHCCL = "vllm_ascend/distributed/device_communicators/pyhccl.py"
NPU_WORKER = "vllm_ascend/worker/worker_v1.py"


def V(path: str, name: str = "") -> Ref:
    return Ref("vllm", path, name)


def VA(path: str, name: str = "") -> Ref:
    return Ref("vllm_ascend", path, name)


def R(path: str, name: str = "") -> Ref:
    return Ref("ray", path, name)


def O(path: str, name: str = "") -> Ref:
    return Ref("ours", path, name)


INSTANCE = (
    Call(V(LLM, "LLM"), site=Site(RO, "RolloutEngine.__init__", "LLM"),
         why="every keyword must reach vLLM's EngineArgs (LLM takes **kwargs)"),
    Call(V("vllm/v1/engine/llm_engine.py", "LLMEngine.add_request"), ("request_id", "prompt", "params"),
         site=Site(RO, "RolloutEngine._add_group", "self.engine.add_request")),
    Call(V("vllm/sampling_params.py", "SamplingParams"), site=Site(RO, "RolloutEngine._add_group", "SamplingParams")),
    Call(V(LLM, "LLM.collective_rpc"), ("method",), site=Site(RO, "RolloutEngine.collective_rpc",
                                                             "self.llm.collective_rpc")),
    Call(V(LLM, "LLM.generate"), ("prompts", "sampling_params"),
         site=Site(RO, "RolloutEngine.sequence_logprobs", "self.llm.generate")),
    Exists(V("vllm/v1/engine/llm_engine.py", "LLMEngine.step"), "method"),
    Exists(V("vllm/v1/engine/llm_engine.py", "LLMEngine.has_unfinished_requests"), "method"),
    Exists(V("vllm/v1/worker/worker_base.py", "WorkerBase.local_rank"), "attr",
           why="the receiver picks communicator j from its worker's rank"),
    Exists(V("vllm/v1/worker/worker_base.py", "WorkerBase.rank"), "attr"),
    Pattern(V("vllm/config/parallel.py", "ParallelConfig.__post_init__"), "get_current_placement_group()",
            key="distributed_executor_backend",
            why="unset, vLLM picks its Ray executor inside a placement group: instances pass 'mp' explicitly"),
    Pattern(V("vllm/v1/worker/worker_base.py", "WorkerWrapperBase.init_worker"),
            "resolve_obj_by_qualname(_.worker_extension_cls)",
            why="the worker extension module is imported in each worker (the receiver installs loaders there)"),
    Order(V("vllm/v1/executor/multiproc_executor.py", "WorkerProc.__init__"), "_.init_worker(_)", "_.load_model()",
          why="the extension is imported before the model is built, so loaders patched on import are bound"),
)

TRANSPORT = (
    Call(V("vllm/distributed/utils.py", "StatelessProcessGroup.create"),
         site=Site(TX, "create_communicator", "StatelessProcessGroup.create")),
    Call(V("vllm/distributed/utils.py", "StatelessProcessGroup"),
         site=Site(TX, "create_communicator", "StatelessProcessGroup"),
         why="rank 0 wraps the store it already listens on (the port is held before the instances join)"),
    Call(VA(PYHCCL, "PyHcclCommunicator"), ("group",), site=Site(TX, "create_communicator", "Comm"),
         why="the HCCL weight-push communicator"),
    Call(VA(PYHCCL, "PyHcclCommunicator.broadcast"), ("tensor",), kwargs=("src",)),
    Exists(VA(PYHCCL, "PyHcclCommunicator.disabled"), "attr", why="a disabled communicator is refused"),
    Exists(VA(PYHCCL, "PyHcclCommunicator.device"), "attr"),
    Exists(VA(NPU_WORKER, "NPUWorker.model_runner"), "attr", why="the receiver loads into model_runner.model"),
    Exists(VA("vllm_ascend/worker/model_runner_v1.py", "NPUModelRunner.model"), "attr"),
    Exists(V("vllm/model_executor/models/qwen2.py", "Qwen2ForCausalLM.load_weights"), "method",
           why="the engine-free push's receiver (engines/vllm_ext.load_hf_weights) loads HF-named full tensors "
               "with the model's own loader where the runner has no reload_weights(weights_iterator=...)"),
    Exists(V("vllm/model_executor/models/llama.py", "LlamaForCausalLM.load_weights"), "method"),
    Pattern(VA(NPU_WORKER, "NPUWorker.__init__"), "WEIGHT_LOADER_V2_SUPPORTED.remove('UnquantizedLinearMethod')",
            why="vllm-ascend builds linear layers with the v1 weight_loader, the one MindSpeed-RL's loaders patch"),
)

RAY = (
    Call(R("ray/util/placement_group.py", "placement_group"), ("bundles",),
         site=Site(RG, "create_instance_placement_groups", "placement_group")),
    Call(R("ray/util/scheduling_strategies.py", "PlacementGroupSchedulingStrategy"),
         site=Site(RG, "instance_actor_options", "PlacementGroupSchedulingStrategy")),
    Exists(R("ray/runtime_context.py", "RuntimeContext.get_accelerator_ids"), "method",
           why="instances bind their devices from Ray's accelerator ids"),
    Call(R("ray/util/scheduling_strategies.py", "NodeAffinitySchedulingStrategy"), kwargs=("node_id", "soft"),
         site=Site(EN, "run", "NodeAffinitySchedulingStrategy"),
         why="the driver task runs on the entry's node, so the run's files land beside config.yaml"),
    Exists(R("ray/runtime_context.py", "RuntimeContext.get_node_id"), "method"),
)

# What our side must keep for the async path to start right on a cluster: each line is one of the
# blockers a review found (devices, executor, weight loaders, resume, reads); a change that
# reintroduces one fails here, next to the vLLM / Ray behaviour that makes it a blocker.
OURS = (
    Call(V(LLM, "LLM"), kwargs=("model", "distributed_executor_backend", "load_format", "gpu_memory_utilization"),
         why="NPU instances pass these through RolloutEngine(engine_args=instance_engine_args())"),
    Pattern(O(RG, "instance_engine_args"), "{'distributed_executor_backend': 'mp', 'load_format': 'dummy'}",
            key="distributed_executor_backend",
            why="TP > 1 needs vLLM's mp executor (its Ray executor rejects a bundle holding several NPUs); dummy "
                "weights until the first push"),
    Pattern(O(RG, "instance_actor_options"), "PlacementGroupSchedulingStrategy(..., "
                                             "placement_group_capture_child_tasks=False)",
            why="a captured placement group makes vLLM choose its Ray executor"),
    Order(O(RG, "instance_actor_class.InstanceEngine.__init__"), "own_devices(...)", "super().__init__(...)",
          why="ASCEND_RT_VISIBLE_DEVICES is narrowed to the instance's devices before vLLM starts its workers "
              "(RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES: Ray does not)"),
    Pattern(O(VR, "<module>"), "install_megatron_loaders(...)",
            why="the loaders are patched when vLLM imports the extension, before it builds the model"),
    Pattern(O(VR, ""), "import_mindspeed(...)", absent=True,
            why="the receiver must not import the mindspeed_rl package (acl, transfer_to_npu) into vLLM workers"),
    Pattern(O(VR, "MindSpeedWeightReceiver.asp_recv_megatron_weights"), "load_megatron_weights(...)", absent=True,
            why="load_megatron_weights ends in .cuda(), which needs MindSpeed-RL's transfer_to_npu patch"),
    Pattern(O(SS, "build_async_rollout"), "source_plan(_, _, _, _, start_iteration)",
            why="resume: admission starts at the checkpointed iteration (else it stalls until the timeout)"),
    Pattern(O(EN, "_train"), "build_async_rollout(..., start_iteration=actor.get_iteration())",
            why="resume: the trainer's checkpointed iteration"),
    Pattern(O(SS, "wire_source"), "publish(plan.start)",
            why="the first push (the trainer's weights as version start) precedes every admission"),
    Pattern(O(TR, "TransferDockStore.read_columns"), "_.get_experience.remote(...)",
            why="reads go through the dock's waiting API"),
    Pattern(O(TR, ""), "get_experience_data", absent=True,
            why="a snapshot skips the wait: fire-and-forget writes would read as None"),
    Pattern(O(EN, "_train"), "AsyncGRPOTrainer(..., asp_on_iteration=files.on_iteration, asp_timeline=files)",
            why="the async run writes timeline.jsonl / metrics.jsonl / summary.json (asp report, --calibrate)"),
)

VLLM_REQUIREMENTS = (*INSTANCE, *TRANSPORT, *RAY, *OURS)
