"""The vLLM, vllm-ascend and Ray entry points the rollout instances and the weight push use.

Checked against the vLLM installed here (or ``--vllm-src``), a vllm-ascend checkout
(``--vllm-ascend-src``) and the installed Ray. vllm-ascend pins an older vLLM than the one
installed for CPU runs; an entry point that exists in one and not the other shows as a
mismatch of the tree it is missing from.
"""
from __future__ import annotations

from ..apicheck import Call, Exists, Order, Pattern, Ref, Site

RO = "asp_ascend/engines/rollout.py"
TX = "asp_ascend/platforms/transport.py"
RG = "asp_ascend/integrations/mindspeed_rl/rollout_groups.py"
LLM = "vllm/entrypoints/llm.py"
PYHCCL = "vllm_ascend/distributed/device_communicators/pyhccl.py"
NPU_WORKER = "vllm_ascend/worker/worker_v1.py"


def V(path: str, name: str = "") -> Ref:
    return Ref("vllm", path, name)


def VA(path: str, name: str = "") -> Ref:
    return Ref("vllm_ascend", path, name)


def R(path: str, name: str = "") -> Ref:
    return Ref("ray", path, name)


INSTANCE = (
    Call(V(LLM, "LLM"), site=Site(RO, "RolloutEngine.__init__", "LLM"),
         why="every keyword must reach vLLM's EngineArgs (LLM takes **kwargs)"),
    Call(V("vllm/v1/engine/llm_engine.py", "LLMEngine.add_request"), ("request_id", "prompt", "params"),
         site=Site(RO, "RolloutEngine.submit", "self.engine.add_request")),
    Call(V("vllm/sampling_params.py", "SamplingParams"), site=Site(RO, "RolloutEngine.submit", "SamplingParams")),
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
    Call(VA(PYHCCL, "PyHcclCommunicator"), ("group",), site=Site(TX, "create_communicator", "Comm"),
         why="the HCCL weight-push communicator"),
    Call(VA(PYHCCL, "PyHcclCommunicator.broadcast"), ("tensor",), kwargs=("src",)),
    Exists(VA(PYHCCL, "PyHcclCommunicator.disabled"), "attr", why="a disabled communicator is refused"),
    Exists(VA(PYHCCL, "PyHcclCommunicator.device"), "attr"),
    Exists(VA(NPU_WORKER, "NPUWorker.model_runner"), "attr", why="the receiver loads into model_runner.model"),
    Exists(VA("vllm_ascend/worker/model_runner_v1.py", "NPUModelRunner.model"), "attr"),
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
)

VLLM_REQUIREMENTS = (*INSTANCE, *TRANSPORT, *RAY)
