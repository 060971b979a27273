"""Everything the verl adapter relies on in verl, as data, checked by ``asp doctor --verl``.

Checked statically by the shared checker (:mod:`asp_ascend.integrations.apicheck`) against the
installed verl package (never imported), plus the config keys :mod:`.config_bridge` and the
``asp`` group read, against verl's flattened reference config
(``verl/trainer/config/_generated_ppo_trainer.yaml``; the fully async group against its own YAML).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..apicheck import Checker, Exists, Finding, Order, Params, Pattern, Ref, Report, installed_root, ours_root
from ..apicheck.expect import ConfigKeys
from .config_bridge import TRANSLATION

RT = "verl/trainer/ppo/ray_trainer.py"
UT = "verl/trainer/ppo/utils.py"
V0 = "verl/trainer/main_ppo_v0.py"
MAIN = "verl/trainer/main_ppo.py"
DS = "verl/utils/dataset/rl_dataset.py"
EW = "verl/workers/engine_workers.py"
TU = "verl/utils/tensordict_utils.py"
OSO = "verl/experimental/one_step_off_policy/ray_trainer.py"
SEP = "verl/experimental/separation/ray_trainer.py"
LLM = "verl/workers/rollout/llm_server.py"
FA = "verl/experimental/fully_async_policy/fully_async_rollouter.py"
MQ = "verl/experimental/fully_async_policy/message_queue.py"
ROUTER = "verl/workers/rollout/router.py"
PROTO = "verl/protocol.py"
GEN_YAML = "verl/trainer/config/_generated_ppo_trainer.yaml"
FA_YAML = "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"


def V(path: str, name: str = "") -> Ref:
    return Ref("verl", path, name)


EXPECTATIONS = (
    Params(V(RT, "RayPPOTrainer.__init__"), ("config", "tokenizer", "role_worker_mapping",
                                             "resource_pool_manager", "ray_worker_group_cls", "processor",
                                             "train_dataset", "val_dataset", "collate_fn", "train_sampler"),
           why="AspTrainer passes train_dataset/collate_fn and (through _create_dataloader) train_sampler"),
    Params(V(RT, "RayPPOTrainer._create_dataloader"), ("train_dataset", "val_dataset", "collate_fn",
                                                       "train_sampler"), exact=True,
           why="overridden: installs the AspSampler"),
    Params(V(RT, "RayPPOTrainer.init_workers"), (), exact=True, why="overridden: reads the actor DP size"),
    Params(V(RT, "RayPPOTrainer._get_dp_size"), ("worker_group", "role"), exact=True),
    Params(V(RT, "RayPPOTrainer._load_checkpoint"), (), exact=True, why="overridden: aligns the sampler"),
    Params(V(RT, "RayPPOTrainer._save_checkpoint"), (), exact=True, why="writes data.pt with the sampler state"),
    Params(V(RT, "RayPPOTrainer._update_actor"), ("batch",), exact=True, why="overridden: records lengths"),
    Exists(V(RT, "RayPPOTrainer._balance_batch"), "method", why="the reorder trainer.balance_batch=false turns off"),
    Exists(V(RT, "RayPPOTrainer.fit"), "method"),
    Exists(V(RT, "RayPPOTrainer.train_dataloader"), "attr"),
    Exists(V(RT, "RayPPOTrainer.global_steps"), "attr"),
    Exists(V(RT, "RayPPOTrainer.actor_rollout_wg"), "attr"),
    Exists(V(RT, "ResourcePoolManager"), "class"),
    Params(V(UT, "create_rl_dataset"), ("data_paths", "data_config", "tokenizer", "processor", "is_train",
                                        "max_samples")),
    Exists(V(UT, "Role"), "class"),
    Exists(V(V0, "TaskRunner"), "ray_actor", why="AspTaskRunner subclasses its __ray_actor_class__"),
    *(Exists(V(V0, f"TaskRunner.{m}"), "method", why="called by AspTaskRunner.run") for m in (
        "add_actor_rollout_worker", "add_critic_worker", "add_reward_model_resource_pool",
        "add_teacher_model_resource_pool", "add_ref_policy_worker", "init_resource_pool_mgr")),
    Params(V(MAIN, "run_ppo"), ("config", "task_runner_class"), exact=True),
    Exists(V(DS, "collate_fn"), "function"),
    Exists(V(DS, "RLHFDataset.__getitem__"), "method", why="items carry raw_prompt and extra_info"),
    Params(V(EW, "TrainingWorker.train_mini_batch"), ("data",),
           why="where update mini-batches are cut (layout.py's account of verl's update)"),
    Params(V(TU, "make_iterator"), ("tensordict", "mini_batch_size", "epochs", "seed", "dataloader_kwargs")),
    Exists(V(PROTO, "DataProto.repeat"), "method", why="interleaved repeat keeps a prompt's samples adjacent"),
    Exists(V(OSO, "OneStepOffRayTrainer"), "class", why="asp_trainer_class(OneStepOffRayTrainer) for one_step_off"),
    Exists(V(OSO, "OneStepOffRayTrainer._create_dataloader"), "method"),
    Params(V(OSO, "OneStepOffRayTrainer.__init__"), ("config", "tokenizer", "role_worker_mapping", "resource_pool_manager",
                                                     "ray_worker_group_cls", "processor", "train_dataset",
                                                     "val_dataset", "collate_fn", "train_sampler", "device_name"),
           why="the one_step_off entry builds it with these keywords (asp_trainer_class adds asp=)"),
    Exists(V("verl/experimental/separation/utils.py", "create_role_worker_mapping"), "function",
           why="the one_step_off entry's worker mapping, as verl's OneStepTaskRunner"),
    Exists(V("verl/experimental/separation/utils.py", "create_resource_pool_manager"), "function"),
    Pattern(V(OSO, "OneStepOffRayTrainer.__init__"), "self._create_dataloader(_, _, _, train_sampler)",
            why="the ASP sampler enters through the overridden _create_dataloader"),
    Exists(V(FA, "FullyAsyncRollouter"), "ray_actor", why="AspRollouter subclasses its __ray_actor_class__"),
    Exists(V(FA, "FullyAsyncRollouter._should_pause_generation"), "method"),
    Params(V(FA, "FullyAsyncRollouter.reset_staleness"), (), exact=True,
           why="overridden: each call publishes the next version to the ASP gate"),
    Pattern(V(FA, "FullyAsyncRollouter.__init__"), "self._create_dataloader(_, _, _, train_sampler)",
            why="the rollouter's dataloader takes our sampler through the overridden _create_dataloader"),
    Pattern(V(FA, "FullyAsyncRollouter.__init__"), "self.pending_queue = asyncio.Queue(maxsize=_)",
            why="replaced after __init__ by the AdmissionQueue"),
    Pattern(V(FA, "FullyAsyncRollouter._processor_worker"), "await self.pending_queue.get()",
            why="verl's processor takes each prompt through the queue's get: where ASP admission waits"),
    Pattern(V(FA, "FullyAsyncRollouter._create_continuous_iterator"), "iter(self.train_dataloader)",
            why="the feed walks the dataloader in its sampler's order"),
    Exists(V(MQ, "MessageQueue"), "class"),
    Params(V(ROUTER, "GlobalRequestLoadBalancer.acquire_server"), ("request_id",),
           why="AspLoadBalancer overrides it (plus the declared priority field)"),
    Params(V(ROUTER, "GlobalRequestLoadBalancer.__init__"), ("servers", "max_cache_size")),
    Params(V(ROUTER, "GlobalRequestLoadBalancer.release_server"), ("server_id", "request_id"), exact=True,
           why="AspLoadBalancer overrides it: a group whose samples all came back frees its instance's slot"),
    Exists(V(ROUTER, "GlobalRequestLoadBalancer.require_release_fields"), "method",
           why="declares request_id, which maps a release to its group"),
    Pattern(V(ROUTER, "_create_plugin_extension"), "ray_cls = cls if isinstance(cls, ray.actor.ActorClass) else ray.remote(cls)",
            why="router_class names AspLoadBalancerActor, an actor class with a concurrency above the waiting requests"),
    Params(V(MQ, "MessageQueueClient.get_sample"), (), exact=True,
           why="ConsumptionClient overrides it: what the trainer takes is what the length history records"),
    Params(V(MQ, "MessageQueueClient.__init__"), ("queue_actor",), exact=True),
    Pattern(V(MQ, "MessageQueue.put_sample"), "self.queue.popleft()",
            why="verl drops the oldest sample when the queue is full: why lengths are recorded at consumption"),
    Params(V("verl/experimental/fully_async_policy/fully_async_trainer.py", "FullyAsyncTrainer.set_message_queue_client"),
           ("message_queue_client",), exact=True, why="the runner gives the trainer the ConsumptionClient"),
    Exists(V("verl/experimental/fully_async_policy/fully_async_main.py", "FullyAsyncTaskRunner._initialize_components"),
           "method", why="overridden: after verl's, the trainer gets the ConsumptionClient"),
    Exists(V(ROUTER, "GlobalRequestLoadBalancer.require_acquire_fields"), "method",
           why="declares priority, the field that carries a group's schedule instance"),
    Exists(V(ROUTER, "DEFAULT_ROUTING_CACHE_SIZE"), "module_attr"),
    Pattern(V(ROUTER, "_create_plugin_extension"), "ray_cls.remote(servers, yaml_config)",
            why="verl builds the router_config_path class with (servers, yaml dict): AspLoadBalancer's signature"),
    Params(V(FA, "FullyAsyncRollouter._process_single_sample_streaming"), ("rollout_sample",), exact=True,
           why="overridden: sets the group's priority before, records its lengths after verl's method"),
    Pattern(V(FA, "FullyAsyncRollouter._process_single_sample_streaming"), "rollout_sample.full_batch = ret",
            why="after verl's method the sample holds the rollout output the lengths are read from"),
    Exists(V(FA, "FullyAsyncRollouter.fit"), "method", why="overridden: writes the length history at the end"),
    Params(V(RT, "RayPPOTrainer._get_gen_batch"), ("batch",), exact=True,
           why="overridden: training batches carry their groups' routing priority"),
    Order(V(RT, "RayPPOTrainer.fit"), 'batch.non_tensor_batch["uid"] = _', "gen_batch = self._get_gen_batch(batch)",
          why="each prompt has its uid when _get_gen_batch sets its priority: AspTrainer keeps uid -> priority until "
              "the batch is trained"),
    Order(V(RT, "RayPPOTrainer.fit"), "gen_batch = self._get_gen_batch(batch)", "actor_output = self._update_actor(batch)",
          why="every trained batch passes _update_actor after generation: its lengths are recorded and reported there"),
    Order(V(OSO, "OneStepOffRayTrainer._async_gen_next_batch"), 'batch.non_tensor_batch["uid"] = _',
          "gen_batch = self._get_gen_batch(batch)", why="as in RayPPOTrainer.fit, for the batch generated ahead"),
    Pattern(V(OSO, "OneStepOffRayTrainer.fit_step"), "batch = self._fit_update_actor(batch)",
            why="one-step-off trains each batch through _fit_update_actor"),
    Pattern(V(SEP, "SeparateRayPPOTrainer._fit_update_actor"), "actor_output = self._update_actor(batch)",
            why="... which calls the overridden _update_actor (records and reports the batch's lengths)"),
    Pattern(V(RT, "RayPPOTrainer.init_workers"), "self.llm_server_manager = LLMServerManager.create(...)",
            why="the sync trainer reaches the load balancer through llm_server_manager.global_load_balancer"),
    Pattern(V(OSO, "OneStepOffRayTrainer._init_async_rollout_manager"),
            "self.llm_server_manager = LLMServerManager.create(...)", why="the same for one-step-off"),
    Pattern(V(LLM, "LLMServerManager._init_global_load_balancer"), "self.global_load_balancer = get_router_handle(...)",
            why="the handle of the balancer the router_config_path YAML names (AspLoadBalancerActor): report_groups"),
    Params(V("verl/experimental/agent_loop/single_turn_agent_loop.py", "SingleTurnAgentLoop.run"),
           ("sampling_params", "priority"), why="the agent loop takes the batch's priority and forwards it to "
                                                "generate (and so to the balancer)"),
)

# verl config keys read by the bridge, the asp group and the resume path
CONFIG_KEYS = (*TRANSLATION.values(), "data.seed", "data.gen_batch_size", "data.train_files", "data.val_files",
               "data.dataloader_num_workers", "actor_rollout_ref.hybrid_engine", "actor_rollout_ref.actor.shuffle",
               "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
               "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node",
               "actor_rollout_ref.rollout.data_parallel_size", "actor_rollout_ref.rollout.pipeline_model_parallel_size",
               "trainer.balance_batch", "trainer.use_v1", "trainer.nnodes", "trainer.n_gpus_per_node",
               "trainer.default_local_dir", "trainer.resume_mode", "trainer.device", "algorithm.filter_groups.enable",
               "actor_rollout_ref.rollout.router_config_path", "actor_rollout_ref.rollout.max_num_seqs")
ASYNC_KEYS = ("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
              "async_training.require_batches", "async_training.partial_rollout")


def _yaml_keys(path: Path) -> set[str]:
    import yaml

    def walk(node, prefix=""):
        for k, v in (node or {}).items():
            key = f"{prefix}{k}"
            yield key
            if isinstance(v, dict):
                yield from walk(v, key + ".")

    return set(walk(yaml.safe_load(path.read_text())))


def config_findings(root: Path) -> list[Finding]:
    out = []
    for rel, keys in ((GEN_YAML, CONFIG_KEYS), (FA_YAML, ASYNC_KEYS)):
        e = ConfigKeys(V(rel, "<yaml>"), tuple(keys), why="read by asp_ascend/integrations/verl/config_bridge.py")
        p = root / rel
        if not p.is_file():
            out.append(Finding(e, False, "file not found"))
            continue
        missing = [k for k in keys if k not in _yaml_keys(p)]
        out.append(Finding(e, not missing, f"keys not in verl's config: {missing}" if missing else f"{len(keys)} keys"))
    return out


def check_verl(root: Optional[Path] = None) -> Report:
    import importlib.metadata as md

    root = root or installed_root("verl")
    if root is None:
        return Report.not_checked("verl", "verl is not installed in this environment (pip install -e '.[verl]', "
                                          "or `source ci/env.sh verl` for its own environment; docs/verl.md)")
    try:
        version = f"installed verl {md.version('verl')}"
    except md.PackageNotFoundError:
        version = "verl (version unknown)"
    report = Checker({"verl": root, "ours": ours_root()}, versions={"verl": version}).run(EXPECTATIONS)
    report.findings.extend(config_findings(root))
    return report


def run_check(as_json: bool = False, verbose: bool = False) -> tuple[int, str]:
    report = check_verl()
    text = json.dumps(report.to_dict(), indent=2) if as_json else report.render(
        "verl adapter contract (asp_ascend/integrations/verl/contract.py):", verbose=verbose)
    return (0 if report.ok else 1), text
