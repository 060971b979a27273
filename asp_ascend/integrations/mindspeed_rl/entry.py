"""Entry point on an Ascend cluster: MindSpeed-RL Hydra YAML + our ``asp:`` group.

    python -m asp_ascend.integrations.mindspeed_rl.entry \\
        --config-path configs/mindspeed_rl --config-name grpo_qwen25_7b_asp_A3 \\
        [rl_config.x=y ...] [asp.pipeline.lag_bound=2 ...]

Run from the MindSpeed-RL root (or set ``asp.mindspeed.root``), after ``ray start`` on every
node (examples/npu/grpo_qwen25_7b_asp.sh does both). Steps, mirroring MindSpeed-RL's
``cli/train_grpo.py``: compose the YAML with Hydra (``defaults: - model: ...`` comes from
MindSpeed-RL's ``configs/model``), translate it (:mod:`.config_bridge`), write the resolved
configs into ``output_dir``, make sure ``schedule.parquet`` exists (else run the ASP pass),
attach to Ray with MindSpeed-RL's runtime env, and run the driver as a Ray task.

``mindspeed.trainer: sync`` runs the stock ``RayGRPOTrainer`` fed by the schedule (ASP batch
composition and order, MindSpeed-RL's colocated generation); ``async`` runs
``AsyncGRPOTrainer`` with separate rollout instances.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from ...errors import AspError, ConfigError


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(MindSpeed-RL Hydra overrides, our overrides with the ``asp.`` prefix removed)."""
    msrl, ours = [], []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key.startswith("asp."):
            ours.append(o.split("asp.", 1)[1] if o.startswith("asp.") else o)
        else:
            msrl.append(o)
    return msrl, ours


def compose(config_path: str, config_name: str, overrides: list[str], mindspeed_root: Optional[str]) -> dict:
    """Hydra compose (like ``@hydra.main``); the model group comes from MindSpeed-RL's ``configs/``."""
    try:
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from omegaconf import OmegaConf
    except ImportError as exc:
        from ...errors import BackendMissingError

        raise BackendMissingError("hydra", "pip install hydra-core==1.3.2", "reading MindSpeed-RL configs") from exc
    cfg_dir = Path(config_path).resolve()
    if not (cfg_dir / f"{config_name}.yaml").is_file():
        raise ConfigError([f"--config-name {config_name}: {cfg_dir / (config_name + '.yaml')} does not exist"])
    extra = []
    root = Path(mindspeed_root or os.getcwd()).resolve()
    if (root / "configs" / "model").is_dir() and root / "configs" != cfg_dir:
        extra.append(f"hydra.searchpath=[file://{root / 'configs'}]")
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        dc = hydra_compose(config_name=config_name, overrides=list(overrides) + extra)
    return OmegaConf.to_container(dc, resolve=True)


def ensure_schedule(cfg) -> Path:
    """``output_dir/schedule.parquet``, planned here when missing: every epoch, or epoch 0 alone with
    ``scheduler.adaptive`` (the driver plans the later ones from the lengths it observes)."""
    path = Path(cfg.output_dir) / "schedule.parquet"
    if path.is_file():
        return path
    try:
        from ...scheduler.run import run_schedule
    except ImportError as exc:
        raise ConfigError([f"{path} does not exist and the ASP pass is not available here ({exc}); "
                           f"run `asp schedule` on a login node first"]) from None
    from ..prompt_tokens import counter_for
    from ..verl.plan import first_plan_config
    from .config_bridge import TRANSLATION

    run_schedule(first_plan_config(cfg), counter_for(cfg, TRANSLATION["model.path"]))
    if not path.is_file():
        raise ConfigError([f"`asp schedule` did not write {path}; check output_dir"])
    return path


def runtime_env(msrl: dict, root: Path) -> dict:
    """MindSpeed-RL's Ray runtime env (``rl_config.runtime_env_path``, relative to its root) plus the
    variables its ``main`` adds (VLLM_DP_SIZE, IS_MULTIMODAL, HCCL_BUFFSIZE), and the root on PYTHONPATH."""
    import yaml

    rel = (msrl.get("rl_config") or {}).get("runtime_env_path", "configs/envs/runtime_env.yaml")
    p = (root / rel) if not Path(rel).is_absolute() else Path(rel)
    env = yaml.safe_load(p.read_text()) if p.is_file() else {"env_vars": {}}
    env.setdefault("env_vars", {})
    rl, gen = msrl.get("rl_config") or {}, msrl.get("generate_config") or {}
    if gen.get("enable_expert_parallel"):
        env["env_vars"]["VLLM_DP_SIZE"] = str(gen.get("infer_expert_parallel_size", 1))
    env["env_vars"]["IS_MULTIMODAL"] = str(bool(rl.get("is_multimodal", False)))
    env["env_vars"]["HCCL_BUFFSIZE"] = str(rl.get("hccl_buffersize", 256))
    env["env_vars"].setdefault("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "true")
    env["env_vars"]["PYTHONPATH"] = os.pathsep.join([str(root), env["env_vars"].get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asp_ascend.integrations.mindspeed_rl.entry",
                                 description="async GRPO with the ASP schedule on MindSpeed-RL worker groups")
    ap.add_argument("--config-path", required=True, help="directory holding the YAML")
    ap.add_argument("--config-name", required=True, help="YAML name without .yaml")
    ap.add_argument("--dry-run", action="store_true", help="translate and write the resolved configs, then stop")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides; asp.KEY=VALUE go to our config")
    args = ap.parse_args(argv)
    try:
        return run(args.config_path, args.config_name, args.overrides, dry_run=args.dry_run)
    except AspError as exc:
        print(f"asp mindspeed: error: {exc}", file=sys.stderr)
        return 2


def run(config_path: str, config_name: str, overrides: list[str], dry_run: bool = False) -> int:
    from ...config import save_resolved, to_dict
    from ...io import write_text_atomic
    from .config_bridge import translate

    msrl_ov, our_ov = split_overrides(overrides)
    raw_yaml = Path(config_path) / f"{config_name}.yaml"
    from .config_bridge import load_mindspeed_yaml

    root_hint = ((load_mindspeed_yaml(raw_yaml).get("asp") or {}).get("mindspeed") or {}).get("root")
    raw = compose(config_path, config_name, msrl_ov, root_hint)
    cfg, msrl = translate(raw, our_ov, source=str(raw_yaml))
    out = Path(cfg.output_dir)
    if not (out / "schedule.parquet").is_file():   # the pass below plans asp.data.path
        from .config_bridge import missing_prompts_problem

        problem = missing_prompts_problem(msrl, cfg)
        if problem:
            raise ConfigError([problem], str(raw_yaml))
    save_resolved(cfg)
    import yaml

    write_text_atomic(out / "mindspeed_config.yaml", yaml.safe_dump(msrl, sort_keys=False))
    if dry_run:
        print(f"asp mindspeed: resolved configs written to {out}")
        return 0
    schedule = ensure_schedule(cfg)
    root = Path(cfg.mindspeed.root or os.getcwd()).resolve()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), runtime_env=runtime_env(msrl, root))
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # the driver task runs on this node, so the run's files land in output_dir beside config.yaml
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    ray.get(ray.remote(_train).options(num_cpus=1, scheduling_strategy=here).remote(
        msrl, to_dict(absolute_paths(cfg)), str(schedule), str(root)))
    return 0


def absolute_paths(cfg):
    """``cfg`` with ``data.path``, ``lengths.path`` and ``model.path`` absolute: the driver task (whose working
    directory is Ray's) reads them to re-plan an adaptive run's epochs (model.path: the tokenizer that counts
    the prompts, integrations/prompt_tokens.py)."""
    import dataclasses

    def absolute(p):
        return str(Path(p).resolve()) if p else p

    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=absolute(cfg.data.path)),
                               lengths=dataclasses.replace(cfg.lengths, path=absolute(cfg.lengths.path)),
                               model=dataclasses.replace(cfg.model, path=absolute(cfg.model.path)))


def _train(msrl: dict, cfg_dict: dict, schedule_path: str, root: str) -> None:
    """The driver, inside a Ray task (as MindSpeed-RL's ``train``)."""
    if root not in sys.path:
        sys.path.insert(0, root)
    from . import require_mindspeed

    require_mindspeed("the MindSpeed-RL driver")
    import ray
    from cli.train_grpo import get_megatron_module, gpt_model_provider, initialize_megatron, parse_training_config
    from mindspeed_rl.datasets.build_dataset import build_train_valid_test_datasets
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset
    from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
    from mindspeed_rl.utils.tokenizer import get_tokenizer
    from mindspeed_rl.utils.utils import get_node_nums
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker
    from mindspeed_rl.workers.rule_reward import RuleReward
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup
    from ray.util.placement_group import placement_group

    from ...config import load_config
    from .schedule_batches import ScheduleBatches, prompt_dataset_fetch
    from .trainer import make_trainer_worker_class

    parsed = parse_training_config(msrl)
    actor_config, rl_config, generate_config = parsed["actor_config"], parsed["rl_config"], parsed["generate_config"]
    cfg = _cfg_from_dict(cfg_dict, load_config)
    asynchronous = cfg.mindspeed.trainer == "async"
    tokenizer = get_tokenizer(tokenizer_model=actor_config.tokenizer_name_or_path, prompt_type=actor_config.prompt_type,
                              prompt_type_path=actor_config.prompt_type_path)
    gbs, n = actor_config.global_batch_size, rl_config.n_samples_per_prompt
    actor = RayActorGroup(
        worker=make_trainer_worker_class(cfg.mindspeed.weight_push == "hf") if asynchronous else IntegratedWorker, placement_group=None,
        megatron_config=actor_config, rl_config=rl_config, generate_config=generate_config,
        model_provider=gpt_model_provider, profiler_config=parsed["profiler_config"]["integrated"],
        msprobe_config=parsed["msprobe_config"], tokenizer=tokenizer, initialize_func=initialize_megatron,
        get_megatron_module=get_megatron_module, global_batch_size=gbs * n).initialize()
    actor_config.max_prompt_length = rl_config.max_prompt_length
    reward_list: list[Any] = []
    if rl_config.rule_reward:
        nodes = get_node_nums()
        pg = placement_group([{"CPU": rl_config.num_cpus_for_local_task} for _ in range(nodes)], strategy="SPREAD")
        ray.get(pg.ready())
        for i in range(nodes):
            rr = RuleReward.options(placement_group=pg, placement_group_bundle_index=i).remote()
            rr.initialize.remote(parsed["reward_config"], rl_config, tokenizer, generate_config.trust_remote_code,
                                 dp_rank=i)
            reward_list.append(rr)
    train_ds, _, _ = build_train_valid_test_datasets(
        data_prefix=[actor_config.data_path], splits_string=actor_config.split, seq_length=actor_config.seq_length,
        train_valid_test_num_samples=[actor_config.train_iters * gbs, 0, 0], seed=actor_config.seed,
        dataset_cls=PromptDataset, extra_param=actor_config)
    actor.wait_all_ref_objs_run_over()
    consumed = actor.get_consumed_train_samples()
    common = dict(tokenizer=tokenizer, global_batch_size=gbs, micro_batch_size=rl_config.adv_dispatch_size,
                  train_iters=actor_config.train_iters, save_interval=actor_config.save_interval,
                  dataset_additional_keys=actor_config.dataset_additional_keys, **rl_config.dict())
    if not asynchronous:
        batches = ScheduleBatches(schedule_path, gbs, prompt_dataset_fetch(train_ds),
                                  dataset_additional_keys=actor_config.dataset_additional_keys,
                                  consumed_samples=consumed, order=cfg.mindspeed.batch_order)
        check_schedule_covers(len(batches), actor_config.train_iters, batches.skipped_iterations)
        RayGRPOTrainer(actor, actor, reward_list, **common).fit(batches)
        return
    from .sample_source import build_async_rollout

    from .config_bridge import trainer_dp

    # resume: the plan starts at the trainer's checkpointed iteration, whose weights are pushed first
    source, publish, settings = build_async_rollout(cfg, actor, schedule_path, train_ds, tokenizer,
                                                    dataset_additional_keys=actor_config.dataset_additional_keys,
                                                    trainer_dp=trainer_dp(msrl), start_iteration=actor.get_iteration(),
                                                    mindspeed_root=root,
                                                    trainer_devices=int(rl_config.actor_resource.get("num_npus") or 0))
    from .trainer import make_async_grpo_trainer_class

    from .run_files import RunFiles

    AsyncGRPOTrainer = make_async_grpo_trainer_class()
    files = RunFiles(cfg.output_dir)   # timeline.jsonl, metrics.jsonl, then summary.json (asp report reads them)
    try:
        AsyncGRPOTrainer(actor, actor, reward_list, asp_samples=source, asp_publish=publish, asp_settings=settings,
                         asp_on_iteration=files.on_iteration, asp_timeline=files, **common).fit()
    except BaseException:
        files.close()
        raise
    files.close(cfg)


def check_schedule_covers(remaining: int, train_iters: int, done: int) -> None:
    """RayGRPOTrainer.fit calls next() train_iters times: the schedule must have that many iterations."""
    if remaining < train_iters - done:
        raise ConfigError([f"megatron_training.train_iters: {train_iters} iterations, but schedule.parquet has "
                           f"{done + remaining}; lower train_iters or schedule more epochs (asp.train.epochs)"])


def _cfg_from_dict(d: dict, load_config):
    import tempfile

    from omegaconf import OmegaConf

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(d)))
    try:
        return load_config(f.name, check_files=False, saved=True)   # the driver's loaded config, as it was
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    sys.exit(main())
